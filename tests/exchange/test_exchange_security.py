"""Security of the exchange over real gRPC and HTTP sockets and a real Redis: authentication,
per-policy authorization, hashed tokens, loopback-only without auth, TLS, rate and size limits."""
import hashlib
import ipaddress
import itertools
import logging
import pathlib
import re
import threading
import uuid

import grpc
import httpx
import pytest
import yaml

from helpers import rollout, self_signed, write_auth_file
from mrl import errors
from mrl.auth import Authenticator, hash_token, new_token
from mrl.exchange_client import Backoff, ExchangeClient
from mrl.v1 import exchange_pb2 as xpb
from mrl.v1 import exchange_pb2_grpc

_ERROR_OF_CODE = {cls.grpc_code: cls for cls in (errors.InvalidArgument, errors.Unauthenticated,
                                                  errors.PermissionDenied, errors.NotFound,
                                                  errors.ResourceExhausted, errors.Unavailable)}


def take(subscription, n, timeout_s=10.0):
    """The first n deliveries, or fewer if they do not come within timeout_s (the subscription is closed)."""
    timer = threading.Timer(timeout_s, subscription.close)
    timer.start()
    try:
        return list(itertools.islice(iter(subscription), n))
    finally:
        timer.cancel()


class Env:
    """An exchange with auth on, its run R (policy-a, policy-b), another run and clients by principal."""

    def __init__(self, exchange, run, tokens):
        self.exchange, self.target, self.tokens = exchange, exchange.target, tokens
        self.runs = {"R": run, "other": f"{run}-other"}
        self._clients = []

    def client(self, who: str | None = None, token: str | None = None) -> ExchangeClient:
        c = ExchangeClient(self.target, token or (self.tokens[who] if who else None), backoff=Backoff(attempts=1))
        self._clients.append(c)
        return c

    def close(self):
        for c in self._clients:
            c.close()


@pytest.fixture
def auth_file(tmp_path, run_id):
    path = tmp_path / "auth.yaml"
    return path, write_auth_file(path, run_id)


@pytest.fixture(scope="module")
def shared_exchange(redis_url, tmp_path_factory):
    """One exchange with auth on for the matrix (each exchange costs ~0.25 s to start and stop)."""
    from servers import RunningExchange
    run = f"run-{uuid.uuid4().hex[:12]}"
    path = tmp_path_factory.mktemp("auth") / "auth.yaml"
    tokens = write_auth_file(path, run)
    ex = RunningExchange(redis_url, auth_file=path)
    yield ex, run, path, tokens
    ex.stop()


@pytest.fixture
def env(shared_exchange):
    ex, run, _, tokens = shared_exchange
    e = Env(ex, run, tokens)
    yield e
    e.close()


def snapshot(e: Env) -> dict:
    """(kind, producer, length) of every stream of both runs, as the admin sees them."""
    admin = e.client("admin")
    return {r: sorted((s.topic.kind, s.topic.producer, s.length) for s in admin.topic_stats(run))
            for r, run in e.runs.items()}


# -- the allow/deny matrix -------------------------------------------------------------------------
def publish(who, producer, run="R", token=None):
    def act(e):
        return e.client(who, token(e) if token else None).publish([rollout(e.runs[run], producer)])
    return act


def publish_batch_with_one_foreign():
    def act(e):
        return e.client("policy-a").publish([rollout(e.runs["R"], "policy-a"), rollout(e.runs["R"], "policy-b")])
    return act


def subscribe(who, subscriber, run="R"):
    def act(e):
        sub = e.client(who).subscribe(e.runs[run], subscriber, start="earliest")
        try:
            return take(sub, 1, timeout_s=5)
        finally:
            sub.close()
    return act


