"""`docker compose up` for real (marker `compose`, `make compose-test`; not part of `make test`).

Builds the images, brings the stack up under its own project name, waits for every service's health check,
calls the REST admin endpoints from the host (401 without the example admin token, 200 with it), sees both
trainers log steps and take each other's experience, runs `docker compose stop` and `down`, finds checkpoints,
metrics and the model cache in their named volumes, and sees a second `up` resume from them. The trainers run
the shipped commands plus two shorter settings (a smaller eval, a shorter warm start), from an override file.

Without a Docker engine or Compose v2 the test is skipped with the reason. TORCH_INDEX_URL, when set, is passed
as the images' build argument (docs/deployment.md), and the images are then built on the host's network, so that
an index on the host's loopback is reachable too.
"""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import yaml

from helpers import ROOT

pytestmark = pytest.mark.compose

PROJECT = "mrl-compose-test"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = ("redis", "exchange", "tokenizer_align", "scheduler")        # the ones with a health check
TRAINERS = {"trainer-a": "policy-a", "trainer-b": "policy-b"}
SHORTER = {"trainer-a": ["eval.problems=8"], "trainer-b": ["eval.problems=8", "warm_start.steps=20"]}
RUN_ID = "compose"                                                      # MRL_RUN_ID unset
STEP = re.compile(r"^\[(policy-[ab])\] step (\d+)/(\d+):", re.M)
RESUMED = re.compile(r"^mrl trainer: resumed from \S+ at step (\d+)$", re.M)
# containers, network and volumes of the test's project; no grace period: nothing of it is kept
CLEAN_UP = ("down", "--volumes", "--remove-orphans", "--timeout", "0")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _admin_token() -> str:
    text = (ROOT / "examples/auth.example.yaml").read_text()
    return re.search(r"^#\s+admin\s+\(example only\):\s+(\S+)$", text, re.M).group(1)


def _skip_reason() -> str | None:
    if not shutil.which("docker"):
        return "no `docker` command"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if info.returncode:
        return f"no Docker engine answers `docker info`: {info.stderr.strip()[:300]}"
    version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if version.returncode or not re.search(r"version v?2\.", version.stdout):
        return f"Compose v2 (`docker compose`) is missing: {(version.stderr or version.stdout).strip()[:300]}"
    return None


