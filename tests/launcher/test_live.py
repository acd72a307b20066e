"""The live page as a user sees it: a real two-policy run under `mrl demo`, its page opened in headless Chromium
(apt: chromium chromium-driver) while the run runs, then `mrl watch` of the finished run; what the page reads
(metrics files as they grow, the exchange's snapshots) and shares with the report; the demo's trackers."""
import json
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import yaml

from mrl_launcher.errors import LauncherError
from mrl_launcher.live import MAX_POINTS, RunFiles, live_page, watch
from mrl_launcher.report import write_report
from helpers import tiny_config

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs chromium and chromium-driver "
                                    "(apt-get install -y chromium chromium-driver)")


def _pair(tmp_path: pathlib.Path, steps: int) -> pathlib.Path:
    """A topology of two tiny GPT-2 policies, SGT and PRP, with the exchange and THL (no scheduler, no warm start)."""
    for policy, peer, mode, seed in (("policy-a", "policy-b", "sgt", 3), ("policy-b", "policy-a", "prp", 4)):
        config = tiny_config(tmp_path, policy=policy, seed=seed, steps=steps,
                             **{"eval.every": 5, "rollout.group_size": 4, "checkpoint.every": 100})
        config["sharing"] = {"mode": mode, "peers": [peer], "peer_wait_s": 30}
        config["exchange"] = {"target": "set-by-mrl-up:1", "tokenizer_id": "gpt2"}
        (tmp_path / f"{policy}.yaml").write_text(yaml.safe_dump(config))
    topology = {"data_dir": "run", "run_id": "live", "exchange": {"port": 0, "admin_port": 0},
                "tokenizer_align": {"port": 0, "admin_port": 0}, "scheduler": None, "report": "report",
                "trainers": [{"config": "policy-a.yaml"}, {"config": "policy-b.yaml"}]}
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology))
    return tmp_path / "topology.yaml"