def subscribe_receives_other_policy():
    def act(e):
        sub = e.client("policy-a").subscribe(e.runs["R"], "policy-a", start="earliest")
        try:
            sent = rollout(e.runs["R"], "policy-b")
            assert e.client("policy-b").publish([sent]).accepted == 1
            got = take(sub, 1)
            assert [d.experience for d in got] == [sent]
            assert sub.ack(got) == 1
        finally:
            sub.close()
    return act


def ack(who, subscriber, run="R"):
    def act(e):
        return e.client(who).ack(e.runs[run], subscriber, ["rollout:policy-b:1-0"])
    return act


def list_topics(who, run="R"):
    return lambda e: e.client(who).list_topics(e.runs[run])


def topic_stats(who, run="R"):
    return lambda e: e.client(who).topic_stats(e.runs[run])


def raw_header(header):
    """ListTopics with the `authorization` metadata exactly as given (the client always sends 'Bearer ...')."""
    def act(e):
        with grpc.insecure_channel(e.target) as channel:
            stub = exchange_pb2_grpc.ExperienceExchangeStub(channel)
            try:
                return stub.ListTopics(xpb.ListTopicsRequest(run_id=e.runs["R"]),
                                       metadata=(("authorization", header(e)),), timeout=10)
            except grpc.RpcError as exc:
                raise _ERROR_OF_CODE.get(exc.code(), errors.MrlError)(f"{exc.code().name}: {exc.details()}")
    return act


UNAUTH, DENIED = errors.Unauthenticated, errors.PermissionDenied

MATRIX = [
    # (action, expected error or None, fragment of the error message)
    pytest.param(publish(None, "policy-a"), UNAUTH, "missing credentials", id="no-token-publish"),
    pytest.param(list_topics(None), UNAUTH, "missing credentials", id="no-token-list-topics"),
    pytest.param(subscribe(None, "policy-a"), UNAUTH, "missing credentials", id="no-token-subscribe"),
    pytest.param(publish(None, "policy-a", token=lambda e: "mrl_not-a-real-token"), UNAUTH, "unknown token",
                 id="wrong-token-publish"),
    pytest.param(publish(None, "policy-a", token=lambda e: hash_token(e.tokens["policy-a"])), UNAUTH,
                 "unknown token", id="stored-hash-is-not-a-token"),
    pytest.param(raw_header(lambda e: f"Basic {e.tokens['policy-a']}"), UNAUTH, "malformed credentials",
                 id="malformed-header-basic-scheme"),
    pytest.param(raw_header(lambda e: e.tokens["policy-a"]), UNAUTH, "malformed credentials",
                 id="malformed-header-no-scheme"),
    pytest.param(raw_header(lambda e: "Bearer"), UNAUTH, "malformed credentials", id="malformed-header-no-token"),
    pytest.param(raw_header(lambda e: f"Bearer {e.tokens['policy-a']}"), None, None,
                 id="raw-bearer-header-ok"),
    pytest.param(publish("policy-a", "policy-a"), None, None, id="policy-a-publishes-as-itself-ok"),
    pytest.param(publish("policy-a", "policy-b"), DENIED, "may publish only as policy 'policy-a'",
                 id="policy-a-publishes-as-policy-b-denied"),
    pytest.param(publish_batch_with_one_foreign(), DENIED, "not as 'policy-b'",
                 id="policy-a-batch-with-one-policy-b-experience-denied"),
    pytest.param(publish("policy-a", "policy-a", run="other"), DENIED, "does not belong to run",
                 id="policy-a-publishes-in-other-run-denied"),
    pytest.param(subscribe("policy-a", "policy-b"), DENIED, "may subscribe only as policy 'policy-a'",
                 id="policy-a-subscribes-as-policy-b-denied"),
    pytest.param(subscribe("policy-a", "policy-a", run="other"), DENIED, "does not belong to run",
                 id="policy-a-subscribes-in-other-run-denied"),
    pytest.param(subscribe_receives_other_policy(), None, None, id="policy-a-subscribes-as-itself-ok"),
    pytest.param(ack("policy-a", "policy-b"), DENIED, "may ack only as policy 'policy-a'",
                 id="policy-a-acks-as-policy-b-denied"),
    pytest.param(ack("policy-a", "policy-a", run="other"), DENIED, "does not belong to run",
                 id="policy-a-acks-in-other-run-denied"),
    pytest.param(ack("policy-a", "policy-a"), None, None, id="policy-a-acks-as-itself-ok"),
    pytest.param(list_topics("policy-a", run="other"), DENIED, "does not belong to run",
                 id="policy-a-list-topics-other-run-denied"),
    pytest.param(topic_stats("policy-a", run="other"), DENIED, "does not belong to run",
                 id="policy-a-topic-stats-other-run-denied"),
    pytest.param(list_topics("policy-b"), None, None, id="policy-b-list-topics-own-run-ok"),
    pytest.param(topic_stats("policy-b"), None, None, id="policy-b-topic-stats-own-run-ok"),
    pytest.param(publish("admin", "policy-b"), None, None, id="admin-publishes-as-policy-b-ok"),
    pytest.param(publish("admin", "some-other-policy", run="other"), None, None,
                 id="admin-publishes-as-anyone-in-any-run-ok"),
    pytest.param(ack("admin", "policy-b"), None, None, id="admin-acks-as-policy-b-ok"),
    pytest.param(list_topics("admin", run="other"), None, None, id="admin-list-topics-any-run-ok"),
]


