"""What every sharing mode shares: peer experience in this policy's tokens, the update plan, the base mode.

A step of policy k with a sharing mode (docs/algorithms.md):

    own batch     P prompts × G samples, rewards R, behaviour log-probs          (StepBatch)
    peers         what the peers published for the same prompt ids, retokenized   (PeerBatch)
    plan          mode.plan(batch, peers) → own advantages A, extra sequences to   (Plan)
                  forward (peer rollouts, rescued successes) and the whole-step normalisers
    terms         mode.terms(batch, plan) → the loss terms the update forwards     (mrl_trainer.terms)

    L_mode = L_own(A, plan totals) + Σ extra_loss(extras)          L_solo = L_own(A_solo, solo totals)

L_own is the trainer's GRPO-family loss on own samples (mrl.algorithms.policy_loss); every mode trains on it.
The base class is solo GRPO/GSPO ("none"): own-group advantages, no extras. The tensor math of each mode lives in
mrl.algorithms; a mode here turns a step's batch and its peers' experience into it.
"""
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
from pydantic import BaseModel
from torch import Tensor

from mrl.algorithms import group_advantages, normaliser, policy_loss
from mrl.algorithms.xgrpo import UniformGroups
from mrl_trainer.experience import StepBatch
from mrl_trainer.guard import Guard
from mrl_trainer.terms import Term

__all__ = ["PeerSample", "PeerBatch", "Extra", "Plan", "SharingMode", "Verifier", "rescored", "pooled_peers",
           "solo_advantages", "PEER_STATS", "UniformGroups", "UNIFORM_GROUPS_HELP"]

UNIFORM_GROUPS_HELP = ("An own group whose rewards are all equal while the pool's differ: 'zero' keeps A = 0 as GRPO "
                       "does; 'pooled' scores it against the pooled baseline (the paper: all failed → every sample "
                       "pushed down).")


@dataclass(frozen=True)
class PeerSample:
    """A peer's response to one of this step's prompts, already in this policy's token ids (THL)."""
    producer: str
    prompt_index: int                # index into StepBatch.problems
    ids: list[int]                   # this policy's tokens of the response (THL-retokenized)
    text: str
    reward: float                    # the producer's claimed reward (SGT never trusts it)
    behaviour_logp: float = 0.0      # Σ_u log π_old^j(y_u): the producer's sequence log-prob, over its own tokens
    chunks: int = 1                  # C(y): THL's aligned chunks of the response (= its tokens for one tokenizer)


@dataclass
class PeerBatch:
    """The peer experience that arrived in time for one step, indexed by prompt index."""
    rollouts: dict[int, list[PeerSample]] = field(default_factory=dict)
    successes: dict[int, list[PeerSample]] = field(default_factory=dict)
    group_rewards: dict[int, list[float]] = field(default_factory=dict)   # peers' group_stats, concatenated
    capability: dict[str, float] = field(default_factory=dict)           # producer → P̂^j (latest policy_stats)


@dataclass(frozen=True)
class Extra:
    """One extra sequence to forward under π_θ^k: a peer rollout (PRP, HACPO) or a rescued success (SGT)."""
    prompt_index: int
    ids: list[int]
    advantage: float = 0.0
    behaviour_logp: float = 0.0      # Σ_u log π_old^j(y_u), the producer's tokens
    chunks: int = 1                  # C(y), the normaliser both sides of a cross-tokenizer ratio share
    weight: float = 1.0              # HACPO: ω^(j,k)


@dataclass
class Plan:
    """What one update needs: own advantages (N,), extras, the whole-update normalisers, and stats."""
    advantages: Tensor
    extras: list[Extra] = field(default_factory=list)
    totals: dict = field(default_factory=dict)          # num_sequences / num_tokens for the own (pooled) loss
    extra_totals: dict = field(default_factory=dict)    # the extras' whole-step normalisers (required with extras)
    stats: dict[str, float] = field(default_factory=dict)


class Verifier:
    """This policy's own verifier: reward(prompt_index, text) ∈ [0, 1] (SGT re-verifies with it)."""

    def __init__(self, batch: StepBatch, reward):
        self._batch, self._reward = batch, reward

    def __call__(self, prompt_index: int, text: str) -> float:
        return self._reward(self._batch.problems[prompt_index], text)


def rescored(samples: list[PeerSample], verify: Verifier) -> tuple[list[PeerSample], int]:
    """The peer samples with this policy's own reward for their text (a peer's claimed reward is never
    trusted: a poisoned or differently-scored peer cannot move the advantages), and how many claims differed."""
    out = [replace(s, reward=verify(s.prompt_index, s.text)) for s in samples]
    return out, sum(a.reward != b.reward for a, b in zip(samples, out))


