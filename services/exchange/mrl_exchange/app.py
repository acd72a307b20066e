"""Run the exchange: Redis (embedded unless MRL_REDIS_URL is set), gRPC and the REST admin."""
import asyncio
import contextlib
import json
import logging
import signal

import grpc
import uvicorn

from mrl.auth import Authenticator
from mrl.embedded_redis import EmbeddedRedis
from mrl.grpc_service import add_health_and_reflection, add_service, bind
from mrl.ratelimit import RateLimiter
from mrl.v1 import exchange_pb2
from mrl_exchange.admin import create_admin_app
from mrl_exchange.core import Exchange, wait_for_redis
from mrl_exchange.server import ExchangeServicer
from mrl_exchange.settings import ExchangeSettings

__all__ = ["ExchangeServer", "serve"]

log = logging.getLogger("mrl.exchange")
SERVICE = exchange_pb2.DESCRIPTOR.services_by_name["ExperienceExchange"]


class ExchangeServer:
    """The gRPC and REST servers over one Exchange; `await start()`, then `port` and `admin_port`."""

    def __init__(self, settings: ExchangeSettings, redis_url: str):
        self.settings = settings
        self.exchange = Exchange.from_url(redis_url, settings)
        self.auth = Authenticator.from_file(settings.auth_file)
        self.limiter = RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)
        opts = [("grpc.max_receive_message_length", settings.max_message_bytes),
                ("grpc.max_send_message_length", settings.max_message_bytes)]
        self.grpc = grpc.aio.server(options=opts)
        self.port = 0
        self.admin_port = 0
        self._uvicorn: uvicorn.Server | None = None
        self._uvicorn_task: asyncio.Task | None = None

    async def start(self) -> None:
        s = self.settings
        await wait_for_redis(self.exchange)
        add_service(self.grpc, SERVICE, ExchangeServicer(self.exchange, self.auth, self.limiter))
        await add_health_and_reflection(self.grpc, [SERVICE.full_name])
        host, self.port = bind(self.grpc, s.host, s.port, self.auth.enabled, s.tls_cert, s.tls_key)
        await self.grpc.start()
        app = create_admin_app(self.exchange, self.auth, self.limiter)
        self._uvicorn = uvicorn.Server(uvicorn.Config(app, host=host, port=s.admin_port, log_level="warning",
                                                      lifespan="off"))
        self._uvicorn_task = asyncio.create_task(self._uvicorn.serve())
        while not self._uvicorn.started:
            if self._uvicorn_task.done():
                self._uvicorn_task.result()
                raise RuntimeError(f"the REST admin could not bind {host}:{s.admin_port}")
            await asyncio.sleep(0.01)
        self.admin_port = self._uvicorn.servers[0].sockets[0].getsockname()[1]
        log.info("exchange serving gRPC on %s:%d (%s), REST admin on http://%s:%d, auth %s",
                 host, self.port, "TLS" if s.tls_cert else "plaintext", host, self.admin_port,
                 "on" if self.auth.enabled else "OFF")

    async def stop(self, grace_s: float = 2.0) -> None:
        await self.grpc.stop(grace_s)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            await self._uvicorn_task
        await self.exchange.close()


async def _serve(settings: ExchangeSettings, redis_url: str) -> None:
    server = ExchangeServer(settings, redis_url)
    await server.start()
    # One JSON line on stdout tells a parent process (mrl up, the demo, the benchmark) where we listen.
    print(json.dumps({"ready": "exchange", "grpc_port": server.port, "admin_port": server.admin_port}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await server.stop()


def serve(settings: ExchangeSettings | None = None) -> None:
    """`mrl exchange serve`: blocks until SIGINT/SIGTERM."""
    settings = settings or ExchangeSettings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.ExitStack() as stack:
        url = settings.redis_url
        if not url:
            url = stack.enter_context(EmbeddedRedis(settings.data_dir / "redis"))
            log.info("MRL_REDIS_URL unset: started an embedded redis-server at %s", url)
        asyncio.run(_serve(settings, url))
