"""Real exchange and scheduler servers on free loopback ports, each on an event loop in a background thread,
and the fixtures that start them (imported by the conftests of the folders that use them)."""
import asyncio
import threading
import uuid

import pytest


class RunningServer:
    """A ServiceServer (mrl_serving.server) on its own event loop in a thread; `target` is host:port for clients."""

    def __init__(self, make_server):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self._run(self._make(make_server))
        self._run(self.server.start())
        self.target = f"127.0.0.1:{self.server.port}"
        self.admin = f"http://127.0.0.1:{self.server.admin_port}"

    @staticmethod
    async def _make(make_server):
        return make_server()  # constructed on the server's loop: grpc.aio binds to it

    def _run(self, coro, timeout=60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        if not self.thread.is_alive():
            return
        self._run(self.server.stop(grace_s=0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class RunningExchange(RunningServer):
    """An exchange on free ports; its own rate-limit scope (unless given), so no test spends another's buckets."""

    def __init__(self, redis_url: str, **overrides):
        from mrl_exchange.app import ExchangeServer
        from mrl_exchange.settings import ExchangeSettings
        defaults = {"port": 0, "admin_port": 0, "rate_limit_scope": f"rl-{uuid.uuid4().hex[:12]}"}
        self.settings = ExchangeSettings(redis_url=redis_url, **{**defaults, **overrides})
        super().__init__(lambda: ExchangeServer(self.settings, redis_url))


def _starter(running, redis_url):
    """A fixture's body: yields start(**overrides) -> a running server (on `redis_url` unless overridden);
    stops every server it started."""
    started = []

    def start(**overrides):
        server = running(overrides.pop("redis_url", redis_url), **overrides)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def start_exchange(redis_url):
    yield from _starter(RunningExchange, redis_url)


@pytest.fixture
def exchange(start_exchange):
    return start_exchange()


class RunningScheduler(RunningServer):
    """A scheduler on free ports; its own namespace (unless given) and `slots` declared slots on node-0."""

    def __init__(self, redis_url: str, **overrides):
        from mrl_scheduler.app import SchedulerServer
        from mrl_scheduler.settings import SchedulerSettings
        defaults = {"port": 0, "admin_port": 0, "namespace": f"ns-{uuid.uuid4().hex[:12]}", "inventory": "slots",
                    "node": "node-0", "slots": 4, "sweep_interval_s": 0.05}
        self.settings = SchedulerSettings(redis_url=redis_url, **{**defaults, **overrides})
        super().__init__(lambda: SchedulerServer(self.settings, redis_url))

    def wait_for_watchers(self, count: int = 1, timeout_s: float = 10.0) -> None:
        """Wait until `count` Watch streams are registered (the `mrl_scheduler_watchers` gauge): a Watch sees
        events "from now on", so a test that acts before its stream is registered can miss the first ones."""
        import re

        import httpx

        from helpers import wait_for

        def registered() -> bool:
            found = re.search(r"^mrl_scheduler_watchers (\S+)$", httpx.get(f"{self.admin}/metrics").text, re.M)
            return bool(found) and float(found.group(1)) >= count
        wait_for(registered, timeout_s, f"{count} Watch stream(s) registered")


@pytest.fixture
def start_scheduler(redis_url):
    yield from _starter(RunningScheduler, redis_url)


class RunningAlign(RunningServer):
    """A THL service on free ports holding the gpt2 and smollm2 tokenizers (the shipped ones)."""

    def __init__(self, **overrides):
        from mrl_tokenizer_align.app import AlignServer
        from mrl_tokenizer_align.catalog import cached_paths
        from mrl_tokenizer_align.settings import AlignSettings
        paths = cached_paths()
        missing = {"gpt2", "smollm2"} - set(paths)
        assert not missing, f"tokenizers {sorted(missing)} are not cached: run `make tokenizers`"
        defaults = {"port": 0, "admin_port": 0, "tokenizers": {k: paths[k] for k in ("gpt2", "smollm2")}}
        self.settings = AlignSettings(**{**defaults, **overrides})
        super().__init__(lambda: AlignServer(self.settings))


@pytest.fixture
def align():
    server = RunningAlign()
    yield server
    server.stop()
