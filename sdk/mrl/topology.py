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

Each service is a child process (`python -m mrl.cli ... serve`) that prints one JSON
"ready" line with its ports; Ctrl-C (or SIGTERM) stops the children, then Redis.
"""
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

import yaml

from mrl.child_process import die_with_parent
from mrl.embedded_redis import EmbeddedRedis

__all__ = ["ServiceProcess", "SERVICES", "spawn", "redis_for", "up"]


class ServiceProcess:
    """A service child process; `ready` holds its JSON ready line (ports)."""

    def __init__(self, args: list[str], env: dict[str, str], timeout_s: float = 60.0):
        self.proc = subprocess.Popen(args, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=die_with_parent)
        self.ready: dict = {}
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not line or not line[0].strip():
            self.stop()
            raise RuntimeError(f"{' '.join(args)} did not become ready in {timeout_s} s (see its log above)")
        self.ready = json.loads(line[0])

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


# service -> (CLI words, default ports, needs Redis)
SERVICES = {"exchange": (["exchange", "serve"], (50051, 8080), True),
            "tokenizer_align": (["align", "serve"], (50052, 8081), False),
            "scheduler": (["scheduler", "serve"], (50053, 8082), True)}


@contextlib.contextmanager
def spawn(service: str, redis_url: str | None = None, **settings):
    """A service child process (on free ports unless given); yields its ServiceProcess."""
    words, _, needs_redis = SERVICES[service]
    env = {"MRL_PORT": "0", "MRL_ADMIN_PORT": "0", **({"MRL_REDIS_URL": redis_url} if needs_redis else {})}
    # lists and mappings as JSON, as pydantic-settings reads them from the environment
    env.update({f"MRL_{k.upper()}": json.dumps(v) if isinstance(v, (list, dict)) else str(v)
                for k, v in settings.items()})
    process = ServiceProcess([sys.executable, "-m", "mrl.cli", *words], env)
    try:
        yield process
    finally:
        process.stop()


@contextlib.contextmanager
def redis_for(redis_url: str | None, data_dir: pathlib.Path):
    """The configured Redis, or an embedded one under data_dir/redis."""
    if redis_url:
        yield redis_url
    else:
        with EmbeddedRedis(pathlib.Path(data_dir) / "redis") as url:
            yield url


def up(config_path: str) -> None:
    config = yaml.safe_load(pathlib.Path(config_path).read_text()) or {}
    valid = {"redis_url", "data_dir", *SERVICES}
    if set(config) - valid:
        raise SystemExit(f"{config_path}: unknown keys {sorted(set(config) - valid)}; valid: {', '.join(sorted(valid))}")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(redis_for(config.get("redis_url"), pathlib.Path(config.get("data_dir", ".mrl/local"))))
        print(f"mrl up: redis {url}", flush=True)
        running = {}
        for name, (_, (port, admin_port), _) in SERVICES.items():
            if name in config and config[name] is None:
                continue
            settings = {"port": port, "admin_port": admin_port, **(config.get(name) or {})}
            running[name] = stack.enter_context(spawn(name, url, **settings))
            r = running[name].ready
            print(f"  {name:<16} gRPC 127.0.0.1:{r['grpc_port']}  REST http://127.0.0.1:{r['admin_port']}/docs",
                  flush=True)
        print("Ctrl-C to stop.", flush=True)
        while not stop.wait(0.5):
            for name, process in running.items():
                if process.proc.poll() is not None:
                    raise SystemExit(f"{name} exited with code {process.proc.returncode}")
    print("mrl up: stopped", flush=True)