def pooled_peers(peers: PeerBatch, prompt_index: int, per_prompt: int, verify: Verifier) -> tuple[list[PeerSample], int]:
    """The peer rollouts of one prompt that join its group (PRP, HACPO): non-empty, at most `per_prompt`,
    re-scored by this policy's verifier; and how many claimed rewards that changed."""
    return rescored([s for s in peers.rollouts.get(prompt_index, []) if s.ids][:per_prompt], verify)


def solo_advantages(batch: StepBatch, loss) -> Tensor:
    """A_i = group-relative advantage within the own group (GRPO; Dr.GRPO without std), flat (N,): solo's."""
    return group_advantages(torch.tensor(batch.rewards, dtype=torch.float32), scale=loss.scale_rewards).flatten()


PEER_STATS = {"peer_samples": "peer samples used",
              "peer_reward_disputed": "peer rewards disputed by the own verifier"}   # modes that pool rollouts


class SharingMode:
    """The base of the sharing modes; its methods are solo GRPO / GSPO (none). Each mode's class declares

        name, title   its `sharing.mode` value and its full name
        kinds         the experience kinds it takes from peers (of rollout, group_stats, success, policy_stats)
        Config        its knobs (pydantic, extra="forbid"): the `sharing.<name>` section when it has any
        stats         every statistic its plan() and summarize() log → a label
        figures       report figure ("thl", "ratios", "sgt", "exchange") → the stats it draws
        cumulative    the stats that count per step: figures draw them summed over steps
        summary       stat → its column in the report's summary table (the total if cumulative, else the mean)

    and overrides plan, and extra_loss (and summarize) when it forwards extra sequences; the registry in
    sharing/__init__.py lists it.
    """
    name: ClassVar[str]
    title: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]
    Config: ClassVar[type[BaseModel]]
    stats: ClassVar[dict[str, str]]
    figures: ClassVar[dict[str, tuple[str, ...]]] = {}
    cumulative: ClassVar[frozenset[str]] = frozenset()
    summary: ClassVar[dict[str, str]] = {}
    guard_max_ratio: ClassVar[float] = 0.0  # sharing.guard.max_ratio when unset (0: no cap)
    guard_initial_trust: ClassVar[float] = 1.0   # sharing.guard.initial_trust when unset

    def __init__(self, sharing, loss):
        """`sharing`: the SharingConfig; `loss`: the trainer's LossConfig. A mode that takes peers' experience
        has the no-harm guard (mrl_trainer.guard) unless `sharing.guard.enabled` is false."""
        self.sharing, self.loss = sharing, loss
        self.guard = Guard(sharing.guard, self.guard_max_ratio, self.guard_initial_trust) \
            if self.kinds and sharing.guard.enabled else None

    def state(self) -> dict:
        """What a resumed trainer must keep of the mode (checkpointed with it): the guard's score m (and its τ,
        for a reader). Plain values only."""
        return {} if self.guard is None else {"guard_trust": self.guard.trust, "guard_score": self.guard.score}

    def restore(self, state: dict) -> None:
        """Take back a checkpoint's `state()`."""
        if self.guard is not None and "guard_score" in state:
            self.guard.score = float(state["guard_score"])

    def guided_share(self) -> float:
        """async: the most of a batch's prompts its peers choose (sdk guided_batch): sharing.guided_share, times
        the guard's trust τ under `guard.guidance: trust` (so at τ = 0 the batch is solo's); unguarded or
        `guidance: full`, guided_share itself."""
        share = self.sharing.guided_share
        if self.guard is None or self.guard.config.guidance == "full":
            return share
        return share * self.guard.trust

    def rationalizes(self) -> int:
        """Samples the trainer draws per rescuable prompt with the peer's answer as a hint (SGT's
        `rationalize`); 0: none."""
        return 0

    def rescuable(self, batch: StepBatch) -> list[int]:
        """The prompts a peer's success can rescue (SGT); none."""
        return []

    def own_totals(self, batch: StepBatch) -> dict:
        flat = [s for group in batch.samples for s in group]
        return dict(num_sequences=len(flat), num_tokens=sum(len(s.ids) for s in flat))

    def plan(self, batch: StepBatch, peers: PeerBatch, *, capability: float, verify: Verifier) -> Plan:
        """A_i = group-relative advantage within the own group (GRPO; Dr.GRPO without std)."""
        return Plan(solo_advantages(batch, self.loss), totals=self.own_totals(batch))

    def own_loss(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, ref_logp: Tensor | None,
                 max_tokens: int, totals: dict) -> tuple[Tensor, dict[str, float]]:
        """L_own: the trainer's GRPO-family loss on own samples (level, clip, aggregation, β from the loss
        config): S / D with D = normaliser(loss.aggregation, **totals)."""
        cfg = self.loss
        return policy_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, beta=cfg.beta, eps_low=cfg.eps_low,
                           eps_high=cfg.eps_high, level=cfg.level, aggregation=cfg.aggregation,
                           max_tokens=max_tokens, **totals)

    def terms(self, batch: StepBatch, plan: Plan, *, max_tokens: int) -> tuple[list[Term], list[Term]]:
        """The loss terms of the step (mrl_trainer.update), as (own, peer). Without a guard: own = L_own at the
        plan's advantages and totals, peer = the extras' loss; their sum is L_mode. With one: own = L_solo, the
        gradient g_s the guard measures against, and peer = L_mode − L_solo, the peer term d:

            the own samples whose loss differs    L_own(A, plan totals) − L_own(A_solo, solo totals), per sample
            the extras                            extra_loss

        An own sample whose advantages are 0 under both (with β = 0) adds exactly 0 and is not forwarded; nor is
        one whose advantage and normaliser the plan left as solo's (its two losses are equal)."""
        flat = [s for group in batch.samples for s in group]
        prompt_of = [p for p, group in enumerate(batch.samples) for _ in group]
        kl = self.loss.beta > 0

        def own_term(members: list[int], loss, stats: str | None) -> Term:
            return Term([flat[i].prompt_ids for i in members], [flat[i].ids for i in members],
                        [prompt_of[i] for i in members], loss, own=True, keys=members, stats=stats)

        def own_loss(advantages: Tensor, totals: dict, members: list[int]):
            def loss(logp, mask, indices, m, old, ref):
                a = advantages[[members[i] for i in indices]].to(logp.dtype)
                return self.own_loss(logp, old, a, mask, ref_logp=ref, max_tokens=max_tokens, totals=totals)
            return loss

        extras = [e for e in plan.extras if e.ids]
        peer = [Term([flat_prompt(batch, e.prompt_index) for e in extras], [e.ids for e in extras],
                     [e.prompt_index for e in extras],
                     lambda logp, mask, indices, m, old, ref: self.extra_loss(
                         logp, mask, [extras[i] for i in indices], update=m, max_tokens=max_tokens,
                         totals=plan.extra_totals),
                     part="peer", stats="per_sequence")] if extras else []
        mode = plan.advantages.tolist()
        if self.guard is None:
            members = [i for i, s in enumerate(flat) if s.ids and (kl or mode[i] != 0)]
            return [own_term(members, own_loss(plan.advantages, plan.totals, members), "mean")], peer
        solo_tensor, solo_totals = solo_advantages(batch, self.loss), self.own_totals(batch)
        solo = solo_tensor.tolist()
        members = [i for i, s in enumerate(flat) if s.ids and (kl or solo[i] != 0)]
        same_scale = (normaliser(self.loss.aggregation, **plan.totals, max_tokens=1)
                      == normaliser(self.loss.aggregation, **solo_totals, max_tokens=1))
        changed = [i for i, s in enumerate(flat)
                   if s.ids and (kl or mode[i] != 0 or solo[i] != 0) and not (same_scale and mode[i] == solo[i])]
        mode_loss, solo_loss = own_loss(plan.advantages, plan.totals, changed), own_loss(solo_tensor, solo_totals, changed)

        def difference(logp, mask, indices, m, old, ref):
            return mode_loss(logp, mask, indices, m, old, ref)[0] - solo_loss(logp, mask, indices, m, old, ref)[0], {}
        own = [own_term(members, own_loss(solo_tensor, solo_totals, members), "mean")]
        if changed:
            peer.insert(0, replace(own_term(changed, difference, None), part="peer"))
        return own, peer

    def extra_loss(self, logp: Tensor, mask: Tensor, extras: list[Extra], *, update: int, max_tokens: int,
                   totals: dict) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss term of a micro-batch of extras, and per-sequence statistics (name → (n,), detached).

        `update` = m, the optimizer updates already made this step; `totals` = the plan's extra_totals.
        """
        raise NotImplementedError(f"sharing mode {self.name!r} forwards no extra sequences")

    def summarize(self, per_sequence: dict[str, Tensor]) -> dict[str, float]:
        """The step's statistics from the extras' per-sequence values (all micro-batches concatenated)."""
        return {name: values.float().mean().item() for name, values in per_sequence.items()}


def flat_prompt(batch: StepBatch, prompt_index: int) -> list[int]:
    """The prompt token ids of one of the step's prompts."""
    return batch.samples[prompt_index][0].prompt_ids
