"""The Redis boundary every Redis-backed service shares: a failed Redis call becomes `Unavailable`.

    value = await redis_call(redis.hgetall(key))     # RedisError / OSError -> mrl.errors.Unavailable
    await wait_for_redis(redis)                       # at start: Redis answers within the timeout
"""
import asyncio

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from mrl.errors import Unavailable

__all__ = ["redis_call", "ping", "redis_ready", "wait_for_redis"]


async def redis_call(awaitable):
    """Await a Redis command; a connection or server failure becomes Unavailable (the boundary mapping)."""
    try:
        return await awaitable
    except (RedisError, OSError) as exc:
        raise Unavailable(f"Redis is unreachable or failed: {exc}") from exc


async def ping(redis: aioredis.Redis) -> bool:
    try:
        return bool(await redis.ping())
    except (RedisError, OSError):
        return False


async def redis_ready(redis: aioredis.Redis) -> str | None:
    """A REST app's readiness (mrl_serving.server.rest_app): None while Redis answers, else why not."""
    return None if await ping(redis) else "Redis is not reachable"


async def wait_for_redis(redis: aioredis.Redis, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await ping(redis):
        if asyncio.get_running_loop().time() > deadline:
            raise Unavailable(f"Redis did not answer within {timeout_s} s")
        await asyncio.sleep(0.1)
