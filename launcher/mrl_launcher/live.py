"""The live page of a run: one page, served by the launcher while `mrl up` / `mrl demo` runs and by `mrl watch
RUN_DIR` for a finished or remote run, that draws the run's figures (figures.run_figures, the report's own) as the
records arrive, in the browser, with the vendored uPlot (static/, MIT: static/uPlot.LICENSE): no network at view
time.

It reads what the run already writes:

    RUN_DIR/<policy>/metrics.jsonl   each trainer's records (MetricsSink), read as they grow
    RUN_DIR/exchange.jsonl           the exchange's snapshots (`flow`), one JSON line each, written while the run
                                     runs by FlowRecorder from the exchange's admin REST API (/v1/runs/{run}/topics,
                                     /metrics)

A snapshot is {"time": Unix s, "published": {"<producer> <kind>": n}, "taken": {"<producer> → <subscriber>
<kind>": n}, "counters": {"stale dropped": n, "redelivered": n}}: per topic (kind, producer) n = its stream's
length; per subscriber's consumer group on it, taken = length − lag, what the subscriber was delivered of what the
stream keeps; counters = the exchange's mrl_exchange_stale_dropped and mrl_exchange_redelivered (all runs).

Routes: / (the page), /data.json (RunFiles.data: each figure's series now, each line thinned to at most
MAX_POINTS points, each policy's latest numbers, the latest snapshot), /uPlot.iife.min.js, /uPlot.min.css.

A run of days stays light: a line of n > MAX_POINTS points is drawn from every ⌈n / MAX_POINTS⌉-th point and the
last, and snapshots are taken every max(2 s, elapsed / 300): about 300 · (1 + ln(T / 600 s)) of them in a run of
T seconds (T > 600 s).
"""
import contextlib
import http.server
import json
import os
import pathlib
import ssl
import threading
import time
import urllib.error
import urllib.request

from mrl_launcher.analysis import PolicyRun, as_run, num
from mrl_launcher.errors import LauncherError
from mrl_launcher.figures import X_LABELS, Reference, figure_series, run_figures

__all__ = ["RunFiles", "FlowRecorder", "live_page", "read_flow", "watch", "FLOW_FILE", "MAX_POINTS"]

Path = pathlib.Path
STATIC = Path(__file__).parent / "static"
FLOW_FILE = "exchange.jsonl"
MAX_POINTS = 1000
ASSETS = {"/": ("live.html", "text/html; charset=utf-8"),
          "/uPlot.iife.min.js": ("uPlot.iife.min.js", "text/javascript; charset=utf-8"),
          "/uPlot.min.css": ("uPlot.min.css", "text/css; charset=utf-8")}


class _Tail:
    """A JSONL file read as it grows: whole lines only (a line being written waits for its newline)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.records = path, 0, []

    def read(self) -> list[dict]:
        with contextlib.suppress(FileNotFoundError), self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self.offset += end
            self.records += [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]
        return self.records


def read_flow(run_dir: str | Path) -> list[dict]:
    """The exchange's snapshots a run recorded (RUN_DIR/exchange.jsonl); [] when it has none."""
    return _Tail(Path(run_dir) / FLOW_FILE).read()


class RunFiles:
    """A run folder's metrics files and snapshots, read as they grow; data() is the page's /data.json."""

    def __init__(self, run_dir: str | Path, title: str, reference: Reference | None = None):
        self.run_dir, self.title, self.reference = Path(run_dir), title, reference
        self._tails: dict[Path, _Tail] = {}
        self._flow = _Tail(self.run_dir / FLOW_FILE)
        self._lock = threading.Lock()

    def runs(self) -> list[PolicyRun]:
        """One PolicyRun per RUN_DIR/<policy>/metrics.jsonl that has a record; a step logged twice keeps its last
        record (a resumed run), as read_metrics does."""
        runs = []
        for path in sorted(self.run_dir.glob("*/metrics.jsonl")):
            records = self._tails.setdefault(path, _Tail(path)).read()
            if records:
                last = {(r["step"], r.get("kind", "train")): r for r in records}
                runs.append(as_run(path, sorted(last.values(), key=lambda r: r["step"])))
        return runs

    def data(self) -> dict:
        with self._lock:
            runs, flow = self.runs(), self._flow.read()
        figures = []
        for figure in run_figures():
            series = figure_series(figure, runs, flow, self.reference)
            if series:
                figures.append({"name": figure.name, "heading": figure.heading, "text": figure.text,
                                "panels": [{"key": panel.key, "title": panel.title, "xlabel": X_LABELS[panel.x],
                                            "lines": {label: _thin(xs, ys) for label, (xs, ys) in lines.items()}}
                                           for panel, lines in series]})
        return {"title": self.title, "time": time.time(), "figures": figures, "flow": flow[-1] if flow else None,
                "policies": [_latest(run) for run in runs]}