@pytest.mark.parametrize("action, error, message", MATRIX)
def test_grpc_auth_matrix(env, action, error, message):
    before = snapshot(env)
    if error is None:
        action(env)
        return
    with pytest.raises(error) as info:
        action(env)
    assert type(info.value) is error
    assert message in str(info.value)
    assert snapshot(env) == before  # a refused call wrote nothing, in either run


def test_admin_publish_as_anyone_is_stored_under_that_producer(env):
    admin = env.client("admin")
    sent = rollout(env.runs["R"], "policy-c")
    admin.publish([sent])
    assert (env.runs["R"], "policy-c") in [(t.run_id, t.producer) for t in admin.list_topics(env.runs["R"])]
    # ...and policy-a, subscribed as itself with a producer filter, receives it as policy-c's.
    sub = env.client("policy-a").subscribe(env.runs["R"], "policy-a", producers=["policy-c"], start="earliest")
    try:
        assert [d.experience for d in take(sub, 1)] == [sent]
    finally:
        sub.close()


def test_ack_cannot_release_another_policys_subscription_credit(env):
    """policy-a acking (as itself) with policy-b's subscription_id must not free policy-b's credit:
    policy-b, at max_in_flight=1 with one delivery un-acked, gets nothing more."""
    run = env.runs["R"]
    env.client("admin").publish([rollout(run, "policy-c") for _ in range(3)])
    b = env.client("policy-b").subscribe(run, "policy-b", producers=["policy-c"], start="earliest",
                                          max_in_flight=1)
    deliveries = iter(b)
    try:
        first = next(deliveries)
        assert b.ack([first]) == 1  # control: b's own ack frees its credit, the next one comes
        second = next(deliveries)
        a = env.client("policy-a")
        try:
            a.ack(run, "policy-a", [second.delivery_id], subscription_id=b.subscription_id)
        except errors.MrlError:
            pass  # refusing the mismatched subscription_id is fine too
        timer = threading.Timer(1.5, b.close)
        timer.start()
        more = list(itertools.islice(deliveries, 1))
        timer.cancel()
        assert more == [], "policy-a's ack released policy-b's credit"
    finally:
        b.close()
    stats = {s.topic.producer: s for s in env.client("admin").topic_stats(run, producer="policy-c")}
    assert [g.pending for g in stats["policy-c"].groups if g.subscriber == "policy-b"] == [1]


