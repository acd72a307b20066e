"""Per-principal rate limits: a token bucket each.

A bucket holds at most `burst` tokens and refills at `rate` tokens/s; a call of cost c
passes when c tokens are there (and takes them), otherwise it is refused with the wait
it would need. Buckets live in the serving process: with R replicas behind a balancer
a principal gets up to R·rate.
"""
import threading
import time

from mrl.errors import ResourceExhausted

__all__ = ["RateLimiter"]


class RateLimiter:
    def __init__(self, rate: float, burst: float):
        if rate <= 0 or burst <= 0:
            raise ValueError(f"rate ({rate}) and burst ({burst}) must be > 0")
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, last refill time)
        self._lock = threading.Lock()  # REST work may charge from a worker thread

    def take(self, name: str, cost: float = 1.0) -> None:
        with self._lock:
            self._take(name, cost)

    def _take(self, name: str, cost: float) -> None:
        now = time.monotonic()
        tokens, last = self._buckets.get(name, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if cost > tokens:
            self._buckets[name] = (tokens, now)
            wait = (cost - tokens) / self.rate
            if cost > self.burst:
                raise ResourceExhausted(f"{name!r}: a request of cost {cost:g} exceeds the burst limit "
                                        f"{self.burst:g}; split it into smaller batches")
            raise ResourceExhausted(f"rate limit of {self.rate:g}/s exceeded for {name!r}; retry in {wait:.3f} s")
        self._buckets[name] = (tokens - cost, now)
