"""Simulated training workers on a simulated cluster, in virtual time, for the benchmark and tests.

Each policy has a declared per-step cost (its fair-share weight) and a cycle of phases, each
with a device count and a mean length (±25%, seeded); each of its workers loops: acquire the
phase's devices (same node) → hold them for the phase → release → next phase. A worker holding
a lease renews it every TTL/3; the scheduler's sweeper ticks every virtual second (not counted as
a lease operation; its time is). Time is virtual (the core's injected clock), every scheduler
call is real: `CoreBackend` runs the real core (Lua on a real Redis); `FifoBackend` is the naive
baseline in memory — one global FIFO, all-or-nothing, head-of-line blocking, no weights.

Measured over [warmup, duration] (leases clipped to it):
  utilization  Σ k·held time / (D · window)
  jain         Jain index of x_p = GPU-time_p / w_p over the policies
  longest_wait_s  the longest any request waited (still-waiting ones count up to the end)
  deadlocks    times requests waited while no lease was held and a pass granted nothing
  ops          scheduler calls (acquire, renew, release); ops_per_s = ops / wall seconds
"""
import collections
import dataclasses
import heapq
import math
import random
import time

from mrl.v1 import scheduler_pb2 as spb
from mrl_scheduler.fairshare import jain
from mrl_scheduler.inventory import slot_devices
from mrl_scheduler.leases import Grant, Scheduler

__all__ = ["Phase", "PolicySpec", "policies_for", "Clock", "CoreBackend", "FifoBackend", "simulate"]

NODE_SIZE = 8
TTL_MS = 6_000


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    devices: int
    mean_s: float


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    name: str
    step_cost: float
    workers: int
    phases: tuple[Phase, ...]


# (name, step cost, phases): bigger models cost more per step, use more devices and longer phases.
_FAMILIES = (("smol-135m", 1.0, (Phase("rollout", 1, 2.0), Phase("update", 1, 1.0))),
             ("qwen-0.5b", 2.0, (Phase("rollout", 1, 4.0), Phase("update", 2, 2.0))),
             ("llama-1b", 3.0, (Phase("rollout", 2, 6.0), Phase("update", 2, 3.0))),
             ("mistral-7b", 4.0, (Phase("rollout", 2, 8.0), Phase("update", 4, 4.0))))


def policies_for(gpus: int, oversubscription: float = 4.0) -> list[PolicySpec]:
    """The four policies, each with enough workers to ask for `oversubscription` × its fair share of `gpus`."""
    total_cost = sum(cost for _, cost, _ in _FAMILIES)
    out = []
    for name, cost, phases in _FAMILIES:
        mean_devices = sum(p.devices * p.mean_s for p in phases) / sum(p.mean_s for p in phases)
        workers = math.ceil(oversubscription * gpus * cost / total_cost / mean_devices)
        out.append(PolicySpec(name, cost, max(2, workers), phases))
    return out


class CoreBackend:
    """The real scheduler core on a real Redis, with the simulation's clock."""

    def __init__(self, core: Scheduler):
        self.core = core

    async def setup(self, gpus: int) -> None:
        for n in range(math.ceil(gpus / NODE_SIZE)):
            node = f"node-{n}"
            await self.core.register(node, slot_devices(node, min(NODE_SIZE, gpus - n * NODE_SIZE)))

    async def submit(self, rid: str, policy: PolicySpec, worker: str, phase: Phase) -> list[Grant]:
        req = spb.AcquireRequest(run_id="sim", policy=policy.name, worker=worker, phase=phase.name,
                                 devices=phase.devices, same_node=True, ttl_ms=TTL_MS, step_cost=policy.step_cost,
                                 wait_timeout_ms=int(self.core.settings.max_wait_s * 1000))
        return list((await self.core.submit(self.core.check(req), rid)).passed.grants)

    async def renew(self, grant: Grant) -> None:
        await self.core.renew(grant.lease_id, grant.fencing_token)

    async def release(self, grant: Grant) -> list[Grant]:
        return list((await self.core.release(grant.lease_id, grant.fencing_token))[1].grants)

    async def tick(self, waiting: list[str]) -> list[Grant]:
        return list((await self.core.tick(waiting))[0].grants)


class FifoBackend:
    """The naive baseline: one global FIFO, a request granted only at the head and only whole."""

    def __init__(self, clock):
        self.clock, self.free, self.queue, self.token = clock, {}, collections.deque(), 0

    async def setup(self, gpus: int) -> None:
        for n in range(math.ceil(gpus / NODE_SIZE)):
            self.free[f"node-{n}"] = [f"node-{n}/slot-{i}" for i in range(min(NODE_SIZE, gpus - n * NODE_SIZE))]

    async def submit(self, rid, policy, worker, phase) -> list[Grant]:
        self.queue.append((rid, policy.name, worker, phase))
        return self._grant()

    async def renew(self, grant) -> None:
        pass

    async def tick(self, waiting) -> list[Grant]:
        return []

    async def release(self, grant) -> list[Grant]:
        for d in grant.device_ids:
            self.free[d.split("/")[0]].append(d)
        return self._grant()

    def _grant(self) -> list[Grant]:
        out = []
        while self.queue:
            rid, policy, worker, phase = self.queue[0]
            node = next((n for n, devs in self.free.items() if len(devs) >= phase.devices), None)
            if node is None:
                break
            self.queue.popleft()
            devices, self.free[node] = self.free[node][:phase.devices], self.free[node][phase.devices:]
            self.token += 1
            out.append(Grant(rid, self.token, tuple(devices), self.clock() + TTL_MS, policy, worker, phase.name))
        return out


