"""`mrl experiment compare TOPOLOGY`: the same pair of policies under each sharing mode, over seeds, compared.

For each seed s and each registered sharing mode m (mrl_trainer.sharing.MODES, or --modes), the
topology's trainers run with `sharing.mode = m` and `seed = s` (plus any --set overrides; without --seeds,
each trainer keeps its config's own seed, labelled "config") in a fresh run (`run_id = <run_id>-<m>-<label>`,
data under OUT/<label>/<m>/; a run id over 64 characters keeps its start and ends in a hash of the whole) on its
own Redis and services. An arm may also be a variant of a mode
(mrl_launcher.variants, as in `mrl lab bandit`: `sgt:rationalize=8`, `xgrpo-unguarded`): its settings apply
over --set's, and its name in run ids and folders has `-` for the characters they do not allow. Runs are
paired: the modes of a seed start from the same initial policies and prompts, and every run scores the same
held-out problems (the task's own seed fixes them).

OUT must be empty (trainers would resume from an earlier comparison's checkpoints), unless `keep`: then a run
that finished there (OUT/<label>/<m>/finished.json, written once all its trainers exited 0) with the same
settings is kept and not run again, one that finished with other settings is an error before anything runs,
and one cut short is removed and run from the start. So seeds or arms can be added to a comparison, or a
stopped one completed (the topology file itself is not checked: keep it as it was).

`parallel` runs go at once (default: as many as the cores allow, one core per trainer, at least one); each
run's trainers share cores // parallel compute threads. A failed run stops the others and the comparison.

Then `report.write_compare_page` writes OUT/index.html and OUT/compare.json (analysis.compare): per policy
and mode, final held-out accuracy and its paired difference to the baseline arm (`baseline`, default solo GRPO,
"none"; it must be one of the arms) with 95% bootstrap intervals over seeds and eval problems, curves with
bands, and the rollouts each mode needed to reach the baseline's final accuracy. The last line printed is that
JSON object. Another baseline pairs arms among themselves: `--baseline xgrpo` with the arms xgrpo and
xgrpo:coupling=async is asynchronous against lockstep XGRPO; with --keep and the same runs it only rewrites the
report. `at_step` reads every run as it stood at that step's eval (analysis.up_to), for arms whose budgets differ;
{policy: step} reads each named policy at its own step (a fast asynchronous policy at the end of its longer budget).
"""
import concurrent.futures
import hashlib
import json
import os
import pathlib
import shutil
import threading

from mrl.errors import FailedPrecondition
from mrl.experience import NAME_MAX
from mrl_launcher.errors import LauncherError, RunFailed
from mrl_launcher.report import write_compare_page
from mrl_launcher.analysis import compare
from mrl_launcher.topology import read_settings, run_topology, stop_on_signals, validate_trainers
from mrl_launcher.variants import variant_settings, variant_slug
from mrl_serving.registry import installed_services

__all__ = ["run_compare", "default_parallel"]


