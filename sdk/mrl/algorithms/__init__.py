"""The algorithms of mutual RL as pure functions of tensors: no I/O, no process group, no guard
(docs/algorithms.md). The mrl trainer and the TRL integration (mrl.integrations.trl) both compute with these;
importing this package needs torch (the SDK's base install does not).

    advantages.py   group_advantages                       GRPO / Dr.GRPO group-relative advantages
    aggregation.py  aggregate, masked_seq_mean, normaliser  per-token losses → one scalar (DAPO, GRPO, Dr.GRPO)
    grpo.py         policy_loss, clipped_surrogate, kl_k3   the GRPO-family clipped surrogate (+ β·k3 KL)
    gspo.py         sequence_ratio                          GSPO's sequence-level importance ratio
    ratios.py       cross_log_ratio                         a peer response's density ratio across tokenizers
    xgrpo.py        pooled_advantages                       XGRPO's (and PRP's) pooled baseline
    prp.py          truncated_ratio, peer_rollout_loss      PRP's loss on a peer rollout
    sgt.py          rescue_nll                              SGT's rescue term
    hacpo.py        capability_ratio, mixed_advantages,     HACPO's capability-weighted baseline and its
                    stepwise_lower_bound, peer_loss         clipped exponential importance sampling

A non-finite loss is not raised on here: the caller checks `torch.isfinite(loss)`.
"""
from .advantages import group_advantages
from .aggregation import Aggregation, aggregate, masked_seq_mean, normaliser
from .grpo import ImportanceLevel, clipped_surrogate, kl_k3, policy_loss, token_ratio
from .gspo import GSPO_EPS_HIGH, GSPO_EPS_LOW, sequence_ratio
from .ratios import cross_log_ratio

__all__ = ["Aggregation", "GSPO_EPS_HIGH", "GSPO_EPS_LOW", "ImportanceLevel", "aggregate", "clipped_surrogate",
           "cross_log_ratio", "group_advantages", "kl_k3", "masked_seq_mean", "normaliser", "policy_loss",
           "sequence_ratio", "token_ratio"]
