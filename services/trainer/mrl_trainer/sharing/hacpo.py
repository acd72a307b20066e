"""HACPO — Heterogeneous Agent Collaborative Policy Optimization (the HACRL paper and its public code).

Capability P̂^k = mean of k's batch mean reward over a sliding window of K steps (current
included; `window`). A peer's capability is MEASURED by the receiver, never taken from the peer:

    P̂^j = mean over the last K steps (with j's rollouts) of the mean reward, under k's own verifier,
          of the rollouts of j pooled that step

(a peer's own claim, policy_stats.capability, is only compared: hacpo_capability_gap = mean |claim − P̂^j|;
a peer claiming P̂ = 1 would otherwise get up to 10× weight). Capability ratio

    ω^(k,j) = clamp(P̂^k / P̂^j, 0.1, 10),      ω^(k,k) = 1

Mixed baseline for k on prompt x over the n pooled samples (own G and the peers' rollouts of x,
each peer rollout re-scored by k's own verifier: a peer's claimed reward is never trusted):

    μ̂ = (1/n) Σ_j Σ_i ω^(k,j) R(y_i^j),   σ = std of the n rewards (n − 1),   A = (R − μ̂) / (σ + ε)

for own and peer samples alike. Safeguards: all n rewards equal → A = 0; μ̂ > 1 → μ̂ = k's own
group mean. An own group whose G rewards are all equal while the pool's differ gets one advantage for all its
samples (all failed and a peer succeeded → every own sample pushed down, with no direction toward anything;
all succeeded beside a failing peer → all pushed up). `uniform_groups` chooses: `zero` [the default] keeps their A = 0
as GRPO does (the peer samples keep theirs), `pooled` scores them against μ̂ (the paper). Own samples take the GSPO
loss (sequence ratio, clip [1 − 3e-4, 1 + 4e-4], β·KL).
A peer sample y^j (k's tokens, THL-retokenized) takes exponential importance sampling with
stepwise clipping, no min():

    s     = exp( ( Σ_t log π_θ^k(y_t) − Σ_u log π_old^j(y_u) ) / C(y) )     each sum over its own tokens of y,
                                                                        C(y) = THL chunks of y (base.cross_log_ratio)
    s̄     = clip(s, 1 − δ + m·δ_step, 1)        m = optimizer updates already made this step (lower bound ≤ 1)
    l     = −s̄ · sg[s̄]^α · ω^(j,k) · A

Both terms are aggregated as GSPO does, seq-mean-token-mean (`aggregation`), with the pooled
totals. Where s lies outside [1 − δ + m·δ_step, 1], s̄ is a constant and the peer sample has no gradient;
between heterogeneous models that is nearly every one (s ≈ 0.006 and below between the demo's SmolLM2 and
GPT-2). With `screen` (default) the update forwards the peer samples without autograd first and forwards
with it only those inside the clip (`live`; mrl_trainer.update): the same update, without the others'
backward. Stats: hacpo_omega_mean (mean ω^(j,k) over peer samples), hacpo_ratio_mean (s),
hacpo_clipped (share of s outside the bounds), hacpo_lower_bound (at the step's last update),
hacpo_peer_capability (mean measured P̂^j), hacpo_capability_gap, peer_reward_disputed (peer claims
k's verifier disagrees with), hacpo_uniform (own groups of equal rewards the pool moved: pushed one way under
`pooled`, zeroed under `zero`).
"""
from collections import deque

import torch
from pydantic import Field
from torch import Tensor

from mrl_trainer.experience import StepBatch
from mrl_trainer.losses import GSPO_EPS_HIGH, GSPO_EPS_LOW, aggregate, policy_loss
from mrl_trainer.losses import Aggregation
from mrl_trainer.section import Section
from mrl_trainer.sharing.base import (PEER_STATS, UNIFORM_GROUPS_HELP, Extra, PeerBatch, PeerSample, Plan,
                                      SharingMode, UniformGroups, Verifier, cross_log_ratio, pooled_peers,
                                      settle_uniform_groups, solo_advantages)

__all__ = ["HACPO", "HACPOConfig", "capability_ratio", "mixed_advantages", "stepwise_lower_bound", "peer_loss"]

OMEGA_MIN, OMEGA_MAX = 0.1, 10.0


class HACPOConfig(Section):
    alpha: float = Field(1.0, ge=0, description="α: exponent of the stopped-gradient weight sg[s̄]^α (1 or 3).")
    delta: float = Field(0.2, gt=0, lt=1, description="δ: the peer ratio's lower clip bound starts at 1 − δ.")
    delta_step: float = Field(0.01, ge=0, description="δ_step: the lower bound rises by this per optimizer update.")
    window: int = Field(5, ge=1, description="K: steps in the capability window P̂.")
    per_prompt: int = Field(8, ge=1, description="Most peer rollouts pooled per prompt.")
    aggregation: Aggregation = Field("seq-mean-token-mean", description="GSPO's (one term per sequence); "
                                                                        "token sums weight sequences by length.")
    uniform_groups: UniformGroups = Field("zero", description=UNIFORM_GROUPS_HELP)
    screen: bool = Field(True, description="Forward the peer samples first without autograd and only those "
                                           "whose s lies within the clip with it: the same update, without the "
                                           "backward of the clipped ones (false: every one forwarded with it).")


