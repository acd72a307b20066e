"""XGRPO — Cross-Policy GRPO Advantage Sharing (value level; the Mutual RL paper).

For prompt x, policy k pools its own G rewards with the rewards its peers published in their
`group_stats` for x, and computes the baseline (and std) over the pool; the gradient comes from
k's own samples only, so the actor keeps its on-policy support:

    pool_x = {R_i^k}_{i ≤ G} ∪ {R^j from group_stats_j(x)}_j
    A_i^k  = (R_i^k − mean(pool_x)) / (std(pool_x) + ε)          (scale_rewards: false → no std)
    loss   = the trainer's GRPO-family loss over own samples with A^k

A pool whose rewards are all equal gives A = 0 (as GRPO). Without peer stats for x it is GRPO.
Stats: xgrpo_pooled = mean pool size per prompt.
"""
import torch
from pydantic import BaseModel, ConfigDict

from mrl_trainer.experience import StepBatch
from mrl_trainer.losses import group_advantages
from mrl_trainer.sharing.base import PeerBatch, Plan, SharingMode, Verifier

__all__ = ["XGRPO", "XGRPOConfig", "pooled_advantages"]


class XGRPOConfig(BaseModel):
    """XGRPO has no knobs."""
    model_config = ConfigDict(extra="forbid")


def pooled_advantages(own: list[list[float]], peer: dict[int, list[float]], scale: bool) -> torch.Tensor:
    """A^k (P·G,) of own samples against a baseline pooled with the peers' rewards for the same prompt."""
    rewards, groups, is_own = [], [], []
    for p, group in enumerate(own):
        pool = [*group, *peer.get(p, [])]
        rewards += pool
        groups += [p] * len(pool)
        is_own += [True] * len(group) + [False] * (len(pool) - len(group))
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32), torch.tensor(groups), scale=scale)
    return advantages[torch.tensor(is_own)]


class XGRPO(SharingMode):
    name = "xgrpo"
    title = "XGRPO — Cross-Policy GRPO Advantage Sharing"
    kinds = ("group_stats",)
    Config = XGRPOConfig
    stats = {"xgrpo_pooled": "rewards in XGRPO pooled baseline"}
    figures = {"exchange": ("xgrpo_pooled",)}

    def plan(self, batch: StepBatch, peers: PeerBatch, *, capability: float, verify: Verifier) -> Plan:
        advantages = pooled_advantages(batch.rewards, peers.group_rewards, self.loss.scale_rewards)
        pooled = sum(len(g) + len(peers.group_rewards.get(p, [])) for p, g in enumerate(batch.rewards))
        return Plan(advantages, totals=self.own_totals(batch),
                    stats={"xgrpo_pooled": pooled / max(len(batch.rewards), 1)})