class Clock:
    """The virtual clock (ms) the core and the backends read."""

    def __init__(self):
        self.now_ms = 0

    def __call__(self) -> int:
        return self.now_ms


async def simulate(backend, clock: Clock, policies: list[PolicySpec], gpus: int, duration_s: float,
                   warmup_s: float, seed: int = 0) -> dict:
    """Run the workers on `backend` until duration_s of virtual time; the figures of the module docstring."""
    rng = random.Random(seed)
    await backend.setup(gpus)
    end_ms, start_ms = int(duration_s * 1000), int(warmup_s * 1000)
    events: list = []  # (time ms, seq, kind, payload)
    seq = 0

    def at(t_ms: int, kind: str, payload) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t_ms, seq, kind, payload))

    workers = [(p, f"{p.name}-w{i}") for p in policies for i in range(p.workers)]
    step = {w: 0 for _, w in workers}
    waiting: dict[str, tuple[int, str, PolicySpec]] = {}  # rid -> (submitted ms, worker, policy)
    held = {}  # lease id -> (grant, granted ms)
    gpu_ms = collections.Counter()
    stats = {"ops": 0, "deadlocks": 0, "longest_wait_ms": 0, "grants": 0}
    for policy, w in workers:
        at(rng.randrange(0, 1000), "submit", (policy, w))
    for t_ms in range(1000, end_ms + 1, 1000):
        at(t_ms, "tick", None)

    def granted(grants: list[Grant]) -> None:
        for g in grants:
            submitted, w, policy = waiting.pop(g.lease_id)
            stats["longest_wait_ms"] = max(stats["longest_wait_ms"], clock.now_ms - submitted)
            stats["grants"] += 1
            phase = policy.phases[step[w] % len(policy.phases)]
            length = int(phase.mean_s * 1000 * rng.uniform(0.75, 1.25))
            held[g.lease_id] = (g, clock.now_ms)
            for k in range(1, (length - 1) // (TTL_MS // 3) + 1):
                at(clock.now_ms + k * (TTL_MS // 3), "renew", g)
            at(clock.now_ms + length, "release", (g, policy, w))

    wall = time.perf_counter()
    while events and events[0][0] <= end_ms:
        clock.now_ms, _, kind, payload = heapq.heappop(events)
        stats["ops"] += kind != "tick"
        if kind == "tick":
            granted(await backend.tick(list(waiting)))  # the sweeper keeps the waiting requests alive
        elif kind == "submit":
            policy, w = payload
            rid = f"{w}-{step[w]}"
            waiting[rid] = (clock.now_ms, w, policy)
            granted(await backend.submit(rid, policy, w, policy.phases[step[w] % len(policy.phases)]))
        elif kind == "renew":
            await backend.renew(payload)
        else:
            g, policy, w = payload
            _, since = held.pop(g.lease_id)
            gpu_ms[policy.name] += len(g.device_ids) * max(0, clock.now_ms - max(since, start_ms))
            granted(await backend.release(g))
            step[w] += 1
            at(clock.now_ms, "submit", (policy, w))
        if waiting and not held and all(e[2] == "tick" for e in events):
            stats["deadlocks"] += 1
            break
    wall = time.perf_counter() - wall
    clock.now_ms = end_ms
    for g, since in held.values():
        gpu_ms[g.policy] += len(g.device_ids) * max(0, end_ms - max(since, start_ms))
    for submitted, _, _ in waiting.values():
        stats["longest_wait_ms"] = max(stats["longest_wait_ms"], end_ms - submitted)
    window_ms = end_ms - start_ms
    per_weight = [gpu_ms[p.name] / p.step_cost for p in policies]
    return {"gpus": gpus, "workers": len(workers), "virtual_s": duration_s, "grants": stats["grants"],
            "ops": stats["ops"], "wall_s": round(wall, 3), "ops_per_s": round(stats["ops"] / wall, 1),
            "utilization": round(sum(gpu_ms.values()) / (gpus * window_ms), 4),
            "jain": round(jain(per_weight), 4), "longest_wait_s": round(stats["longest_wait_ms"] / 1000, 2),
            "deadlocks": stats["deadlocks"],
            "gpu_share": {p.name: round(gpu_ms[p.name] / max(1, sum(gpu_ms.values())), 4) for p in policies},
            "fair_share": {p.name: round(p.step_cost / sum(q.step_cost for q in policies), 4) for p in policies}}
