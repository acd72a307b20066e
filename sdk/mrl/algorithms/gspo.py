"""GSPO: the sequence-level importance ratio (Zheng et al. 2025, "Group Sequence Policy Optimization").

    s_i(theta) = (pi_theta(y_i | x) / pi_old(y_i | x))^(1/|y_i|)
               = exp( (1/|y_i|) sum_t m_{i,t} [log pi_theta(y_{i,t}) - log pi_old(y_{i,t})] )

    J_GSPO(theta) = E[ (1/G) sum_i min( s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i ) ]

The paper clips at eps_low = 3e-4, eps_high = 4e-4 (`GSPO_EPS_LOW`, `GSPO_EPS_HIGH`). Terms as in the code:
`sequence_ratio` returns s (N, 1); `grpo.policy_loss(level="sequence")` feeds it to the same clipped surrogate
as GRPO, broadcast over each response's tokens, then aggregates. With aggregation "seq-mean-token-mean" the
|y_i| equal copies average back to one term per sequence, which is J_GSPO; it is also GSPO-token (paper §4.3)
with A_{i,t} = A_i, whose value and gradient are the same. This is TRL 1.16's importance_sampling_level="sequence".

Departures: an empty response (|y_i| = 0) gets s = 1. Aggregations that sum tokens ("token-mean",
"seq-mean-token-sum-norm") weight each sequence by its length; they are allowed but are not GSPO.
"""
import torch
from torch import Tensor

from .aggregation import masked_seq_mean

__all__ = ["GSPO_EPS_LOW", "GSPO_EPS_HIGH", "sequence_ratio"]

GSPO_EPS_LOW = 3e-4
GSPO_EPS_HIGH = 4e-4


def sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """s_i = exp(masked mean_t (logp - old_logp)): logp, old_logp, mask (N, T) -> (N, 1), differentiable in logp."""
    return torch.exp(masked_seq_mean(logp - old_logp, mask)).unsqueeze(-1)
