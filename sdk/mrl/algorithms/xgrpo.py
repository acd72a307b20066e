"""XGRPO — Cross-Policy GRPO Advantage Sharing (value level; the Mutual RL paper), and the pooled baseline
PRP shares with it.

For prompt x, policy k pools its own G rewards with the rewards its peers published for x, and scores its own
samples against the pool's baseline (and std):

    pool_x = {R_i^k}_{i ≤ G} ∪ {R^j of x}_j
    A_i^k  = (R_i^k − mean(pool_x)) / (std(pool_x) + ε)          scale; without: R_i^k − mean(pool_x) (Dr.GRPO)

std is the unbiased (n − 1) standard deviation and ε = 1e-4 (advantages.group_advantages, on the pool as one
group). A pool of equal rewards gives A = 0. An own group whose rewards are all equal while the pool's differ gets
one advantage for all its samples (all failed beside a peer's success → every own sample pushed down, with no
direction toward anything). `uniform_groups` chooses:

    zero     [the default] such a group keeps A = 0, as GRPO gives it
    pooled   A_i^k as above (the paper)

An own reward that is NaN (an unscorable completion, as TRL marks one) stays out of the pool and gets A = 0.
"""
from typing import Literal

import torch
from torch import Tensor

from .advantages import group_advantages

__all__ = ["UniformGroups", "pooled_advantages", "settle_uniform_groups"]

UniformGroups = Literal["pooled", "zero"]


def pooled_advantages(own: Tensor, peer: list[float], scale: bool = True,
                      uniform_groups: UniformGroups = "zero") -> tuple[Tensor, bool]:
    """A^k (G,) of one prompt's own rewards `own` (G,) against the baseline pooled with the peers' rewards
    `peer`, and whether the own group has equal rewards that the pool moved (zeroed under `zero`)."""
    ok = ~torch.isnan(own)
    pool = torch.cat([own[ok], torch.tensor(peer, dtype=own.dtype, device=own.device)])
    advantages = torch.zeros_like(own)
    if pool.numel():
        advantages[ok] = group_advantages(pool, torch.zeros(len(pool), dtype=torch.long), scale=scale)[:int(ok.sum())]
    mine = own[ok]
    uniform = mine.numel() > 0 and bool((mine == mine[0]).all()) and bool((advantages != 0).any())
    if uniform and uniform_groups == "zero":
        advantages.zero_()
    return advantages, uniform


def settle_uniform_groups(rewards: list[list[float]], advantages: Tensor, uniform_groups: UniformGroups) -> int:
    """The own groups whose rewards are all equal but whose pooled advantages are not 0; under `zero` their
    advantages (flat (N,), group after group, changed in place) are set to GRPO's 0. Returns how many."""
    moved = 0
    for group, part in zip(rewards, advantages.split([len(g) for g in rewards])):
        if len(set(group)) == 1 and bool((part != 0).any()):
            moved += 1
            if uniform_groups == "zero":
                part.zero_()
    return moved
