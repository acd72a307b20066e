"""Run the platform's services as local processes: `mrl up CONFIG`, and the demo and benchmark.

A topology file (examples/local.yaml):

    redis_url: null          # null: an embedded redis-server persisting under data_dir
    data_dir: .mrl/local
    exchange:                # settings of the exchange (the ExchangeSettings field names)
      port: 50051
      admin_port: 8080

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

__all__ = ["ServiceProcess", "spawn_exchange", "redis_for", "up"]


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


@contextlib.contextmanager
def spawn_exchange(redis_url: str, **settings):
    """An exchange child process on free ports (unless given); yields its ServiceProcess."""
    env = {"MRL_REDIS_URL": redis_url, "MRL_PORT": "0", "MRL_ADMIN_PORT": "0"}
    env.update({f"MRL_{k.upper()}": str(v) for k, v in settings.items()})
    service = ServiceProcess([sys.executable, "-m", "mrl.cli", "exchange", "serve"], env)
    try:
        yield service
    finally:
        service.stop()


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
    unknown = set(config) - {"redis_url", "data_dir", "exchange"}
    if unknown:
        raise SystemExit(f"{config_path}: unknown keys {sorted(unknown)}; valid: redis_url, data_dir, exchange")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with redis_for(config.get("redis_url"), pathlib.Path(config.get("data_dir", ".mrl/local"))) as url:
        exchange_settings = {"port": 50051, "admin_port": 8080, **(config.get("exchange") or {})}
        with spawn_exchange(url, **exchange_settings) as exchange:
            r = exchange.ready
            print(f"mrl up: redis {url}\n  exchange  gRPC 127.0.0.1:{r['grpc_port']}  "
                  f"admin http://127.0.0.1:{r['admin_port']}/docs\nCtrl-C to stop.", flush=True)
            while not stop.wait(0.5):
                if exchange.proc.poll() is not None:
                    raise SystemExit(f"the exchange exited with code {exchange.proc.returncode}")
    print("mrl up: stopped", flush=True)
