"""The connection check (mrl.connection, WhoAmI in identity.proto) against real exchanges, a scheduler and THL
on real sockets: one round trip proves the address, TLS, the token and its policy and run, and each way to get
one of them wrong fails at once with a message that names the address, the token's source and the fix."""
import socket
import time
import uuid

import grpc
import pytest

from helpers import self_signed, write_auth_file
from mrl import errors
from mrl.align_client import AlignClient
from mrl.exchange_client import AsyncExchangeClient, Backoff, ExchangeClient
from mrl.scheduler_client import SchedulerClient
from mrl.v1 import exchange_pb2_grpc, identity_pb2 as ipb
from servers import RunningAlign, RunningScheduler


@pytest.fixture(scope="module")
def secured(redis_url, tmp_path_factory):
    """An exchange with auth and TLS on, one with auth on in plaintext, their run, tokens and CA."""
    from servers import RunningExchange
    folder = tmp_path_factory.mktemp("secured")
    run = f"run-{uuid.uuid4().hex[:12]}"
    tokens = write_auth_file(folder / "auth.yaml", run)
    cert, key = self_signed(folder, "exchange")
    tls = RunningExchange(redis_url, auth_file=folder / "auth.yaml", tls_cert=cert, tls_key=key)
    plain = RunningExchange(redis_url, auth_file=folder / "auth.yaml")
    yield {"tls": tls, "plain": plain, "run": run, "tokens": tokens, "ca": cert.read_bytes()}
    tls.stop()
    plain.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_fails(client, error, *needles, **as_whom):
    """The client's check (as `as_whom`: run_id, policy) fails at once with `error`, its message holding each
    needle."""
    start = time.monotonic()
    with client, pytest.raises(error) as caught:
        client.check(**as_whom)
    assert time.monotonic() - start < 8, "the check must fail at once, not after the publish retry budget"
    for needle in needles:
        assert needle in str(caught.value), f"{needle!r} not in: {caught.value}"
    return str(caught.value)


def test_the_check_names_the_principal_its_policy_and_the_service(secured):
    s = secured
    with ExchangeClient(s["tls"].target, s["tokens"]["policy-a"], tls_root_cert=s["ca"]) as client:
        who = client.check(s["run"], "policy-a")
    assert (who.principal, who.role, who.policy, who.auth, who.service) == (
        "policy-a", "policy", "policy-a", True, "mrl.v1.ExperienceExchange")


def test_the_check_passes_anonymously_where_auth_is_off(exchange):
    with ExchangeClient(exchange.target) as client:
        who = client.check("any-run", "any-policy")
    assert (who.principal, who.role, who.auth) == ("anonymous", "admin", False)


@pytest.mark.parametrize("case", ["plaintext-to-tls", "tls-to-plaintext", "rest-port", "rest-port-tls",
                                  "closed-port"])
def test_a_wrong_address_or_tls_setting_fails_at_once_saying_what_to_fix(secured, case):
    s, token = secured, secured["tokens"]["policy-a"]
    tls, plain = s["tls"].server, s["plain"].server
    target, ca, hint = {
        "plaintext-to-tls": (s["tls"].target, None, "this looks like TLS"),
        "tls-to-plaintext": (s["plain"].target, s["ca"], "speaks plaintext"),
        "rest-port": (f"127.0.0.1:{plain.admin_port}", None, "this is the REST port (HTTP)"),
        "rest-port-tls": (f"127.0.0.1:{tls.admin_port}", s["ca"], "this is the REST port (HTTPS)"),
        "closed-port": (f"127.0.0.1:{closed_port()}", None, "nothing listens on"),
    }[case]
    client = ExchangeClient(target, token, tls_root_cert=ca, token_source="--token")
    check_fails(client, errors.Unavailable, f"the exchange at {target}", "TLS" if ca else "plaintext",
                "token from --token", hint, run_id=s["run"], policy="policy-a")


def test_a_wrong_token_names_its_source(secured, monkeypatch):
    s = secured
    monkeypatch.setenv("MRL_TOKEN", "mrl_not-a-known-token")
    client = ExchangeClient(s["plain"].target)             # no token argument: the environment's
    check_fails(client, errors.Unauthenticated, "unknown token", "token from MRL_TOKEN", s["plain"].target)
    check_fails(ExchangeClient(s["plain"].target, "mrl_wrong", token_source="exchange.token in a.yaml"),
                errors.Unauthenticated, "token from exchange.token in a.yaml")


def test_the_token_argument_wins_over_the_environment(secured, monkeypatch):
    s = secured
    monkeypatch.setenv("MRL_TOKEN", "mrl_not-a-known-token")
    with ExchangeClient(s["plain"].target, s["tokens"]["policy-b"]) as client:
        assert client.check(s["run"], "policy-b").principal == "policy-b"


@pytest.mark.parametrize("case", ["another-policy", "another-run"])
def test_a_token_of_another_policy_or_run_is_refused_before_any_work(secured, case):
    s = secured
    run, policy = (s["run"], "policy-b") if case == "another-policy" else (f"{s['run']}-other", "policy-a")
    client = ExchangeClient(s["plain"].target, s["tokens"]["policy-a"])
    check_fails(client, errors.PermissionDenied, "token from the token argument", repr(policy if
                case == "another-policy" else run), run_id=run, policy=policy)


def test_a_malformed_name_is_invalid_argument(exchange):
    stub = exchange_pb2_grpc.ExperienceExchangeStub(grpc.insecure_channel(exchange.target))
    with pytest.raises(grpc.RpcError) as caught:
        stub.WhoAmI(ipb.WhoAmIRequest(run_id="bad run!"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_async_client_checks_the_same(secured):
    import asyncio
    s = secured

    async def run():
        async with AsyncExchangeClient(s["tls"].target, s["tokens"]["policy-a"]) as client:   # no CA
            await client.check(s["run"], "policy-a")
    with pytest.raises(errors.Unavailable, match="this looks like TLS"):
        asyncio.run(run())


def test_the_scheduler_and_thl_clients_check_too(redis_url, tmp_path, run_id):
    tokens = write_auth_file(tmp_path / "auth.yaml", run_id)
    scheduler = RunningScheduler(redis_url, auth_file=tmp_path / "auth.yaml")
    thl = RunningAlign(auth_file=tmp_path / "auth.yaml")
    try:
        with SchedulerClient(scheduler.target, tokens["policy-a"], run_id=run_id, policy="policy-a") as client:
            assert client.check().service == "mrl.v1.Scheduler"
        check_fails(SchedulerClient(scheduler.target, tokens["policy-a"], run_id=run_id, policy="policy-b"),
                    errors.PermissionDenied, "the scheduler at", "'policy-b'")
        with SchedulerClient(scheduler.target, tokens["policy-a"], run_id=run_id, policy="policy-a") as client, \
                pytest.raises(errors.PermissionDenied, match="the scheduler at .*token from the token argument"):
            next(iter(client.watch("policy-b")))          # a stream's refusal names the token's source too
        with AlignClient(thl.target, tokens["policy-b"]) as client:
            assert client.check().principal == "policy-b"
        check_fails(AlignClient(f"127.0.0.1:{thl.server.admin_port}", tokens["policy-b"], backoff=Backoff(attempts=1)),
                    errors.Unavailable, "the tokenizer alignment service at", "this is the REST port")
    finally:
        scheduler.stop()
        thl.stop()
