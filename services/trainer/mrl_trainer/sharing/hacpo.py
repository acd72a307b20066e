"""HACPO — Heterogeneous Agent Collaborative Policy Optimization (the HACRL paper): the mode.

The math is mrl.algorithms.hacpo: capability ratios ω, the mixed baseline, the peer samples' clipped exponential
importance sampling. Here the receiver MEASURES a peer's capability, never taking it from the peer:

    P̂^k = mean of k's batch mean reward over the last K steps (`sharing.window`, current included)
    P̂^j = mean over the last K steps (with j's rollouts) of the mean reward, under k's own verifier, of the
          rollouts of j pooled that step

(a peer's claim, policy_stats.capability, is only compared: hacpo_capability_gap = mean |claim − P̂^j|; a peer
claiming P̂ = 1 would otherwise get up to 10× weight). Each pooled peer rollout is re-scored by k's verifier, and
the mixed baseline scores own and peer samples. An own group whose G rewards are all equal while the pool's differ
gets one advantage for all its samples; `uniform_groups` chooses: `zero` [the default] keeps A = 0 as GRPO does
(the peer samples keep theirs), `pooled` scores it against μ̂ (the paper). Own samples take the trainer's loss
(the paper's GSPO is `loss.level: sequence` with its clip); peer samples take mrl.algorithms.hacpo.peer_loss, both
aggregated as the trainer's loss with the pooled totals. Between heterogeneous models nearly every peer sample's
ratio lies outside the clip, where it has no gradient.

Stats: hacpo_omega_mean (mean ω^(j,k) over peer samples), hacpo_ratio_mean (s), hacpo_clipped (share of s outside
the bounds), hacpo_lower_bound (at the step's last update), hacpo_peer_capability (mean measured P̂^j),
hacpo_capability_gap, peer_reward_disputed (peer claims k's verifier disagrees with), hacpo_uniform (own groups
of equal rewards the pool moved).
"""
from collections import deque

import torch
from pydantic import Field
from torch import Tensor

from mrl.algorithms.hacpo import capability_ratio, mixed_advantages, peer_loss, stepwise_lower_bound
from mrl.algorithms.xgrpo import settle_uniform_groups
from mrl_trainer.experience import StepBatch
from mrl_trainer.section import Section
from mrl_trainer.sharing.base import (PEER_STATS, UNIFORM_GROUPS_HELP, Extra, PeerBatch, PeerSample, Plan,
                                      SharingMode, UniformGroups, Verifier, pooled_peers, solo_advantages)

__all__ = ["HACPO", "HACPOConfig"]


class HACPOConfig(Section):
    alpha: float = Field(1.0, ge=0, description="α: exponent of the stopped-gradient weight sg[s̄]^α (1 or 3).")
    delta: float = Field(0.2, gt=0, lt=1, description="δ: the peer ratio's lower clip bound starts at 1 − δ.")
    delta_step: float = Field(0.01, ge=0, description="δ_step: the lower bound rises by this per optimizer update.")
    per_prompt: int = Field(8, ge=1, description="Most peer rollouts pooled per prompt.")
    uniform_groups: UniformGroups = Field("zero", description=UNIFORM_GROUPS_HELP)


