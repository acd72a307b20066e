"""examples/trl_peer.py as a lab runs it: `pip install "./sdk[trl]"` in a fresh virtualenv (a CPU torch first), then
the example, which imports nothing of the project but `mrl`, trains one step against a real exchange and publishes
its experience to it."""
import ast
import json
import os
import subprocess

import pytest

from helpers import ROOT, fresh_venv
from mrl.exchange_client import ExchangeClient
from mrl.experience import kind_name

PROJECT_PACKAGES = {"mrl-trainer", "mrl-research", "mrl-launcher", "mrl-serving", "mrl-exchange", "mrl-scheduler",
                    "mrl-tokenizer-align"}


@pytest.fixture(scope="module")
def lab_python(tmp_path_factory):
    """A fresh virtualenv holding torch 2.13.0 (the CPU build) and ./sdk[trl], nothing else of the project."""
    python = str(fresh_venv(tmp_path_factory.mktemp("lab"), ["sdk[trl]"], first=["torch==2.13.0"]) / "bin" / "python")
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], check=True, capture_output=True,
                            text=True).stdout
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
    assert {"mrl", "trl", "math-verify"} <= installed and not installed & PROJECT_PACKAGES
    return python


@pytest.mark.slow
@pytest.mark.timeout(1500)       # the fresh virtualenv: torch and TRL installed (minutes)
def test_the_trl_example_runs_a_step_with_only_the_sdk_installed(lab_python, exchange, run_id, tmp_path):
    env = {**os.environ, "MRL_EXCHANGE_TARGET": exchange.target, "PYTHONPATH": ""}   # the target from the environment
    proc = subprocess.run([lab_python, str(ROOT / "examples" / "trl_peer.py"), "--run-id", run_id, "--sharing", "none",
                           "--steps", "1", "--prompts-per-step", "2", "--group-size", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = ast.literal_eval(proc.stdout.strip().splitlines()[-1])          # the step's mutual_log record
    assert record["step"] == 0 and record["published"] > 0 and record["unpublished_steps"] == 0
    with ExchangeClient(exchange.target) as client:
        published = {kind_name(t.topic.kind): t.length for t in client.topic_stats(run_id, producer="trl-tiny")}
    assert published["group_stats"] == 2 and published["rollout"] == 4 and published["policy_stats"] == 1


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_trl_example_stops_before_its_model_on_a_wrong_address(lab_python, exchange, tmp_path):
    rest = f"127.0.0.1:{exchange.server.admin_port}"
    proc = subprocess.run([lab_python, str(ROOT / "examples" / "trl_peer.py"), "--exchange", rest, "--steps", "1"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and f"the exchange at {rest}" in proc.stderr and "this is the REST port" in proc.stderr
