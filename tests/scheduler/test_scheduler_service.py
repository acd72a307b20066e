"""The scheduler over real gRPC and HTTP sockets and a real Redis: Acquire/Renew/Release/Inventory/Watch,
waiting and its deadline, status codes for bad input, two replicas, restart, the REST admin, auth, rate limits."""
import math
import os
import signal
import threading
import time
import uuid

import grpc
import httpx
import pytest

from helpers import wait_for, write_auth_file
from mrl import errors
from mrl.grpc_client import Backoff
from mrl.scheduler_client import SchedulerClient
from mrl.v1 import scheduler_pb2 as spb
from mrl.v1 import scheduler_pb2_grpc
from mrl_serving.processes import spawn


def client(server, policy="policy-a", token=None, run_id="run-1") -> SchedulerClient:
    return SchedulerClient(server.target, token, run_id=run_id, policy=policy, worker="w-1",
                           backoff=Backoff(attempts=1))


def events_of(watch, into: list) -> threading.Thread:
    thread = threading.Thread(target=lambda: into.extend(watch), daemon=True)
    thread.start()
    return thread


def hand_over(holder: SchedulerClient, held, waiter: SchedulerClient, devices: int):
    """`waiter` asks for `devices` while `holder` holds `held`, which it then releases: (the waiter's lease,
    seconds from the release to the grant's arrival)."""
    got: list = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(devices, wait_timeout_s=10)))
    thread.start()
    wait_for(lambda: waiter.inventory().queued == 1)
    released_at = time.monotonic()
    holder.release(held)
    thread.join(10)
    assert got, "the waiter got nothing"
    return got[0], time.monotonic() - released_at


def test_acquire_renew_release_and_inventory(start_scheduler):
    server = start_scheduler(slots=4, slot_memory_bytes=1 << 30)
    with client(server) as c:
        lease = c.acquire(2, "rollout", ttl_s=5)
        assert [d.node for d in lease.devices] == ["node-0", "node-0"] and lease.fencing_token > 0
        assert lease.policy == "policy-a" and lease.phase == "rollout" and lease.devices[0].memory_bytes == 1 << 30
        renewed = c.renew(lease, ttl_s=10)
        assert renewed.expires_at.ToMilliseconds() > lease.expires_at.ToMilliseconds()
        inv = c.inventory()
        assert len(inv.devices) == 4 and [x.lease_id for x in inv.leases] == [lease.lease_id]
        assert sum(d.lease_id == lease.lease_id for d in inv.devices) == 2
        assert c.release(lease) is True and c.release(lease) is False
        with pytest.raises(errors.FailedPrecondition, match="lost"):
            c.renew(lease)


def test_acquire_waits_for_a_release_and_watch_sees_both(start_scheduler):
    server = start_scheduler(slots=2)
    seen: list = []
    with client(server) as a, client(server, "policy-b") as b:
        watch = a.watch()
        watcher = events_of(watch, seen)
        server.wait_for_watchers(1)
        held = a.acquire(2)
        got, seconds = hand_over(a, held, b, 2)
        assert seconds < 1.0  # woken by the release, not by a poll
        wait_for(lambda: len(seen) >= 3)
        watch.close()
        watcher.join(5)
    types = [(e.type, e.lease.lease_id) for e in seen[:3]]
    assert types == [(spb.LEASE_EVENT_TYPE_GRANTED, held.lease_id), (spb.LEASE_EVENT_TYPE_RELEASED, held.lease_id),
                     (spb.LEASE_EVENT_TYPE_GRANTED, got.lease_id)]
    assert got.fencing_token > held.fencing_token


def test_wait_timeout_is_deadline_exceeded_and_withdraws_the_request(start_scheduler):
    server = start_scheduler(slots=1)
    with client(server) as c:
        c.acquire(1)
        start = time.monotonic()
        with pytest.raises(errors.DeadlineExceeded, match="wait_timeout_ms=300"):
            c.acquire(1, wait_timeout_s=0.3)
        assert 0.25 < time.monotonic() - start < 2
        assert c.inventory().queued == 0