# -- REST admin ------------------------------------------------------------------------------------
@pytest.mark.parametrize("method, path, who, status", [
    pytest.param("GET", "/v1/runs", None, 401, id="runs-no-token-401"),
    pytest.param("GET", "/v1/runs", "wrong", 401, id="runs-wrong-token-401"),
    pytest.param("GET", "/v1/runs", "policy-a", 403, id="runs-policy-token-403"),
    pytest.param("GET", "/v1/runs", "admin", 200, id="runs-admin-token-200"),
    pytest.param("GET", "/v1/runs/{R}/topics", None, 401, id="topics-no-token-401"),
    pytest.param("GET", "/v1/runs/{R}/topics", "policy-a", 403, id="topics-policy-token-403"),
    pytest.param("GET", "/v1/runs/{R}/topics", "admin", 200, id="topics-admin-token-200"),
    pytest.param("DELETE", "/v1/runs/{R}", None, 401, id="delete-run-no-token-401"),
    pytest.param("DELETE", "/v1/runs/{R}", "policy-a", 403, id="delete-run-policy-token-403"),
    pytest.param("POST", "/v1/runs/{R}/topics/rollout/policy-a/trim?maxlen=0", "policy-a", 403,
                 id="trim-policy-token-403"),
    pytest.param("GET", "/healthz", None, 200, id="healthz-open"),
    pytest.param("GET", "/readyz", None, 200, id="readyz-open"),
    pytest.param("GET", "/metrics", None, 200, id="metrics-open"),
])
def test_rest_admin_auth(env, method, path, who, status):
    env.client("admin").publish([rollout(env.runs["R"], "policy-a")])
    before = snapshot(env)
    headers = {}
    if who == "wrong":
        headers["authorization"] = "Bearer mrl_wrong"
    elif who:
        headers["authorization"] = f"Bearer {env.tokens[who]}"
    r = httpx.request(method, env.exchange.admin + path.format(R=env.runs["R"]), headers=headers, timeout=10)
    assert r.status_code == status, r.text
    if status == 200 and path == "/v1/runs":
        assert env.runs["R"] in r.json()["runs"]
    if status in (401, 403):
        assert r.json()["error"] == {401: "Unauthenticated", 403: "PermissionDenied"}[status]
        assert snapshot(env) == before  # a refused trim or delete changed nothing


# -- tokens are stored hashed; malformed auth files fail to load -----------------------------------
def test_auth_file_holds_only_sha256_of_tokens(shared_exchange, env):
    _, _, path, tokens = shared_exchange
    text = path.read_text()
    for token in tokens.values():
        assert token not in text
    doc = yaml.safe_load(text)
    assert all(re.fullmatch(r"[0-9a-f]{64}", p["token_sha256"]) for p in doc["principals"])
    assert hash_token(tokens["admin"]) == hashlib.sha256(tokens["admin"].encode()).hexdigest()
    # The server hashes what is presented: the token works, its stored hash does not.
    env.client(token=tokens["admin"]).list_topics(env.runs["R"])
    with pytest.raises(errors.Unauthenticated):
        env.client(token=doc["principals"][-1]["token_sha256"]).list_topics(env.runs["R"])


GOOD_HASH = hash_token("mrl_x")


