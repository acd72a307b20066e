"""PRP — Peer Rollout Pooling (data level; the Mutual RL paper): the peer sample's loss.

Peers' rollouts for the prompt join the own group (re-scored by the receiver's verifier) and advantages are
computed over the pooled group (xgrpo.pooled_advantages' baseline, over own and peer samples alike). A peer
sample y, sampled by π^j, is weighted by its density ratio (ratios.cross_log_ratio), truncated at c and used as
a constant:

    ρ̄_i = min(exp(log s_i), c)
    L   = agg_{i,t}[ −sg[ρ̄_i] A_i log π_θ(y_{i,t}) ]      over the pooled totals
"""
import torch
from torch import Tensor

from .aggregation import aggregate
from .ratios import cross_log_ratio

__all__ = ["truncated_ratio", "peer_rollout_loss"]


def truncated_ratio(logp: Tensor, mask: Tensor, behaviour_logp: Tensor, chunks: Tensor,
                    c: float) -> tuple[Tensor, Tensor]:
    """(log ρ, ρ̄) per sequence (N,), both constants: log ρ = ratios.cross_log_ratio, ρ̄ = min(e^{log ρ}, c)."""
    log_rho = cross_log_ratio(logp.detach(), mask, behaviour_logp, chunks)
    return log_rho, torch.exp(log_rho).clamp(max=c)


def peer_rollout_loss(logp: Tensor, mask: Tensor, advantages: Tensor, weights: Tensor, aggregation: str, *,
                      max_tokens: int | None = None, num_sequences: int | None = None,
                      num_tokens: int | None = None) -> Tensor:
    """agg_{i,t}[ −sg[ρ̄_i] A_i log π_θ(y_{i,t}) ]: logp, mask (N, T); advantages, weights ρ̄ (N,)."""
    per_token = -(weights.detach() * advantages).unsqueeze(-1) * torch.where(mask.bool(), logp, 0.0)
    return aggregate(per_token, mask, aggregation, max_tokens=max_tokens, num_sequences=num_sequences,
                     num_tokens=num_tokens)