def test_an_impossible_request_fails_at_once_naming_the_inventory(start_scheduler):
    server = start_scheduler(slots=4, nodes={"node-1": {"slots": 2}})
    with client(server) as c:
        start = time.monotonic()
        with pytest.raises(errors.FailedPrecondition, match=r"has 6 such device\(s\), at most 4 on one node"):
            c.acquire(5, same_node=True, wait_timeout_s=30)
        assert time.monotonic() - start < 1
        assert len(c.acquire(5, same_node=False).devices) == 5
        with pytest.raises(errors.FailedPrecondition, match=r"pins node-0/slot-9, which is not in the inventory "
                                                            r"\(node-0 has node-0/slot-0, .*node-0/slot-3\)"):
            c.acquire(1, device_ids=["node-0/slot-9"], wait_timeout_s=30)


def test_a_pinned_acquire_gets_exactly_its_devices_and_waits_while_one_is_leased(start_scheduler):
    server = start_scheduler(slots=4)
    pins = ["node-0/slot-2", "node-0/slot-0"]
    with client(server) as a, client(server, "policy-b") as b, client(server, "policy-c") as c, \
            httpx.Client(base_url=server.admin, timeout=10) as http:
        held = a.acquire(1, device_ids=["node-0/slot-2"])
        assert [d.device_id for d in held.devices] == ["node-0/slot-2"]
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(b.acquire(2, device_ids=pins, wait_timeout_s=10)))
        waiter.start()
        wait_for(lambda: http.get("/v1/queue").json()["queue"])
        assert http.get("/v1/queue").json()["queue"][0]["device_ids"] == pins
        other = c.acquire(2, wait_timeout_s=1)             # the free devices that b does not name
        assert {d.device_id for d in other.devices} == {"node-0/slot-1", "node-0/slot-3"}
        a.release(held)
        waiter.join(10)
        assert got and [d.device_id for d in got[0].devices] == pins


BAD_ACQUIRES = [
    ({"devices": 0}, "devices"), ({"step_cost": math.nan}, "step_cost"), ({"step_cost": -math.inf}, "step_cost"),
    ({"policy": ""}, "policy"), ({"worker": "w" * 65}, "worker"), ({"run_id": "a:b"}, "run_id"),
    ({"ttl_ms": 1}, "ttl_ms"), ({"wait_timeout_ms": 4_000_000}, "wait_timeout_ms"),
    ({"device_ids": ["node-0/slot-0", "node-0/slot-1"]}, "devices (1) must equal the number of device_ids (2)"),
    ({"devices": 2, "device_ids": ["node-0/slot-0", "node-0/slot-0"]}, "device_ids names 'node-0/slot-0' twice"),
]