class HACPO(SharingMode):
    name = "hacpo"
    title = "HACPO — Heterogeneous Agent Collaborative Policy Optimization"
    kinds = ("rollout", "policy_stats")
    Config = HACPOConfig
    stats = {**PEER_STATS, "hacpo_ratio_mean": "HACPO mean ratio", "hacpo_clipped": "HACPO fraction clipped",
             "hacpo_omega_mean": "HACPO mean ω", "hacpo_lower_bound": "HACPO lower bound",
             "hacpo_peer_capability": "HACPO measured peer capability P̂^j",
             "hacpo_capability_gap": "HACPO |claimed − measured| peer capability",
             "hacpo_uniform": "HACPO own groups of equal rewards moved by the pool"}
    figures = {"ratios": ("hacpo_ratio_mean", "hacpo_clipped", "hacpo_omega_mean", "hacpo_lower_bound"),
               "exchange": ("peer_samples",)}
    guard_initial_trust = 0.0   # its peer samples are nearly all clipped between heterogeneous models (no gradient):
                                # what is left is mostly the mixed baseline, a shift like XGRPO's: trust is earned

    def __init__(self, sharing, loss):
        super().__init__(sharing, loss)
        self._measured: dict[str, deque] = {}     # producer → its steps' mean re-scored reward, the last K

    def state(self) -> dict:
        """The guard's trust and each producer's window of measured capabilities."""
        return {**super().state(), "measured": {p: list(window) for p, window in self._measured.items()}}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self._measured = {p: deque(values, maxlen=self.sharing.window)
                          for p, values in state.get("measured", {}).items()}

    def measure_capabilities(self, pooled: list[list[PeerSample]]) -> dict[str, float]:
        """P̂^j of every producer with rollouts pooled this step, from this step and its K − 1 before."""
        rewards: dict[str, list[float]] = {}
        for samples in pooled:
            for s in samples:
                rewards.setdefault(s.producer, []).append(s.reward)
        for producer, values in rewards.items():
            window = self._measured.setdefault(producer, deque(maxlen=self.sharing.window))
            window.append(sum(values) / len(values))
        return {producer: sum(self._measured[producer]) / len(self._measured[producer]) for producer in rewards}

    def plan(self, batch: StepBatch, peers: PeerBatch, *, capability: float, verify: Verifier) -> Plan:
        cfg = self.sharing.hacpo
        own_advantages, extras, omega_used = [], [], []
        n_peer = peer_tokens = disputed = 0
        pooled = []
        for p in range(len(batch.rewards)):
            samples, differ = pooled_peers(peers, p, cfg.per_prompt, verify)
            pooled.append(samples)
            disputed += differ
        measured = self.measure_capabilities(pooled)
        solo = solo_advantages(batch, self.loss).split([len(group) for group in batch.rewards])
        for p, group in enumerate(batch.rewards):
            if not pooled[p]:   # the mixed baseline of the own group alone is GRPO's: taken as solo computes it
                own_advantages += solo[p].tolist()
                continue
            omega_kj = [capability_ratio(capability, measured[s.producer]) for s in pooled[p]]
            advantages = mixed_advantages(
                torch.tensor([*group, *(s.reward for s in pooled[p])], dtype=torch.float64),
                torch.tensor([1.0] * len(group) + omega_kj, dtype=torch.float64),
                torch.tensor([True] * len(group) + [False] * len(pooled[p])), scale=self.loss.scale_rewards)
            own_advantages += advantages[:len(group)].tolist()
            for s, a in zip(pooled[p], advantages[len(group):].tolist()):
                n_peer, peer_tokens = n_peer + 1, peer_tokens + len(s.ids)
                omega_jk = capability_ratio(measured[s.producer], capability)
                omega_used.append(omega_jk)
                if a != 0.0:
                    extras.append(Extra(prompt_index=p, ids=s.ids, advantage=a, behaviour_logp=s.behaviour_logp,
                                        chunks=s.chunks, weight=omega_jk))
        own_advantages = torch.tensor(own_advantages, dtype=torch.float32)
        uniform = settle_uniform_groups(batch.rewards, own_advantages, cfg.uniform_groups)
        totals = self.own_totals(batch)
        totals = dict(num_sequences=totals["num_sequences"] + n_peer, num_tokens=totals["num_tokens"] + peer_tokens)
        stats = {"peer_samples": n_peer, "peer_reward_disputed": disputed, "hacpo_uniform": uniform}
        if omega_used:
            stats["hacpo_omega_mean"] = sum(omega_used) / len(omega_used)
        if measured:
            stats["hacpo_peer_capability"] = sum(measured.values()) / len(measured)
        gaps = [abs(peers.capability[j] - value) for j, value in measured.items() if j in peers.capability]
        if gaps:
            stats["hacpo_capability_gap"] = sum(gaps) / len(gaps)
        return Plan(own_advantages, extras=extras, totals=totals,
                    extra_totals=totals, stats=stats)

    def _lower_bound(self, update: int) -> float:
        return stepwise_lower_bound(self.sharing.hacpo.delta, self.sharing.hacpo.delta_step, update)

    @staticmethod
    def _tensors(logp: Tensor, extras, *fields: str) -> list[Tensor]:
        """Each named field of the extras as a tensor (n,) of logp's dtype and device."""
        return [torch.tensor([getattr(e, f) for e in extras], dtype=logp.dtype, device=logp.device) for f in fields]

    def extra_loss(self, logp, mask, extras, *, update, max_tokens, totals):
        cfg = self.sharing.hacpo
        lower = self._lower_bound(update)
        loss, ratio = peer_loss(logp, mask, *self._tensors(logp, extras, "behaviour_logp", "chunks", "advantage",
                                                           "weight"),
                                lower=lower, alpha=cfg.alpha, aggregation=self.loss.aggregation,
                                max_tokens=max_tokens, **totals)
        return loss, {"ratio_mean": ratio, "clipped": ((ratio < lower) | (ratio > 1.0)).float(),
                      "lower_bound": torch.full_like(ratio, lower)}

    def summarize(self, per_sequence):
        return {f"hacpo_{name}": values.float().mean().item() for name, values in per_sequence.items()}
