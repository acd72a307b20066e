"""The queue discipline of MWRA: weighted fair share across policies, aging, FIFO within a policy.

Implemented once, in the atomic scheduling pass (fairshare.lua); this module states the rule
and holds the Python side of it (weights, the per-policy view, the Jain index).

Weights. w_p = the configured `weights[p]`, else the request's declared per-step cost
(`step_cost`), else 1: a policy whose step costs twice the GPU-time gets twice the share, so
policies advance in steps at comparable rates.

Virtual time (device-milliseconds per unit of weight), per policy:

    at a grant of k devices      vt_p += k · est_p / w_p
    when that lease ends         vt_p += k · (actual − est_p) / w_p

est_p is the policy's expected lease length for that phase: an EWMA (α = 0.25) of the lengths
of its released leases (the request's TTL before the first release). So vt_p is charged in
advance with what a grant will likely cost and settled with what it really cost: over a run
vt_p = Σ k·actual / w_p, the GPU-time of p per unit of weight, plus any floor below.

Activation floor (no banked credit): a policy that becomes active (it has neither queued
requests nor leases, and is not expected back) starts at vt_p = max(vt_p, min over active
policies q of (vt_q − adv_q)), adv_q being the advance charges of q's live leases (so the floor is
what q has really used).

Anticipation (policies at different speeds). A holder that releases a lease usually asks again at
once (its next phase), but in between its policy has no request, so a work-conserving pass would
hand the device to whoever waits and a policy of short leases would alternate with one of long
leases: device time by lease length, not by weight. So a policy that released a lease and has no
queued request is *expected back* until now + anticipation (`anticipation_s`): it stays active (in
W, and no floor when it returns) and, while its key vt_p would come first, the pass keeps the k
devices of that lease for it: a request r is granted only if free − k_r ≥ Σ k_q over the policies
q expected back with vt_q < key_r (r waits, reserving as one that does not fit, otherwise). When
the anticipation ends, a pass (the releasing replica's, or the sweep) grants the devices as usual;
a waiting request's key falls with aging while the returner's vt grows with its use, so it gets
the device after at most the returner's lead in vt (then wait bounded as above).

Order. Only the head of each policy's FIFO competes (FIFO within a policy). Heads are ordered by

    key_r = vt_p − aging · (D / W) · wait_r

D = registered devices, W = Σ weights of active policies, wait_r = now − enqueue time (ms).
D/W is the rate at which a backlogged policy's vt advances under its fair share, so `aging`
is dimensionless: a request that has waited t ms moves ahead as if its policy had used
aging·t ms of its fair share less. A waiting policy's vt does not grow while others' does, and
its key falls without bound, so every request reaches the front.

Gang placement. A request takes all its devices at once or none (no hold-and-wait, hence no
deadlock). One node: best fit, the fullest node that fits. Several nodes: fewest nodes.

Pinning. A request that names its devices (`device_ids`) is granted exactly those, once every one
is free and none is reserved by a request ahead of it; it competes in the same order as any
other. While it waits it reserves those of its devices that are free, and its shadow time is when
the last of the others is expected to end.

Reservation and backfill (EASY backfilling with the estimates above). Going down the order, each
request that does not fit reserves the free devices it will take, on one node it keeps while it
waits and that no request ahead of it reserved this pass; its shadow time is when enough busy
devices are expected to free up, the (k − reserved)-th smallest of grant + est over that node's
busy devices, and it never moves later (backfills cannot push it back). The first request that
fits is granted:

    on free unreserved devices   if its policy is under its fair share (held_p < D·w_p/W), or
                                 no under-served request waits ahead of it, or
                                 now + est ≤ min_r shadow_r
    on reserved devices          if now + est ≤ min_r (shadow_r + slack·est_r)

over the reservations r ahead of it (slack = backfill_slack, est_r = r's expected lease length; an
under-served request that could reserve nothing counts as shadow = now). So a small request
backfills only where it delays no reservation (or by at most slack·est_r, which buys utilization
on small clusters), and a policy at its share cannot take the scattered free devices that an
under-served gang waits to see gather on a node (on a large cluster that would starve gangs).

A request no inventory can ever satisfy (a pinned one: a device it names is not registered, or has
less memory than it asks for) is refused at submission (and queued ones are refused when a node
leaves or changes).
"""
from collections.abc import Mapping, Sequence

__all__ = ["ESTIMATE_ALPHA", "weight_of", "jain", "shares"]

ESTIMATE_ALPHA = 0.25  # EWMA weight of the newest lease length in est_p


def weight_of(policy: str, step_cost: float, configured: Mapping[str, float]) -> float:
    """w_p: the configured weight, else the declared step cost, else 1."""
    return configured.get(policy) or (step_cost if step_cost > 0 else 1.0)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all x are equal, 1/n when one x has everything."""
    if not values:
        return 1.0
    squares = sum(x * x for x in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def shares(state: Mapping[str, Mapping[str, float]]) -> dict[str, dict]:
    """Per policy: weight, held devices, queued requests, GPU-seconds used, its share of them and its fair
    share (w_p / Σw), and vt. `state` maps a column (weight, held, queued, usage_ms, vt) to {policy: value}."""
    policies = sorted(set().union(*(column.keys() for column in state.values())))
    weights = {p: state["weight"].get(p, 1.0) for p in policies}
    used = {p: state["usage_ms"].get(p, 0.0) / 1000 for p in policies}
    total_w, total_used = sum(weights.values()) or 1.0, sum(used.values())
    return {p: {"weight": weights[p], "held_devices": int(state["held"].get(p, 0)),
                "queued": int(state["queued"].get(p, 0)), "gpu_seconds": round(used[p], 3),
                "share": round(used[p] / total_used, 4) if total_used else 0.0,
                "fair_share": round(weights[p] / total_w, 4),
                "vt": round(state["vt"].get(p, 0.0), 3)}
            for p in policies}
