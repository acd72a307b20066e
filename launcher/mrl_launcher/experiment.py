"""`mrl experiment compare TOPOLOGY`: the same pair of policies under each sharing mode, compared.

For each seed s and each registered sharing mode m (mrl_trainer.sharing.MODES, or --modes), the
topology's trainers run with `sharing.mode = m` and `seed = s` (plus any --set overrides; without --seeds,
each trainer keeps its config's own seed, labelled "config") in a fresh run
(`run_id = <run_id>-<m>-<label>`, data under OUT/<label>/<m>/), one mode after the other, on the
same services' code, prompts and budget (OUT must be empty: trainers would resume from an earlier
comparison's checkpoints). Then, per seed, `report.write_compare_report` writes
OUT/<label>/index.html and compare.json: each policy's held-out accuracy against rollouts
consumed per mode, and how many rollouts each mode needed to reach solo GRPO's ("none") final
accuracy. The last line printed is one JSON object with those figures.
"""
import pathlib
import threading

import yaml

from mrl_launcher.topology import run_topology, stop_on_signals
from mrl_launcher.errors import LauncherError, RunFailed
from mrl_launcher.analysis import compare
from mrl_launcher.report import write_compare_report
from mrl_trainer.sharing import SHARING_MODES

__all__ = ["run_compare"]


def run_compare(topology: str | pathlib.Path, modes: list[str], seeds: list[int] | None, out: str | pathlib.Path,
                overrides: dict | None = None) -> dict:
    path = pathlib.Path(topology)
    if not path.is_file():
        raise LauncherError(f"topology file {str(path)!r} does not exist")
    unknown = [m for m in modes if m not in SHARING_MODES]
    if unknown or "none" not in modes:
        raise LauncherError(f"modes {modes} must include 'none' (the baseline) and be among {list(SHARING_MODES)}")
    config = yaml.safe_load(path.read_text()) or {}
    if not config.get("trainers"):
        raise LauncherError(f"{path}: a comparison needs `trainers:` (the pair of policies)")
    out = pathlib.Path(out).resolve()
    if out.exists() and any(out.iterdir()):   # its trainers would resume from the old checkpoints
        raise LauncherError(f"{out} is not empty: a comparison starts from scratch; remove it or pass another --out")
    with stop_on_signals() as stop:
        return _run_modes(config, path, modes, seeds, out, overrides, stop)


def _run_modes(config: dict, path: pathlib.Path, modes: list[str], seeds: list[int] | None, out: pathlib.Path,
               overrides: dict | None, stop: threading.Event) -> dict:
    figures = {}
    for seed in seeds or [None]:
        label = "config" if seed is None else f"s{seed}"
        runs = {}
        for mode in modes:
            run = {**config, "data_dir": str(out / label / mode), "run_id": f"{config.get('run_id', 'compare')}-{mode}-{label}"}
            run.pop("report", None)
            print(f"mrl experiment: seed {label}, mode {mode}", flush=True)
            extra = {"sharing.mode": mode, **({} if seed is None else {"seed": seed})}
            results = run_topology(run, path.parent, stop, {**(overrides or {}), **extra})
            if stop.is_set():        # its trainers stopped early (and exited 0): not a complete run
                raise RunFailed(f"stopped during mode {mode}; runs so far are under {out / label}")
            failed = {p: r["exit_code"] for p, r in results.items() if r["exit_code"] != 0}
            if failed:
                raise RunFailed(f"mode {mode}, seed {label}: trainers failed with exit codes {failed}")
            runs[mode] = [r["metrics"] for r in results.values()]
        index = write_compare_report(runs, out / label)
        print(f"mrl experiment: report {index}", flush=True)
        figures[label] = compare(runs)
    return figures
