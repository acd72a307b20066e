"""PRP — Peer Rollout Pooling (data level; the Mutual RL paper).

Peers' rollouts for the same prompt, retokenized into policy k's tokens by THL, join k's group
as extra trajectories, each re-scored by k's own verifier (a peer's claimed reward is never
trusted; `peer_reward_disputed` counts the claims that differ); advantages are computed over the
pooled group:

    pool_x = {y_i^k}_{i ≤ G} ∪ {y^j : peer rollouts of x}
    A      = (R − mean_pool R) / (std_pool R + ε)                 own and peer samples alike

Own samples keep the trainer's GRPO-family clipped surrogate. A peer sample y (sampled by π^j)
is weighted by a sequence-level, length-normalised density ratio, truncated at c and used as a
stopped-gradient weight (a truncated importance-sampled policy gradient):

    log ρ = ( Σ_t log π_θ^k(y_t)  −  Σ_u log π_old^j(y_u) ) / C(y)      each sum over its own tokens of y,
                                                                        C(y) = THL chunks of y (mrl.algorithms.ratios)
    ρ̄     = min(ρ, c)
    l_t   = −sg[ρ̄] · A · log π_θ^k(y_t)                                          on k's tokens of y

Both parts are aggregated like the trainer's loss with the pooled totals (own + peer sequences
and tokens), so a peer trajectory counts as one more member of the group. An own group whose rewards
are all equal while the pool's differ gets one advantage for all its samples (all failed and a peer
succeeded → all pushed down); `uniform_groups` chooses `zero` (the default: GRPO's A = 0 for
them; the peer samples keep theirs) or `pooled` (the paper), counted in prp_uniform. PRP pays density-ratio
variance and the THL residual; both are logged: prp_rho_mean, prp_log_rho_var, prp_truncated
(share with ρ > c), and the trainer's thl_* residual statistics.
"""
import torch
from pydantic import Field
from torch import Tensor

from mrl.algorithms import group_advantages
from mrl.algorithms.prp import peer_rollout_loss, truncated_ratio
from mrl.algorithms.xgrpo import settle_uniform_groups
from mrl_trainer.experience import StepBatch
from mrl_trainer.section import Section
from mrl_trainer.sharing.base import (PEER_STATS, UNIFORM_GROUPS_HELP, Extra, PeerBatch, Plan, SharingMode,
                                      UniformGroups, Verifier, pooled_peers)

__all__ = ["PRP", "PRPConfig"]


class PRPConfig(Section):
    c: float = Field(1.0, gt=0, description="Truncation of the peer density ratio: ρ̄ = min(ρ, c).")
    per_prompt: int = Field(8, ge=1, description="Most peer rollouts pooled per prompt.")
    uniform_groups: UniformGroups = Field("zero", description=UNIFORM_GROUPS_HELP)


class PRP(SharingMode):
    name = "prp"
    title = "PRP — Peer Rollout Pooling"
    kinds = ("rollout",)
    Config = PRPConfig
    stats = {**PEER_STATS, "prp_rho_mean": "PRP mean ρ", "prp_log_rho_var": "PRP var log ρ",
             "prp_truncated": "PRP fraction truncated at c",
             "prp_uniform": "PRP own groups of equal rewards moved by the pool"}
    figures = {"ratios": ("prp_rho_mean", "prp_log_rho_var", "prp_truncated"), "exchange": ("peer_samples",)}

    def plan(self, batch: StepBatch, peers: PeerBatch, *, capability: float, verify: Verifier) -> Plan:
        rewards, groups, members = [], [], []          # members: None for own, the PeerSample for a peer
        disputed = 0
        for p, group in enumerate(batch.rewards):
            pooled, differ = pooled_peers(peers, p, self.sharing.prp.per_prompt, verify)
            disputed += differ
            rewards += [*group, *(s.reward for s in pooled)]
            groups += [p] * (len(group) + len(pooled))
            members += [None] * len(group) + pooled
        advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32), torch.tensor(groups),
                                      scale=self.loss.scale_rewards)
        own = torch.tensor([m is None for m in members])
        own_advantages = advantages[own]
        uniform = settle_uniform_groups(batch.rewards, own_advantages, self.sharing.prp.uniform_groups)
        peer = [(m, a) for m, a in zip(members, advantages.tolist()) if m is not None]
        totals = self.own_totals(batch)
        totals = dict(num_sequences=totals["num_sequences"] + len(peer),
                      num_tokens=totals["num_tokens"] + sum(len(m.ids) for m, _ in peer))
        extras = [Extra(prompt_index=m.prompt_index, ids=m.ids, advantage=a, behaviour_logp=m.behaviour_logp,
                        chunks=m.chunks) for m, a in peer if a != 0.0]   # a zero-advantage peer adds exactly nothing
        return Plan(own_advantages, extras=extras, totals=totals, extra_totals=totals,
                    stats={"peer_samples": len(peer), "peer_reward_disputed": disputed, "prp_uniform": uniform})

    def extra_loss(self, logp, mask, extras, *, update, max_tokens, totals):
        tensor = lambda values: torch.tensor(values, dtype=logp.dtype, device=logp.device)  # noqa: E731
        log_rho, weights = truncated_ratio(logp, mask, tensor([e.behaviour_logp for e in extras]),
                                           tensor([e.chunks for e in extras]), self.sharing.prp.c)
        advantages = tensor([e.advantage for e in extras])
        loss = peer_rollout_loss(logp, mask, advantages, weights, self.loss.aggregation, max_tokens=max_tokens,
                                 **totals)
        return loss, {"log_rho": log_rho}

    def summarize(self, per_sequence: dict[str, Tensor]) -> dict[str, float]:
        log_rho = per_sequence["log_rho"]
        return {"prp_rho_mean": log_rho.exp().mean().item(), "prp_log_rho_var": log_rho.var(unbiased=False).item(),
                "prp_truncated": (log_rho.exp() > self.sharing.prp.c).float().mean().item()}
