"""`mrl bench mutual`: how fast two co-trained policies of very different speed step, coupled or not.

The demo's pair (examples/mutual.yaml: policy-a = SmolLM2-135M, slow; policy-b = a small GPT-2, fast), run
under run_topology (embedded Redis, the exchange, THL, the scheduler, both trainers as processes) three
ways, each for the same wall time W (--seconds), one after the other, each in a fresh data_dir and Redis:

  alone     both trainers with sharing.mode none, side by side: each publishes, takes nothing, waits for
            nothing. Both run so that the machine's load is the same as in the other arms: on a small
            machine one policy run by itself would measure the CPU it no longer shares, not the coupling.
  lockstep  the topology's sharing modes (the demo: policy-a sgt, policy-b hacpo) with `sharing.coupling:
            lockstep`: at step t each waits up to sharing.peer_wait_s for its peers' experience of step t's
            prompts
  async     the same modes with `sharing.coupling: async`: never wait, use what has arrived (docs/algorithms.md).
            The arms' configs are validated before any arm runs.

Every trainer gets many steps, one torch thread (OMP_NUM_THREADS = 1, so two trainers on two cores do not
fight; the same in every arm), eval off (eval.every 0) and checkpoints only when stopped. The window is
[T0, T0 + W], T0 = the latest first-step start of the trainers (model loading and warm starts excluded:
both are training throughout the window); once it is over the trainers are stopped (SIGTERM: each finishes
its step under way). From each trainer's metrics.jsonl (a train record's `time` is its step's end, `step_s`
its duration, peer wait included): steps per minute = 60 / W × the steps' worth of work inside the window
(a step straddling an edge counts for its share inside), so a slow policy's few long steps are not rounded
to whole steps. fast / slow = the policies with the most / fewest steps per minute alone; each sharing arm's
`fast_ratio_vs_solo` and `slow_ratio_vs_solo` = its steps per minute ÷ the same policy's alone. A sharing arm
also costs its modes' own compute (THL retokenization, peers' sequences in the loss), so a ratio below 1 is
not all waiting: `peer_wait_s_mean` (seconds per step waited for peers) tells the wait apart, and
`peer_samples` (HACPO, PRP) / `sgt_accepted` (SGT) that experience did cross. Where each step's time went,
as means over the steps that ended in the window: rollout_s_mean, update_s_mean, exchange_s_mean (the rest
of the step: publishing, taking the peers' experience with THL, planning, the peer wait) and active_mean
(the share of the step's samples the update trained on: the update skips samples of zero advantage, so a
policy whose rewards spread more under sharing also trains on more of its batch), tokens_mean (the tokens
the step's rollout generated: a policy that learns longer answers from its peer also rolls out longer),
cpu_s_mean (the trainer process's CPU time in the step, all its threads: on a machine whose cores are all
busy, step time beyond it is time the trainer waited for a core, or for its peers) and the update's parts,
update_{own,solo,extras,memory,guard,optimizer}_s_mean (mrl_trainer.update: the own loss, the guard's solo
gradient, the peers' extra sequences, the guard's memory, the guard's combination, clipping and the optimizer
step; a skipped update counts 0 in each; update_s less their sum is the lease, the engine's weight sync and
the update's bookkeeping: planning its micro-batches, the guard's memory and trust, gathering its statistics).

W defaults to 300 s: a demo step of the slow policy takes about a minute on 2 cores. --quick (a smoke test of
the plumbing, not a measurement): W = 10 s, 1 prompt × 2 samples of at most 4 tokens, no warm start.
--arms runs a subset (alone, the ratios' reference, always); --topology another pair (default: the demo's).
--frozen runs every trainer at loss.lr 0: each step samples, verifies, publishes, takes its peers' experience and
computes its whole update, optimizer step included, and the weights stay as they are. The policies then write the
same kind of answers in every arm, and the ratios measure what coupling and sharing cost. Without it they also
measure what the policies learn from each other while the window runs (a policy that learns its peer's longer
answers rolls out and trains on more tokens per step).

The last stdout line is one JSON object: bench, quick, frozen, machine, cores, threads_per_trainer, seconds,
topology, arms (the arms run), fast, slow, and one object per arm run: {"policies": {policy: {steps,
steps_per_min, rollout_s_mean, update_s_mean, exchange_s_mean, cpu_s_mean, active_mean, tokens_mean, the
update's parts[, peer_wait_s_mean, peers_complete_mean, peer_samples, sgt_accepted]}}}, plus
fast_ratio_vs_solo and slow_ratio_vs_solo in the sharing arms (e.g. result["async"]["fast_ratio_vs_solo"]), and
fast_tokens_ratio_vs_solo and slow_tokens_ratio_vs_solo: the same ratios of generated tokens per minute
(steps_per_min × tokens_mean), which tell a policy that steps slower because it learned longer answers from its
peer from one whose steps cost more.
"""
import json
import math
import os
import pathlib
import tempfile
import threading
import time

