"""SGT — Success-Gated Transfer (outcome level; the Mutual RL paper): the rescue term.

Where the receiver's own group failed and a peer's success passes the receiver's own verifier, the success joins
the rescue set S (in the receiver's tokens), and the loss adds

    L = L_GRPO(own) + λ · (1/N) Σ_{y ∈ S} (1/|y|) Σ_t −log π_θ(y_t | x, y_<t)

N = |S| (`responses`, the paper) or the step's prompts P (`prompts`). With S empty L = L_GRPO exactly.
"""
from torch import Tensor

from .aggregation import masked_seq_mean

__all__ = ["rescue_nll"]


def rescue_nll(logp: Tensor, mask: Tensor, lam: float, divisor: int) -> Tensor:
    """λ · Σ_y [(1/|y|) Σ_t −log π_θ(y_t)] / N over a micro-batch of rescued responses (N = `divisor`, the step's):
    logp, mask (|S|, T) per-token log-probs and the response mask."""
    return lam * (-masked_seq_mean(logp, mask)).sum() / max(divisor, 1)
