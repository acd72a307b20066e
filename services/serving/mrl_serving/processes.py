"""Services as child processes, and the Redis they use: what launchers, demos and benchmarks share.

    with redis_for(None, data_dir) as url, spawn("exchange", url, log_level="ERROR") as exchange:
        target = f"127.0.0.1:{exchange.ready['grpc_port']}"

`spawn` runs `python -m mrl.cli <the service's command>` on free ports unless told otherwise,
with the settings as `MRL_*` environment variables, and waits for the one JSON "ready" line
the service prints on stdout (its ports). The child runs in its own session (a terminal's
Ctrl-C reaches the launcher alone, which stops children in order) and dies with its parent.
"""
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

from mrl.errors import Unavailable
from mrl_serving.child_process import die_with_parent
from mrl_serving.embedded_redis import EmbeddedRedis
from mrl_serving.registry import service_settings

__all__ = ["ServiceProcess", "spawn", "redis_for"]


class ServiceProcess:
    """A service child process; `ready` holds its JSON ready line (ports)."""

    def __init__(self, args: list[str], env: dict[str, str], timeout_s: float = 60.0):
        self.proc = subprocess.Popen(args, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=die_with_parent, start_new_session=True)
        self.ready: dict = {}
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not line or not line[0].strip():
            self.stop()
            raise Unavailable(f"{' '.join(args)} did not become ready in {timeout_s} s (see its log above)")
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
def spawn(service: str, redis_url: str | None = None, **settings):
    """A service child process (on free ports unless given); yields its ServiceProcess. A service that needs
    Redis and is given no `redis_url` starts its own embedded one (under the `data_dir` setting)."""
    cls = service_settings(service)
    env = {"MRL_PORT": "0", "MRL_ADMIN_PORT": "0",
           **({"MRL_REDIS_URL": redis_url} if cls.needs_redis and redis_url else {})}
    # lists and mappings as JSON, as pydantic-settings reads them from the environment
    env.update({f"MRL_{k.upper()}": json.dumps(v) if isinstance(v, (list, dict)) else str(v)
                for k, v in settings.items()})
    process = ServiceProcess([sys.executable, "-m", "mrl.cli", *cls.command], env)
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
