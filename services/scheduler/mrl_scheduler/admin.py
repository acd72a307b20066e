"""REST admin of the scheduler (FastAPI): inventory, leases, queue, per-policy shares, force release,
node registration, Prometheus /metrics.

/healthz, /readyz and /metrics are open (probes and scrapers); everything under /v1 needs an
admin principal's bearer token when auth is on. Errors carry the same status as over gRPC
(mrl.errors: 400, 401, 403, 404, 409, 429, 503). OpenAPI at /openapi.json, docs at /docs.
"""
import functools

from fastapi import Depends, FastAPI

from mrl import experience
from mrl.auth import Authenticator
from mrl_serving.ratelimit import RateLimiter
from mrl_serving.redis_io import redis_ready
from mrl_serving.server import rest_app
from mrl.v1 import scheduler_pb2 as spb
from mrl_scheduler import fairshare
from mrl_scheduler.dispatch import Dispatcher
from mrl_scheduler.inventory import slot_devices
from mrl_scheduler.settings import NodeSpec

__all__ = ["create_admin_app"]


def create_admin_app(dispatcher: Dispatcher, auth: Authenticator, limiter: RateLimiter) -> FastAPI:
    core = dispatcher.core
    app, _, admin = rest_app("mrl scheduler admin", "Multi-Worker Resource Allocation (MWRA): devices, leases, the "
                             "fair-share queue.", auth, limiter, dispatcher.metrics.registry,
                             functools.partial(redis_ready, core.redis))

    @app.get("/v1/inventory", dependencies=[Depends(admin)])
    async def inventory():
        inv = await core.inventory()
        return {"devices": [_device_json(d) for d in inv.devices], "leases": len(inv.leases), "queued": inv.queued}

    @app.get("/v1/leases", dependencies=[Depends(admin)])
    async def leases():
        return {"leases": [_lease_json(lease) for lease in await core.leases()]}

    @app.get("/v1/queue", dependencies=[Depends(admin)])
    async def queue():
        return {"queue": await core.queue()}

    @app.get("/v1/shares", dependencies=[Depends(admin)])
    async def shares():
        return {"policies": fairshare.shares(await core.policy_state())}

    @app.delete("/v1/leases/{lease_id}", dependencies=[Depends(admin)])
    async def force_release(lease_id: str):
        """Revoke a lease whatever its token (REVOKED event; its holder's next renew fails)."""
        return {"revoked": await dispatcher.release(lease_id, 0, force=True, detail="revoked by an admin")}

    @app.put("/v1/nodes/{node}", dependencies=[Depends(admin)])
    async def register_node(node: str, spec: NodeSpec):
        """Make `spec` the node's whole device set (a lease on a device that leaves is revoked)."""
        experience.validate_name("node", node)
        devices = slot_devices(node, spec.slots, spec.memory_bytes, spec.kind)
        revoked, refused, passed = await core.register(node, devices)
        dispatcher.wake(passed)
        return {"node": node, "devices": len(devices), "revoked_leases": revoked, "refused_requests": refused}

    @app.delete("/v1/nodes/{node}", dependencies=[Depends(admin)])
    async def remove_node(node: str):
        revoked, refused, passed = await core.register(node, [])
        dispatcher.wake(passed)
        return {"node": node, "devices": 0, "revoked_leases": revoked, "refused_requests": refused}

    return app


def _device_json(d: spb.Device) -> dict:
    return {"device_id": d.device_id, "node": d.node, "index": d.index, "memory_bytes": d.memory_bytes,
            "kind": d.kind, "lease_id": d.lease_id or None}


def _lease_json(lease: spb.Lease) -> dict:
    """A Lease as plain JSON (numbers as numbers: MessageToDict writes uint64 as strings)."""
    return {"lease_id": lease.lease_id, "fencing_token": lease.fencing_token, "policy": lease.policy,
            "worker": lease.worker, "phase": lease.phase, "devices": [d.device_id for d in lease.devices],
            "expires_at": lease.expires_at.ToJsonString()}