class _Lines:
    """A child's stdout, line by line, read in a thread: wait for the line that starts with a prefix."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.seen, self._lines = proc, [], queue.Queue()
        threading.Thread(target=lambda: [self._lines.put(line) for line in proc.stdout], daemon=True).start()

    def wait_for(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.seen)
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} in {timeout_s}s:\n" + "".join(self.seen))


@pytest.fixture
def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,2200"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def _points(driver) -> dict[str, int]:
    """{figure name: the points it draws} of the page as it is now."""
    return {s.get_attribute("id")[4:]: int(s.get_attribute("data-points") or 0)
            for s in driver.find_elements("css selector", "section[id^=fig-]")}


def _until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s}s")


@needs_chromium
def test_the_live_page_draws_a_real_run_as_it_runs_and_mrl_watch_after(tmp_path, chromium):
    """`mrl demo` of a tiny topology: the live page grows as the run runs; the demo logs to TensorBoard and prints
    the command that opens it; `mrl watch` serves the finished run."""
    topology = _pair(tmp_path, steps=40)
    proc = subprocess.Popen([sys.executable, "-m", "mrl.cli", "demo", str(topology)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = _Lines(proc)
        url = lines.wait_for("live page", 120).split()[2]
        command = lines.wait_for("TensorBoard", 60).split(None, 1)[1].strip()
        assert command == f"tensorboard --logdir {tmp_path / 'run' / 'tracking' / 'tensorboard' / 'live'}"
        chromium.get(url)
        # the figures appear, then grow on the same page, without a reload, as the trainers log steps
        first = _until(lambda: (p := _points(chromium)).get("curves") and p, 120, "the curves figure")
        _until(lambda: _points(chromium)["curves"] > first["curves"], 120, "the curves figure growing")
        _until(lambda: _points(chromium).get("flow"), 60, "the flow between policies")
        rows = chromium.find_elements("css selector", "#policies tbody tr")
        assert sorted(r.find_element("css selector", "td").text for r in rows) == ["policy-a", "policy-b"]
        assert len(chromium.find_elements("css selector", "#fig-curves canvas")) == 2    # uPlot draws canvases
        assert int(chromium.find_element("css selector", "body").get_attribute("data-updates")) >= 2
        assert proc.wait(timeout=300) == 0, "".join(lines.seen)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    run_dir = tmp_path / "run"
    flow = [json.loads(line) for line in (run_dir / "exchange.jsonl").read_text().splitlines()]
    last = flow[-1]
    # lockstep: each policy took every step's experience of the kinds its mode takes (PRP: rollouts; both: group
    # statistics), and the exchange kept all of it
    assert last["published"]["policy-a rollout"] == 40 * 2 * 4      # steps × prompts × group size
    for producer, subscriber, kind in (("policy-a", "policy-b", "rollout"), ("policy-a", "policy-b", "group_stats"),
                                       ("policy-b", "policy-a", "group_stats")):
        assert last["taken"][f"{producer} → {subscriber} {kind}"] == last["published"][f"{producer} {kind}"]
    assert last["counters"] == {"stale dropped": 0, "redelivered": 0}
    assert (run_dir / "report" / "flow.png").is_file()
    assert sorted(p.name for p in (run_dir / "tracking" / "tensorboard" / "live").iterdir()) == ["policy-a",
                                                                                            "policy-b"]

    # the finished run, served again by `mrl watch`: the same figures, every point the files hold
    watcher = subprocess.Popen([sys.executable, "-m", "mrl.cli", "watch", str(run_dir)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        url = _Lines(watcher).wait_for("mrl watch:", 60).split()[2]
        data = json.loads(urllib.request.urlopen(url + "data.json", timeout=10).read())
        want = {f["name"]: sum(len(xs) for p in f["panels"] for xs, _ in p["lines"].values()) for f in data["figures"]}
        chromium.get(url)
        assert _until(lambda: (p := _points(chromium)) == want and p, 30, "every figure of the finished run")
        assert {"curves", "flow", "sgt", "exchange", "budget"} <= set(want)
    finally:
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 0


def _record(path: pathlib.Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_the_page_reads_records_as_they_are_written_and_draws_the_reports_figures(tmp_path):
    """A record half written is read once its line ends; a resumed step keeps its last record; the page's
    figures are the ones the report draws of the same files."""
    metrics = tmp_path / "run" / "p1" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    files = RunFiles(tmp_path / "run", "t")
    assert files.data()["figures"] == [] and files.data()["policies"] == []
    train = {"step": 0, "policy": "p1", "reward_mean": 0.5, "rollouts_total": 8, "sharing": "sgt", "sgt_rescued": 1}
    line = json.dumps(train) + "\n"
    _record(metrics, json.dumps({"step": 0, "policy": "p1", "kind": "eval", "eval_accuracy": 0.25,
                                 "rollouts_total": 0}) + "\n" + line[:20])
    data = files.data()
    assert data["policies"] == [{"policy": "p1", "sharing": None, "step": None, "reward_mean": None,
                                 "eval_accuracy": 0.25, "eval_step": 0, "rollouts_total": 0}]
    _record(metrics, line[20:] + json.dumps({**train, "reward_mean": 0.75}) + "\n")    # step 0 again: resumed
    data = files.data()
    assert data["policies"][0]["reward_mean"] == 0.75 and data["policies"][0]["step"] == 0
    curves = next(f for f in data["figures"] if f["name"] == "curves")
    assert [p["lines"]["p1"] for p in curves["panels"]] == [[[0], [0.25]], [[8], [0.75]]]
    report = tmp_path / "report"
    write_report([metrics], report)
    assert {f["name"] for f in data["figures"]} == {p.stem for p in report.glob("*.png")} == {"curves", "sgt",
                                                                                           "budget"}


def test_a_long_run_is_drawn_from_at_most_max_points_per_line_with_its_last(tmp_path):
    metrics = tmp_path / "p1" / "metrics.jsonl"
    metrics.parent.mkdir()
    n = 2 * MAX_POINTS + 1
    _record(metrics, "".join(json.dumps({"step": t, "policy": "p1", "reward_mean": t, "rollouts_total": t}) + "\n"
                             for t in range(n)))
    budget = next(f for f in RunFiles(tmp_path, "t").data()["figures"] if f["name"] == "budget")
    xs, ys = budget["panels"][0]["lines"]["p1"]
    assert xs == ys == [*range(0, n, 3), n - 1] and len(xs) <= MAX_POINTS + 1


def test_the_page_serves_its_assets_with_no_network_and_refuses_other_paths(tmp_path):
    with live_page(tmp_path, "t") as url:
        page = urllib.request.urlopen(url, timeout=5).read().decode()
        assert '<script src="uPlot.iife.min.js">' in page and "http" not in page.split("<script>")[0]
        assert b"uPlot" in urllib.request.urlopen(url + "uPlot.iife.min.js", timeout=5).read()
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url + "elsewhere", timeout=5)


@pytest.mark.parametrize("folder, options, error", [
    ("missing", {}, "does not exist"),
    ("empty", {}, "holds no <policy>/metrics.jsonl"),
    ("empty", {"exchange_admin": "http://127.0.0.1:1"}, "needs --run-id"),
], ids=["missing-folder", "no-metrics", "admin-without-run-id"])
def test_watch_refuses_what_it_cannot_show(tmp_path, folder, options, error):
    (tmp_path / "empty").mkdir()
    with pytest.raises(LauncherError, match=error):
        watch(tmp_path / folder, **options)


@pytest.mark.parametrize("report_to, error", [
    ("neptune", "Input should be 'tensorboard', 'wandb', 'mlflow' or 'trackio'"),
    ("tensorboard,tensorboard", "names a tracker twice"),
], ids=["unknown", "twice"])
def test_a_bad_report_to_stops_the_demo_before_anything_starts(tmp_path, report_to, error):
    topology = _pair(tmp_path, steps=1)
    out = subprocess.run([sys.executable, "-m", "mrl.cli", "demo", str(topology), "--report-to", report_to],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and error in out.stderr
    assert "redis" not in out.stdout and not (tmp_path / "run").exists()     # nothing started
