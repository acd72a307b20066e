"""Prometheus metrics of the scheduler, in their own registry (one per server).

Lease counters count the namespace's events as this replica's event pump reads them (every
replica sees every grant, release, expiry and revocation); the gauges are set by its sweeper.
"""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["SchedulerMetrics"]


class SchedulerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.granted = Counter("mrl_scheduler_granted", "Leases granted", ["policy"], registry=r)
        self.released = Counter("mrl_scheduler_released", "Leases released by their holder", registry=r)
        self.revoked = Counter("mrl_scheduler_revoked", "Leases revoked (admin, or a device left)", registry=r)
        self.expired = Counter("mrl_scheduler_expired", "Leases expired (not renewed in time)", registry=r)
        self.renewed = Counter("mrl_scheduler_renewed", "Renewals answered by this replica", registry=r)
        self.refused = Counter("mrl_scheduler_refused", "Acquire calls of this replica that failed, by error",
                               ["reason"], registry=r)
        self.wait = Histogram("mrl_scheduler_acquire_wait_seconds", "Acquire: submission to grant",
                              buckets=(.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 1800), registry=r)
        self.devices = Gauge("mrl_scheduler_devices", "Registered devices", registry=r)
        self.free = Gauge("mrl_scheduler_free_devices", "Devices not leased", registry=r)
        self.leases = Gauge("mrl_scheduler_leases", "Live leases", registry=r)
        self.queued = Gauge("mrl_scheduler_queued", "Requests waiting", registry=r)
        self.waiting = Gauge("mrl_scheduler_waiting_calls", "Acquire calls waiting on this replica", registry=r)
        self.watchers = Gauge("mrl_scheduler_watchers", "Watch streams open on this replica", registry=r)

    def observe_gauges(self, gauges: dict[str, int]) -> None:
        for name, value in gauges.items():
            getattr(self, name).set(value)