def default_parallel(trainers: int, jobs: int) -> int:
    """As many runs at once as there are cores for one thread per trainer; at least one, at most `jobs`."""
    return max(1, min(jobs, (os.cpu_count() or 1) // max(trainers, 1)))


def run_compare(topology: str | pathlib.Path, modes: list[str], seeds: list[int] | None, out: str | pathlib.Path,
                overrides: dict | None = None, parallel: int | None = None, keep: bool = False,
                baseline: str = "none", at_step: int | dict[str, int] | None = None) -> dict:
    path = pathlib.Path(topology)
    if not path.is_file():
        raise LauncherError(f"topology file {str(path)!r} does not exist")
    try:
        arms = {spec: variant_settings(spec) for spec in modes}
    except FailedPrecondition as exc:
        raise LauncherError(f"--modes: {exc}") from None
    if baseline not in modes:
        raise LauncherError(f"modes {modes} must include the baseline {baseline!r}"
                            + (" (solo GRPO)" if baseline == "none" else ""))
    for what, values in (("modes", [variant_slug(m) for m in modes]), ("seeds", seeds or [])):
        if len(set(values)) != len(values):
            raise LauncherError(f"{what} {values} name one twice: each run needs its own data folder and run id")
    if parallel is not None and parallel < 1:
        raise LauncherError(f"--parallel {parallel}: run at least one run at a time")
    config = read_settings(path)
    if not config.get("trainers"):
        raise LauncherError(f"{path}: a comparison needs `trainers:` (the pair of policies)")
    for spec, settings in arms.items():      # a value an arm's trainers refuse fails here, before any run
        try:
            validate_trainers(config, path.parent, {**(overrides or {}), **settings})
        except LauncherError as exc:
            raise LauncherError(f"arm {spec!r}: {exc}") from None
    out = pathlib.Path(out).resolve()
    if not keep and out.exists() and any(out.iterdir()):   # its trainers would resume from the old checkpoints
        raise LauncherError(f"{out} is not empty: a comparison starts from scratch; remove it, pass another --out, "
                            f"or --keep to keep its finished runs")
    jobs = [(seed, mode) for seed in seeds or [None] for mode in modes]
    for seed, mode in jobs if keep else []:
        finished, settings = _finished(out, seed, mode), _settings(overrides, mode, seed)
        if finished and finished["settings"] != settings:
            raise LauncherError(f"{out / _label(seed) / variant_slug(mode)} finished with other settings "
                                f"({finished['settings']}; now {settings}): remove it or pass another --out")
    parallel = parallel or default_parallel(len(config["trainers"]), len(jobs))
    with stop_on_signals() as stop:
        runs = _run_all(config, path, jobs, out, overrides, stop, parallel)
    result = compare(runs, baseline, at_step)
    print(f"mrl experiment: report {write_compare_page(result, out)}", flush=True)
    return result


def _label(seed: int | None) -> str:
    return "config" if seed is None else f"s{seed}"


FINISHED = "finished.json"     # in a run's folder once its trainers all exited 0: its settings and metrics files


def _settings(overrides: dict | None, mode: str, seed: int | None) -> dict:
    """What a run's trainers get over their topology's settings, as JSON would read them back."""
    settings = {**(overrides or {}), **variant_settings(mode), **({} if seed is None else {"seed": seed})}
    return json.loads(json.dumps(settings))


def _finished(out: pathlib.Path, seed: int | None, mode: str) -> dict | None:
    """A run's finished.json ({settings, metrics: files, relative to its folder}), if it finished; the files as
    paths."""
    marker = out / _label(seed) / variant_slug(mode) / FINISHED
    if not marker.is_file():
        return None
    finished = json.loads(marker.read_text())
    return {**finished, "metrics": [str(marker.parent / m) for m in finished["metrics"]]}


def _run_one(config: dict, path: pathlib.Path, seed: int | None, mode: str, out: pathlib.Path,
             overrides: dict | None, stop: threading.Event, cpus: int) -> list[str]:
    label, slug = _label(seed), variant_slug(mode)
    if stop.is_set():        # another run failed, or Ctrl-C: do not start
        raise RunFailed(f"stopped before mode {mode}, seed {label}; runs so far are under {out}")
    folder, settings, finished = out / label / slug, _settings(overrides, mode, seed), _finished(out, seed, mode)
    if finished:             # run_compare checked that its settings are these
        print(f"mrl experiment: seed {label}, mode {mode}: kept ({folder / FINISHED})", flush=True)
        return finished["metrics"]
    shutil.rmtree(folder, ignore_errors=True)      # a run cut short: from the start, not from its checkpoints
    run = {**config, "data_dir": str(folder), "run_id": _run_id(config, slug, label)}
    run.pop("report", None)
    for name in installed_services():     # free ports: runs go in parallel, and beside anything already serving
        if run.get(name, {}) is not None:
            run[name] = {**(run.get(name) or {}), "port": 0, "admin_port": 0}
    print(f"mrl experiment: seed {label}, mode {mode}", flush=True)
    results = run_topology(run, path.parent, stop, settings, cpus=cpus)
    if stop.is_set():        # its trainers stopped early (and exited 0): not a complete run
        raise RunFailed(f"stopped during mode {mode}, seed {label}; runs so far are under {out}")
    failed = {p: r["exit_code"] for p, r in results.items() if r["exit_code"] != 0}
    if failed:
        raise RunFailed(f"mode {mode}, seed {label}: trainers failed with exit codes {failed}")
    metrics = [str(r["metrics"]) for r in results.values()]
    relative = [str(pathlib.Path(m).resolve().relative_to(folder)) for m in metrics]
    (folder / FINISHED).write_text(json.dumps({"settings": settings, "metrics": relative}, indent=1))
    return metrics


def _run_id(config: dict, slug: str, label: str) -> str:
    """<run_id>-<arm slug>-<seed label>; one longer than a name may be (mrl.experience.NAME_MAX) keeps its first
    characters and ends in a hash of the whole, so long arms that differ only at the end still get distinct run ids."""
    run_id = f"{config.get('run_id', 'compare')}-{slug}-{label}"
    if len(run_id) <= NAME_MAX:
        return run_id
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    return f"{run_id[:NAME_MAX - len(digest) - 1]}-{digest}"


def _run_all(config: dict, path: pathlib.Path, jobs: list, out: pathlib.Path, overrides: dict | None,
             stop: threading.Event, parallel: int) -> dict[str, dict[str, list[str]]]:
    """{seed label: {mode: metrics files}}; the first failure stops the runs still going and is raised."""
    cpus = max(1, (os.cpu_count() or 1) // parallel)
    failures: list[Exception] = []

    def run(seed, mode):
        try:
            return _run_one(config, path, seed, mode, out, overrides, stop, cpus)
        except Exception as exc:    # noqa: BLE001 - the first is re-raised once every run has ended
            failures.append(exc)    # (list.append is atomic)
            stop.set()
            raise

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        futures = [(seed, mode, pool.submit(run, seed, mode)) for seed, mode in jobs]
        concurrent.futures.wait([f for *_, f in futures])
    if failures:
        raise failures[0]
    runs: dict = {}
    for seed, mode, future in futures:
        runs.setdefault(_label(seed), {})[mode] = future.result()
    return runs
