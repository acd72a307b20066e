"""Health tells the truth about Redis, and the embedded Redis of `mrl exchange serve` comes back after a crash.

A real `mrl exchange serve` process (no MRL_REDIS_URL: it starts its own redis-server), its redis-server
child killed with SIGKILL: readiness (gRPC health of the service, /readyz) reports the outage while liveness
(gRPC health of "liveness", /healthz) does not, since restarting the process would not bring Redis back; the
Redis is restarted from its AOF, and every experience the exchange had acknowledged, and every ack, is still
there.
"""
import os
import pathlib
import shutil
import signal
import tempfile
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers import rollout
from mrl.exchange_client import ExchangeClient
from mrl_serving.grpc_service import LIVENESS
from mrl_serving.processes import spawn

pytestmark = pytest.mark.slow

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def redis_child(pid: int) -> int:
    """The pid of the redis-server that process `pid` started."""
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if pathlib.Path(f"/proc/{child}/comm").read_text().strip() == "redis-server":
                return int(child)
    raise AssertionError(f"process {pid} has no redis-server child")


def wait_for_health(health, status, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = health.Check(health_pb2.HealthCheckRequest(service="mrl.v1.ExperienceExchange"), timeout=2).status
        except grpc.RpcError as exc:
            seen = exc.code()
        if seen == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"health is {seen}, not {status}, after {timeout_s} s")


@pytest.fixture
def data_dir():
    path = tempfile.mkdtemp(prefix="mrl-health-")  # short: the unix socket's path must fit in 108 bytes
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_health_follows_the_embedded_redis_which_restarts_with_nothing_acked_lost(data_dir, run_id):
    with spawn("exchange", None, data_dir=str(data_dir), log_level="WARNING") as exchange:
        target = f"127.0.0.1:{exchange.ready['grpc_port']}"
        admin = f"http://127.0.0.1:{exchange.ready['admin_port']}"
        sent = [rollout(run_id) for _ in range(20)]
        with ExchangeClient(target) as see, grpc.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert see.publish(sent).accepted == 20
            sub = see.subscribe(run_id, "policy-b", start="earliest", max_in_flight=8)
            got = [d for _, d in zip(range(8), sub)]
            assert sub.ack(got) == 8
            sub.close()
            wait_for_health(health, SERVING, 5)

            os.kill(redis_child(exchange.proc.pid), signal.SIGKILL)
            # the outage may be short (Redis restarts after ~1 s): poll both until each has reported it; the
            # liveness checks never may
            seen, dead, deadline = set(), set(), time.monotonic() + 10
            while seen != {"grpc", "rest"} and time.monotonic() < deadline:
                if health.Check(health_pb2.HealthCheckRequest(service="mrl.v1.ExperienceExchange"), timeout=2).status \
                        == NOT_SERVING:
                    seen.add("grpc")
                if health.Check(health_pb2.HealthCheckRequest(service=LIVENESS), timeout=2).status != SERVING:
                    dead.add("grpc")
                if (ready := httpx.get(f"{admin}/readyz")).status_code == 503:
                    seen.add("rest")
                    assert "redis" in ready.json()["detail"].lower()
                if httpx.get(f"{admin}/healthz").status_code != 200:
                    dead.add("rest")
                time.sleep(0.05)
            assert seen == {"grpc", "rest"}, f"only {seen or 'nothing'} reported the dead Redis"
            assert not dead, f"liveness ({dead}) failed while only Redis was down: a probe would restart the process"
            wait_for_health(health, SERVING, 30)
            assert httpx.get(f"{admin}/readyz").status_code == 200
            assert exchange.proc.poll() is None

            assert see.topic_stats(run_id)[0].length == 20
            again = see.subscribe(run_id, "policy-b", max_in_flight=64, visibility_timeout_s=0.5)
            rest = [d for _, d in zip(range(12), again)]
            assert {d.experience.experience_id for d in rest} == {e.experience_id for e in sent[8:]}
            assert again.ack(rest) == 12
            again.close()
            later = rollout(run_id)
            assert see.publish([later]).accepted == 1
