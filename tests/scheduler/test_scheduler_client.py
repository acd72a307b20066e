"""The trainer-side helper `SchedulerClient.lease()` against a real scheduler: the devices in
CUDA_VISIBLE_DEVICES for the block, background renewal past the TTL, release at the end, and the work
stopped when the lease is lost (flag, or LeaseLost raised inside the block)."""
import os
import time

import httpx
import pytest

from mrl import errors
from mrl.scheduler_client import SchedulerClient


@pytest.fixture
def server(start_scheduler):
    return start_scheduler(slots=4)


def revoke(server, lease_id: str) -> None:
    assert httpx.delete(f"{server.admin}/v1/leases/{lease_id}", timeout=10).json() == {"revoked": True}


def test_lease_sets_the_devices_renews_and_releases(server, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    with SchedulerClient(server.target, run_id="run-1", policy="pol-a") as c:
        with c.lease(devices=2, phase="update", ttl_s=0.3) as lease:
            assert os.environ["CUDA_VISIBLE_DEVICES"] == lease.cuda_visible_devices == "0,1"
            assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
            time.sleep(1.0)  # > 3 TTLs: kept alive by the background renewals
            lease.check()
            assert [x.lease_id for x in c.inventory().leases] == [lease.lease_id]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "7" and "CUDA_DEVICE_ORDER" not in os.environ
        assert c.inventory().leases == [] and not lease.lost.is_set()


def test_a_pinned_lease_sets_its_devices_in_its_order(server):
    with SchedulerClient(server.target, policy="pol-a") as c:
        with c.lease(devices=2, device_ids=["node-0/slot-3", "node-0/slot-1"]) as lease:
            assert os.environ["CUDA_VISIBLE_DEVICES"] == lease.cuda_visible_devices == "3,1"


def test_a_lost_lease_sets_the_flag_and_raises_at_the_end_of_the_block(server):
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    with SchedulerClient(server.target, policy="pol-a") as c:
        with pytest.raises(errors.LeaseLost, match="revoked by an admin"):
            with c.lease(devices=1, ttl_s=0.3, on_lost="flag") as lease:
                revoke(server, lease.lease_id)
                assert lease.lost.wait(2), "the loss was not noticed"
                with pytest.raises(errors.LeaseLost):
                    lease.check()
        assert os.environ.get("CUDA_VISIBLE_DEVICES") == before  # restored on the way out


def test_a_lost_lease_interrupts_the_work_inside_the_block(server):
    steps = 0
    with SchedulerClient(server.target, policy="pol-a") as c:
        start = time.monotonic()
        with pytest.raises(errors.LeaseLost, match="lost"):
            with c.lease(devices=1, ttl_s=0.3) as lease:
                revoke(server, lease.lease_id)
                while time.monotonic() - start < 10:  # the work: interrupted at its next bytecode
                    steps += 1
                    time.sleep(0.01)
        assert time.monotonic() - start < 2 and steps > 0
        assert lease.lost.is_set() and c.acquire(4, wait_timeout_s=2)  # nothing left held


def test_a_block_that_ends_normally_is_not_interrupted_afterwards(server):
    with SchedulerClient(server.target, policy="pol-a") as c:
        for _ in range(5):
            with c.lease(devices=1, ttl_s=0.2):
                time.sleep(0.05)
        time.sleep(0.3)  # a stray LeaseLost would surface here


def test_on_lost_must_be_known(server):
    with SchedulerClient(server.target, policy="pol-a") as c, pytest.raises(errors.InvalidArgument, match="on_lost"):
        c.lease(on_lost="ignore")
