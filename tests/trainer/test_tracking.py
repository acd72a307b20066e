"""tracking.report_to: a real tiny run logs every metric to TensorBoard, W&B (offline), MLflow and Trackio, each
read back with the tracker's own reader; the policies of one run sit side by side; a bad name or a missing
package is refused when the config loads."""
import contextlib
import json
import math
import pathlib
import subprocess
import sys

import pytest

from mrl_trainer.config import TrainerConfig, load_config
from mrl_trainer.errors import TrainerError
from mrl_trainer.metrics import MetricsSink, read_metrics
from mrl_trainer.trainer import build_trainer
from mrl_trainer.tracking import TRACKERS, TrackingConfig, open_trackers
from helpers import tiny_config

ALL = list(TRACKERS)


def _numbers(record: dict) -> dict[str, float]:
    return {k: float(v) for k, v in record.items() if k not in ("step", "time") and isinstance(v, (int, float))
            and not isinstance(v, bool) and v is not None and math.isfinite(v)}


def _tensorboard(folder: pathlib.Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _mlflow(store: pathlib.Path, run_id: str) -> dict[str, dict[str, dict[int, float]]]:
    """{policy: {metric: {step: value}}} of the MLflow experiment `run_id`."""
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name(run_id)
    out = {}
    for run in client.search_runs([experiment.experiment_id]):
        out[run.info.run_name] = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
                                  for key in run.data.metrics}
        assert run.info.status == "FINISHED"
    return out


