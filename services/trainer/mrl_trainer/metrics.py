"""Per-step metrics: one JSON line per step, Prometheus gauges, and the trackers of `tracking.report_to`.

Every record carries `step`, `policy` and, in the JSONL file, `time` (Unix seconds when it was logged: a
train record's is the end of its step); its finite numbers become gauges `mrl_trainer_<name>`
labelled by policy (served on `metrics.prometheus_port` when set) and each tracker's scalars `<kind>/<name>`
at `step` (train/reward_mean, eval/eval_accuracy: mrl_trainer.tracking). A resumed run appends to the same JSONL
file, so a curve spans restarts.
"""
import json
import math
import pathlib
import re
import time

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from mrl_trainer.tracking import Tracker

__all__ = ["MetricsSink", "read_metrics"]


class MetricsSink:
    def __init__(self, policy: str, jsonl: str | pathlib.Path, prometheus_port: int | None = None,
                 trackers: list[Tracker] = ()):
        self.policy = policy
        self.path = pathlib.Path(jsonl)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self.registry = CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}
        self.port = None
        self._server = None
        if prometheus_port is not None:
            self._server, _ = start_http_server(prometheus_port, addr="127.0.0.1", registry=self.registry)
            self.port = self._server.server_port
        self.trackers = list(trackers)     # opened and closed by their owner (tracking.open_trackers)

    def log(self, step: int, **values) -> None:
        # JSON has no NaN: a non-finite value is written as null
        clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()}
        self._file.write(json.dumps({"step": step, "policy": self.policy, "time": time.time(), **clean}) + "\n")
        self._file.flush()
        numbers = {name: float(value) for name, value in values.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}
        for name, value in numbers.items():
            self._gauge(name).labels(policy=self.policy).set(value)
        tracked = {f"{values.get('kind', 'train')}/{name}": value for name, value in numbers.items()}
        for tracker in self.trackers:
            tracker.log(step, tracked)

    def _gauge(self, name: str) -> Gauge:
        if name not in self._gauges:
            metric = "mrl_trainer_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)
            self._gauges[name] = Gauge(metric, f"trainer metric {name}", ["policy"], registry=self.registry)
        return self._gauges[name]

    def close(self) -> None:
        self._file.close()
        if self._server:
            self._server.shutdown()


def read_metrics(path: str | pathlib.Path) -> list[dict]:
    """The records of a metrics file; a step logged twice (a resumed run) keeps its last record."""
    records: dict[tuple, dict] = {}
    for line in pathlib.Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            records[(r["step"], r.get("kind", "train"))] = r
    return sorted(records.values(), key=lambda r: r["step"])