@pytest.mark.parametrize("doc, fragment", [
    pytest.param({"principals": [{"name": "a", "role": "policy", "policy": "a", "token_sha256": "mrl_plaintext"}]},
                 "token_sha256", id="plaintext-token-instead-of-hash"),
    pytest.param({"principals": [{"name": "a", "role": "policy", "policy": "a", "token_sha256": GOOD_HASH[:-1]}]},
                 "token_sha256", id="hash-one-char-short"),
    pytest.param({"principals": [{"name": "a", "role": "policy", "policy": "a", "token_sha256": "g" * 64}]},
                 "token_sha256", id="hash-not-hex"),
    pytest.param({"principals": [{"name": "a", "role": "policy", "token_sha256": GOOD_HASH}]},
                 "no 'policy' id", id="policy-principal-without-policy"),
    pytest.param({"principals": [{"name": "a", "role": "root", "token_sha256": GOOD_HASH}]},
                 "role", id="unknown-role"),
    pytest.param({"principals": [{"name": "a", "role": "admin", "token_sha256": GOOD_HASH},
                                 {"name": "b", "role": "admin", "token_sha256": GOOD_HASH}]},
                 "share a token hash", id="two-principals-one-hash"),
    pytest.param([{"name": "a", "role": "admin", "token_sha256": GOOD_HASH}],
                 "principals", id="top-level-list-not-mapping"),
    pytest.param({"principals": ["admin"]}, "auth file", id="principal-not-a-mapping"),
])
def test_malformed_auth_file_fails_to_load_clearly(tmp_path, doc, fragment):
    path = tmp_path / "auth.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(errors.InvalidArgument) as info:
        Authenticator.from_file(path)
    assert fragment in str(info.value)


def test_auth_file_error_does_not_echo_a_plaintext_token(tmp_path):
    """A token pasted where its hash belongs must not end up in the error (and so in logs)."""
    token = new_token()
    path = tmp_path / "auth.yaml"
    path.write_text(yaml.safe_dump({"principals": [{"name": "a", "role": "admin", "token_sha256": token}]}))
    with pytest.raises(errors.InvalidArgument) as info:
        Authenticator.from_file(path)
    assert "token_sha256" in str(info.value)
    assert token not in str(info.value) and token[4:20] not in str(info.value)
    assert info.value.__cause__ is None or token not in str(info.value.__cause__)


def test_missing_auth_file_fails_to_load(tmp_path):
    with pytest.raises(errors.InvalidArgument, match="auth file"):
        Authenticator.from_file(tmp_path / "absent.yaml")


# -- no auth: loopback only ------------------------------------------------------------------------
def _listening(port: int) -> set[str]:
    """Local addresses listening on TCP `port`, from /proc/net/tcp{,6}."""
    found = set()
    for name, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = pathlib.Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if fields[3] != "0A" or int(hexport, 16) != port:
                continue
            raw = bytes.fromhex(addr)
            if v6:
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                ip6 = ipaddress.IPv6Address(raw)
                found.add(str(ip6.ipv4_mapped or ip6))  # a dual-stack socket on 127.0.0.1 shows ::ffff:127.0.0.1
            else:
                found.add(str(ipaddress.IPv4Address(raw[::-1])))
    return found


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_without_auth_any_host_is_forced_to_loopback(start_exchange, run_id, caplog, host):
    caplog.set_level(logging.INFO)
    ex = start_exchange(host=host)
    with ExchangeClient(ex.target) as c:  # reachable on 127.0.0.1
        assert c.publish([rollout(run_id)]).accepted == 1
    assert any(r.levelno == logging.WARNING and "127.0.0.1 only" in r.getMessage() and host in r.getMessage()
               for r in caplog.records)
    assert any(r.getMessage().startswith(f"exchange serving gRPC on 127.0.0.1:{ex.server.port} ")
               for r in caplog.records)
    assert ex.server._uvicorn.servers[0].sockets[0].getsockname()[0] == "127.0.0.1"
    if not pathlib.Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp to read the bound addresses from")
    for port in (ex.server.port, ex.server.admin_port):
        bound = _listening(port)
        assert bound and all(ipaddress.ip_address(a).is_loopback for a in bound), (port, bound)


def test_with_auth_the_configured_host_is_bound(start_exchange, auth_file):
    """The counterpart: with principals configured, 0.0.0.0 is honoured (so the check above is meaningful)."""
    if not pathlib.Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp to read the bound addresses from")
    ex = start_exchange(host="0.0.0.0", auth_file=auth_file[0])
    bound = _listening(ex.server.port)
    assert bound and bound <= {"0.0.0.0", "::"}, bound  # grpc may take 0.0.0.0 as the dual-stack '::'
    assert _listening(ex.server.admin_port) == {"0.0.0.0"}


