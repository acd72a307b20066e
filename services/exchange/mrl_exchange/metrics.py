"""Prometheus metrics of the exchange, in their own registry (one per Exchange)."""
from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["ExchangeMetrics"]


class ExchangeMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.published = Counter("mrl_exchange_published", "Experiences appended", ["kind"], registry=r)
        self.duplicates = Counter("mrl_exchange_duplicates", "Publishes of an id seen before", registry=r)
        self.rejected = Counter("mrl_exchange_rejected_batches", "Publish batches refused as invalid",
                                registry=r)
        self.delivered = Counter("mrl_exchange_delivered", "Deliveries sent to subscribers", ["kind"],
                                 registry=r)
        self.redelivered = Counter("mrl_exchange_redelivered", "Deliveries sent again after the visibility "
                                   "timeout", registry=r)
        self.acked = Counter("mrl_exchange_acked", "Deliveries acknowledged", registry=r)
        self.successes_served = Counter("mrl_exchange_successes_served", "Successes sent from the success library "
                                        "(GetSuccesses)", registry=r)
        self.stale = Counter("mrl_exchange_stale_dropped", "Entries dropped by a staleness bound", registry=r)
        self.latency = Histogram("mrl_exchange_publish_to_deliver_seconds", "Broker append to delivery",
                                 buckets=(.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 10, 60),
                                 registry=r)
