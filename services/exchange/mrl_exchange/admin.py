"""REST admin of the exchange (FastAPI): health, runs, topics, trim, delete, Prometheus /metrics.

/healthz, /readyz and /metrics are open (probes and scrapers); everything under /v1 needs an
admin principal's bearer token when auth is on. OpenAPI at /openapi.json, docs at /docs.
"""
import functools

from fastapi import Depends, FastAPI, Query

from mrl import experience
from mrl.auth import Authenticator
from mrl_serving.ratelimit import RateLimiter
from mrl_serving.redis_io import redis_ready
from mrl_serving.server import rest_app
from mrl_exchange.core import Exchange

__all__ = ["create_admin_app"]


def create_admin_app(exchange: Exchange, auth: Authenticator, limiter: RateLimiter) -> FastAPI:
    app, _, admin = rest_app("mrl exchange admin", "Shared Experience Exchange (SEE): runs, topics, consumer lag, "
                             "retention.", auth, limiter, exchange.metrics.registry,
                             functools.partial(redis_ready, exchange.redis))

    @app.get("/v1/runs", dependencies=[Depends(admin)])
    async def runs():
        return {"runs": await exchange.runs()}

    @app.get("/v1/runs/{run_id}/topics", dependencies=[Depends(admin)])
    async def topics(run_id: str):
        experience.validate_name("run_id", run_id)
        stats = await exchange.topic_stats(run_id)
        return {"run_id": run_id, "topics": [_topic_json(s) for s in stats]}

    @app.post("/v1/runs/{run_id}/topics/{kind}/{producer}/trim", dependencies=[Depends(admin)])
    async def trim(run_id: str, kind: str, producer: str, maxlen: int = Query(..., ge=0)):
        experience.validate_name("run_id", run_id)
        return {"removed": await exchange.trim(run_id, kind, producer, maxlen)}

    @app.delete("/v1/runs/{run_id}", dependencies=[Depends(admin)])
    async def delete_run(run_id: str):
        return {"deleted_keys": await exchange.delete_run(run_id)}

    return app


def _topic_json(s) -> dict:
    """TopicStats as plain JSON (numbers as numbers: MessageToDict writes uint64 as strings)."""
    return {"kind": experience.kind_name(s.topic.kind), "producer": s.topic.producer, "length": s.length,
            "last_id": s.last_id, "latest_policy_version": s.latest_policy_version,
            "groups": [{"subscriber": g.subscriber, "pending": g.pending, "lag": g.lag,
                        "last_delivered_id": g.last_delivered_id, "consumers": g.consumers} for g in s.groups]}
