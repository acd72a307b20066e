"""Experiment trackers: every metric the trainer records (MetricsSink.log), through each tracker's own library.

    tensorboard   SummaryWriter event files    DIR/tensorboard/<run_id>/<policy>/
    wandb         a W&B run, group <run_id>     DIR/wandb/  (offline by default: no network, `wandb sync` later)
    mlflow        an MLflow run in the          DIR/mlruns/ (a local file store)
                  experiment <run_id>
    trackio       a Trackio run in the          DIR/trackio/
                  project <run_id>

DIR is `tracking.dir`. The run id names the experiment (TensorBoard's log dir, W&B's group, MLflow's experiment,
Trackio's project) and the policy names the run, so that the policies of one mutual run sit side by side in one
view. Each tracker is an optional extra of the trainer package (`pip install 'mrl-trainer[wandb]'`), imported only
when named; a name whose package is missing is refused when the config loads (TrackingConfig), not mid-run.

A tracker logs a record's finite numbers (booleans and text left out) at the record's step, each named
`<kind>/<name>`: train/reward_mean, train/loss, ... for a step's record, eval/eval_accuracy and eval/rollouts_total
for the held-out eval at that step (MetricsSink.log).
"""
import contextlib
import fcntl
import importlib.util
import os
import pathlib
import shlex
import time
from typing import Literal

from pydantic import Field, field_validator

from mrl_trainer.section import Section

__all__ = ["TrackingConfig", "Tracker", "TRACKERS", "open_trackers", "tensorboard_command"]

TrackerName = Literal["tensorboard", "wandb", "mlflow", "trackio"]


class TrackingConfig(Section):
    report_to: list[TrackerName] = Field([], description="Trackers that receive every metric: tensorboard, wandb, "
                                         "mlflow, trackio (each an extra: pip install 'mrl-trainer[NAME]'). "
                                         "The run id names the experiment, the policy the run.")
    dir: str = Field(".mrl/tracking", description="Where the trackers write (tensorboard/, wandb/, mlruns/, "
                                                   "trackio/); `mrl up` puts every policy's under data_dir/tracking.")
    wandb_mode: Literal["offline", "online"] = Field("offline", description="W&B: offline writes run files to "
                                                     "the disk only (no network, `wandb sync` later); online "
                                                     "needs a login.")

    @field_validator("report_to")
    @classmethod
    def _installed(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError(f"tracking.report_to names a tracker twice: {names}")
        for name in names:
            if importlib.util.find_spec(TRACKERS[name].module) is None:
                raise ValueError(f"tracking.report_to names {name!r}, whose package {TRACKERS[name].module!r} is "
                                 f"not installed: pip install 'mrl-trainer[{name}]' (or leave {name!r} out)")
        return names


class Tracker:
    """One policy's run in one tracker: log(step, values) of finite numbers, then close()."""
    module: str     # the package that must be importable

    def log(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TensorBoard(Tracker):
    module = "tensorboard"

    def __init__(self, config: TrackingConfig, run_id: str, policy: str, params: dict):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(pathlib.Path(config.dir) / "tensorboard" / run_id / policy))

    def log(self, step, values):
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class WandB(Tracker):
    module = "wandb"

    def __init__(self, config: TrackingConfig, run_id: str, policy: str, params: dict):
        import wandb
        pathlib.Path(config.dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project="mrl", group=run_id, name=policy, dir=config.dir, mode=config.wandb_mode,
                              config=params, reinit="create_new")

    def log(self, step, values):
        self.run.log(values, step=step)

    def close(self):
        self.run.finish()


class MLflow(Tracker):
    module = "mlflow"

    def __init__(self, config: TrackingConfig, run_id: str, policy: str, params: dict):
        from mlflow.tracking import MlflowClient
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"   # MLflow refuses its file store unless this opts in
        store = pathlib.Path(config.dir).resolve() / "mlruns"
        store.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=store.as_uri())
        with open(store / ".experiments.lock", "w") as lock:   # the policies of a run create its experiment once
            fcntl.flock(lock, fcntl.LOCK_EX)
            found = self.client.get_experiment_by_name(run_id)
            experiment = found.experiment_id if found else self.client.create_experiment(run_id)
        self.run = self.client.create_run(experiment, run_name=policy).info.run_id   # MLflow's id of this run
        self.client.log_batch(self.run, params=_params(params))

    def log(self, step, values):
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run, metrics=[Metric(_mlflow_key(k), v, now, step) for k, v in values.items()])

    def close(self):
        self.client.set_terminated(self.run)


class Trackio(Tracker):
    module = "trackio"

    def __init__(self, config: TrackingConfig, run_id: str, policy: str, params: dict):
        os.environ["TRACKIO_DIR"] = str(pathlib.Path(config.dir).resolve() / "trackio")   # read when imported
        import trackio
        self.run = trackio.init(project=run_id, name=policy, config=params, auto_log_cpu=False, auto_log_gpu=False)

    def log(self, step, values):
        self.run.log(values, step=step)

    def close(self):
        self.run.finish()


TRACKERS: dict[str, type[Tracker]] = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow,
                                      "trackio": Trackio}


def _params(params: dict) -> list:
    """A config as MLflow params: dotted keys, text values of at most MLflow's 6000 characters."""
    from mlflow.entities import Param
    flat = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = str(value)[:6000]
    walk("", params)
    return [Param(_mlflow_key(k), v) for k, v in flat.items()]


def _mlflow_key(name: str) -> str:
    """MLflow keys take letters, digits, _ - . space / only."""
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in name)


def open_trackers(config: TrackingConfig, run_id: str, policy: str, params: dict,
                  closing: contextlib.ExitStack) -> list[Tracker]:
    """The trackers config.report_to names, each opened for (run_id, policy) and closed by `closing`."""
    trackers = []
    for name in config.report_to:
        tracker = TRACKERS[name](config, run_id, policy, params)
        closing.callback(tracker.close)
        trackers.append(tracker)
    return trackers


def tensorboard_command(tracking_dir: str | pathlib.Path, run_id: str) -> str:
    """The command that opens a run's policies side by side in TensorBoard."""
    return f"tensorboard --logdir {shlex.quote(str(pathlib.Path(tracking_dir) / 'tensorboard' / run_id))}"
