"""Loading trainers' runs and comparing sharing modes: pure functions, JSON out (no figures, no HTML).

A run is one metrics.jsonl per policy (what `mrl trainer run` writes: one JSON record per step,
`kind` "train" or "eval"). `load_run(paths)` checks and indexes it by policy.

`compare(runs, baseline="none")` compares sharing modes: `runs` maps a mode to its run's metrics
files (one per policy; the policy is named in the records). For each policy and mode it gives

    final_eval_accuracy   the last eval record's held-out greedy accuracy
    rollouts_total        the most rollouts the policy consumed
    rollouts_to_baseline  the rollouts_total of the mode's first eval record (in step order)
                          whose eval_accuracy >= the baseline mode's final eval accuracy for that
                          policy (within 1e-9); None if no eval record of the mode reaches it.
    ratio_to_baseline     rollouts_to_baseline / the baseline's own rollouts_to_baseline;
                          below 1 means the mode needed fewer rollouts. None when either is None

A policy absent from the baseline run has no target (all rollouts_to_baseline None).

Errors (LauncherError, with what to do): a missing, empty or unreadable metrics file, a file with
no eval records, one policy in two files of a run, and a baseline mode absent from runs.
"""
import dataclasses
import math
import pathlib

from mrl_launcher.errors import LauncherError
from mrl_trainer.metrics import read_metrics

__all__ = ["PolicyRun", "load_policy_run", "load_run", "load_runs", "compare", "compare_loaded", "TOLERANCE"]

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


def load_policy_run(path: str | Path) -> PolicyRun:
    """Read one trainer's metrics.jsonl, checking it can be reported on."""
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


def _rollouts_to(run: PolicyRun, target: float | None) -> int | None:
    if target is None:
        return None
    for r in run.evals:
        if r["eval_accuracy"] >= target - TOLERANCE:
            return r.get("rollouts_total")
    return None


def compare_loaded(loaded: dict[str, dict[str, PolicyRun]], baseline: str) -> dict:
    policies = list(dict.fromkeys(p for mode in [baseline, *loaded] for p in loaded[mode]))
    out: dict = {"baseline": baseline, "policies": {}}
    for policy in policies:
        base = loaded[baseline].get(policy)
        target = float(base.evals[-1]["eval_accuracy"]) if base else None
        base_to = _rollouts_to(base, target) if base else None
        entry = {}
        for mode, runs in loaded.items():
            run = runs.get(policy)
            if run is None:
                continue
            to = _rollouts_to(run, target)
            entry[mode] = {
                "sharing": run.sharing,
                "steps": len(run.train),
                "first_eval_accuracy": float(run.evals[0]["eval_accuracy"]),
                "final_eval_accuracy": float(run.evals[-1]["eval_accuracy"]),
                "rollouts_total": run.rollouts_total,
                "target_accuracy": target,
                "rollouts_to_baseline": to,
                "ratio_to_baseline": to / base_to if to is not None and base_to else None,
            }
        out["policies"][policy] = entry
    return out


def load_runs(runs: dict[str, list[str | Path]], baseline: str) -> dict[str, dict[str, PolicyRun]]:
    if baseline not in runs:
        given = ", ".join(map(repr, runs)) or "none given"
        raise LauncherError(f"baseline mode {baseline!r} is not among the runs ({given}): "
                           f"add the {baseline!r} run's metrics files or pass baseline= one of them")
    return {mode: load_run(list(paths), f"mode {mode!r}") for mode, paths in runs.items()}


def compare(runs: dict[str, list[str | Path]], baseline: str = "none") -> dict:
    """Per policy and sharing mode: final eval accuracy, rollouts consumed, rollouts to the baseline's
    final accuracy and its ratio to the baseline's own (see the module docstring). JSON-able."""
    return compare_loaded(load_runs(runs, baseline), baseline)
