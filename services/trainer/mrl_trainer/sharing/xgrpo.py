"""XGRPO — Cross-Policy GRPO Advantage Sharing (value level; the Mutual RL paper): the mode.

Each prompt's own rewards pooled with those its peers published in their `group_stats` for it
(mrl.algorithms.xgrpo.pooled_advantages); the gradient comes from own samples only, so the actor keeps its
on-policy support. Without peer stats for a prompt it is GRPO.

Stats: xgrpo_pooled = mean pool size per prompt; xgrpo_uniform = own groups with equal rewards whose
pooled advantage is not 0 (pushed all one way under "pooled", zeroed under "zero"); xgrpo_baseline_shift_abs =
mean over the prompts with peer rewards of |mean(pool) − mean(own)|, how far the pooled baseline moves.
"""
import torch
from pydantic import Field

from mrl.algorithms.xgrpo import pooled_advantages
from mrl_trainer.experience import StepBatch
from mrl_trainer.section import Section
from mrl_trainer.sharing.base import UNIFORM_GROUPS_HELP, PeerBatch, Plan, SharingMode, UniformGroups, Verifier

__all__ = ["XGRPO", "XGRPOConfig"]


class XGRPOConfig(Section):
    uniform_groups: UniformGroups = Field("zero", description=UNIFORM_GROUPS_HELP)


class XGRPO(SharingMode):
    name = "xgrpo"
    title = "XGRPO — Cross-Policy GRPO Advantage Sharing"
    kinds = ("group_stats",)
    Config = XGRPOConfig
    stats = {"xgrpo_pooled": "rewards in XGRPO pooled baseline",
             "xgrpo_uniform": "XGRPO own groups of equal rewards moved by the pool",
             "xgrpo_baseline_shift_abs": "XGRPO |pooled − own| baseline"}
    figures = {"exchange": ("xgrpo_pooled",)}
    guard_initial_trust = 0.0   # its peer term is a baseline shift, no direction in expectation: trust is earned

    def plan(self, batch: StepBatch, peers: PeerBatch, *, capability: float, verify: Verifier) -> Plan:
        advantages, uniform = [], 0
        for p, group in enumerate(batch.rewards):
            a, moved = pooled_advantages(torch.tensor(group, dtype=torch.float32), peers.group_rewards.get(p, []),
                                         self.loss.scale_rewards, self.sharing.xgrpo.uniform_groups)
            advantages.append(a)
            uniform += moved
        advantages = torch.cat(advantages) if advantages else torch.zeros(0)
        pooled = sum(len(g) + len(peers.group_rewards.get(p, [])) for p, g in enumerate(batch.rewards))
        stats = {"xgrpo_pooled": pooled / max(len(batch.rewards), 1), "xgrpo_uniform": uniform}
        shifts = [sum(g + peers.group_rewards[p]) / len(g + peers.group_rewards[p]) - sum(g) / len(g)
                  for p, g in enumerate(batch.rewards) if peers.group_rewards.get(p)]
        if shifts:
            stats["xgrpo_baseline_shift_abs"] = sum(abs(x) for x in shifts) / len(shifts)
        return Plan(advantages, totals=self.own_totals(batch), stats=stats)
