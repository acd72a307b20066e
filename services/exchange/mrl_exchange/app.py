"""Run the exchange: Redis (embedded unless MRL_REDIS_URL is set), gRPC and the REST admin."""
import asyncio
import contextlib
import logging

from mrl.embedded_redis import EmbeddedRedis
from mrl.serving import ServiceServer, run_until_signal
from mrl.v1 import exchange_pb2
from mrl_exchange.admin import create_admin_app
from mrl_exchange.core import Exchange, wait_for_redis
from mrl_exchange.server import ExchangeServicer
from mrl_exchange.settings import ExchangeSettings

__all__ = ["ExchangeServer", "serve"]

log = logging.getLogger("mrl.exchange")
SERVICE = exchange_pb2.DESCRIPTOR.services_by_name["ExperienceExchange"]


class ExchangeServer(ServiceServer):
    """The gRPC and REST servers over one Exchange; `await start()`, then `port` and `admin_port`."""

    def __init__(self, settings: ExchangeSettings, redis_url: str):
        super().__init__("exchange", settings)
        self.exchange = Exchange.from_url(redis_url, settings)

    async def start(self) -> None:
        await wait_for_redis(self.exchange)
        servicer = ExchangeServicer(self.exchange, self.auth, self.limiter)
        await super().start([(SERVICE, servicer)], create_admin_app(self.exchange, self.auth, self.limiter))

    async def stop(self, grace_s: float = 2.0) -> None:
        await super().stop(grace_s)
        await self.exchange.close()


async def _serve(settings: ExchangeSettings, redis_url: str) -> None:
    server = ExchangeServer(settings, redis_url)
    await server.start()
    await run_until_signal(server, "exchange")


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