def _thin(xs: list, ys: list) -> list[list]:
    """[xs, ys] with every ⌈n / MAX_POINTS⌉-th point of n, and the last."""
    stride = -(-len(xs) // MAX_POINTS)
    keep = list(range(0, len(xs), stride))
    if keep[-1] != len(xs) - 1:
        keep.append(len(xs) - 1)
    return [[xs[i] for i in keep], [ys[i] for i in keep]]


def _latest(run: PolicyRun) -> dict:
    """A policy's row of the page's table: its last train record's numbers and its last held-out accuracy."""
    train = run.train[-1] if run.train else {}
    evals = run.evals[-1] if run.evals else {}
    return {"policy": run.policy, "sharing": run.sharing, "step": train.get("step"),
            "reward_mean": train.get("reward_mean") if num(train.get("reward_mean")) else None,
            "eval_accuracy": evals.get("eval_accuracy"), "eval_step": evals.get("step"),
            "rollouts_total": run.rollouts_total}


def _handler(files: RunFiles):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            route = self.path.split("?")[0]
            if route == "/data.json":
                body, kind = json.dumps(files.data()).encode(), "application/json"
            elif route in ASSETS:
                name, kind = ASSETS[route]
                body = (STATIC / name).read_bytes()
            else:
                self.send_error(404, f"no page {route}: the live page is /, its data /data.json")
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):     # no line per request on the launcher's output
            pass
    return Handler


@contextlib.contextmanager
def live_page(run_dir: str | Path, title: str, port: int = 0, host: str = "127.0.0.1",
              reference: Reference | None = None):
    """Serve the live page of run_dir on host:port (0: any free port) while the block runs; yields its URL."""
    try:
        server = http.server.ThreadingHTTPServer((host, port), _handler(RunFiles(run_dir, title, reference)))
    except OSError as exc:
        raise LauncherError(f"the live page cannot listen on {host}:{port}: {exc}; choose another port "
                            "(live_port in the topology, --port of mrl watch), or 0 for any free one") from exc
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="mrl-live-page", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class FlowRecorder:
    """Append the exchange's snapshot of a run to RUN_DIR/exchange.jsonl while the block runs, every max(2 s,
    elapsed / 300), when it changed (and once more at the end); `token`: an admin bearer token where auth is on."""

    def __init__(self, admin_url: str, run_id: str, run_dir: str | Path, token: str | None = None):
        self.admin_url, self.run_id, self.token = admin_url.rstrip("/"), run_id, token
        self.path = Path(run_dir) / FLOW_FILE
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mrl-flow-recorder", daemon=True)
        self._last = None
        self._failing = None     # the reason snapshots fail, printed once when it changes

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _get(self, route: str) -> bytes:
        request = urllib.request.Request(self.admin_url + route)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        # https: the exchange's certificate checked against MRL_TLS_ROOT_CERT (or the system's CAs)
        context = ssl.create_default_context(cafile=os.environ.get("MRL_TLS_ROOT_CERT") or None) \
            if self.admin_url.startswith("https:") else None
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return response.read()

    def snapshot(self) -> dict:
        from prometheus_client.parser import text_string_to_metric_families
        topics = json.loads(self._get(f"/v1/runs/{self.run_id}/topics"))["topics"]
        counters = {sample.name: sample.value for family in text_string_to_metric_families(self._get("/metrics")
                                                                                            .decode())
                    for sample in family.samples}
        published, taken = {}, {}
        for topic in topics:
            published[f"{topic['producer']} {topic['kind']}"] = topic["length"]
            for group in topic["groups"]:
                taken[f"{topic['producer']} → {group['subscriber']} {topic['kind']}"] = max(
                    topic["length"] - (group["lag"] or 0), 0)
        return {"published": published, "taken": taken,
                "counters": {"stale dropped": counters["mrl_exchange_stale_dropped_total"],
                             "redelivered": counters["mrl_exchange_redelivered_total"]}}

    def _record(self) -> None:
        try:
            snapshot = self.snapshot()
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            if str(exc) != self._failing:
                print(f"mrl: no snapshot of the exchange at {self.admin_url} ({exc}); trying again", flush=True)
            self._failing = str(exc)
            return
        self._failing = None
        if snapshot != self._last:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"time": time.time(), **snapshot}) + "\n")
            self._last = snapshot

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.wait(max(2.0, (time.monotonic() - start) / 300)):
            self._record()
        self._record()


def watch(run_dir: str | Path, port: int = 0, exchange_admin: str | None = None, run_id: str | None = None,
          token: str | None = None) -> None:
    """`mrl watch`: serve the live page of a run folder until Ctrl-C (or SIGTERM); with `exchange_admin`
    (http://host:port of a running exchange's admin API) and `run_id`, record its snapshots into the folder too."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise LauncherError(f"run folder {str(run_dir)!r} does not exist: pass the data_dir of a topology (the "
                            "folder holding <policy>/metrics.jsonl)")
    if not any(run_dir.glob("*/metrics.jsonl")) and not exchange_admin:
        raise LauncherError(f"{run_dir} holds no <policy>/metrics.jsonl: pass the data_dir of a topology, whose "
                            "trainers write there")
    if exchange_admin and not run_id:
        raise LauncherError("--exchange-admin needs --run-id: the run whose topics to read")
    with contextlib.ExitStack() as stack:
        if exchange_admin:
            stack.enter_context(FlowRecorder(exchange_admin, run_id, run_dir, token))
        title = f"mrl run {run_id}" if run_id else f"mrl {run_dir.resolve().name}"
        url = stack.enter_context(live_page(run_dir, title, port))
        print(f"mrl watch: {url}  (Ctrl-C to stop)", flush=True)
        from mrl_launcher.topology import stop_on_signals     # topology serves this page too: imported here
        with stop_on_signals() as stop:
            stop.wait()