# -- TLS -------------------------------------------------------------------------------------------
def test_tls_round_trip_and_plaintext_refused(start_exchange, tmp_path, run_id):
    cert, key = self_signed(tmp_path, "server")
    other_cert, _ = self_signed(tmp_path, "other")
    ex = start_exchange(tls_cert=cert, tls_key=key)
    target = f"localhost:{ex.server.port}"
    sent = rollout(run_id, "policy-a")
    with ExchangeClient(target, tls_root_cert=cert.read_bytes()) as c:
        sub = c.subscribe(run_id, "policy-b", start="earliest")
        try:
            assert c.publish([sent]).accepted == 1
            got = take(sub, 1)
            assert [d.experience for d in got] == [sent]
        finally:
            sub.close()
    with ExchangeClient(target, backoff=Backoff(attempts=1)) as plain:
        with pytest.raises(errors.Unavailable):
            plain.publish([rollout(run_id, "policy-a")])
    with ExchangeClient(target, tls_root_cert=other_cert.read_bytes(), backoff=Backoff(attempts=1)) as untrusted:
        with pytest.raises(errors.Unavailable):
            untrusted.publish([rollout(run_id, "policy-a")])
    with ExchangeClient(target, tls_root_cert=cert.read_bytes()) as c:
        assert [s.length for s in c.topic_stats(run_id)] == [1]


@pytest.mark.parametrize("tls", [False, True])
def test_the_start_line_names_the_rest_scheme_it_serves(start_exchange, tmp_path, caplog, tls):
    """With TLS on, the REST admin port serves HTTPS, and the line that tells a person where it is says so."""
    caplog.set_level(logging.INFO)
    cert, key = self_signed(tmp_path, "server") if tls else (None, None)
    ex = start_exchange(tls_cert=cert, tls_key=key)
    scheme = "https" if tls else "http"
    assert any(f"REST on {scheme}://127.0.0.1:{ex.server.admin_port}" in r.getMessage() for r in caplog.records)
    assert httpx.get(f"{scheme}://localhost:{ex.server.admin_port}/healthz", verify=str(cert) if tls else True,
                     timeout=10).status_code == 200


# -- rate limit ------------------------------------------------------------------------------------
def test_rate_limit_per_principal(start_exchange, auth_file, run_id):
    path, tokens = auth_file
    # 1 token/s: the 10-cost call below stays refused unless publishing 1024 took 10 s (a loaded machine)
    ex = start_exchange(auth_file=path, rate_limit_per_s=1, rate_limit_burst=1024, max_batch=1024)
    with ExchangeClient(ex.target, tokens["policy-a"], backoff=Backoff(attempts=1)) as a, \
            ExchangeClient(ex.target, tokens["policy-b"], backoff=Backoff(attempts=1)) as b, \
            ExchangeClient(ex.target, tokens["admin"]) as admin:
        assert a.publish([rollout(run_id, "policy-a") for _ in range(1024)]).accepted == 1024
        with pytest.raises(errors.ResourceExhausted) as info:
            a.publish([rollout(run_id, "policy-a") for _ in range(10)])
        message = str(info.value)
        assert "retry" in message and "policy-a" in message
        wait = float(re.search(r"retry in ([0-9.]+) s", message).group(1))
        assert 0 < wait <= 10.0
        with pytest.raises(errors.ResourceExhausted):  # every call costs, not only publish
            a.list_topics(run_id)
        assert b.publish([rollout(run_id, "policy-b") for _ in range(10)]).accepted == 10
        lengths = {s.topic.producer: s.length for s in admin.topic_stats(run_id)}
        assert lengths == {"policy-a": 1024, "policy-b": 10}


