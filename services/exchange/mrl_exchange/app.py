"""Run the exchange: Redis (embedded unless MRL_REDIS_URL is set), gRPC and the REST admin."""
import functools

from mrl_serving.redis_io import redis_ready, wait_for_redis
from mrl_serving.server import ServiceServer, serve_service
from mrl.v1 import exchange_pb2
from mrl_exchange.admin import create_admin_app
from mrl_exchange.core import Exchange
from mrl_exchange.server import ExchangeServicer
from mrl_exchange.settings import ExchangeSettings

__all__ = ["ExchangeServer", "serve"]

SERVICE = exchange_pb2.DESCRIPTOR.services_by_name["ExperienceExchange"]


class ExchangeServer(ServiceServer):
    """The gRPC and REST servers over one Exchange; `await start()`, then `port` and `admin_port`."""

    def __init__(self, settings: ExchangeSettings, redis_url: str):
        self.exchange = Exchange.from_url(redis_url, settings)
        super().__init__("exchange", settings, self.exchange.redis,
                         f"mrl:rl:{settings.rate_limit_scope}:")

    async def start(self) -> None:
        """Serve once Redis answers; gRPC health then follows Redis (NOT_SERVING while it does not answer)."""
        await wait_for_redis(self.exchange.redis)
        servicer = ExchangeServicer(self.exchange, self.auth, self.limiter)
        await super().start([(SERVICE, servicer)], create_admin_app(self.exchange, self.auth, self.limiter),
                            functools.partial(redis_ready, self.exchange.redis))

    async def stop(self, grace_s: float = 2.0) -> None:
        await super().stop(grace_s)
        await self.exchange.close()


def serve(settings: ExchangeSettings | None = None) -> None:
    """`mrl exchange serve`: blocks until SIGINT/SIGTERM."""
    settings = settings or ExchangeSettings()
    serve_service("exchange", settings, lambda url: ExchangeServer(settings, url))
