"""The Shared Experience Exchange (SEE): typed experience over Redis Streams, served over gRPC.

    core.Exchange         publish / ack / topics / admin operations — callable in-process
    subscription          one subscriber's delivery session (credit, redelivery, staleness)
    server                the gRPC ExperienceExchange servicer (thin)
    admin                 the REST admin (FastAPI) and Prometheus /metrics (thin)
    app                   runs Redis (embedded or configured), gRPC and REST in one process
"""
from mrl_exchange.core import Exchange
from mrl_exchange.settings import ExchangeSettings

__all__ = ["Exchange", "ExchangeSettings"]
