"""HACPO — Heterogeneous Agent Collaborative Policy Optimization (the HACRL paper): its tensor math.

Capability ratio, from capabilities P̂ the receiver measures (never a peer's claim):

    ω^(k,j) = clamp(P̂^k / P̂^j, 0.1, 10),      ω^(k,k) = 1

Mixed baseline over one prompt's n pooled samples (own and peers', every reward under k's verifier):

    μ̂ = (1/n) Σ_j Σ_i ω^(k,j) R(y_i^j),   σ = std of the n rewards (n − 1),   A = (R − μ̂) / (σ + ε)

all n rewards equal → A = 0; μ̂ > 1 → μ̂ = k's own group mean. A peer sample takes exponential importance
sampling with stepwise clipping, no min():

    s  = exp(log s)                                      ratios.cross_log_ratio
    s̄  = clip(s, 1 − δ + m·δ_step, 1)                    m = optimizer updates already made this step
    l  = −s̄ · sg[s̄]^α · ω^(j,k) · A

Outside the clip s̄ is a constant and the peer sample has no gradient.
"""
import torch
from torch import Tensor

from .aggregation import aggregate
from .ratios import cross_log_ratio

__all__ = ["OMEGA_MIN", "OMEGA_MAX", "capability_ratio", "mixed_advantages", "stepwise_lower_bound", "peer_loss"]

OMEGA_MIN, OMEGA_MAX = 0.1, 10.0


def capability_ratio(p_k: float, p_j: float) -> float:
    """ω^(k,j) = clamp(P̂^k / P̂^j, 0.1, 10); two zero capabilities give 1."""
    if p_j <= 0:
        return 1.0 if p_k <= 0 else OMEGA_MAX
    return min(max(p_k / p_j, OMEGA_MIN), OMEGA_MAX)


def mixed_advantages(rewards: Tensor, omegas: Tensor, own: Tensor, scale: bool = True, eps: float = 1e-4) -> Tensor:
    """A (n,) of one prompt's pooled samples: rewards, ω^(k,j) of each sample's producer, own (bool) mask."""
    if bool((rewards == rewards[0]).all()):
        return torch.zeros_like(rewards)
    baseline = (omegas * rewards).mean()
    if baseline > 1:
        baseline = rewards[own].mean()
    deviation = rewards - baseline
    return deviation / (rewards.std() + eps) if scale and len(rewards) > 1 else deviation


def stepwise_lower_bound(delta: float, delta_step: float, update: int) -> float:
    """1 − δ + m·δ_step, at most 1."""
    return min(1.0 - delta + update * delta_step, 1.0)


def peer_loss(logp: Tensor, mask: Tensor, behaviour_logp: Tensor, chunks: Tensor, advantages: Tensor,
              weights: Tensor, *, lower: float, alpha: float, aggregation: str, max_tokens: int | None = None,
              num_sequences: int | None = None, num_tokens: int | None = None) -> tuple[Tensor, Tensor]:
    """agg[ −s̄ sg[s̄]^α ω A ] broadcast over each sequence's tokens, and s (N,) detached.
    logp, mask (N, T); behaviour_logp, chunks, advantages, weights ω^(j,k) (N,)."""
    ratio = torch.exp(cross_log_ratio(logp, mask, behaviour_logp, chunks))            # s (N,)
    clipped = ratio.clamp(min=lower, max=1.0)
    term = clipped * clipped.detach() ** alpha * weights * advantages
    loss = aggregate(-term.unsqueeze(-1), mask, aggregation, max_tokens=max_tokens, num_sequences=num_sequences,
                     num_tokens=num_tokens)
    return loss, ratio.detach()
