"""mrl_launcher.intervals: the t-interval and the crossed (seeds × problems) bootstrap."""
import math

import numpy as np
import pytest

from mrl_launcher.intervals import crossed_bootstrap, mean_ci, t975


def test_t_interval():
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(100) == pytest.approx(1.984)
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert (m, lo, hi) == pytest.approx((2.0, 2.0 - 4.303 / math.sqrt(3), 2.0 + 4.303 / math.sqrt(3)))
    assert mean_ci([0.9, 1.0, 1.0], 0.0, 1.0)[2] == 1.0          # clipped
    assert mean_ci([0.5]) == (0.5, None, None)


def test_a_constant_matrix_has_no_spread_and_the_draws_are_reproducible():
    assert crossed_bootstrap(np.full((3, 40), 0.25)) == pytest.approx((0.25, 0.25, 0.25))
    rng = np.random.default_rng(1)
    x = (rng.random((3, 64)) < 0.4).astype(float)
    assert crossed_bootstrap(x) == crossed_bootstrap(x)
    mean, lo, hi = crossed_bootstrap(x)
    assert mean == x.mean() and lo < mean < hi


def test_one_seed_resamples_problems_like_a_binomial():
    """S = 1: the interval is the problems' sampling spread, ±1.96·√(p(1−p)/Q) to within bootstrap noise."""
    x = np.zeros((1, 400))
    x[0, :120] = 1.0                                          # p = 0.3
    mean, lo, hi = crossed_bootstrap(x)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 400)
    assert mean == pytest.approx(0.3)
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.15)


def test_seed_to_seed_variation_widens_the_interval():
    """The same problems' outcomes, once with seeds that agree and once with seeds that differ by a lot."""
    rng = np.random.default_rng(2)
    base = (rng.random(64) < 0.5).astype(float)
    agree = np.stack([base, base, base])
    differ = np.stack([np.zeros(64), base, np.ones(64)])
    _, lo_a, hi_a = crossed_bootstrap(agree)
    _, lo_d, hi_d = crossed_bootstrap(differ)
    assert hi_d - lo_d > 2 * (hi_a - lo_a)


def test_bad_shapes_are_refused():
    for bad in ([], [1.0, 2.0], np.zeros((0, 3))):
        with pytest.raises(ValueError, match="seeds × problems"):
            crossed_bootstrap(bad)
