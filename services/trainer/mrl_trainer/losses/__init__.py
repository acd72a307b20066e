"""GRPO-family losses as pure functions of tensors (docs/algorithms.md).

Two stages, each chosen by a `Literal` name: a per-token surrogate (`policy_loss`, with the importance ratio at
`level` "token" = GRPO or "sequence" = GSPO, clipped at eps_low / eps_high, plus beta * k3 KL), then an
`aggregate` ("token-mean" = DAPO, "seq-mean-token-mean" = GRPO, "seq-mean-token-sum-norm" = Dr.GRPO).
Advantages come from `group_advantages` (std scaling on = GRPO, off = Dr.GRPO).

    advantages.py   group_advantages
    aggregation.py  Aggregation, aggregate, masked_seq_mean, normaliser
    gspo.py         sequence_ratio, GSPO_EPS_LOW, GSPO_EPS_HIGH
    grpo.py         ImportanceLevel, token_ratio, kl_k3, clipped_surrogate, policy_loss

A non-finite loss is not raised on here: the trainer checks `torch.isfinite(loss)`.
"""
from .advantages import group_advantages
from .aggregation import Aggregation, aggregate, masked_seq_mean, normaliser
from .grpo import ImportanceLevel, clipped_surrogate, kl_k3, policy_loss, token_ratio
from .gspo import GSPO_EPS_HIGH, GSPO_EPS_LOW, sequence_ratio

__all__ = ["Aggregation", "GSPO_EPS_HIGH", "GSPO_EPS_LOW", "ImportanceLevel", "aggregate", "clipped_surrogate",
           "group_advantages", "kl_k3", "masked_seq_mean", "normaliser", "policy_loss", "sequence_ratio",
           "token_ratio"]
