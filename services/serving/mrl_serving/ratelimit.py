"""Per-principal rate limits: a token bucket each, charged with `await limiter.take(name, cost)`.

A bucket holds at most `burst` tokens and refills at `rate` tokens/s; a call of cost c
passes when c tokens are there (and takes them), otherwise it is refused with the wait
it would need. Where the buckets live:

    RedisRateLimiter   in Redis (the exchange: mrl:rl:<rate_limit_scope>:<principal>; the scheduler: in its
                       namespace, mrl:sched:{<namespace>}:rl:<principal>), one hash per principal read and changed by one
                       atomic script on Redis's clock: every replica on the same Redis charges the same bucket,
                       so a principal gets `rate` however many replicas it reaches
    LocalRateLimiter   in the serving process (the THL, which has no Redis): with R replicas behind a balancer
                       a principal gets up to R·rate
"""
import threading
import time

from mrl.errors import ResourceExhausted
from mrl_serving.redis_io import redis_call

__all__ = ["RateLimiter", "LocalRateLimiter", "RedisRateLimiter"]


class RateLimiter:
    """What both share: the limits, `take` (ResourceExhausted when refused) and the refusal's words."""

    def __init__(self, rate: float, burst: float):
        if rate <= 0 or burst <= 0:
            raise ValueError(f"rate ({rate}) and burst ({burst}) must be > 0")
        self.rate, self.burst = rate, burst

    async def take(self, name: str, cost: float = 1.0) -> None:
        raise NotImplementedError

    def _refuse(self, name: str, cost: float, tokens: float) -> ResourceExhausted:
        if cost > self.burst:
            return ResourceExhausted(f"{name!r}: a request of cost {cost:g} exceeds the burst limit "
                                     f"{self.burst:g}; split it into smaller batches")
        wait = (cost - tokens) / self.rate
        return ResourceExhausted(f"rate limit of {self.rate:g}/s exceeded for {name!r}; retry in {wait:.3f} s")


class LocalRateLimiter(RateLimiter):
    """Buckets in this process."""

    def __init__(self, rate: float, burst: float):
        super().__init__(rate, burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, last refill time)
        self._lock = threading.Lock()

    async def take(self, name: str, cost: float = 1.0) -> None:
        with self._lock:
            now = time.monotonic()
            tokens, last = self._buckets.get(name, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            passed = cost <= tokens
            self._buckets[name] = (tokens - cost if passed else tokens, now)
        if not passed:
            raise self._refuse(name, cost, tokens)


# KEYS[1] = the bucket, a hash of tokens and at (ms, Redis's clock); ARGV = rate per s, burst, cost.
# Returns {1 (passed) or 0, the tokens left}. A bucket that would be full again expires.
_TAKE_LUA = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = burst
if b[1] then tokens = math.min(burst, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * rate / 1000) end
local passed = cost <= tokens
if passed then tokens = tokens - cost end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%.17g', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {passed and 1 or 0, string.format('%.17g', tokens)}
"""


class RedisRateLimiter(RateLimiter):
    """Buckets in Redis, shared by every limiter with the same `prefix`: key prefix + principal name."""

    def __init__(self, redis, prefix: str, rate: float, burst: float):
        super().__init__(rate, burst)
        self.prefix = prefix
        self._take = redis.register_script(_TAKE_LUA)

    async def take(self, name: str, cost: float = 1.0) -> None:
        passed, tokens = await redis_call(self._take(keys=[self.prefix + name],
                                                     args=[repr(self.rate), repr(self.burst), repr(cost)]))
        if not passed:
            raise self._refuse(name, cost, float(tokens))