class Stack:
    """`docker compose -p PROJECT -f docker-compose.yml -f OVERRIDE ...` with a log of each command's time."""

    def __init__(self, override):
        self.base = ["docker", "compose", "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml"), "-f", str(override)]

    def __call__(self, *args, timeout=1800, check=True) -> subprocess.CompletedProcess:
        start = time.monotonic()
        proc = subprocess.run([*self.base, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        print(f"$ docker compose {' '.join(args)}: rc {proc.returncode}, {time.monotonic() - start:.1f} s", flush=True)
        if check and proc.returncode:
            raise AssertionError(f"docker compose {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return proc

    def logs(self, service: str) -> str:
        """The service's log as `docker compose logs` shows it, less the terminal codes it adds (ESC[2K)."""
        return ANSI.sub("", self("logs", "--no-color", "--no-log-prefix", service, check=False).stdout)

    def health(self) -> dict[str, str]:
        """service -> its container's health (or state, for one without a health check)."""
        out = self("ps", "--all", "--format", "json", check=False).stdout.strip()
        rows = json.loads(out) if out.startswith("[") else [json.loads(line) for line in out.splitlines() if line]
        return {row["Service"]: row.get("Health") or row["State"] for row in rows}


def _override(path, index_url: str | None) -> None:
    services = {}
    for name in ("exchange", "tokenizer_align", "scheduler", *TRAINERS):
        build = dict(COMPOSE["services"][name]["build"])
        if index_url:
            build.update(args={"TORCH_INDEX_URL": index_url}, network="host")
        services[name] = {"build": build}
    for name, extra in SHORTER.items():
        command = list(COMPOSE["services"][name]["command"])
        for setting in extra:
            command += ["--set", setting]
        services[name]["command"] = command
    path.write_text(yaml.safe_dump({"services": services}, sort_keys=False))


def _http(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait(condition, timeout_s: float, what: str, stack: Stack, poll_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n}\n{stack.logs(n)[-3000:]}" for n in (*SERVICES[1:], *TRAINERS))
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s; health {stack.health()}\n{logs}")
        time.sleep(poll_s)


def _steps(log: str) -> list[int]:
    return [int(m.group(2)) for m in STEP.finditer(log)]


def _took_from(topics: list[dict], producer: str, subscriber: str) -> bool:
    """Whether the exchange delivered some of producer's experience to subscriber's group."""
    return any(g["subscriber"] == subscriber and g["last_delivered_id"] not in ("", "0-0")
               for t in topics if t["producer"] == producer for g in t["groups"])


def _volume_listing(image: str, volume: str, command: str) -> str:
    return subprocess.run(["docker", "run", "--rm", "-v", f"{volume}:/v", "--entrypoint", "sh", image, "-c", command],
                          capture_output=True, text=True, check=True, timeout=120).stdout


@pytest.mark.timeout(3600)
def test_docker_compose_up_runs_watches_stops_and_resumes(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    override = tmp_path / "compose.override.yaml"
    _override(override, os.environ.get("TORCH_INDEX_URL"))
    stack = Stack(override)
    admin = _admin_token()
    try:
        stack(*CLEAN_UP)                                                # what an earlier, killed run left
        start = time.monotonic()
        stack("build")
        print(f"build: {time.monotonic() - start:.0f} s", flush=True)
        for name in ("exchange", "tokenizer_align", "scheduler", *TRAINERS):
            size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", f"{PROJECT}-{name}"],
                                  capture_output=True, text=True, check=True).stdout
            print(f"image {PROJECT}-{name}: {int(size) / 1e9:.2f} GB", flush=True)

        start = time.monotonic()
        stack("up", "--detach")                 # returns once the trainers' dependencies are healthy
        health = _wait(lambda: (lambda h: h if all(h.get(s) == "healthy" for s in SERVICES) else None)(stack.health()),
                       120, "every service healthy", stack)
        print(f"healthy after {time.monotonic() - start:.0f} s: {health}", flush=True)

        # the REST admin endpoints from the host: the example admin token, and nothing without it
        for url in ("http://127.0.0.1:8080/v1/runs", "http://127.0.0.1:8082/v1/leases"):
            assert _http(url)[0] == 401, url
            status, body = _http(url, admin)
            assert status == 200, (url, body)
        assert _http("http://127.0.0.1:8081/readyz")[0] == 200

        # both trainers log steps, and each takes the other's experience (the exchange's consumer groups)
        def exchanged():
            logs = {name: stack.logs(name) for name in TRAINERS}
            status, body = _http(f"http://127.0.0.1:8080/v1/runs/{RUN_ID}/topics", admin)
            topics = json.loads(body)["topics"] if status == 200 else []
            done = (all(_steps(log) for log in logs.values()) and _took_from(topics, "policy-a", "policy-b")
                    and _took_from(topics, "policy-b", "policy-a"))
            return logs if done else None
        start = time.monotonic()
        logs = _wait(exchanged, 1200, "both trainers stepping and taking each other's experience", stack, 10)
        print(f"steps and exchange after {time.monotonic() - start:.0f} s: "
              f"{ {name: max(_steps(log)) for name, log in logs.items()} }", flush=True)

        # stop: each trainer finishes its step, checkpoints and exits 0; then down keeps the named volumes
        stack("stop")
        for name, policy in TRAINERS.items():
            state = subprocess.run(["docker", "inspect", "-f", "{{.State.ExitCode}}", f"{PROJECT}-{name}-1"],
                                   capture_output=True, text=True, check=True).stdout.strip()
            log = stack.logs(name)
            assert state == "0", f"{name} exited {state}:\n{log[-3000:]}"
            summary = json.loads(log.strip().splitlines()[-1])
            assert summary["policy"] == policy and summary["stopped_early"] and summary["step"] >= 1, summary
        stopped_at = {name: json.loads(stack.logs(name).strip().splitlines()[-1])["step"] for name in TRAINERS}
        print(f"stopped at {stopped_at}", flush=True)
        stack("down")

        image = f"{PROJECT}-trainer-a"
        for name, policy in TRAINERS.items():
            folder = f"/v/{RUN_ID}/{policy}"
            listing = _volume_listing(image, f"{PROJECT}_{name}",
                                      f"ls {folder}; wc -l < {folder}/metrics.jsonl; stat -c %U {folder}")
            lines = listing.split()
            assert "latest" in lines and lines[-1] == "mrl", listing
            assert int(lines[-2]) >= stopped_at[name], f"{name}: metrics.jsonl has {lines[-2]} lines"
            print(f"volume {PROJECT}_{name}:{folder}: {' '.join(lines[:-2])}; metrics.jsonl {lines[-2]} lines",
                  flush=True)
        models = _volume_listing(image, f"{PROJECT}_models", "ls /v")
        assert models.split(), "the model cache volume is empty"
        print(f"volume {PROJECT}_models: {' '.join(models.split())}", flush=True)

        # a second up resumes each trainer from its checkpoint and goes on stepping
        start = time.monotonic()
        stack("up", "--detach")

        def resumed():
            logs = {name: stack.logs(name) for name in TRAINERS}
            ok = all((m := RESUMED.search(log)) and int(m.group(1)) == stopped_at[name]
                     and any(s > stopped_at[name] for s in _steps(log)) for name, log in logs.items())
            return logs if ok else None
        _wait(resumed, 900, "both trainers resuming from their checkpoints and stepping on", stack, 10)
        print(f"resumed and stepping after {time.monotonic() - start:.0f} s", flush=True)
    finally:
        stack(*CLEAN_UP, check=False)
