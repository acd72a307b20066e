"""Run the platform's services as local processes: `mrl up CONFIG`, demos and benchmarks.

A topology file (examples/local.yaml):

    redis_url: null          # null: an embedded redis-server persisting under data_dir
    data_dir: .mrl/local
    exchange:                # settings of each service (its settings' field names); a service
      port: 50051            # set to null is not started
      admin_port: 8080
    tokenizer_align:
      port: 50052
      admin_port: 8081
    scheduler:
      slots: 4               # CPU-only: declared devices (GPUs are found by NVML)
    run_id: local            # the run the trainers share
    trainers:                # optional: N trainers (paths relative to this file), each with overrides
      - config: policy-a.yaml
        set: {sharing.mode: sgt}
        ranks: 1             # optional: > 1 trains it under torchrun, sharded over that many devices
    report: report           # optional: an HTML report of the trainers' metrics, under data_dir
    live_port: 0             # the live page's port while the run runs (0, the default: any free port; null: none)
    solo_reference: ../docs/compare-gemma-screening/compare.json   # optional, relative to this file: the solo
                             # arm of an earlier comparison, drawn dashed beside each policy's held-out accuracy on
                             # the live page and in the report (labelled as the comparison's, not this run's)

Each service installed (entry points `mrl.services`) is a child process (`python -m mrl.cli ...
serve`, mrl_serving.processes) that prints one JSON "ready" line with its ports; a service's
default ports are its settings' defaults. Each trainer is a child `mrl trainer run CONFIG` pointed at the
services (exchange.target, sharing.align.target, scheduler.target), with its checkpoints and
metrics under data_dir/<policy>/; a trainer with a cached warm start does it first (`mrl trainer warm-start`,
all of them at once, into the model cache), so that no policy starts its steps while a peer is still
warm-starting; with `ranks: N` > 1 it is `torchrun --standalone --nproc-per-node N -m mrl.cli
trainer run CONFIG`. Every trainer's trackers (tracking.report_to) write under data_dir/tracking, so that the
policies of the run sit side by side. While the run runs, the launcher serves its live page (mrl_launcher.live) and
records the exchange's snapshots into data_dir/exchange.jsonl; `mrl watch DATA_DIR` serves the page again later.
With trainers, `up` returns when they have all finished (and the report is written); without, it serves until
Ctrl-C. Ctrl-C (or SIGTERM) asks the
trainers to finish their step and checkpoint (under torchrun: its ranks, not torchrun itself, which would
stop them before they are done), then stops the services, then Redis.
"""
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import psutil
import yaml

from mrl_launcher.errors import LauncherError, RunFailed
from mrl_launcher.figures import Reference, read_reference
from mrl_launcher.live import FlowRecorder, live_page, read_flow
from mrl_serving.child_process import die_with_parent
from mrl_serving.processes import redis_for, spawn
from mrl_serving.registry import installed_services
from mrl_trainer.tracking import tensorboard_command

__all__ = ["up", "run_topology", "validate_trainers", "stop_on_signals", "data_dir_of", "TRAINER_STOP_GRACE_S"]

TRAINER_STOP_GRACE_S = 600   # a trainer asked to stop finishes its step and checkpoints first


def _trainer_overrides(spec: dict, base: pathlib.Path, run_id: str, data_dir: pathlib.Path,
                       running: dict) -> tuple[str, str, dict]:
    """(config path, policy, --set overrides) of one `trainers:` entry, pointed at the running services."""
    path, policy = _entry(spec, base)
    overrides = {"run_id": run_id, "checkpoint.dir": str(data_dir / policy / "checkpoints"),
                 "metrics.jsonl": str(data_dir / policy / "metrics.jsonl"), "metrics.progress": False,
                 "tracking.dir": str(data_dir / "tracking")}
    address = lambda name: f"127.0.0.1:{running[name].ready['grpc_port']}"  # noqa: E731
    if "exchange" in running:
        overrides["exchange.target"] = address("exchange")
    if "tokenizer_align" in running:
        overrides["sharing.align"] = {"target": address("tokenizer_align")}
    if "scheduler" in running:
        overrides["scheduler.target"] = address("scheduler")
    overrides.update(spec.get("set") or {})
    return str(path), policy, overrides


