"""The per-principal token bucket: burst, refill, per-name buckets, and refusals that say what to do."""
import time

import pytest

from mrl.errors import ResourceExhausted
from mrl_serving.ratelimit import RateLimiter


def test_a_burst_passes_then_the_next_call_is_refused_with_its_wait():
    limiter = RateLimiter(rate=10, burst=5)
    for _ in range(5):
        limiter.take("a")
    with pytest.raises(ResourceExhausted, match=r"retry in 0\.\d+ s"):
        limiter.take("a")
    limiter.take("b")           # another principal has its own bucket


def test_the_bucket_refills_at_the_rate():
    limiter = RateLimiter(rate=50, burst=1)
    limiter.take("a")
    with pytest.raises(ResourceExhausted):
        limiter.take("a")
    time.sleep(0.05)
    limiter.take("a")


def test_a_cost_above_the_burst_can_never_pass_and_says_split_it():
    limiter = RateLimiter(rate=1000, burst=8)
    with pytest.raises(ResourceExhausted, match="split it into smaller batches"):
        limiter.take("a", cost=9)
    limiter.take("a", cost=8)


@pytest.mark.parametrize("rate, burst", [(0, 1), (1, 0), (-1, 5)])
def test_bad_limits_are_refused(rate, burst):
    with pytest.raises(ValueError):
        RateLimiter(rate, burst)
