"""The Redis boundary every Redis-backed service shares: the client, and a failed Redis call becomes `Unavailable`.

    redis = connect(url, cluster=settings.redis_cluster, max_connections=128)   # Redis, or RedisCluster
    value = await redis_call(redis.hgetall(key))     # RedisError / OSError -> mrl.errors.Unavailable
    await wait_for_redis(redis)                       # at start: Redis answers within the timeout, in the mode
                                                      # configured (one server, or a cluster)

With `cluster` the client is redis-py's RedisCluster: it reads the slot map from the node `url` names and
sends each command to the node serving its key's slot. Every multi-key command and script of the services
touches the keys of one run (exchange) or one namespace (scheduler), which share a hash tag (`{run}`,
`{namespace}`) and so one slot.
"""
import asyncio

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from mrl.errors import InvalidArgument, Unavailable

__all__ = ["connect", "redis_call", "ping", "redis_ready", "wait_for_redis"]

_FAILURES = (RedisError, RedisClusterException, OSError)


def connect(url: str, *, cluster: bool = False, max_connections: int,
            decode_responses: bool = False) -> aioredis.Redis | RedisCluster:
    """An asyncio client of `url`. One server: a pool of max_connections where a command waits (up to 10 s) for
    a free connection. A cluster (`url` names any of its nodes, redis:// or rediss://): max_connections per node,
    beyond which a command fails (Unavailable)."""
    if not cluster:
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=10,
                                                        decode_responses=decode_responses)
        return aioredis.Redis(connection_pool=pool)
    if not url.startswith(("redis://", "rediss://")):
        raise InvalidArgument(f"redis_cluster is set but redis_url {url!r} is not redis:// or rediss://: name one "
                              f"node of the cluster by host and port (a cluster is not reached over a unix socket)")
    return RedisCluster.from_url(url, max_connections=max_connections, decode_responses=decode_responses)


async def redis_call(awaitable):
    """Await a Redis command; a connection or server failure becomes Unavailable (the boundary mapping)."""
    try:
        return await awaitable
    except _FAILURES as exc:
        raise Unavailable(f"Redis is unreachable or failed: {exc}") from exc


async def ping(redis: aioredis.Redis | RedisCluster) -> bool:
    return await _probe(redis) is None


async def _probe(redis) -> str | None:
    """None when Redis answers PING (every node, for a cluster), else why not."""
    try:
        return None if await redis.ping() else "PING was not answered"
    except _FAILURES as exc:
        return str(exc) or type(exc).__name__


async def redis_ready(redis: aioredis.Redis | RedisCluster) -> str | None:
    """A REST app's readiness (mrl_serving.server.rest_app): None while Redis answers, else why not."""
    return None if await ping(redis) else "Redis is not reachable"


async def wait_for_redis(redis: aioredis.Redis | RedisCluster, timeout_s: float = 10.0) -> None:
    """Wait until Redis answers; InvalidArgument when it is a cluster node and the client is not a cluster
    client (every command on another node's slot would fail with MOVED)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (why := await _probe(redis)) is not None:
        if "Cluster mode is not enabled" in why:
            raise InvalidArgument("redis_cluster is set but redis_url names a Redis server that is not in cluster "
                                  "mode: unset redis_cluster, or name a node of the cluster")
        if asyncio.get_running_loop().time() > deadline:
            raise Unavailable(f"Redis did not answer within {timeout_s} s: {why}")
        await asyncio.sleep(0.1)
    if not isinstance(redis, RedisCluster):
        info = await redis_call(redis.info("cluster"))
        if int(info.get("cluster_enabled", 0)):
            raise InvalidArgument("redis_url names a node of a Redis Cluster: set redis_cluster (MRL_REDIS_CLUSTER="
                                  "true) so that commands go to the node serving each key's slot")