@pytest.mark.parametrize("fields, named", BAD_ACQUIRES, ids=[n[:20] for _, n in BAD_ACQUIRES])
def test_bad_acquire_is_invalid_argument(start_scheduler, fields, named):
    server = start_scheduler(slots=1)
    req = {"run_id": "run-1", "policy": "policy-a", "worker": "w", "phase": "rollout", "devices": 1, **fields}
    with grpc.insecure_channel(server.target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            scheduler_pb2_grpc.SchedulerStub(channel).Acquire(spb.AcquireRequest(**req), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in info.value.details()


def test_lease_status_codes(start_scheduler):
    server = start_scheduler(slots=1)
    with grpc.insecure_channel(server.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        lease = stub.Acquire(spb.AcquireRequest(run_id="r", policy="p", worker="w", phase="x", devices=1), timeout=10)
        cases = [(stub.Renew, spb.RenewRequest(lease_id="no-such-lease", fencing_token=1), grpc.StatusCode.NOT_FOUND),
                 (stub.Renew, spb.RenewRequest(lease_id=lease.lease_id, fencing_token=lease.fencing_token + 7),
                  grpc.StatusCode.FAILED_PRECONDITION),
                 (stub.Release, spb.ReleaseRequest(lease_id=lease.lease_id), grpc.StatusCode.INVALID_ARGUMENT),
                 (stub.Release, spb.ReleaseRequest(lease_id="", fencing_token=1), grpc.StatusCode.INVALID_ARGUMENT),
                 (stub.Renew, spb.RenewRequest(lease_id=lease.lease_id, fencing_token=lease.fencing_token,
                                               ttl_ms=10**9), grpc.StatusCode.INVALID_ARGUMENT)]
        for method, request, code in cases:
            with pytest.raises(grpc.RpcError) as info:
                method(request, timeout=10)
            assert info.value.code() == code, (request, info.value.details())


def test_a_caller_that_goes_away_withdraws_its_request(start_scheduler):
    server = start_scheduler(slots=1)
    with client(server) as c, grpc.insecure_channel(server.target) as channel:
        c.acquire(1)
        req = spb.AcquireRequest(run_id="r", policy="p", worker="w", phase="x", devices=1, wait_timeout_ms=60_000)
        with pytest.raises(grpc.RpcError) as info:
            scheduler_pb2_grpc.SchedulerStub(channel).Acquire(req, timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: c.inventory().queued == 0)


def test_a_request_whose_replica_was_killed_never_becomes_a_lease(redis_url):
    """kill -9 of the replica serving a waiting Acquire: its caller hears UNAVAILABLE, and once the replica is
    back the request is gone, so the device a release frees stays free (not leased to nobody for a TTL)."""
    settings = {"namespace": f"ns-{uuid.uuid4().hex[:12]}", "inventory": "slots", "node": "node-0", "slots": 1,
                "request_liveness_s": 1, "log_level": "WARNING"}

    def dial(replica, policy="policy-a") -> SchedulerClient:
        return SchedulerClient(f"127.0.0.1:{replica.ready['grpc_port']}", run_id="run-1", policy=policy,
                               worker="w-1", backoff=Backoff(attempts=1))

    failed: list = []
    with spawn("scheduler", redis_url, **settings) as first, dial(first) as holder, dial(first, "policy-b") as waiter:
        held = holder.acquire(1)
        thread = threading.Thread(target=lambda: failed.append(pytest.raises(errors.MrlError, waiter.acquire, 1,
                                                                              wait_timeout_s=60).value))
        thread.start()
        wait_for(lambda: holder.inventory().queued == 1)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        killed_at = time.monotonic()
        thread.join(10)
    assert [type(e) for e in failed] == [errors.Unavailable]
    with spawn("scheduler", redis_url, **settings) as second, dial(second) as c:
        time.sleep(max(0.0, killed_at + 1.5 - time.monotonic()))  # past the request's liveness
        assert c.release(held) is True
        time.sleep(0.6)                                             # a couple of sweeps
        inventory = c.inventory()
        assert (list(inventory.leases), inventory.queued) == ([], 0)
        assert [d.lease_id for d in inventory.devices] == [""]


def test_two_replicas_share_the_devices_and_wake_each_others_waiters(start_scheduler):
    a_server = start_scheduler(slots=2)
    b_server = start_scheduler(namespace=a_server.settings.namespace, slots=2)  # same node, same devices
    with client(a_server) as a, client(b_server, "policy-b") as b:
        _, seconds = hand_over(a, a.acquire(2), b, 1)
        assert seconds < 1.5  # B's waiter is woken through the event stream
        assert len(a.inventory().devices) == 2


def test_a_restarted_scheduler_keeps_leases_and_tokens(start_scheduler):
    first = start_scheduler(slots=2)
    with client(first) as c:
        lease = c.acquire(1, ttl_s=30)
    first.stop()
    second = start_scheduler(namespace=first.settings.namespace, slots=2)
    with client(second) as c:
        assert [x.lease_id for x in c.inventory().leases] == [lease.lease_id]
        assert c.renew(lease).fencing_token == lease.fencing_token
        assert c.acquire(1).fencing_token > lease.fencing_token
        assert c.release(lease) is True


def test_rest_admin_views_force_release_and_nodes(start_scheduler):
    server = start_scheduler(slots=2)
    with client(server) as c, httpx.Client(base_url=server.admin, timeout=10) as http:
        lease = c.acquire(2, step_cost=3.0)
        inventory = http.get("/v1/inventory").json()
        assert inventory["leases"] == 1 and {d["lease_id"] for d in inventory["devices"]} == {lease.lease_id}
        assert http.get("/v1/leases").json()["leases"][0]["fencing_token"] == lease.fencing_token
        assert http.get("/v1/shares").json()["policies"]["policy-a"]["weight"] == 3.0
        waiting: list = []
        waiter = threading.Thread(target=lambda: waiting.append(c.acquire(1, wait_timeout_s=10)))
        waiter.start()
        wait_for(lambda: http.get("/v1/queue").json()["queue"])
        assert http.get("/v1/queue").json()["queue"][0]["devices"] == 1
        assert http.delete("/v1/leases/no-such-lease").status_code == 404
        assert http.delete(f"/v1/leases/{lease.lease_id}").json() == {"revoked": True}
        with pytest.raises(errors.FailedPrecondition, match="revoked by an admin"):
            c.renew(lease)
        waiter.join(10)
        assert waiting and waiting[0].fencing_token > lease.fencing_token  # the revoked devices went to the queue
        added = http.put("/v1/nodes/node-9", json={"slots": 3, "memory_bytes": 1024})
        assert added.json()["devices"] == 3 and len(c.inventory().devices) == 5
        assert http.put("/v1/nodes/bad:name", json={"slots": 1}).status_code == 400
        assert http.put("/v1/nodes/node-8", json={"slots": 0}).status_code == 422
        assert http.delete("/v1/nodes/node-9").json()["devices"] == 0 and len(c.inventory().devices) == 2
        assert http.delete("/v1/nodes/node-0").json()["revoked_leases"] == 1  # the waiter's lease was on it
        assert "mrl_scheduler_granted" in http.get("/metrics").text


def test_auth_policy_principals_act_only_as_their_policy(start_scheduler, tmp_path):
    path = tmp_path / "auth.yaml"
    tokens = write_auth_file(path, "run-1")
    server = start_scheduler(slots=2, auth_file=path)
    a = client(server, "policy-a", tokens["policy-a"])
    b = client(server, "policy-b", tokens["policy-b"])
    a_as_b = client(server, "policy-b", tokens["policy-a"])
    anonymous = client(server)
    other_run = client(server, "policy-a", tokens["policy-a"], run_id="run-2")
    try:
        lease = a.acquire(1)
        with pytest.raises(errors.PermissionDenied, match="may acquire only as policy 'policy-a'"):
            a_as_b.acquire(1)
        with pytest.raises(errors.PermissionDenied, match="does not belong to run"):
            other_run.acquire(1)
        with pytest.raises(errors.Unauthenticated):
            anonymous.inventory()
        with pytest.raises(errors.PermissionDenied, match="may renew only as policy 'policy-b'"):
            b.renew(lease)
        with pytest.raises(errors.PermissionDenied, match="may release only as policy 'policy-b'"):
            b.release(lease)
        with pytest.raises(errors.PermissionDenied, match="may watch only policy 'policy-a'"):
            list(a.watch("policy-b"))
        with httpx.Client(base_url=server.admin, timeout=10) as http:
            assert http.get("/v1/leases").status_code == 401
            assert http.get("/v1/leases", headers={"authorization": f"Bearer {tokens['policy-a']}"}).status_code == 403
            admin = {"authorization": f"Bearer {tokens['admin']}"}
            assert http.delete(f"/v1/leases/{lease.lease_id}", headers=admin).json() == {"revoked": True}
        with pytest.raises(errors.FailedPrecondition, match="revoked"):
            a.renew(lease)
    finally:
        for c in (a, b, a_as_b, anonymous, other_run):
            c.close()


def test_a_policy_sees_which_devices_are_leased_but_only_its_own_lease_ids(start_scheduler, tmp_path):
    tokens = write_auth_file(tmp_path / "auth.yaml", "run-1")
    server = start_scheduler(slots=3, auth_file=tmp_path / "auth.yaml")
    with client(server, "policy-a", tokens["policy-a"]) as a, client(server, "policy-b", tokens["policy-b"]) as b, \
            client(server, token=tokens["admin"]) as admin:
        theirs, mine = a.acquire(1), b.acquire(1)
        inventory = b.inventory()
        assert [lease.lease_id for lease in inventory.leases] == [mine.lease_id]
        assert sorted(d.lease_id for d in inventory.devices) == ["", "", mine.lease_id]
        assert sorted(d.leased for d in inventory.devices) == [False, True, True]
        assert sorted(d.lease_id for d in admin.inventory().devices) == sorted(["", theirs.lease_id, mine.lease_id])
        assert sorted(d.leased for d in admin.inventory().devices) == [False, True, True]


def test_rate_limit_is_resource_exhausted(start_scheduler):
    server = start_scheduler(slots=1, rate_limit_per_s=1, rate_limit_burst=3)
    with client(server) as c:
        for _ in range(3):
            c.inventory()
        with pytest.raises(errors.ResourceExhausted, match="rate limit"):
            c.inventory()
