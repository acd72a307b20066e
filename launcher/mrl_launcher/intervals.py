"""95% intervals for comparisons over seeds: Student's t over seeds, and a crossed bootstrap over seeds and problems.

t-interval (`mean_ci`), for n per-seed values v_1..v_n:

    mean ± t_{0.975, n−1} · sd / √n        (sd with n − 1; no interval for n < 2)

Crossed bootstrap (`crossed_bootstrap`), for outcomes X[s, q] of seed s = 1..S on problem q = 1..Q (held-out
correctness 0/1, or a paired difference of two modes on the same seed and problem). Seeds and problems are both
sampled — a new run would draw other seeds *and* the task other problems — so each replicate b draws S seeds
and Q problems with replacement, independently, and takes

    θ*_b = (1 / (S·Q)) · Σ_i Σ_j X[s*_bi, q*_bj] = (w_b^S)ᵀ X w_b^Q / (S·Q)

with w^S, w^Q the draw counts. The interval is the 2.5th and 97.5th percentiles of θ*_1..θ*_B (percentile
bootstrap); the estimate is the plain mean of X. With S = 1 it resamples problems only (the interval then
says nothing about seed-to-seed variation); with Q = 1 (only an accuracy per seed was recorded) seeds only.
Replicates are drawn from a fixed generator seed, so a report is reproducible.
"""
import math

import numpy as np

__all__ = ["t975", "mean_ci", "crossed_bootstrap", "REPLICATES"]

REPLICATES = 4000

_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with df degrees of freedom (table to 30, then 1.96 + 2.4/df)."""
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def mean_ci(values: list[float], lo: float = -math.inf,
            hi: float = math.inf) -> tuple[float, float | None, float | None]:
    """(mean, lower, upper) of the 95% t-interval, clipped to [lo, hi]; no interval for fewer than two values."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, None, None
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = t975(n - 1) * sd / math.sqrt(n)
    return m, max(m - h, lo), min(m + h, hi)


def crossed_bootstrap(x, replicates: int = REPLICATES, seed: int = 0) -> tuple[float, float, float]:
    """(mean, lower, upper): the 95% percentile interval of the mean of x[seed, problem], both axes resampled."""
    x = np.asarray(x, dtype=float)
    if x.ndim != 2 or not x.size:
        raise ValueError(f"expected a non-empty seeds × problems matrix, got shape {x.shape}")
    s, q = x.shape
    rng = np.random.default_rng(seed)
    w_s = rng.multinomial(s, np.full(s, 1.0 / s), size=replicates)    # draw counts per seed
    w_q = rng.multinomial(q, np.full(q, 1.0 / q), size=replicates)
    theta = np.einsum("bs,sq,bq->b", w_s, x, w_q) / (s * q)
    lo, hi = np.percentile(theta, [2.5, 97.5])
    return float(x.mean()), float(lo), float(hi)
