"""What the Kubernetes manifests lean on, against real servers: the liveness probe (`python -m mrl_serving.probe`)
checks gRPC health over TLS or plaintext, asks for liveness, not readiness, and a client given no root certificate takes MRL_TLS_ROOT_CERT."""
import asyncio
import functools
import subprocess
import sys

import grpc
import pytest

from helpers import rollout, self_signed
from mrl import errors
from mrl.exchange_client import ExchangeClient
from mrl.grpc_client import Backoff
from mrl_serving import probe
from mrl_serving.grpc_service import add_health_and_reflection, follow_health

pytestmark = pytest.mark.scale


def test_the_probe_checks_grpc_health_over_tls(start_exchange, tmp_path, monkeypatch):
    cert, key = self_signed(tmp_path, "server")
    other, _ = self_signed(tmp_path, "other")
    ex = start_exchange(tls_cert=cert, tls_key=key)
    monkeypatch.setenv("MRL_TLS_CERT", str(cert))
    assert probe.check(ex.server.port) is None
    assert probe.check(ex.server.port, "mrl.v1.ExperienceExchange") is None
    monkeypatch.setenv("MRL_TLS_ROOT_CERT", str(other))               # a CA that did not sign it
    assert "UNAVAILABLE" in probe.check(ex.server.port, timeout_s=1)
    monkeypatch.delenv("MRL_TLS_ROOT_CERT")
    proc = subprocess.run([sys.executable, "-m", "mrl_serving.probe", str(ex.server.port), "--service", "nope"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "NOT_FOUND" in proc.stderr


def test_the_probe_checks_grpc_health_in_plaintext(start_exchange, monkeypatch):
    monkeypatch.delenv("MRL_TLS_CERT", raising=False)
    ex = start_exchange()
    proc = subprocess.run([sys.executable, "-m", "mrl_serving.probe", str(ex.server.port)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_a_client_takes_its_root_certificate_from_the_environment(start_exchange, tmp_path, monkeypatch, run_id):
    cert, key = self_signed(tmp_path, "server")
    ex = start_exchange(tls_cert=cert, tls_key=key)
    target = f"localhost:{ex.server.port}"
    monkeypatch.setenv("MRL_TLS_ROOT_CERT", str(cert))
    with ExchangeClient(target) as c:
        assert c.publish([rollout(run_id)]).accepted == 1
    monkeypatch.setenv("MRL_TLS_ROOT_CERT", str(tmp_path / "missing.pem"))
    with pytest.raises(errors.InvalidArgument, match="MRL_TLS_ROOT_CERT names .*missing.pem"):
        ExchangeClient(target, backoff=Backoff(attempts=1))


def test_the_probe_asks_liveness_which_stays_serving_while_the_backend_is_down():
    """A real gRPC server whose backend check fails: readiness ("" and the service) turns NOT_SERVING, liveness,
    which the probe asks by default, stays SERVING (a restart would not bring the backend back)."""
    name = "mrl.v1.ExperienceExchange"

    async def down() -> str:
        return "Redis is not reachable"

    async def run() -> tuple:
        server = grpc.aio.server()
        health = await add_health_and_reflection(server, [name])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        follow = asyncio.create_task(follow_health(health, [name], down))
        try:
            ask = functools.partial(asyncio.to_thread, probe.check, port, timeout_s=2)
            deadline = asyncio.get_running_loop().time() + 10
            while (readiness := await ask(service="")) is None and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            return readiness, await ask(service=name), await ask()
        finally:
            follow.cancel()
            await server.stop(0)

    readiness, service, liveness = asyncio.run(run())
    assert readiness is not None and "NOT_SERVING" in readiness
    assert service is not None and "NOT_SERVING" in service
    assert liveness is None
