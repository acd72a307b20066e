"""The gRPC Scheduler servicer: authenticate, rate-limit, validate, authorize, call the core.

A `policy` principal may acquire, renew and release only leases of its own policy (in its runs)
and watch only its own policy's events; an admin may do anything (force release: REST admin).
"""
import grpc

from mrl import experience
from mrl.auth import Authenticator, Principal
from mrl.errors import PermissionDenied
from mrl_serving.ratelimit import RateLimiter
from mrl_serving.server import grpc_principal, who_am_i
from mrl.v1 import identity_pb2 as ipb
from mrl.v1 import scheduler_pb2 as spb
from mrl_scheduler.dispatch import Dispatcher

__all__ = ["SchedulerServicer"]


class SchedulerServicer:
    def __init__(self, dispatcher: Dispatcher, auth: Authenticator, limiter: RateLimiter):
        self.dispatcher, self.core, self.auth, self.limiter = dispatcher, dispatcher.core, auth, limiter

    async def _principal(self, context: grpc.aio.ServicerContext) -> Principal:
        return await grpc_principal(self.auth, self.limiter, context)

    async def _require_holder(self, principal: Principal, lease_id: str, action: str) -> None:
        policy, run_id = await self.core.owner(lease_id)
        principal.require_policy(policy, run_id, action)

    async def Acquire(self, request: spb.AcquireRequest, context) -> spb.Lease:
        principal = await self._principal(context)
        checked = self.core.check(request)
        principal.require_policy(checked.policy, checked.run_id, "acquire")
        return await self.dispatcher.acquire(checked)

    async def Renew(self, request: spb.RenewRequest, context) -> spb.Lease:
        principal = await self._principal(context)
        self.core.check_lease_args(request.lease_id, request.fencing_token)
        await self._require_holder(principal, request.lease_id, "renew")
        return await self.dispatcher.renew(request.lease_id, request.fencing_token, request.ttl_ms)

    async def Release(self, request: spb.ReleaseRequest, context) -> spb.ReleaseResponse:
        principal = await self._principal(context)
        self.core.check_lease_args(request.lease_id, request.fencing_token)
        await self._require_holder(principal, request.lease_id, "release")
        return spb.ReleaseResponse(released=await self.dispatcher.release(request.lease_id, request.fencing_token))

    async def WhoAmI(self, request: ipb.WhoAmIRequest, context) -> ipb.WhoAmIResponse:
        return who_am_i(await self._principal(context), self.auth, request, "mrl.v1.Scheduler")

    async def Inventory(self, request: spb.InventoryRequest, context) -> spb.InventoryResponse:
        principal = await self._principal(context)
        inventory = await self.core.inventory()
        if not principal.is_admin:  # a policy sees every device's occupancy, but only its own leases
            own = [lease for lease in inventory.leases if lease.policy == principal.policy]
            del inventory.leases[:]
            inventory.leases.extend(own)
            own_ids = {lease.lease_id for lease in own}
            for device in inventory.devices:
                if device.lease_id not in own_ids:
                    device.lease_id = ""  # `leased` still says it is taken
        return inventory

    async def Watch(self, request: spb.WatchRequest, context):
        principal = await self._principal(context)
        policy = request.policy or ("" if principal.is_admin else principal.policy)
        if policy:
            experience.validate_name("policy", policy)
        if not principal.is_admin and policy != principal.policy:
            raise PermissionDenied(f"principal {principal.name!r} may watch only policy {principal.policy!r}, "
                                   f"not {policy!r}")
        async for event in self.dispatcher.watch(policy):
            yield event
