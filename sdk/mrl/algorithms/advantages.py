"""Group-relative advantages (GRPO, Shao et al. 2024 "DeepSeekMath"; Dr.GRPO, Liu et al. 2025).

For a group g of responses to one prompt with rewards R_1..R_n:

    A_i = (R_i - mean_g R) / (std_g R + eps)      scale=True   (GRPO)
    A_i =  R_i - mean_g R                          scale=False  (Dr.GRPO: no std, which removes the
                                                                 question-difficulty bias)

std_g is the unbiased (Bessel-corrected, n - 1) standard deviation, as `torch.std` and TRL 1.16's `nanstd`;
eps = 1e-4 as in TRL. Terms as in the code: `rewards` = R, `mean` = mean_g R, `std` = std_g R.

Departures from TRL 1.16 (`GRPOTrainer._generate_and_score_completions`, scale_rewards "group" / "none"):
- a group whose rewards are all equal gets A = 0 exactly (TRL: 0 up to the rounding of its mean, ~1e-8);
- a one-member group gets A = 0 directly (TRL: its std is NaN, then `nan_to_num` makes A = 0);
- NaN rewards are not skipped (TRL's `nanmean` drops unscorable completions): they propagate, so a
  caller can see them with `torch.isfinite`; TRL's scale_rewards="batch" (one std over the batch) is not offered;
- groups may have different sizes (pass `group_ids`), which TRL's fixed `num_generations` cannot express.
"""
import torch
from torch import Tensor

__all__ = ["group_advantages"]


def group_advantages(rewards: Tensor, group_ids: Tensor | None = None, *, scale: bool = True,
                     eps: float = 1e-4) -> Tensor:
    """Advantages of `rewards` relative to their group, same shape as `rewards`.

    rewards: (B, G), one row per prompt, or flat (N,) with `group_ids` (N,) of any integer labels (groups may
    differ in size). scale: divide by the group's unbiased std + eps (GRPO) or not (Dr.GRPO).
    """
    if group_ids is None:
        if rewards.dim() != 2:
            raise ValueError(f"rewards of shape {tuple(rewards.shape)} need group_ids, or shape (B, G)")
        group_ids = torch.arange(rewards.shape[0], device=rewards.device).repeat_interleave(rewards.shape[1])
    elif rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"with group_ids, rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} "
                         "must both be flat (N,)")
    r = rewards.reshape(-1)
    r = r if r.is_floating_point() else r.to(torch.get_default_dtype())  # (N,)
    _, group, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)  # (N,), (K,)
    zeros = r.new_zeros(len(counts))  # (K,)
    mean = zeros.index_add(0, group, r) / counts
    deviation = r - mean[group]
    spread = (zeros.scatter_reduce(0, group, r, "amax", include_self=False)
              - zeros.scatter_reduce(0, group, r, "amin", include_self=False))
    deviation = torch.where(spread[group] == 0, 0.0, deviation)  # all-equal group: exactly 0, not rounding noise
    if scale:
        std = (zeros.index_add(0, group, deviation**2) / (counts - 1).clamp(min=1)).sqrt()  # unbiased; n=1 -> 0
        deviation = deviation / (std[group] + eps)
    return deviation.reshape(rewards.shape)