def capability_ratio(p_k: float, p_j: float) -> float:
    """ω^(k,j) = clamp(P̂^k / P̂^j, 0.1, 10); two zero capabilities give 1."""
    if p_j <= 0:
        return 1.0 if p_k <= 0 else OMEGA_MAX
    return min(max(p_k / p_j, OMEGA_MIN), OMEGA_MAX)


def mixed_advantages(rewards: Tensor, omegas: Tensor, own: Tensor, scale: bool = True, eps: float = 1e-4) -> Tensor:
    """A (n,) of one prompt's pooled samples: rewards, ω^(k,j) of each sample's producer, own (bool) mask."""
    if bool((rewards == rewards[0]).all()):
        return torch.zeros_like(rewards)
    baseline = (omegas * rewards).mean()
    if baseline > 1:
        baseline = rewards[own].mean()
    deviation = rewards - baseline
    return deviation / (rewards.std() + eps) if scale and len(rewards) > 1 else deviation


def stepwise_lower_bound(delta: float, delta_step: float, update: int) -> float:
    """1 − δ + m·δ_step, at most 1."""
    return min(1.0 - delta + update * delta_step, 1.0)


def peer_loss(logp: Tensor, mask: Tensor, behaviour_logp: Tensor, chunks: Tensor, advantages: Tensor,
              weights: Tensor, *, lower: float, alpha: float, aggregation: str, max_tokens: int | None = None,
              num_sequences: int | None = None, num_tokens: int | None = None) -> tuple[Tensor, Tensor]:
    """agg[ −s̄ sg[s̄]^α ω A ] broadcast over each sequence's tokens, and s (N,) detached.

    logp, mask (N, T); behaviour_logp, chunks, advantages, weights ω^(j,k) (N,).
    """
    ratio = torch.exp(cross_log_ratio(logp, mask, behaviour_logp, chunks))            # s (N,)
    clipped = ratio.clamp(min=lower, max=1.0)
    term = clipped * clipped.detach() ** alpha * weights * advantages
    loss = aggregate(-term.unsqueeze(-1), mask, aggregation, max_tokens=max_tokens, num_sequences=num_sequences,
                     num_tokens=num_tokens)
    return loss, ratio.detach()


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
                                # what is left is mostly the mixed baseline, a shift like XGRPO's; and GSPO's
                                # difference from the trainer's loss (the own guard's, τ_own); both trusts are earned

    def __init__(self, sharing, loss):
        super().__init__(sharing, loss)
        self._measured: dict[str, deque] = {}     # producer → its steps' mean re-scored reward, the last K

    def state(self) -> dict:
        """The guard's trust and each producer's window of measured capabilities."""
        return {**super().state(), "measured": {p: list(window) for p, window in self._measured.items()}}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self._measured = {p: deque(values, maxlen=self.sharing.hacpo.window)
                          for p, values in state.get("measured", {}).items()}

    def measure_capabilities(self, pooled: list[list[PeerSample]]) -> dict[str, float]:
        """P̂^j of every producer with rollouts pooled this step, from this step and its K − 1 before."""
        rewards: dict[str, list[float]] = {}
        for samples in pooled:
            for s in samples:
                rewards.setdefault(s.producer, []).append(s.reward)
        for producer, values in rewards.items():
            window = self._measured.setdefault(producer, deque(maxlen=self.sharing.hacpo.window))
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

    def own_loss(self, logp, old_logp, advantages, mask, *, ref_logp, max_tokens, totals):
        """GSPO on own samples: sequence ratio, clip [1 − 3e-4, 1 + 4e-4], β·KL only here."""
        return policy_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, beta=self.loss.beta,
                           eps_low=GSPO_EPS_LOW, eps_high=GSPO_EPS_HIGH, level="sequence",
                           aggregation=self.sharing.hacpo.aggregation, max_tokens=max_tokens, **totals)

    @property
    def screens(self) -> bool:
        return self.sharing.hacpo.screen

    def live(self, logp, mask, extras, *, update):
        """lower ≤ s ≤ 1: the peer samples whose clipped ratio s̄ = clip(s, lower, 1) follows s, hence has a
        gradient (torch.clamp passes it on the closed interval); s̄ is a constant elsewhere."""
        lower = self._lower_bound(update)
        ratio = torch.exp(cross_log_ratio(logp, mask, *self._tensors(logp, extras, "behaviour_logp", "chunks")))
        return (ratio >= lower) & (ratio <= 1.0)

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
                                lower=lower, alpha=cfg.alpha, aggregation=cfg.aggregation,
                                max_tokens=max_tokens, **totals)
        return loss, {"ratio_mean": ratio, "clipped": ((ratio < lower) | (ratio > 1.0)).float(),
                      "lower_bound": torch.full_like(ratio, lower)}

    def summarize(self, per_sequence):
        return {f"hacpo_{name}": values.float().mean().item() for name, values in per_sequence.items()}
