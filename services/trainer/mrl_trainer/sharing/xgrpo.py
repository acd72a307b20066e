"""XGRPO — Cross-Policy GRPO Advantage Sharing (value level; the Mutual RL paper).

For prompt x, policy k pools its own G rewards with the rewards its peers published in their
`group_stats` for x, and computes the baseline (and std) over the pool; the gradient comes from
k's own samples only, so the actor keeps its on-policy support:

    pool_x = {R_i^k}_{i ≤ G} ∪ {R^j from group_stats_j(x)}_j
    A_i^k  = (R_i^k − mean(pool_x)) / (std(pool_x) + ε)          (scale_rewards: false → no std)
    loss   = the trainer's GRPO-family loss over own samples with A^k

A pool whose rewards are all equal gives A = 0 (as GRPO). Without peer stats for x it is GRPO.

An own group whose rewards are all equal (all failed, or all succeeded) while the peers' differ gets
the same advantage for every sample: all failed and a peer succeeded → every own sample is pushed
down, away from everything k sampled, with no direction toward anything. `uniform_groups` chooses:

    zero     [the default] such a group keeps A = 0, as GRPO gives it: the pooled baseline only re-centres
             own groups with a spread of rewards
    pooled   A_i^k as above (the paper)

Stats: xgrpo_pooled = mean pool size per prompt; xgrpo_uniform = own groups with equal rewards whose
pooled advantage is not 0 (pushed all one way under "pooled", zeroed under "zero").
"""
import torch
from pydantic import Field

from mrl_trainer.experience import StepBatch
from mrl_trainer.losses import group_advantages
from mrl_trainer.section import Section
from mrl_trainer.sharing.base import (UNIFORM_GROUPS_HELP, PeerBatch, Plan, SharingMode, UniformGroups, Verifier,
                                      settle_uniform_groups)

__all__ = ["XGRPO", "XGRPOConfig", "pooled_advantages"]


class XGRPOConfig(Section):
    uniform_groups: UniformGroups = Field("zero", description=UNIFORM_GROUPS_HELP)


def pooled_advantages(own: list[list[float]], peer: dict[int, list[float]], scale: bool,
                      uniform_groups: str = "zero") -> tuple[torch.Tensor, int]:
    """A^k (P·G,) of own samples against a baseline pooled with the peers' rewards for the same prompt, and the
    number of own groups with equal rewards whose pooled advantage is not 0."""
    rewards, groups, is_own = [], [], []
    for p, group in enumerate(own):
        pool = [*group, *peer.get(p, [])]
        rewards += pool
        groups += [p] * len(pool)
        is_own += [True] * len(group) + [False] * (len(pool) - len(group))
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32), torch.tensor(groups), scale=scale)
    advantages = advantages[torch.tensor(is_own)]
    return advantages, settle_uniform_groups(own, advantages, uniform_groups)


class XGRPO(SharingMode):
    name = "xgrpo"
    title = "XGRPO — Cross-Policy GRPO Advantage Sharing"
    kinds = ("group_stats",)
    Config = XGRPOConfig
    stats = {"xgrpo_pooled": "rewards in XGRPO pooled baseline",
             "xgrpo_uniform": "XGRPO own groups of equal rewards moved by the pool"}
    figures = {"exchange": ("xgrpo_pooled",)}
    guard_initial_trust = 0.0   # its peer term is a baseline shift, no direction in expectation: trust is earned

    def plan(self, batch: StepBatch, peers: PeerBatch, *, capability: float, verify: Verifier) -> Plan:
        advantages, uniform = pooled_advantages(batch.rewards, peers.group_rewards, self.loss.scale_rewards,
                                                self.sharing.xgrpo.uniform_groups)
        pooled = sum(len(g) + len(peers.group_rewards.get(p, [])) for p, g in enumerate(batch.rewards))
        return Plan(advantages, totals=self.own_totals(batch),
                    stats={"xgrpo_pooled": pooled / max(len(batch.rewards), 1), "xgrpo_uniform": uniform})
