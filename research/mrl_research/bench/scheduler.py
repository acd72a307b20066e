"""`mrl bench scheduler`: simulated workers of several policies through the lease scheduler.

In-process, virtual time (simulation.py): four policies with per-step costs 1-4 (their weights),
phases of 1-4 devices (one node) and 1-8 s, workers enough to ask for 4× each policy's fair
share, on 8 to 1,024 GPUs (nodes of 8) — the real scheduler core, every call a real Lua call
on the real Redis (embedded, AOF on, unless MRL_REDIS_URL is set) — and the naive FIFO baseline
on the same workload in the same run.
Over gRPC, real time: the same policies with phases scaled to 50-400 ms, fewer workers (threads),
on 16 slots (two nodes) of a `mrl scheduler serve` child process; measured from the clients
(utilization counts grant-received to release-sent, so it is a lower bound).
Printed per run: deadlocks (must be 0), the longest wait, utilization, the Jain index of
GPU-time / weight, lease operations (acquire, renew, release) per second. The last stdout line
is one JSON object.

Placement: the simulation is one caller waiting on each Lua call, so its rate is set by the round
trip. On the 2-vCPU development VM a wake-up across cores costs ~100 µs each way, about as much as
the Lua itself; the in-process runs therefore pin this process and the embedded redis-server to one
core (only when the Redis is the embedded one), and one run at REFERENCE_GPUS repeats unpinned, so
both figures are printed.
"""
import asyncio
import contextlib
import json
import os
import random
import tempfile
import threading
import time
import uuid

import redis

from mrl import errors
from mrl_research import benchmarking
from mrl.scheduler_client import SchedulerClient
from mrl_serving.processes import redis_for, spawn
from mrl_scheduler.fairshare import jain
from mrl_scheduler.leases import Scheduler, namespace_prefix
from mrl_scheduler.settings import SchedulerSettings
from mrl_research.simulation import Clock, CoreBackend, FifoBackend, policies_for, simulate

__all__ = ["main"]

TARGETS = {"utilization": 0.95, "jain": 0.95, "ops_per_s": 5000}
REFERENCE_GPUS = 64
GRPC_GPUS, GRPC_TIME_SCALE = 16, 0.05  # 1 s of a simulated phase lasts 50 ms over gRPC


async def _through_core(url: str, gpus: int, duration_s: float) -> dict:
    clock = Clock()
    settings = SchedulerSettings(namespace=f"bench-{uuid.uuid4().hex[:12]}", node="bench")
    client = redis.Redis.from_url(url, decode_responses=True)  # blocking: the simulation is one caller
    try:
        return await simulate(CoreBackend(Scheduler(client, settings, clock)), clock, policies_for(gpus), gpus,
                              duration_s, duration_s / 10)
    finally:
        client.close()
        benchmarking.delete_keys(url, [namespace_prefix(settings.namespace) + "*"])


async def _in_process(url: str, gpus: int, duration_s: float) -> dict:
    mrl = await _through_core(url, gpus, duration_s)
    clock = Clock()
    fifo = await simulate(FifoBackend(clock), clock, policies_for(gpus), gpus, duration_s, duration_s / 10)
    return {"gpus": gpus, "workers": mrl["workers"], "mrl": mrl, "fifo": fifo}


@contextlib.contextmanager
def _one_core(url: str):
    """Pin this process and the embedded redis-server to one CPU meanwhile; yields whether it could."""
    client = redis.Redis.from_url(url)
    pid = client.info("server")["process_id"]
    client.close()
    if not (url.startswith("unix://") and hasattr(os, "sched_setaffinity") and os.path.exists(f"/proc/{pid}")):
        yield False
        return
    before = {0: os.sched_getaffinity(0), pid: os.sched_getaffinity(pid)}
    cpu = min(before[0])
    for p in before:
        os.sched_setaffinity(p, {cpu})
    try:
        yield True
    finally:
        for p, cpus in before.items():
            os.sched_setaffinity(p, cpus)