def test_rate_buckets_are_shared_within_a_scope_and_apart_across_scopes(start_exchange, run_id):
    limits = {"rate_limit_per_s": 0.01, "rate_limit_burst": 2, "max_batch": 2}
    first, replica = start_exchange(rate_limit_scope="lab-1", **limits), start_exchange(rate_limit_scope="lab-1", **limits)
    other = start_exchange(rate_limit_scope="lab-2", **limits)
    with ExchangeClient(first.target, backoff=Backoff(attempts=1)) as c:
        assert c.publish([rollout(run_id), rollout(run_id)]).accepted == 2
    with ExchangeClient(replica.target, backoff=Backoff(attempts=1)) as c, pytest.raises(errors.ResourceExhausted):
        c.publish([rollout(run_id)])
    with ExchangeClient(other.target, backoff=Backoff(attempts=1)) as c:
        assert c.publish([rollout(run_id), rollout(run_id)]).accepted == 2


def test_rate_limit_scope_must_be_a_name():
    from mrl_exchange.settings import ExchangeSettings
    with pytest.raises(ValueError, match="rate_limit_scope"):
        ExchangeSettings(rate_limit_scope="a:b")


# -- size limits -----------------------------------------------------------------------------------
def sized(run_id, text_bytes):
    exp = rollout(run_id)
    exp.rollout.prompt_text = "x" * text_bytes
    return exp


def test_grpc_message_size_limit(start_exchange, run_id):
    ex = start_exchange(max_message_bytes=128 * 1024, max_experience_bytes=64 * 1024)
    with ExchangeClient(ex.target, backoff=Backoff(attempts=1)) as c:
        assert c.publish([sized(run_id, (32 * 1024))]).accepted == 1
        with pytest.raises(errors.ResourceExhausted):
            c.publish([sized(run_id, (200 * 1024))])
        assert [s.length for s in c.topic_stats(run_id)] == [1]


def test_experience_size_limit(start_exchange, run_id):
    ex = start_exchange(max_experience_bytes=4096)
    with ExchangeClient(ex.target, backoff=Backoff(attempts=1)) as c:
        assert c.publish([sized(run_id, 2048)]).accepted == 1
        big = sized(run_id, 8192)
        with pytest.raises(errors.InvalidArgument) as info:  # the client's own limit (1 MiB) lets it through
            c.publish([rollout(run_id), big])
        assert "the limit is 4096 bytes" in str(info.value) and big.experience_id in str(info.value)
        assert [s.length for s in c.topic_stats(run_id)] == [1]


def test_oversize_batch_is_invalid_even_when_it_exceeds_the_burst(start_exchange, run_id):
    ex = start_exchange(rate_limit_per_s=5, rate_limit_burst=8, max_batch=8)
    stub = exchange_pb2_grpc.ExperienceExchangeStub(grpc.insecure_channel(ex.target))
    with pytest.raises(grpc.RpcError) as info:
        stub.Publish(xpb.PublishRequest(experiences=[rollout(run_id) for _ in range(9)]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 8 per Publish" in info.value.details()


def test_failed_authentication_is_rate_limited_per_peer(start_exchange, auth_file, run_id):
    path, tokens = auth_file
    ex = start_exchange(auth_file=path, rate_limit_per_s=1, rate_limit_burst=3, max_batch=3)
    codes = []
    with ExchangeClient(ex.target, "mrl_guessed-token", backoff=Backoff(attempts=1)) as guesser:
        for _ in range(5):
            try:
                guesser.list_topics(run_id)
            except (errors.Unauthenticated, errors.ResourceExhausted) as exc:
                codes.append(type(exc).__name__)
    assert codes == ["Unauthenticated"] * 3 + ["ResourceExhausted"] * 2
    with ExchangeClient(ex.target, tokens["policy-a"]) as a:  # a principal's own budget is untouched
        assert a.list_topics(run_id) == []
