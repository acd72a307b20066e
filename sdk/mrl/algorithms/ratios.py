"""The density ratio of a peer's response under the receiver (PRP, HACPO), across tokenizers.

    log s = ( Σ_t log π_θ^k(y_t)  −  Σ_u log π_old^j(y_u) ) / C(y)

each sum over its own policy's tokens of the same text y, divided by ONE normaliser, C(y) = the number of THL
chunks of y (the smallest spans both tokenizations agree on; = |y| when the tokenizers are the same, where this
is the papers' per-token ratio). When both policies give y the same probability, log s = 0 whatever the two token
counts (a per-side mean would give log P · (1/|y|_k − 1/|y|_j) ≠ 0 instead).
"""
import torch
from torch import Tensor

__all__ = ["cross_log_ratio"]


def cross_log_ratio(logp: Tensor, mask: Tensor, behaviour_logp: Tensor, chunks: Tensor) -> Tensor:
    """log s (N,): logp, mask (N, T) in k's tokens; behaviour_logp, chunks (N,) from the producer j.
    Differentiable in logp."""
    return (torch.where(mask.bool(), logp, 0.0).sum(-1) - behaviour_logp) / chunks.clamp(min=1)