from mrl_launcher.errors import LauncherError, RunFailed
from mrl_launcher.topology import read_settings, run_topology, stop_on_signals, validate_trainers
from mrl_research import benchmarking
from mrl_trainer.update import TIMINGS

__all__ = ["main", "ARMS"]

ARMS = {"alone": {"sharing.mode": "none"}, "lockstep": {"sharing.coupling": "lockstep"},
        "async": {"sharing.coupling": "async"}}
THREADS = 1                    # torch threads per trainer
RUN = {"steps": 1_000_000, "eval.every": 0, "checkpoint.every": 1_000_000, "metrics.progress": False}
QUICK = {"rollout.group_size": 2, "rollout.prompts_per_step": 1, "rollout.max_new_tokens": 4, "warm_start": None}
FROZEN = {"loss.lr": 0.0}     # --frozen: every step computes its update and the weights stay as they are
FIRST_STEP_TIMEOUT_S = 1800    # model loads and warm starts (policy-b's 300 supervised steps, uncached)
PEER_MEANS = ("peer_wait_s", "peers_complete")
STEP_MEANS = ("rollout_s", "update_s", "cpu_s", "active", "tokens") + TIMINGS   # where a step's time went, its
                                    # CPU time, the share of samples trained on, the tokens its rollout generated
                                    # and where the update's time went
PEER_TOTALS = ("peer_samples", "sgt_accepted")


def _steps(path: pathlib.Path) -> list[dict]:
    """The train records a trainer has written so far (complete lines only: the last may be half-written)."""
    try:
        lines = path.read_text().split("\n")[:-1]
    except FileNotFoundError:
        return []
    return [r for r in map(json.loads, filter(None, lines)) if r.get("kind", "train") == "train"]


def _window_start(steps: list[list[dict]]) -> float:
    """T0: the latest of the trainers' first-step starts (Unix seconds)."""
    return max(s[0]["time"] - s[0]["step_s"] for s in steps)


def _stop_after_window(metrics: dict[str, pathlib.Path], seconds: float, stop: threading.Event) -> None:
    """Set `stop` W seconds after T0 (or FIRST_STEP_TIMEOUT_S after starting, when some trainer never steps)."""
    deadline = time.monotonic() + FIRST_STEP_TIMEOUT_S
    while not stop.is_set() and time.monotonic() < deadline:
        steps = [_steps(path) for path in metrics.values()]
        if all(steps):
            stop.wait(max(0.0, _window_start(steps) + seconds - time.time()))
            break
        stop.wait(0.5)
    stop.set()


def _figures(steps: list[dict], t0: float, t1: float) -> dict:
    """Steps per minute in [t0, t1] (each step counted for its share inside) and the steps that ended in it,
    with their peer figures where the records have them."""
    work = sum(max(0.0, min(r["time"], t1) - max(r["time"] - r["step_s"], t0)) / r["step_s"] for r in steps)
    ended = [r for r in steps if t0 < r["time"] <= t1]
    out = {"steps": len(ended), "steps_per_min": round(60 * work / (t1 - t0), 3)}
    if ended:
        rest = [r["step_s"] - r.get("rollout_s", 0.0) - r.get("update_s", 0.0) for r in ended]
        out["exchange_s_mean"] = round(sum(rest) / len(rest), 3)
        # a skipped update (every advantage 0) trained on nothing and took no time in any part
        ended = [{"active": 0.0, **(dict.fromkeys(TIMINGS, 0.0) if r.get("skipped") else {}), **r} for r in ended]
    for key in STEP_MEANS + PEER_MEANS:
        values = [r[key] for r in ended if key in r]
        if values:
            out[f"{key}_mean"] = round(sum(values) / len(values), 3)
    for key in PEER_TOTALS:
        if any(key in r for r in ended):
            out[key] = sum(r.get(key, 0) for r in ended)
    return out


def _run_arm(arm: str, config: dict, base: pathlib.Path, overrides: dict, metrics: dict[str, pathlib.Path],
             seconds: float) -> dict:
    """One arm: the topology run until W seconds after T0; {policy: its figures in the window}."""
    with stop_on_signals() as stop:
        timer = threading.Thread(target=_stop_after_window, args=(metrics, seconds, stop), daemon=True)
        timer.start()
        try:
            results = run_topology(config, base, stop, overrides, cpus=THREADS * len(metrics))
        finally:
            stop.set()
            timer.join()
    failed = {policy: r["exit_code"] for policy, r in results.items() if r["exit_code"] != 0}
    if failed:
        raise RunFailed(f"arm {arm}: trainers failed (exit codes {failed})")
    steps = {policy: _steps(path) for policy, path in metrics.items()}
    idle = [policy for policy, s in steps.items() if not s]
    if idle:
        raise LauncherError(f"arm {arm}: {', '.join(idle)} made no step within {FIRST_STEP_TIMEOUT_S} s")
    t0 = _window_start(list(steps.values()))
    if min(s[-1]["time"] for s in steps.values()) < t0 + seconds:
        raise LauncherError(f"arm {arm}: the trainers stopped before the {seconds:g} s window ended (interrupted?)")
    return {policy: _figures(s, t0, t0 + seconds) for policy, s in steps.items()}


