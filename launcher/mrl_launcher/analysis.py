"""Loading trainers' runs and comparing sharing modes over seeds: pure functions, JSON out (no figures, no HTML).

A run is one metrics.jsonl per policy (what `mrl trainer run` writes: one JSON record per step,
`kind` "train" or "eval"; an eval record carries eval_accuracy and, per held-out problem, eval_prompt_ids
and eval_correct). `load_run(paths)` checks and indexes it by policy.

`compare(seeds, baseline="none")` compares sharing modes: `seeds` maps a seed label to {mode: the run's
metrics files}. The design is paired: every mode of a seed starts from the same initial policies and
prompts, and every run scores the same eval problems. For each policy and mode, with X[s, q] the outcome
of seed s on eval problem q at an eval point (0/1; or, when some record lacks per-problem outcomes, the
accuracy of seed s as the only "problem"), and intervals from intervals.crossed_bootstrap (seeds and
problems both resampled; 95%, percentile):

    final_accuracy, final_ci    mean of X at the last eval point, and its interval
    finals                      each seed's final accuracy
    delta_baseline, _ci         mean of X_mode − X_baseline at the last eval point (same seed, same problem),
                                and its interval: the paired difference to solo when the baseline is "none";
                                only when both last evals are at the same step (not for the baseline itself)
    delta_baseline_seeds_ci     the 95% t-interval of the per-seed mean differences (seeds only; wider than
                                the bootstrap's seed axis with few seeds, which resampling 3 seeds understates)
    late_steps                  the late window W = {k : 2·t_k ≥ t_K}, the evals at steps t_k ≥ half the last's
    late_accuracy, late_ci      the late endpoint: mean of L[s, q] = (1/|W|) Σ_{k∈W} X_k[s, q], and its
                                interval; late_finals each seed's
    delta_baseline_late, _ci,   the paired difference of L to the baseline's, and its two intervals as above;
    delta_baseline_late_seeds_ci   only when both late windows are at the same steps
    gain, gain_ci, gain_seeds_ci   mean of X_K[s, q] − X_0[s, q], the last eval against the first (step 0: where
                                the policy started), with the same two intervals: whether the mode learned at all
                                (for solo, the gate a comparison needs before it can show sharing helping)
    curve                       per eval point: rollouts consumed (mean over seeds), mean, lo, hi
    target_accuracy             the baseline's final_accuracy
    rollouts_to_baseline        the rollouts of the mode's first curve point whose mean >= target (within
                                1e-9); None if it never gets there
    ratio_to_baseline           rollouts_to_baseline / the baseline's own; below 1: fewer rollouts needed
and, per policy, `interval`: "seeds × eval problems", or "seeds" where per-problem outcomes are missing.

The late endpoint is pre-registered for small policies on a CPU budget, whose held-out accuracy can swing by more
between two consecutive evals than a sharing mode moves it: one final eval then decides a comparison by chance.
Averaging the second half's evals keeps the pairing (same seed, same problem) and weighs where a run ended up,
not where its last eval happened to land.

`compare(…, at_step=N)` reads every run as it stood at its eval of step N (`up_to`): its train records before
step N and its evals up to it, so "final" is step N's. Arms whose runs went on for different budgets are then
compared at equal own rollouts: under asynchronous coupling a fast policy may be given many more steps than its
slow peer, so that it keeps training and publishing while the peer works, and is read at the peer's budget.
Every run must have an eval at step N, and the late window is then its evals at steps ≥ N/2.
`at_step={policy: N, …}` reads the named policies' runs at their own steps and the others at their last eval: a
fast policy at the end of its longer budget, its slow peer at its own.

Errors (LauncherError, with what to do): a missing, empty or unreadable metrics file, a file with
no eval records, one policy in two files of a run, a baseline mode absent from runs, seeds that ran other
modes, and runs that scored different eval problems (not paired).
"""
import dataclasses
import math
import pathlib

import numpy as np

from mrl_launcher.errors import LauncherError
from mrl_launcher.intervals import crossed_bootstrap, mean_ci
from mrl_trainer.metrics import read_metrics

__all__ = ["PolicyRun", "as_run", "load_policy_run", "load_run", "load_runs", "load_seeds", "compare", "compare_loaded",
           "rollouts_to", "up_to", "TOLERANCE"]

Path = pathlib.Path
TOLERANCE = 1e-9


