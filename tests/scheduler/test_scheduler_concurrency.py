"""No device is ever held by two leases, whoever acquires at once — threads through gRPC replicas, processes
each running its own core — and a holder killed with SIGKILL loses its lease to expiry (a Watch sees it)."""
import asyncio
import multiprocessing as mp
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import redis

from mrl.grpc_client import Backoff
from mrl.scheduler_client import SchedulerClient
from mrl.v1 import scheduler_pb2 as spb


def occupy(r: redis.Redis, marker: str, device_ids, lease_id: str, errors: list) -> None:
    """Mark each device held (SET NX): a device marked already is held twice."""
    for d in device_ids:
        if not r.set(f"{marker}:{d}", lease_id, nx=True):
            errors.append(f"{d} granted to {lease_id} while held by {r.get(f'{marker}:{d}')}")


def vacate(r: redis.Redis, marker: str, device_ids) -> None:
    r.delete(*[f"{marker}:{d}" for d in device_ids])


def test_threads_through_two_replicas_never_share_a_device(start_scheduler, redis_url):
    a = start_scheduler(slots=4, nodes={"node-1": {"slots": 2}})
    b = start_scheduler(namespace=a.settings.namespace, slots=4, nodes={"node-1": {"slots": 2}})
    marker, errors, tokens, lock = f"test:{uuid.uuid4().hex}", [], [], threading.Lock()
    stop = time.monotonic() + 3

    def worker(i: int) -> None:
        server = (a, b)[i % 2]
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        with SchedulerClient(server.target, policy=f"pol-{i % 3}", worker=f"w{i}", backoff=Backoff(attempts=1)) as c:
            while time.monotonic() < stop:
                lease = c.acquire(1 + i % 3, same_node=i % 2 == 0, wait_timeout_s=10)
                occupy(r, marker, [d.device_id for d in lease.devices], lease.lease_id, errors)
                with lock:
                    tokens.append(lease.fencing_token)
                time.sleep(0.005)
                vacate(r, marker, [d.device_id for d in lease.devices])
                c.release(lease)
        r.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors[:3]
    assert len(tokens) > 50 and len(set(tokens)) == len(tokens)  # every grant has its own token


def _process_worker(redis_url: str, namespace: str, marker: str, index: int, seconds: float, out) -> None:
    """One process with its own core (like another replica) acquiring and releasing on the shared state."""
    from mrl_scheduler.leases import Scheduler
    from mrl_scheduler.settings import SchedulerSettings

    async def run() -> tuple[int, list]:
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        core = Scheduler(redis.Redis.from_url(redis_url, decode_responses=True),
                         SchedulerSettings(namespace=namespace, node="node-0",
                                           request_liveness_s=3600))  # bare cores: no dispatcher keeps them alive
        grants, errors, stop = 0, [], time.monotonic() + seconds
        while time.monotonic() < stop:
            req = core.check(spb.AcquireRequest(run_id="r", policy=f"pol-{index % 2}", worker=f"p{index}",
                                                phase="x", devices=1 + index % 2, same_node=True))
            submitted = await core.submit(req)
            grant = submitted.grant
            while grant is None:  # no dispatcher here: look again until granted
                await asyncio.sleep(0.002)
                state, grant, _ = await core.status(submitted.request_id)
                assert state in ("queued", "granted"), state
            occupy(r, marker, grant.device_ids, grant.lease_id, errors)
            vacate(r, marker, grant.device_ids)
            await core.release(grant.lease_id, grant.fencing_token)
            grants += 1
        await core.close()
        return grants, errors

    out.put(asyncio.run(run()))


def test_processes_each_with_its_own_core_never_share_a_device(redis_url):
    from mrl_scheduler.inventory import slot_devices
    from mrl_scheduler.leases import Scheduler
    from mrl_scheduler.settings import SchedulerSettings

    namespace, marker = f"t-{uuid.uuid4().hex[:12]}", f"test:{uuid.uuid4().hex}"
    core = Scheduler(redis.Redis.from_url(redis_url, decode_responses=True),
                     SchedulerSettings(namespace=namespace, node="node-0"))
    asyncio.run(core.register("node-0", slot_devices("node-0", 3)))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_process_worker, args=(redis_url, namespace, marker, i, 2.0, out)) for i in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert all(not errors for _, errors in results), [e for _, errs in results for e in errs][:3]
    assert all(grants > 0 for grants, _ in results) and sum(g for g, _ in results) > 40
    assert all(p.exitcode == 0 for p in procs)


HOLDER = textwrap.dedent("""
    import sys, time
    from mrl.scheduler_client import SchedulerClient
    with SchedulerClient(sys.argv[1], policy="holder") as c, c.lease(devices=2, ttl_s=0.5) as lease:
        print(lease.lease_id, flush=True)
        time.sleep(60)
""")


def test_a_killed_holder_loses_its_lease_to_expiry_and_a_watcher_sees_it(start_scheduler, tmp_path):
    server = start_scheduler(slots=2, sweep_interval_s=0.05)
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    seen: list = []
    with SchedulerClient(server.target, policy="observer") as c:
        watch = c.watch("holder")
        threading.Thread(target=lambda: seen.extend(watch), daemon=True).start()
        server.wait_for_watchers(1)
        holder = subprocess.Popen([sys.executable, str(script), server.target], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parent)})
        try:
            lease_id = holder.stdout.readline().strip()
            assert lease_id, "the holder did not get its lease"
            time.sleep(1.0)  # two TTLs: its background renewals keep it
            assert [x.lease_id for x in c.inventory().leases] == [lease_id]
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
            killed = time.monotonic()
            devices = c.acquire(2, wait_timeout_s=5)  # granted once the lease expires
            assert time.monotonic() - killed < 2.0
            c.release(devices)
        finally:
            holder.kill()
            holder.stdout.close()
        deadline = time.monotonic() + 5
        while not any(e.type == spb.LEASE_EVENT_TYPE_EXPIRED for e in seen) and time.monotonic() < deadline:
            time.sleep(0.02)
        watch.close()
    expired = [e for e in seen if e.type == spb.LEASE_EVENT_TYPE_EXPIRED]
    assert [e.lease.lease_id for e in expired] == [lease_id] and len(expired[0].lease.devices) == 2
    assert [e.type for e in seen][0] == spb.LEASE_EVENT_TYPE_GRANTED