def _line(arm: str, policies: dict) -> str:
    parts = []
    for policy, f in policies.items():
        text = f"{policy} {f['steps_per_min']:.3f} steps/min ({f['steps']} ended in the window"
        if "update_s_mean" in f:
            text += (f"; per step: rollout {f['rollout_s_mean']:.1f} s, update {f['update_s_mean']:.1f} s on "
                     f"{f['active_mean']:.0%} of the samples, the rest {f['exchange_s_mean']:.1f} s, CPU "
                     f"{f.get('cpu_s_mean', 0.0):.1f} s")
            took = [(name[len("update_"):-len("_s")], f.get(f"{name}_mean", 0.0)) for name in TIMINGS]
            if any(s for _, s in took):
                text += " (update: " + ", ".join(f"{part} {s:.2f} s" for part, s in took if s) + ")"
        if "peer_wait_s_mean" in f:
            text += f", waited {f['peer_wait_s_mean']:.1f} s/step for peers"
        text += "".join(f", {f[k]} {k.replace('_', ' ')}" for k in PEER_TOTALS if k in f)
        parts.append(text + ")")
    return f"  {arm:<9} " + "; ".join(parts)


def main(quick: bool = False, seconds: float | None = None, arms: str = ",".join(ARMS),
         topology: str = "examples/mutual.yaml", frozen: bool = False) -> dict:
    requested = arms.split(",")
    if "alone" not in requested or set(requested) - set(ARMS):
        raise LauncherError(f"--arms: a comma-separated list of {', '.join(ARMS)} that includes alone "
                            f"(the ratios' reference); got {arms!r}")
    chosen = [arm for arm in ARMS if arm in requested]       # alone first
    seconds = (10.0 if quick else 300.0) if seconds is None else seconds
    if not 0 < seconds < math.inf:
        raise LauncherError(f"--seconds {seconds}: the window of each arm is a positive number of seconds")
    path = pathlib.Path(topology)
    if not path.is_file():
        raise LauncherError(f"topology file {topology!r} does not exist (the demo's is examples/mutual.yaml in the "
                            f"repository: run from its root or pass --topology)")
    config = read_settings(path)
    config.pop("report", None)
    if len(config.get("trainers") or []) < 2:
        raise LauncherError(f"{topology}: the bench needs a topology with at least two trainers")
    common = {**RUN, **(QUICK if quick else {}), **(FROZEN if frozen else {})}
    machine = benchmarking.machine()
    result = {"bench": "mutual", "quick": quick, "frozen": frozen, "machine": machine, "cores": os.cpu_count(),
              "threads_per_trainer": THREADS, "seconds": seconds, "topology": str(path), "arms": chosen}
    print(f"mrl bench mutual: {machine}\n  {topology}: {len(config['trainers'])} trainers, {THREADS} torch thread "
          f"each, all of them running in every arm (the same load); arms {', '.join(chosen)}, {seconds:g} s of "
          f"training each, from the latest first-step start" + (" (frozen: lr 0, the policies do not change)"
                                                                 if frozen else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="mrl-bench-mutual-") as tmp:
        configs = {arm: {**config, "data_dir": str(pathlib.Path(tmp) / arm)} for arm in chosen}
        overrides = {arm: {**common, **ARMS[arm]} for arm in chosen}
        # every arm's trainer settings are checked before the first arm runs
        metrics = {arm: validate_trainers(configs[arm], path.parent, overrides[arm]) for arm in chosen}
        for arm in chosen:
            policies = _run_arm(arm, configs[arm], path.parent, overrides[arm], metrics[arm], seconds)
            result[arm] = {"policies": policies}
            print(_line(arm, policies), flush=True)
    alone = result["alone"]["policies"]
    result["fast"] = max(alone, key=lambda p: alone[p]["steps_per_min"])
    result["slow"] = min(alone, key=lambda p: alone[p]["steps_per_min"])
    for arm in chosen[1:]:
        for side in ("fast", "slow"):
            policy, shared = result[side], result[arm]["policies"][result[side]]
            result[arm][f"{side}_ratio_vs_solo"] = round(shared["steps_per_min"] / alone[policy]["steps_per_min"], 3)
            if shared.get("tokens_mean") and alone[policy].get("tokens_mean"):
                result[arm][f"{side}_tokens_ratio_vs_solo"] = round(
                    shared["steps_per_min"] * shared["tokens_mean"]
                    / (alone[policy]["steps_per_min"] * alone[policy]["tokens_mean"]), 3)
        print(f"  {arm}: fast ({result['fast']}) ×{result[arm]['fast_ratio_vs_solo']} of alone, slow "
              f"({result['slow']}) ×{result[arm]['slow_ratio_vs_solo']} (generated tokens per minute: ×"
              f"{result[arm].get('fast_tokens_ratio_vs_solo')}, ×{result[arm].get('slow_tokens_ratio_vs_solo')})",
              flush=True)
    print(json.dumps(result), flush=True)
    return result