def _wandb(folder: pathlib.Path) -> dict[str, tuple[str, dict[str, dict[int, float]]]]:
    """{run name: (group, {metric: {step: value}})} from W&B's offline run files (its DataStore reader)."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal.datastore import DataStore
    out = {}
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        store = DataStore()
        store.open_for_scan(str(path))
        name, group, history = None, None, {}
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "run":
                name, group = record.run.display_name, record.run.run_group
            elif record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                step = int(items.pop("_step"))
                for key, value in items.items():
                    if not key.startswith("_"):
                        history.setdefault(key, {})[step] = value
        out[name] = (group, history)
    return out


def _trackio(run_id: str) -> dict[str, dict[str, dict[int, float]]]:
    """{policy: {metric: {step: value}}} of the Trackio project `run_id`, from its local storage."""
    from trackio.sqlite_storage import SQLiteStorage
    out = {}
    for name in SQLiteStorage.get_runs(run_id):
        metrics = {}
        for log in SQLiteStorage.get_logs(run_id, name):
            for key, value in log.items():
                if key not in ("step", "timestamp") and isinstance(value, (int, float)):
                    metrics.setdefault(key, {})[log["step"]] = value
        out[name] = metrics
    return out


def _expected(records: list[dict]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for record in records:
        for key, value in _numbers(record).items():
            out.setdefault(f"{record.get('kind', 'train')}/{key}", {})[record["step"]] = value
    return out


def _same(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]], tracker: str) -> None:
    assert set(want) <= set(got), f"{tracker} lacks {sorted(set(want) - set(got))}"
    for key, steps in want.items():
        assert set(got[key]) == set(steps), (tracker, key)
        for step, value in steps.items():
            assert got[key][step] == pytest.approx(value, rel=1e-5, abs=1e-6), (tracker, key, step)


def test_a_real_run_logs_every_metric_to_every_tracker(tmp_path, monkeypatch):
    """Two steps and three evals of a tiny GPT-2, with no network (every HTTP(S) request would go to a closed
    port): each tracker holds every number of the metrics file."""
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(proxy, "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("no_proxy", "")
    tracking = tmp_path / "tracking"
    config = TrainerConfig.model_validate(tiny_config(
        tmp_path, run_id="tracked", policy="tiny", **{"eval.every": 1, "tracking.report_to": ALL,
                                                      "tracking.dir": str(tracking)}))
    trainer = build_trainer(config)
    try:
        trainer.run()
    finally:
        trainer.close()
    records = read_metrics(tmp_path / "ckpt" / "metrics.jsonl")
    want = _expected(records)
    assert {"train/reward_mean", "train/rollouts_total", "eval/eval_accuracy", "eval/rollouts_total"} <= set(want)
    assert sorted(want["eval/eval_accuracy"]) == [0, 1, 2] and sorted(want["train/reward_mean"]) == [0, 1]
    _same(_tensorboard(tracking / "tensorboard" / "tracked" / "tiny"), want, "tensorboard")
    _same(_mlflow(tracking / "mlruns", "tracked")["tiny"], want, "mlflow")
    group, history = _wandb(tracking)["tiny"]
    assert group == "tracked"
    _same(history, want, "wandb")
    _same(_trackio("tracked")["tiny"], want, "trackio")


def test_the_policies_of_one_run_sit_side_by_side(tmp_path):
    """Two policies of run r2 into one tracking dir: one TensorBoard folder, MLflow experiment, W&B group and
    Trackio project for the run, one run per policy in each."""
    config = TrackingConfig(report_to=ALL, dir=str(tmp_path))
    with contextlib.ExitStack() as closing:
        for i, policy in enumerate(("policy-a", "policy-b")):
            sink = MetricsSink(policy, tmp_path / policy / "metrics.jsonl",
                               trackers=open_trackers(config, "r2", policy, {"policy": policy}, closing))
            closing.callback(sink.close)
            sink.log(0, reward_mean=0.5 + i, sharing="sgt", peers_complete=True)
            sink.log(1, reward_mean=0.25 + i, loss=float("nan"))
    assert sorted(p.name for p in (tmp_path / "tensorboard" / "r2").iterdir()) == ["policy-a", "policy-b"]
    assert _tensorboard(tmp_path / "tensorboard" / "r2" / "policy-b") == {"train/reward_mean": {0: 1.5, 1: 1.25}}
    assert {p: m["train/reward_mean"] for p, m in _mlflow(tmp_path / "mlruns", "r2").items()} == {
        "policy-a": {0: 0.5, 1: 0.25}, "policy-b": {0: 1.5, 1: 1.25}}
    runs = {name: run for name, run in _wandb(tmp_path).items() if run[0] == "r2"}
    assert {name: run[1]["train/reward_mean"] for name, run in runs.items()} == {
        "policy-a": {0: 0.5, 1: 0.25}, "policy-b": {0: 1.5, 1: 1.25}}
    assert {p: m["train/reward_mean"] for p, m in _trackio("r2").items()} == {
        "policy-a": {0: 0.5, 1: 0.25}, "policy-b": {0: 1.5, 1: 1.25}}


@pytest.mark.parametrize("report_to, error", [
    (["neptune"], "tensorboard', 'wandb', 'mlflow' or 'trackio"),
    (["tensorboard", "tensorboard"], "names a tracker twice"),
    ("tensorboard", "valid list"),
], ids=["unknown-name", "twice", "not-a-list"])
def test_a_bad_report_to_is_refused_at_load(tmp_path, report_to, error):
    path = tmp_path / "trainer.yaml"
    path.write_text(json.dumps(tiny_config(tmp_path, **{"tracking.report_to": report_to})))
    with pytest.raises(TrainerError, match=error):
        load_config(path)


@pytest.mark.parametrize("tracker", ALL)
def test_a_tracker_whose_package_is_missing_is_refused_at_load(tmp_path, tracker):
    """In a Python whose path lacks the installed packages (as where the extra was never installed), the config
    that names the tracker fails to load, naming the extra to install."""
    path = tmp_path / "trainer.yaml"
    path.write_text(json.dumps(tiny_config(tmp_path, **{"tracking.report_to": [tracker]})))
    script = ("import sys\nfrom mrl_trainer.config import load_config\n"
              "sys.path[:] = [p for p in sys.path if 'site-packages' not in p]\n"
              f"load_config({str(path)!r})\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"pip install 'mrl-trainer[{tracker}]'" in out.stderr and "TrainerError" in out.stderr
