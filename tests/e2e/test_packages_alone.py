"""Each service package installed alone into a fresh virtualenv (with the SDK and mrl-serving it names, and for
the trainer the pinned torch first, as the Makefile and the image do), then started: what it runs must come from
its declared dependencies, not from the development requirements (the trainer loading a GGUF needs accelerate,
which only TRL pulled into the development venv)."""
import json
import os
import pathlib
import signal
import subprocess
import urllib.request

import pytest
import yaml

from helpers import fresh_venv
from mrl.assets import tokenizer_cache_dir

TORCH = "torch==2.13.0"          # the Makefile's TORCH_VERSION (tests/e2e/test_compose.py keeps the image on it)
SMOLLM2_GGUF = "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SERVICES = {"exchange": ["exchange", "serve"], "scheduler": ["scheduler", "serve"],
            "tokenizer_align": ["align", "serve"]}


def _venv(tmp_path, service: str, first: list[str] = ()) -> pathlib.Path:
    """A fresh venv with ./sdk, ./services/serving and ./services/<service> installed (after `first`)."""
    return fresh_venv(tmp_path, ["sdk", "services/serving", f"services/{service}"], first)


def _env(tmp_path) -> dict[str, str]:
    return {**os.environ, "MRL_DATA_DIR": str(tmp_path / "data"), "MRL_MODEL_CACHE": str(tmp_path / "models"),
            "MRL_TOKENIZER_CACHE": str(tokenizer_cache_dir()), "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_package_alone_serves(tmp_path, service):
    venv = _venv(tmp_path, service)
    env = {**_env(tmp_path), "MRL_PORT": "0", "MRL_ADMIN_PORT": "0"}
    proc = subprocess.Popen([str(venv / "bin" / "mrl"), *SERVICES[service]], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()        # the ready line, or "" when it died
        assert line, f"`mrl {' '.join(SERVICES[service])}` exited {proc.wait()}:\n{proc.stderr.read()[-3000:]}"
        ready = json.loads(line)
        assert ready["ready"] == service
        with urllib.request.urlopen(f"http://127.0.0.1:{ready['admin_port']}/readyz", timeout=10) as resp:
            assert resp.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


@pytest.mark.slow
def test_the_trainer_package_alone_trains_from_a_gguf(tmp_path):
    gguf = tokenizer_cache_dir() / SMOLLM2_GGUF
    assert gguf.is_file(), f"{gguf} missing: run `make tokenizers`"
    venv = _venv(tmp_path, "trainer", first=[TORCH])
    config = tmp_path / "solo.yaml"
    config.write_text(yaml.safe_dump({
        "policy": "policy-a", "run_id": "alone", "steps": 1, "model": {"source": "gguf", "path": str(gguf)},
        "task": {"family": "linear", "level": 1, "seed": 0},
        "rollout": {"group_size": 2, "prompts_per_step": 1, "max_new_tokens": 4},
        "eval": {"every": 0}, "checkpoint": {"dir": str(tmp_path / "ckpt")}, "metrics": {"progress": False}}))
    proc = subprocess.run([str(venv / "bin" / "mrl"), "trainer", "run", str(config)], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["step"] == 1 and not summary["stopped_early"]
    assert "step 1/1" in proc.stderr