@dataclasses.dataclass
class PolicyRun:
    """One policy's metrics file: its train records and eval records (with a numeric accuracy), step order."""
    policy: str
    path: Path
    train: list[dict]
    evals: list[dict]

    @property
    def rollouts_total(self) -> int | None:
        values = [r["rollouts_total"] for r in self.train + self.evals if num(r.get("rollouts_total"))]
        return max(values) if values else None

    @property
    def sharing(self) -> str | None:
        modes = list(dict.fromkeys(str(r["sharing"]) for r in self.train if r.get("sharing") is not None))
        return ", ".join(modes) if modes else None

    def has(self, key: str) -> bool:
        return any(num(r.get(key)) for r in self.train)

    def values(self, key: str) -> list[float]:
        return [r[key] for r in self.train if num(r.get(key))]


def num(value) -> bool:
    """A finite number (not a bool): what a metrics record holds for a statistic that was measured."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_policy_records(path: str | Path) -> list[dict]:
    """One trainer's metrics.jsonl records; LauncherError when the file is missing, not metrics, or empty."""
    path = Path(path)
    if not path.is_file():
        raise LauncherError(f"metrics file {str(path)!r} does not exist: pass the metrics.jsonl a trainer wrote "
                           "(metrics.jsonl in its config, by default <checkpoint.dir>/metrics.jsonl)")
    try:
        records = read_metrics(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise LauncherError(f"{path} is not a trainer metrics file (every line must be a JSON object with "
                           f"'step' and 'policy'): {exc}") from exc
    if not records:
        raise LauncherError(f"{path} is empty: the trainer has not logged a step yet; report once it has")
    return records


def as_run(path: str | Path, records: list[dict]) -> PolicyRun:
    """The PolicyRun of one policy's records as they stand (a run under way may have no eval yet), unchecked."""
    return PolicyRun(str(records[0]["policy"]), Path(path), [r for r in records if r.get("kind", "train") == "train"],
                     [r for r in records if r.get("kind") == "eval" and num(r.get("eval_accuracy"))])


def load_policy_run(path: str | Path) -> PolicyRun:
    """Read one trainer's metrics.jsonl, checking it can be reported on."""
    path = Path(path)
    records = read_policy_records(path)
    policies = list(dict.fromkeys(str(r.get("policy")) for r in records))
    if len(policies) > 1:
        raise LauncherError(f"{path} holds records of several policies ({', '.join(policies)}): "
                           "pass one metrics file per policy")
    evals = [r for r in records if r.get("kind") == "eval" and num(r.get("eval_accuracy"))]
    if not evals:
        raise LauncherError(f"{path} has no eval records (policy {policies[0]}): run the trainer with "
                           "eval.every > 0 so it logs held-out accuracy")
    train = [r for r in records if r.get("kind", "train") == "train"]
    return PolicyRun(policies[0], path, train, evals)


def up_to(run: PolicyRun, step: int) -> PolicyRun:
    """The run as it stood at its eval of `step`: the train records of the steps before it, the evals up to it."""
    steps = [r["step"] for r in run.evals]
    if step not in steps:
        raise LauncherError(f"{run.path}: policy {run.policy!r} evaluated at steps {steps}, not at step {step}: "
                            "compare at a step every run evaluated at (a multiple of eval.every, within its steps)")
    return dataclasses.replace(run, train=[r for r in run.train if r["step"] < step],
                               evals=[r for r in run.evals if r["step"] <= step])


def load_run(paths: list[str | Path], what: str) -> dict[str, PolicyRun]:
    if not paths:
        raise LauncherError(f"{what}: no metrics files given: pass one metrics.jsonl per policy")
    runs: dict[str, PolicyRun] = {}
    for path in paths:
        run = load_policy_run(path)
        if run.policy in runs:
            raise LauncherError(f"{what}: policy {run.policy!r} is in both {runs[run.policy].path} and {run.path}: "
                               "pass one metrics file per policy")
        runs[run.policy] = run
    return runs


def _outcomes(run: PolicyRun, per_problem: bool) -> list[tuple[list[str], list[float]]]:
    """Per eval record: (problem ids, outcomes) — each problem's 0/1, or the accuracy as one outcome."""
    if per_problem:
        return [(list(r["eval_prompt_ids"]), [float(c) for c in r["eval_correct"]]) for r in run.evals]
    return [([], [float(r["eval_accuracy"])]) for r in run.evals]


def _has_outcomes(run: PolicyRun) -> bool:
    return all(isinstance(r.get("eval_correct"), list) and isinstance(r.get("eval_prompt_ids"), list)
               and len(r["eval_correct"]) == len(r["eval_prompt_ids"]) > 0 for r in run.evals)


def _matrices(by_seed: list[PolicyRun], per_problem: bool, ids: list[str]) -> tuple[list[int], list[np.ndarray]]:
    """(eval steps, one seeds × problems matrix per eval step). Every seed must have evaluated at the same steps,
    and every eval must have scored the problems `ids` in that order, or the runs are not paired."""
    outcomes = [_outcomes(run, per_problem) for run in by_seed]
    steps = [r["step"] for r in by_seed[0].evals]
    for run, o in zip(by_seed, outcomes):
        if [r["step"] for r in run.evals] != steps:
            mine = [r["step"] for r in run.evals]
            raise LauncherError(f"{run.path}: policy {run.policy!r} evaluated at steps {mine}, {by_seed[0].path} at "
                                f"{steps}: the seeds of a mode must run the same budget")
        for k, (scored, _) in enumerate(o):
            if scored != ids:
                raise LauncherError(f"{run.path}: eval {k} of policy {run.policy!r} scored other problems than "
                                    f"{by_seed[0].path}: a paired comparison needs the same eval problems (the same "
                                    "task, task.seed and eval.problems) in every run")
    return steps, [np.array([o[k][1] for o in outcomes]) for k in range(len(steps))]


def _late(steps: list[int], mats: list[np.ndarray]) -> tuple[list[int], np.ndarray]:
    """(the late window's eval steps, L): L[s, q] the mean of X[s, q] over the evals at steps ≥ half the last's."""
    late = [k for k, step in enumerate(steps) if 2 * step >= steps[-1]]
    return [steps[k] for k in late], np.mean([mats[k] for k in late], axis=0)


def _paired(diff: np.ndarray, key: str) -> dict:
    """A paired difference matrix's mean (`key`), its crossed-bootstrap interval and the t-interval over seeds."""
    d, dlo, dhi = crossed_bootstrap(diff)
    _, tlo, thi = mean_ci([float(row.mean()) for row in diff])
    return {key: d, f"{key}_ci": [dlo, dhi], f"{key}_seeds_ci": [tlo, thi]}


def _entry(by_seed: list[PolicyRun], steps: list[int], mats: list[np.ndarray],
           base: tuple[list[int], list[np.ndarray]] | None) -> dict:
    """One mode's figures; `base`: the baseline's eval steps and matrices (None for the baseline itself)."""
    rollouts = [round(sum(r.evals[k].get("rollouts_total") or 0 for r in by_seed) / len(by_seed))
                for k in range(len(mats))]
    band = [crossed_bootstrap(m) for m in mats]
    mean, lo, hi = band[-1]
    late_steps, late = _late(steps, mats)
    late_mean, late_lo, late_hi = crossed_bootstrap(late)
    entry = {"sharing": by_seed[0].sharing, "steps": len(by_seed[0].train),
             "rollouts_total": max(r.rollouts_total or 0 for r in by_seed),
             "eval_problems": mats[-1].shape[1], "final_accuracy": mean, "final_ci": [lo, hi],
             "finals": [float(row.mean()) for row in mats[-1]],
             "late_steps": late_steps, "late_accuracy": late_mean, "late_ci": [late_lo, late_hi],
             "late_finals": [float(row.mean()) for row in late],
             "curve": {"rollouts": rollouts, "mean": [b[0] for b in band], "lo": [b[1] for b in band],
                       "hi": [b[2] for b in band]},
             **_paired(mats[-1] - mats[0], "gain")}
    if base is not None:     # paired: the same seeds (rows) and problems (columns), _matrices checked
        base_steps, base_mats = base
        if steps[-1] == base_steps[-1]:
            entry.update(_paired(mats[-1] - base_mats[-1], "delta_baseline"))
        base_late_steps, base_late = _late(base_steps, base_mats)
        if late_steps == base_late_steps:
            entry.update(_paired(late - base_late, "delta_baseline_late"))
    return entry


def rollouts_to(curve: dict, target: float | None, tolerance: float = TOLERANCE) -> int | None:
    """The rollouts of a curve's ({"rollouts", "mean"}) first point whose mean ≥ target − tolerance; None if none
    is, or there is no target."""
    if target is None:
        return None
    return next((x for x, y in zip(curve["rollouts"], curve["mean"]) if y >= target - tolerance), None)


def compare_loaded(loaded: dict[str, dict[str, dict[str, PolicyRun]]], baseline: str) -> dict:
    """`loaded`: {seed label: {mode: {policy: PolicyRun}}}, every seed with the same modes."""
    seeds = list(loaded)
    modes = list(loaded[seeds[0]])
    for label in seeds:
        if set(loaded[label]) != set(modes):
            raise LauncherError(f"seed {label!r} ran modes {list(loaded[label])}, seed {seeds[0]!r} {modes}: "
                                "every seed must run the same modes")
    policies = list(dict.fromkeys(p for mode in [baseline, *modes] for p in loaded[seeds[0]][mode]))
    out: dict = {"baseline": baseline, "seeds": seeds, "interval": {}, "policies": {}}
    for policy in policies:
        runs = {mode: [loaded[label][mode].get(policy) for label in seeds] for mode in modes}
        runs = {mode: by_seed for mode, by_seed in runs.items() if all(by_seed)}
        if not runs:     # in no mode in every seed
            continue
        per_problem = all(_has_outcomes(run) for by_seed in runs.values() for run in by_seed)
        first = runs.get(baseline, next(iter(runs.values())))[0]
        ids = _outcomes(first, per_problem)[0][0]
        evals = {mode: _matrices(by_seed, per_problem, ids) for mode, by_seed in runs.items()}
        base = evals.get(baseline)
        entries = {mode: _entry(runs[mode], *evals[mode], base if mode != baseline else None) for mode in runs}
        target = entries[baseline]["final_accuracy"] if baseline in entries else None
        base_to = rollouts_to(entries[baseline]["curve"], target) if baseline in entries else None
        for entry in entries.values():
            to = rollouts_to(entry["curve"], target)
            entry.update(target_accuracy=target, rollouts_to_baseline=to,
                         ratio_to_baseline=to / base_to if to is not None and base_to else None)
        out["interval"][policy] = "seeds × eval problems" if per_problem else "seeds"
        out["policies"][policy] = entries
    return out


def load_runs(runs: dict[str, list[str | Path]], baseline: str) -> dict[str, dict[str, PolicyRun]]:
    if baseline not in runs:
        given = ", ".join(map(repr, runs)) or "none given"
        raise LauncherError(f"baseline mode {baseline!r} is not among the runs ({given}): "
                           f"add the {baseline!r} run's metrics files or pass baseline= one of them")
    return {mode: load_run(list(paths), f"mode {mode!r}") for mode, paths in runs.items()}


def load_seeds(seeds: dict[str, dict[str, list[str | Path]]], baseline: str) -> dict:
    if not seeds:
        raise LauncherError("no runs to compare: pass {seed: {mode: [metrics.jsonl, ...]}}")
    return {label: load_runs(runs, baseline) for label, runs in seeds.items()}


def compare(seeds: dict[str, dict[str, list[str | Path]]], baseline: str = "none",
            at_step: int | dict[str, int] | None = None) -> dict:
    """Per policy and sharing mode, over seeds: final held-out accuracy and its paired difference to the
    baseline with 95% intervals, curves with bands, rollouts to the baseline's final accuracy (see the module
    docstring); with `at_step`, each run as it stood at that step's eval, or with {policy: step} each named
    policy's runs at its step (the others at their last eval). `seeds` maps a seed label to {mode: metrics
    files, one per policy}. JSON-able."""
    loaded = load_seeds(seeds, baseline)
    if at_step is not None:
        steps = _steps_by_policy(at_step, {p for modes in loaded.values() for runs in modes.values() for p in runs})
        loaded = {label: {mode: {policy: up_to(run, steps[policy]) if policy in steps else run
                                 for policy, run in runs.items()}
                          for mode, runs in modes.items()} for label, modes in loaded.items()}
    return {**compare_loaded(loaded, baseline), "at_step": at_step}


def _steps_by_policy(at_step: int | dict[str, int], policies: set[str]) -> dict[str, int]:
    """`at_step` as {policy: step}: one step for every policy, or the policies it names (each in some run)."""
    if not isinstance(at_step, dict):
        return dict.fromkeys(policies, at_step)
    for policy in at_step:
        if policy not in policies:
            raise LauncherError(f"--at-step names policy {policy!r}, which is in no run (policies: "
                                f"{', '.join(sorted(policies))})")
    return at_step
