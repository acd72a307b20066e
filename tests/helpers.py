"""Builders of valid experiences and auth files for the tests."""
import importlib.util
import json
import pathlib
import queue
import shutil
import subprocess
import sys
import threading
import time

import pytest
import yaml

from mrl.assets import tokenizer_cache_dir
from mrl.auth import hash_token, new_token
from mrl.experience import new_experience
from mrl.v1 import experience_pb2 as pb


def rollout(run_id, producer="policy-a", version=1, reward=1.0, n_tokens=4, prompt_id="arith/0/0", **kw):
    payload = pb.Rollout(prompt_id=prompt_id, prompt_text="1+1=", response_text="2",
                         token_ids=list(range(n_tokens)), logprobs=[-0.5] * n_tokens, reward=reward,
                         verdict=pb.VERDICT_CORRECT, group_id="g0", tokenizer_id="gpt2", **kw)
    return new_experience(run_id, producer, version, payload)


def success(run_id, producer="policy-a", version=1, prompt_id="arith/0/0", response_text="2", **kw):
    return new_experience(run_id, producer, version, pb.VerifiedSuccess(
        prompt_id=prompt_id, prompt_text="1+1=", response_text=response_text, token_ids=[5], reward=1.0, answer="2",
        group_id="g0", tokenizer_id="gpt2"), **kw)


def one_of_each(run_id, producer="policy-a", version=1):
    return [
        rollout(run_id, producer, version),
        new_experience(run_id, producer, version, pb.GroupStats(prompt_id="arith/0/0", group_id="g0",
                                                                rewards=[0.0, 1.0, 1.0])),
        success(run_id, producer, version),
        new_experience(run_id, producer, version, pb.PolicyStats(step=3, batch_mean_reward=0.5, capability=0.4,
                                                                 window=5, rollouts_per_s=10.0)),
    ]


POLICIES = ("policy-a", "policy-b")


def wait_for(condition, timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll `condition` every 20 ms until it holds; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not met in {timeout_s:g} s"
        time.sleep(0.02)


def write_auth_file(path: pathlib.Path, run_id: str) -> dict[str, str]:
    """policy-a and policy-b in run_id, and an admin; returns the tokens (the file holds only hashes)."""
    tokens = {name: new_token() for name in (*POLICIES, "admin")}
    principals = [{"name": p, "role": "policy", "policy": p, "runs": [run_id],
                   "token_sha256": hash_token(tokens[p])} for p in POLICIES]
    principals.append({"name": "admin", "role": "admin", "token_sha256": hash_token(tokens["admin"])})
    path.write_text(yaml.safe_dump({"principals": principals}))
    return tokens


def self_signed(folder: pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key (skips the test without openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command line to make a certificate (and the cryptography package is not "
                    "a dependency)")
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def run_quick_bench(name: str, cwd: pathlib.Path, timeout_s: float, *options: str) -> dict:
    """Run `mrl bench NAME --quick [OPTIONS]` in a child process; its last stdout line, parsed (it must be JSON)."""
    proc = subprocess.run([sys.executable, "-m", "mrl.cli", "bench", name, "--quick", *options], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == name and result["quick"] is True and result["machine"]
    return result


# --- a tiny trainer config (GPT-2 architecture, 2 layers, over the real GPT-2 tokenizer) --------------
GPT2 = str(tokenizer_cache_dir() / "gpt2.tiktoken")
TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 256}


def fresh_venv(folder: pathlib.Path, packages: list[str], first: list[str] = ()) -> pathlib.Path:
    """A new virtualenv folder/venv: the pip requirements `first` (e.g. the pinned torch), then copies of the
    repository's `packages` (folders relative to its root, extras allowed: "sdk[trl]"), copied so that no build
    artefact of this checkout leaks in. Returns the venv's folder; a failed install names pip's error."""
    sources = []
    for spec in packages:
        rel, bracket, extras = spec.partition("[")
        dest = folder / "src" / rel
        shutil.copytree(ROOT / rel, dest, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
        sources.append(f"{dest}{bracket}{extras}")
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for group in ([list(first)] if first else []) + [sources]:
        proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", *group],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"pip install {' '.join(group)}: {proc.stderr[-3000:]}"
    return venv


def tiny_config(tmp_path: pathlib.Path, **overrides) -> dict:
    config = {
        "policy": "tiny", "run_id": "test", "seed": 3, "steps": 2,
        "model": {"source": "config", "tokenizer": GPT2, "architecture": TINY},
        "task": {"family": "arithmetic", "level": 1, "seed": 0},
        "rollout": {"group_size": 3, "prompts_per_step": 2, "max_new_tokens": 6, "temperature": 1.0},
        "loss": {"lr": 1e-3, "micro_batch_tokens": 64},
        "eval": {"every": 0, "problems": 4},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "every": 1},
        "metrics": {"progress": False},
    }
    for key, value in overrides.items():
        section, _, leaf = key.rpartition(".")
        (config.setdefault(section, {}) if section else config)[leaf] = value
    return config


ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_script(name: str):
    """A module of scripts/ (they are not a package), e.g. load_script("gen_proto")."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Collector:
    """Iterates a subscription in a thread, so a test can watch what arrives and when."""

    def __init__(self, subscription):
        self.subscription = subscription
        self.items: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        for d in self.subscription:
            self.items.put(d)

    def started(self, timeout=10.0) -> "Collector":
        """Wait for the subscription's first message (its id): from then on whatever is published is delivered."""
        wait_for(lambda: self.subscription.subscription_id, timeout, "the subscription's start")
        return self

    def take(self, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        out = []
        while len(out) < n:
            out.append(self.items.get(timeout=max(0.01, deadline - time.monotonic())))
        return out

    def nothing_more(self, wait=1.0) -> bool:
        try:
            self.items.get(timeout=wait)
            return False
        except queue.Empty:
            return True

    def close(self):
        self.subscription.close()
        self.thread.join(5)
