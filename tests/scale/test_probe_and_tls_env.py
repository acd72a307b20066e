"""What the Kubernetes manifests lean on, against real servers: the liveness probe (`python -m mrl_serving.probe`)
checks gRPC health over TLS or plaintext, and a client given no root certificate takes MRL_TLS_ROOT_CERT."""
import subprocess
import sys

import pytest

from helpers import rollout, self_signed
from mrl import errors
from mrl.exchange_client import ExchangeClient
from mrl.grpc_client import Backoff
from mrl_serving import probe

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
