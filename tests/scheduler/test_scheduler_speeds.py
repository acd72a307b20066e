"""Policies at different speeds (asynchronous mutual RL) sharing one slot over real gRPC and a real Redis: each
policy is one thread that holds a lease for its phase length, releases it and asks again at once. The device
time each gets follows the weights, whatever its lease length, and neither waits without bound for the other."""
import threading
import time

import pytest

from mrl.grpc_client import Backoff
from mrl.scheduler_client import SchedulerClient

RUN_S = 7.0


def contend(server, holds: dict[str, float], run_s: float = RUN_S) -> dict[str, dict]:
    """One thread per policy, each holding every lease for holds[policy] s and asking again at once, for run_s:
    per policy the device-seconds it held inside the window, its leases and its longest wait."""
    start = time.monotonic() + 0.5  # every client connected before either asks
    stop = start + run_s
    out = {p: {"held_s": 0.0, "leases": 0, "waits": []} for p in holds}

    def policy(name: str, hold_s: float) -> None:
        with SchedulerClient(server.target, policy=name, worker=f"{name}-0", backoff=Backoff(attempts=1)) as c:
            c.inventory()
            time.sleep(max(0.0, start - time.monotonic()))
            while (asked := time.monotonic()) < stop:
                lease = c.acquire(1, ttl_s=30, wait_timeout_s=30)
                got = time.monotonic()
                time.sleep(hold_s)
                done = time.monotonic()
                c.release(lease)
                out[name]["waits"].append(got - asked)
                out[name]["held_s"] += max(0.0, min(done, stop) - max(got, start))
                out[name]["leases"] += 1

    threads = [threading.Thread(target=policy, args=item, daemon=True) for item in holds.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(run_s + 60)
    assert not any(t.is_alive() for t in threads), "a policy thread hung"
    total = sum(r["held_s"] for r in out.values())
    for r in out.values():
        r["share"] = r["held_s"] / total
        r["longest_wait"] = max(r["waits"])
    print({p: {k: round(v, 3) for k, v in r.items() if k != "waits"} for p, r in out.items()})
    return out


def test_a_fast_and_a_slow_policy_share_one_slot_by_device_time(start_scheduler):
    """S holds 1.2 s leases, F 0.12 s ones, equal weights: each gets about half the device time (by request
    count F would get ~10 times S's share, by alternation S would get ~90%). F waits at most about one of
    S's leases (it never queues behind several), S at most about the time F needs to catch up."""
    slow, fast = 1.2, 0.12
    r = contend(start_scheduler(slots=1), {"slow": slow, "fast": fast})
    assert r["fast"]["share"] == pytest.approx(0.5, abs=0.15), r
    assert r["fast"]["longest_wait"] <= slow + 0.6, r
    assert r["slow"]["longest_wait"] <= 3 * slow + 0.6, r
    assert r["slow"]["leases"] >= 2, r


@pytest.mark.parametrize("heavy_hold,light_hold", [(0.06, 0.3), (0.6, 0.12)], ids=["heavy-is-fast", "heavy-is-slow"])
def test_weights_three_to_one_give_three_to_one_device_time(start_scheduler, heavy_hold, light_hold):
    """Weights 3:1 give about 3:1 device time, whichever of the two holds the longer leases."""
    server = start_scheduler(slots=1, weights={"heavy": 3.0, "light": 1.0})
    r = contend(server, {"heavy": heavy_hold, "light": light_hold})
    assert r["heavy"]["share"] == pytest.approx(0.75, abs=0.12), r
    assert r["light"]["leases"] >= 2 and r["heavy"]["longest_wait"] <= light_hold + 0.6, r
    assert r["light"]["longest_wait"] <= 4 * max(heavy_hold, light_hold) + 0.6, r