def _over_grpc(url: str, duration_s: float) -> dict:
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    policies = policies_for(GRPC_GPUS, oversubscription=2.0)
    gpu_s = {p.name: 0.0 for p in policies}
    stats = {"ops": 0, "longest_wait_s": 0.0, "last_grant": time.monotonic()}
    lock = threading.Lock()
    start = time.monotonic()
    warm, end = start + duration_s / 10, start + duration_s

    def worker(client: SchedulerClient, policy, seed: int) -> None:
        rng, step = random.Random(seed), 0
        while time.monotonic() < end:
            phase = policy.phases[step % len(policy.phases)]
            asked = time.monotonic()
            try:
                lease = client.acquire(phase.devices, phase.name, ttl_s=5.0, wait_timeout_s=max(0.1, end - asked),
                                       step_cost=policy.step_cost)
            except errors.DeadlineExceeded:
                break
            got = time.monotonic()
            time.sleep(phase.mean_s * GRPC_TIME_SCALE * rng.uniform(0.75, 1.25))
            done = time.monotonic()
            client.release(lease)
            with lock:
                stats["ops"] += 2
                stats["longest_wait_s"] = max(stats["longest_wait_s"], got - asked)
                stats["last_grant"] = got
                gpu_s[policy.name] += len(lease.devices) * max(0.0, min(done, end) - max(got, warm))
            step += 1

    with spawn("scheduler", url, namespace=namespace, inventory="slots", node="node-0", slots=GRPC_GPUS // 2,
               nodes={"node-1": {"slots": GRPC_GPUS // 2}}, log_level="ERROR") as server:
        target = f"127.0.0.1:{server.ready['grpc_port']}"
        clients = {p.name: SchedulerClient(target, run_id="bench", policy=p.name, worker=f"{p.name}-bench")
                   for p in policies}
        threads = [threading.Thread(target=worker, args=(clients[p.name], p, i), daemon=True)
                   for p in policies for i in range(p.workers)]
        for t in threads:
            t.start()
        deadlocks = 0
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
            if time.monotonic() - stats["last_grant"] > 10:  # requests wait, nothing is granted
                deadlocks += 1
                break
        for t in threads:
            t.join(10)
        elapsed = time.monotonic() - start
        for c in clients.values():
            c.close()
    benchmarking.delete_keys(url, [namespace_prefix(namespace) + "*"])
    window = end - warm
    return {"gpus": GRPC_GPUS, "workers": len(threads), "real_s": round(elapsed, 2), "ops": stats["ops"],
            "ops_per_s": round(stats["ops"] / elapsed, 1),
            "utilization": round(sum(gpu_s.values()) / (GRPC_GPUS * window), 4),
            "jain": round(jain([gpu_s[p.name] / p.step_cost for p in policies]), 4),
            "longest_wait_s": round(stats["longest_wait_s"], 3), "deadlocks": deadlocks}


def _line(name: str, r: dict) -> str:
    return (f"  {name:<10} deadlocks {r['deadlocks']}  longest wait {r['longest_wait_s']:>6.2f} s  utilization "
            f"{r['utilization']:.3f}  Jain {r['jain']:.4f}  {r['ops_per_s']:>9,.0f} lease ops/s")


def main(quick: bool = False) -> None:
    sizes, virtual_s, grpc_s = ((8, 64), 60.0, 3.0) if quick else ((8, 64, 1024), 300.0, 10.0)
    with tempfile.TemporaryDirectory(prefix="mrl-bench-") as tmp, \
            redis_for(os.environ.get("MRL_REDIS_URL"), tmp) as url:
        machine = benchmarking.machine(url)
        print(f"mrl bench scheduler: {machine}\n  policies (step cost = weight): "
              f"{', '.join(f'{p.name} ({p.step_cost:g})' for p in policies_for(8))}; {virtual_s:g} s of virtual "
              f"time per size, measured after the first 10%", flush=True)
        runs = []
        with _one_core(url) as pinned:
            print(f"  in-process: {'this process and the embedded redis-server on one core' if pinned else 'unpinned'}",
                  flush=True)
            for gpus in sizes:
                run = asyncio.run(_in_process(url, gpus, virtual_s))
                runs.append(run)
                print(f" {gpus} GPUs, {run['workers']} workers:\n{_line('mrl', run['mrl'])}\n"
                      f"{_line('naive FIFO', run['fifo'])}", flush=True)
        unpinned = asyncio.run(_through_core(url, REFERENCE_GPUS, virtual_s)) if pinned else None
        if unpinned:
            print(f" {REFERENCE_GPUS} GPUs again, unpinned:\n{_line('mrl', unpinned)}", flush=True)
        grpc = _over_grpc(url, grpc_s)
        print(f" over gRPC, {grpc['gpus']} slots, {grpc['workers']} worker threads, {grpc_s:g} s:\n"
              f"{_line('mrl', grpc)}", flush=True)
    mrl = [r["mrl"] for r in runs]
    passed = {"utilization": min(r["utilization"] for r in mrl) >= TARGETS["utilization"],
              "jain": min(r["jain"] for r in mrl) >= TARGETS["jain"],
              "ops_per_s": min(r["ops_per_s"] for r in mrl) >= TARGETS["ops_per_s"],
              "deadlocks": sum(r["deadlocks"] for r in mrl) + grpc["deadlocks"] == 0}
    verdicts = ", ".join(f"{name} {'met' if ok else 'NOT met'}" for name, ok in passed.items())
    print(f"  targets (in-process, every size): utilization ≥ {TARGETS['utilization']}, Jain ≥ {TARGETS['jain']}, "
          f"≥ {TARGETS['ops_per_s']:,} lease ops/s, 0 deadlocks: {verdicts}")
    print(json.dumps({"bench": "scheduler", "machine": machine, "quick": quick, "virtual_s": virtual_s,
                      "in_process_on_one_core": pinned, "runs": runs, "unpinned": unpinned, "grpc": grpc,
                      "targets": TARGETS, "pass": passed}), flush=True)
