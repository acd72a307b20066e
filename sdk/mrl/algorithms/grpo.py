"""GRPO-family policy loss: a per-token clipped surrogate with a k3 KL penalty, then an aggregation.

    loss = agg_{i,t}[ l_{i,t} ],   l_{i,t} = -min( w_{i,t} A_i, clip(w_{i,t}, 1 - eps_low, 1 + eps_high) A_i )
                                             + beta * D_{i,t}

    w_{i,t} = r_{i,t} = pi_theta(y_{i,t} | x, y_{i,<t}) / pi_old(y_{i,t} | x, y_{i,<t})   level "token" (GRPO)
    w_{i,t} = s_i = exp(mean_t log r_{i,t})                                                level "sequence" (GSPO)
    D_{i,t} = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1                                   k3 (Schulman 2020)

GRPO is Shao et al. 2024 ("DeepSeekMath"); DAPO's clip-higher (Yu et al. 2025) is eps_high > eps_low; GSPO is
in gspo.py; agg (token-mean / seq-mean-token-mean / seq-mean-token-sum-norm) in aggregation.py; the
advantages A_i in advantages.py. Terms as in the code: `ratio` = w, `advantages` = A, `kl` = D, `beta`,
`eps_low`, `eps_high`, `per_token_loss` = l. k3 is >= 0, 0 iff pi_theta = pi_ref, and unbiased for
KL(pi_theta || pi_ref) on samples from pi_theta.

Departures from the GRPO paper, all matching TRL 1.16 `GRPOTrainer._compute_loss` (loss_type grpo, bnpo, dapo,
dr_grpo x importance_sampling_level token, sequence; tests/test_trainer_losses.py compares them):
- the aggregation is a choice (the paper's is seq-mean-token-mean);
- `kl_ratio_weight=True` multiplies D by w (DeepSeek-V3.2's unbiased KL gradient; TRL's
  use_bias_correction_kl, True by default there). The default here is False, the plain k3 of docs/algorithms.md.
Not offered: TRL's `delta` cap on w, its off-policy sequence mask, entropy mask or bonus, vLLM importance
correction, and the cispo / sapo / vespo / luspo losses.

Masked positions (mask 0) never reach the loss or its gradient, even holding NaN or inf. Non-finite values on
response tokens are NOT checked here: they make the loss non-finite, and the trainer checks
`torch.isfinite(loss)` before `backward()` and stops cleanly. Only bad names, shapes and settings raise.
"""
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from ._names import choose
from .aggregation import Aggregation, aggregate
from .gspo import sequence_ratio

__all__ = ["ImportanceLevel", "clipped_surrogate", "kl_k3", "policy_loss", "token_ratio"]

ImportanceLevel = Literal["token", "sequence"]


def token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """r_{i,t} = exp(logp - old_logp): (N, T) -> (N, T); `mask` unused (same signature as `sequence_ratio`)."""
    return torch.exp(logp - old_logp)


_RATIOS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {"token": token_ratio, "sequence": sequence_ratio}


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref): exp(ref_logp - logp) - (ref_logp - logp) - 1, >= 0."""
    log_ref_ratio = ref_logp - logp
    return torch.exp(log_ref_ratio) - log_ref_ratio - 1


def clipped_surrogate(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """-min(w A, clip(w, 1 - eps_low, 1 + eps_high) A), elementwise with broadcasting (advantages (N, 1))."""
    if not 0 <= eps_low < 1 or eps_high < 0:
        raise ValueError(f"clip range needs 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, "
                         f"eps_high={eps_high}")
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    return -torch.min(ratio * advantages, clipped * advantages)


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
                ref_logp: Tensor | None = None, beta: float = 0.0, eps_low: float = 0.2, eps_high: float = 0.2,
                level: ImportanceLevel = "token", aggregation: Aggregation = "seq-mean-token-mean",
                max_tokens: int | None = None, num_sequences: int | None = None, num_tokens: int | None = None,
                kl_ratio_weight: bool = False) -> tuple[Tensor, dict[str, float]]:
    """The scalar loss of the module docstring, and detached stats.

    logp, old_logp, ref_logp, mask: (N, T) per response token (mask 1 on response tokens); advantages: (N,).
    old_logp and ref_logp are treated as constants (detached). max_tokens, num_sequences, num_tokens: see
    `aggregate` (whole-batch totals under micro-batching). Stats, python floats over this call:
    clip_low / clip_high = fraction of units (tokens; sequences at level "sequence") where the clip bites
    (w < 1 - eps_low with A < 0 / w > 1 + eps_high with A > 0, as TRL), ratio_mean, and kl (mean k3 over
    response tokens, present only when ref_logp is given).
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask "
                         f"{tuple(mask.shape)} must be (N, T), advantages {tuple(advantages.shape)} (N,)")
    if beta != 0.0 and ref_logp is None:
        raise ValueError(f"beta ({beta}) != 0 needs ref_logp, the reference policy's per-token log-probs")
    mask = mask.bool()
    logp = torch.where(mask, logp, 0.0)  # padding may hold anything; its gradient is 0
    old_logp = torch.where(mask, old_logp.detach(), 0.0)
    ratio = choose(_RATIOS, level, "importance level")(logp, old_logp, mask)  # (N, T) or (N, 1)
    advantages = advantages.detach().unsqueeze(-1)  # (N, 1)
    per_token_loss = clipped_surrogate(ratio, advantages, eps_low, eps_high)  # (N, T) or (N, 1)
    kl = None
    if ref_logp is not None:
        kl = kl_k3(logp, torch.where(mask, ref_logp.detach(), 0.0))  # (N, T)
        if beta != 0.0:
            per_token_loss = per_token_loss + beta * (kl * ratio if kl_ratio_weight else kl)
    loss = aggregate(per_token_loss, mask, aggregation, max_tokens=max_tokens, num_sequences=num_sequences,
                     num_tokens=num_tokens)
    return loss, _stats(ratio, advantages, mask, kl, eps_low, eps_high)


@torch.no_grad()
def _stats(ratio, advantages, mask, kl, eps_low, eps_high) -> dict[str, float]:
    """Clip fractions and mean ratio over the units the ratio lives on; mean k3 over response tokens."""
    units = mask if ratio.shape == mask.shape else mask.any(-1, keepdim=True)  # (N, T) or (N, 1)
    count = units.sum().clamp(min=1)
    low = (ratio < 1 - eps_low) & (advantages < 0) & units
    high = (ratio > 1 + eps_high) & (advantages > 0) & units
    stats = {"clip_low": low.sum() / count, "clip_high": high.sum() / count,
             "ratio_mean": torch.where(units, ratio, 0.0).sum() / count}
    if kl is not None:
        stats["kl"] = torch.where(mask, kl, 0.0).sum() / mask.sum().clamp(min=1)
    return {name: value.item() for name, value in stats.items()}
