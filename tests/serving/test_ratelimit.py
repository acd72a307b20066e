"""The per-principal token bucket, in this process and in Redis (shared by a service's replicas): burst,
refill, per-name buckets, and refusals that say what to do."""
import asyncio
import uuid

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from mrl.errors import ResourceExhausted
from mrl_serving.ratelimit import LocalRateLimiter, RedisRateLimiter


@pytest_asyncio.fixture(params=["local", "redis"])
async def limiter(request, redis_url):
    """make(rate, burst) -> a limiter of the parameter's kind (in Redis: a prefix of its own)."""
    client = aioredis.Redis.from_url(redis_url)
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    if request.param == "local":
        yield LocalRateLimiter
    else:
        yield lambda rate, burst: RedisRateLimiter(client, prefix, rate, burst)
    await client.aclose()


@pytest.mark.asyncio
async def test_a_burst_passes_then_the_next_call_is_refused_with_its_wait(limiter):
    a = limiter(rate=10, burst=5)
    for _ in range(5):
        await a.take("a")
    with pytest.raises(ResourceExhausted, match=r"retry in 0\.\d+ s"):
        await a.take("a")
    await a.take("b")           # another principal has its own bucket


@pytest.mark.asyncio
async def test_the_bucket_refills_at_the_rate(limiter):
    a = limiter(rate=50, burst=1)
    await a.take("a")
    with pytest.raises(ResourceExhausted):
        await a.take("a")
    await asyncio.sleep(0.05)
    await a.take("a")


@pytest.mark.asyncio
async def test_a_cost_above_the_burst_can_never_pass_and_says_split_it(limiter):
    a = limiter(rate=1000, burst=8)
    with pytest.raises(ResourceExhausted, match="split it into smaller batches"):
        await a.take("a", cost=9)
    await a.take("a", cost=8)


@pytest.mark.asyncio
async def test_two_redis_limiters_on_one_prefix_share_each_bucket(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    one, two = (RedisRateLimiter(client, prefix, rate=0.01, burst=2) for _ in range(2))
    await one.take("a")
    await two.take("a")
    with pytest.raises(ResourceExhausted):
        await one.take("a")
    await RedisRateLimiter(client, f"{prefix}other:", rate=0.01, burst=2).take("a")  # another prefix's bucket
    await client.aclose()


@pytest.mark.parametrize("rate, burst", [(0, 1), (1, 0), (-1, 5)])
@pytest.mark.parametrize("kind", [LocalRateLimiter, lambda rate, burst: RedisRateLimiter(None, "x", rate, burst)])
def test_bad_limits_are_refused(kind, rate, burst):
    with pytest.raises(ValueError):
        kind(rate, burst)
