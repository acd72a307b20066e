"""Run the scheduler: Redis (embedded unless MRL_REDIS_URL is set), gRPC Scheduler and the REST admin.

At start a replica registers its node's devices (NVML or declared slots) and the nodes its
config declares, then serves; its sweeper and event pump run until it stops. Any number of
replicas may share a namespace (and its devices) on one Redis.
"""
import functools
import logging

from mrl_serving.redis_io import redis_ready, wait_for_redis
from mrl_serving.server import ServiceServer, serve_service
from mrl.v1 import scheduler_pb2
from mrl_scheduler.admin import create_admin_app
from mrl_scheduler.dispatch import Dispatcher
from mrl_scheduler.inventory import configured_nodes
from mrl_scheduler.leases import Scheduler
from mrl_scheduler.server import SchedulerServicer
from mrl_scheduler.settings import SchedulerSettings

__all__ = ["SchedulerServer", "serve"]

log = logging.getLogger("mrl.scheduler")
SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"]


class SchedulerServer(ServiceServer):
    """The gRPC and REST servers over one Scheduler core; `await start()`, then `port` and `admin_port`."""

    def __init__(self, settings: SchedulerSettings, redis_url: str):
        self.core = Scheduler.from_url(redis_url, settings)
        super().__init__("scheduler", settings, self.core.redis, self.core.key("rl:"))
        self.dispatcher = Dispatcher(self.core)

    async def start(self) -> None:
        await wait_for_redis(self.core.redis)
        for node, devices in configured_nodes(self.settings).items():
            if devices:  # a node with nothing to declare leaves what another replica registered alone
                await self.core.register(node, devices)
                log.info("registered node %s: %d %s device(s)", node, len(devices), devices[0].kind)
        passed, gauges = await self.core.tick()
        if not gauges["devices"]:
            log.warning("no devices in namespace %r: every Acquire will be refused; set MRL_SLOTS (CPU-only) or "
                        "run on a host with GPUs", self.settings.namespace)
        await self.dispatcher.start()
        self.dispatcher.wake(passed)
        servicer = SchedulerServicer(self.dispatcher, self.auth, self.limiter)
        # gRPC health follows Redis (NOT_SERVING while it does not answer), as /readyz does
        await super().start([(SERVICE, servicer)], create_admin_app(self.dispatcher, self.auth, self.limiter),
                            functools.partial(redis_ready, self.core.redis))

    async def stop(self, grace_s: float = 2.0) -> None:
        await self.dispatcher.stop()
        await super().stop(grace_s)
        await self.core.close()


def serve(settings: SchedulerSettings | None = None) -> None:
    """`mrl scheduler serve`: blocks until SIGINT/SIGTERM."""
    settings = settings or SchedulerSettings()
    serve_service("scheduler", settings, lambda url: SchedulerServer(settings, url))