def _start_trainer(path: str, overrides: dict, threads: int, ranks: int = 1,
                   command: str = "run", stdout=None) -> subprocess.Popen:
    """`mrl trainer run` of one trainer, under torchrun when ranks > 1 (each rank threads // ranks threads); or
    another `mrl trainer` command on the same config (`warm-start`, in one process). `stdout`: as Popen's (None:
    this process's)."""
    launch = (["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
              if ranks > 1 and command == "run" else [])
    args = [sys.executable, *launch, "-m", "mrl.cli", "trainer", command, path]
    for key, value in overrides.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    threads = str(max(1, threads // ranks))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    return subprocess.Popen(args, env=env, stdout=stdout, preexec_fn=die_with_parent, start_new_session=True)


PATH_SETTINGS = ("auth_file", "tls_cert", "tls_key")   # a service's settings that name files


def _service_settings(cls, section: dict, base: pathlib.Path) -> dict:
    """A service's settings in a topology: its default ports, then its section, whose files (PATH_SETTINGS) are
    relative to the topology file's folder `base`, as data_dir is."""
    settings = {"port": cls.model_fields["port"].default, "admin_port": cls.model_fields["admin_port"].default,
                **section}
    for key in PATH_SETTINGS:
        if settings.get(key):
            settings[key] = str((base / os.path.expanduser(str(settings[key]))).resolve())
    return settings


def _rest_scheme(settings: dict) -> str:
    """https when the service serves TLS (its tls_cert, or MRL_TLS_CERT, which every service inherits)."""
    return "https" if settings.get("tls_cert") or os.environ.get("MRL_TLS_CERT") else "http"


def data_dir_of(config: dict, base: pathlib.Path) -> pathlib.Path:
    """A topology's data_dir (relative to its file's folder `base`), absolute."""
    return (base / config.get("data_dir", ".mrl/local")).resolve()


def solo_reference(config: dict, base: pathlib.Path) -> Reference | None:
    """The topology's `solo_reference` (relative to its folder), read; None without one."""
    return read_reference(base / config["solo_reference"]) if config.get("solo_reference") else None


def _entry(spec, base: pathlib.Path) -> tuple[pathlib.Path, str]:
    """(config path, policy) of one `trainers:` entry, checked; the policy is its `set: {policy: …}`, else its
    config's `policy`, else the file's stem."""
    if not isinstance(spec, dict) or "config" not in spec or set(spec) - {"config", "set", "ranks"}:
        raise LauncherError(f"each trainers entry needs `config` (a trainer YAML) and optional `set` and `ranks`; "
                            f"got {spec!r}")
    ranks = spec.get("ranks", 1)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise LauncherError(f"trainers entry {spec['config']!r}: ranks must be a whole number >= 1, got {ranks!r}")
    path = base / spec["config"]
    if not path.is_file():
        raise LauncherError(f"trainer config {str(path)!r} does not exist")
    chosen = spec.get("set") or {}
    return path, str(isinstance(chosen, dict) and chosen.get("policy") or read_settings(path).get("policy", path.stem))


def _refuse_repeated_policies(specs: list, base: pathlib.Path) -> None:
    """Every entry checked, and each policy once: two entries of one policy would share its checkpoints and
    metrics folder."""
    seen = set()
    for spec in specs:
        _, policy = _entry(spec, base)
        if policy in seen:
            raise LauncherError(f"policy {policy!r} is run by two trainers entries; give each its own "
                                f"(set: {{policy: …}}), as they would share data_dir/{policy}/")
        seen.add(policy)


def validate_trainers(config: dict, base: pathlib.Path, overrides: dict | None = None) -> dict[str, pathlib.Path]:
    """Validate each trainer of a topology as run_topology would start it (its file, its `set`, then `overrides`;
    the service addresses are the file's own, run_topology's are known only once the services run), before
    anything starts; return {policy: the metrics.jsonl it will write}. A setting it refuses is a LauncherError."""
    from mrl_trainer.config import load_config
    from mrl_trainer.errors import TrainerError
    metrics = {}
    _refuse_repeated_policies(config.get("trainers") or [], base)
    for spec in config.get("trainers") or []:
        path, policy, extra = _trainer_overrides(spec, base, config.get("run_id", "local"), data_dir_of(config, base), {})
        try:
            load_config(path, {**extra, **(overrides or {})})
        except TrainerError as exc:
            raise LauncherError(str(exc)) from None
        metrics[policy] = pathlib.Path(extra["metrics.jsonl"])
    return metrics


@contextlib.contextmanager
def stop_on_signals():
    """An Event set by SIGINT or SIGTERM while the block runs; the previous handlers come back after it.

    A watcher thread sets it, not the handler: a Python handler runs in the main thread between bytecodes, and
    Event.set takes the Event's lock, which the main thread holds for a moment inside stop.wait() — a signal in
    that moment would deadlock it. The interpreter's C handler writes each signal's number to a wakeup pipe
    (signal.set_wakeup_fd); the watcher reads the pipe and sets the Event."""
    stop = threading.Event()
    wanted = {signal.SIGINT, signal.SIGTERM}
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def watch():
        while data := os.read(read_fd, 64):     # b"" once the write end is closed
            if wanted & set(data):
                stop.set()

    watcher = threading.Thread(target=watch, name="mrl-stop-on-signals", daemon=True)
    watcher.start()
    previous_fd = signal.set_wakeup_fd(write_fd)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in wanted}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(write_fd)
        watcher.join()
        os.close(read_fd)


def run_topology(config: dict, base: pathlib.Path, stop: threading.Event, overrides: dict | None = None,
                 cpus: int | None = None) -> dict:
    """Start Redis, the services and the trainers of a topology; return {policy: exit code, metrics path}.

    `overrides` are applied to every trainer after its own `set` (e.g. {"sharing.mode": "prp"}). The
    trainers share `cpus` cores (default: all), each with cpus // trainers compute threads (at least one).
    """
    services = installed_services()    # started in the order of their default ports
    valid = {"redis_url", "data_dir", "run_id", "trainers", "report", "live_port", "solo_reference", *services}
    if set(config) - valid:
        raise LauncherError(f"unknown topology keys {sorted(set(config) - valid)}; valid: {', '.join(sorted(valid))}")
    _refuse_repeated_policies(config.get("trainers") or [], base)
    reference = solo_reference(config, base)
    data_dir = data_dir_of(config, base)
    results: dict = {}
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(redis_for(config.get("redis_url"), data_dir))
        print(f"mrl up: redis {url}", flush=True)
        running = {}
        for name, cls in services.items():
            if name in config and config[name] is None:
                continue
            settings = _service_settings(cls, config.get(name) or {}, base)
            running[name] = stack.enter_context(spawn(name, url, **settings))
            r = running[name].ready
            print(f"  {name:<16} gRPC 127.0.0.1:{r['grpc_port']}  REST {_rest_scheme(settings)}://127.0.0.1:"
                  f"{r['admin_port']}/docs", flush=True)
        run_id = config.get("run_id", "local")
        if "exchange" in running:     # its snapshots, recorded until the trainers have stopped
            scheme = _rest_scheme(_service_settings(services["exchange"], config.get("exchange") or {}, base))
            stack.enter_context(FlowRecorder(f"{scheme}://127.0.0.1:{running['exchange'].ready['admin_port']}", run_id,
                                             data_dir, token=os.environ.get("MRL_TOKEN")))
        if config.get("live_port", 0) is not None:
            url = stack.enter_context(live_page(data_dir, f"mrl run {run_id}", config.get("live_port", 0),
                                                reference=reference))
            print(f"  live page        {url}  (afterwards: mrl watch {data_dir})", flush=True)
        trainers: dict = {}
        stack.callback(_stop_trainers, trainers, results)   # runs before the services and Redis stop
        specs = config.get("trainers") or []
        threads = max(1, (cpus or os.cpu_count() or 1) // max(len(specs), 1))
        starts = [(spec, *_trainer_overrides(spec, base, config.get("run_id", "local"), data_dir, running))
                  for spec in specs]
        for *_, extra in starts:
            extra.update(overrides or {})
        if not _warm_starts({policy: (path, extra) for _, path, policy, extra in starts}, threads, stop):
            return results      # stopped during the warm starts: no trainer started
        for spec, path, policy, extra in starts:
            ranks = spec.get("ranks", 1)
            trainers[policy] = (_start_trainer(path, extra, threads, ranks), extra["metrics.jsonl"])
            shown = f", {ranks} ranks under torchrun" if ranks > 1 else ""
            print(f"  trainer {policy:<8} {path}  ({threads} thread(s){shown})", flush=True)
        if any("tensorboard" in _tracking(path, extra).report_to for _, path, _, extra in starts):
            print(f"  TensorBoard      {tensorboard_command(data_dir / 'tracking', run_id)}", flush=True)
        print("Ctrl-C to stop.", flush=True)
        while not stop.wait(0.5):
            for name, process in running.items():
                if process.proc.poll() is not None:
                    raise RunFailed(f"{name} exited with code {process.proc.returncode}")
            if trainers and all(proc.poll() is not None for proc, _ in trainers.values()):
                break
    return results


def _tracking(path: str, overrides: dict):
    """The tracking section of a trainer as it is started (its file, then the launcher's overrides)."""
    from mrl_trainer.config import load_config
    from mrl_trainer.errors import TrainerError
    try:
        return load_config(path, overrides).tracking
    except TrainerError as exc:
        raise LauncherError(str(exc)) from None


def _warm_starts(trainers: dict, threads: int, stop: threading.Event) -> bool:
    """Run `mrl trainer warm-start` for each trainer {policy: (config path, overrides)} whose config has a cached
    warm start, all at once, and wait for them: no policy takes its first step (and waits for its peers' first)
    while a peer is still warm-starting. Every config is loaded before any process starts. False when `stop` was
    set meanwhile; RunFailed when one fails. Either way the others are asked to stop (each stops before its next
    supervised step) and waited for, within TRAINER_STOP_GRACE_S, then killed."""
    from mrl_trainer.config import load_config
    from mrl_trainer.errors import TrainerError
    try:
        wanted = {policy: (path, extra) for policy, (path, extra) in trainers.items()
                  if (spec := load_config(path, extra).warm_start) and spec.cache}
    except TrainerError as exc:
        raise LauncherError(str(exc)) from None
    pending = {}
    failed = {}
    try:
        for policy, (path, extra) in wanted.items():
            pending[policy] = _start_trainer(path, extra, threads, command="warm-start", stdout=subprocess.DEVNULL)
        if pending:
            print(f"  warm starts first: {', '.join(pending)}", flush=True)
        while not stop.is_set():
            failed = {policy: proc.returncode for policy, proc in pending.items() if proc.poll() not in (None, 0)}
            if failed or all(proc.poll() is not None for proc in pending.values()):
                break
            stop.wait(0.5)
    finally:
        _stop(pending.values())
    if failed:
        raise RunFailed(f"warm starts failed (exit codes {failed})")
    return not stop.is_set()


def _stop_trainers(trainers: dict, results: dict) -> None:
    """Stop the trainers still running (_stop) and record {policy: exit code, metrics path} in `results`."""
    _stop([proc for proc, _ in trainers.values()])
    for policy, (proc, metrics) in trainers.items():
        results[policy] = {"exit_code": proc.returncode, "metrics": metrics}


def _stop(procs) -> None:
    """SIGTERM the `mrl trainer` processes still running (each finishes its step and checkpoints, or stops its
    warm start), wait for all of them within one grace period, kill what is left. A trainer under torchrun is
    asked through its ranks (torchrun's children): torchrun itself, signalled, would stop them before they have
    checkpointed, and exits once they have."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            for target in _trainer_processes(proc):
                with contextlib.suppress(psutil.NoSuchProcess):
                    target.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + TRAINER_STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _trainer_processes(proc: subprocess.Popen) -> list:
    """The processes that train: the trainer itself, or torchrun's ranks when it runs under torchrun."""
    try:
        parent = psutil.Process(proc.pid)
        if "torch.distributed.run" in parent.cmdline():
            return parent.children() or [parent]
        return [parent]
    except psutil.NoSuchProcess:
        return []


def read_settings(path: pathlib.Path) -> dict:
    """A YAML file of settings (a topology, a trainer config): its mapping ({} when empty); LauncherError naming the
    file when it is not valid YAML or not a mapping."""
    try:
        settings = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise LauncherError(f"{path}: not valid YAML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise LauncherError(f"{path}: cannot read it: {exc}") from exc
    if not isinstance(settings, dict):
        raise LauncherError(f"{path}: expected a mapping of settings, got {type(settings).__name__}")
    return settings


def up(config_path: str, overrides: dict | None = None) -> dict:
    """Run a topology (run_topology), each trainer with `overrides` after its own settings (`mrl demo`:
    tracking.report_to), every trainer validated before anything starts; then its report."""
    path = pathlib.Path(config_path)
    if not path.is_file():
        raise LauncherError(f"topology file {str(path)!r} does not exist (the examples are in the repository's "
                         f"examples/ folder: run from its root)")
    config = read_settings(path)
    validate_trainers(config, path.parent, overrides)
    with stop_on_signals() as stop:
        results = run_topology(config, path.parent, stop, overrides)
    print("mrl up: stopped", flush=True)
    for policy, r in results.items():
        print(f"  trainer {policy}: exit code {r['exit_code']}, metrics {r['metrics']}", flush=True)
    if results and config.get("report"):
        from mrl_launcher.report import write_report
        try:
            out = write_report([r["metrics"] for r in results.values() if pathlib.Path(r["metrics"]).is_file()],
                               data_dir_of(config, path.parent) / config["report"],
                               title=f"mrl run {config.get('run_id', 'local')}",
                               flow=read_flow(data_dir_of(config, path.parent)),
                               reference=solo_reference(config, path.parent))
            print(f"mrl up: report {out}", flush=True)
        except LauncherError as exc:
            print(f"mrl up: no report: {exc}", flush=True)
    failed = {policy: r["exit_code"] for policy, r in results.items() if r["exit_code"] != 0}
    if failed:
        raise RunFailed(f"trainers failed (exit codes {failed})")
    return results
