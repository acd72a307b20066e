"""What every sharing mode shares: peer experience in this policy's tokens, the update plan, the base mode.

A step of policy k with a sharing mode (docs/algorithms.md):

    own batch     P prompts × G samples, rewards R, behaviour log-probs          (StepBatch)
    peers         what the peers published for the same prompt ids, retokenized   (PeerBatch)
    plan          mode.plan(batch, peers) → own advantages A, extra sequences to   (Plan)
                  forward (peer rollouts, rescued successes) and the whole-update normalisers
    loss          Σ_micro-batches mode.own_loss(own) + mode.extra_loss(extras)

The base class is solo GRPO/GSPO ("none"): own advantages within the own group, no extras.
Every normaliser in a Plan is a whole-update total, so micro-batching leaves the gradient exact.
"""
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

import torch
from pydantic import BaseModel
from torch import Tensor

from mrl_trainer.experience import StepBatch
from mrl_trainer.guard import Guard
from mrl_trainer.losses import group_advantages, policy_loss

__all__ = ["PeerSample", "PeerBatch", "Extra", "Plan", "SharingMode", "Verifier", "rescored", "pooled_peers",
           "cross_log_ratio", "solo_advantages", "PEER_STATS", "UniformGroups", "UNIFORM_GROUPS_HELP",
           "settle_uniform_groups"]

UniformGroups = Literal["pooled", "zero"]   # an own group of equal rewards under a pooled baseline: scored or left at 0
UNIFORM_GROUPS_HELP = ("An own group whose rewards are all equal while the pool's differ: 'zero' keeps A = 0 as GRPO "
                       "does; 'pooled' scores it against the pooled baseline (the paper: all failed → every sample "
                       "pushed down; on the testbed it cost 0.03–0.24 of final success against solo at its best "
                       "learning rate).")


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


def settle_uniform_groups(rewards: list[list[float]], advantages: Tensor, uniform_groups: str) -> int:
    """The own groups whose rewards are all equal but whose pooled advantages are not 0 (every sample pushed one
    way: all failed and a peer succeeded → down, with no direction toward anything); under `zero` their
    advantages (flat (N,), group after group, changed in place) are set to GRPO's 0. Returns how many."""
    moved = 0
    for group, part in zip(rewards, advantages.split([len(g) for g in rewards])):
        if len(set(group)) == 1 and bool((part != 0).any()):
            moved += 1
            if uniform_groups == "zero":
                part.zero_()
    return moved


def cross_log_ratio(logp: Tensor, mask: Tensor, behaviour_logp: Tensor, chunks: Tensor) -> Tensor:
    """The length-normalised log density ratio of a peer response y under π_θ^k and the producer's π_old^j:

        log s = ( Σ_t log π_θ^k(y_t)  −  Σ_u log π_old^j(y_u) ) / C(y)

    each sum over its own policy's tokens of the same text, divided by ONE normaliser, C(y) = the number of
    THL chunks of y (the smallest spans both tokenizations agree on; = |y| when the tokenizers are the same,
    where this is the papers' per-token ratio). When both policies give y the same probability, log s = 0
    whatever the two token counts (a per-side mean would give log P · (1/|y|_k − 1/|y|_j) ≠ 0 instead).
    logp, mask (N, T) in k's tokens; behaviour_logp, chunks (N,) from the producer j. Differentiable in logp."""
    return (torch.where(mask.bool(), logp, 0.0).sum(-1) - behaviour_logp) / chunks.clamp(min=1)


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

    and overrides plan, and extra_loss (and summarize) when it forwards extra sequences, and own_loss when it puts
    a loss of its own on its own samples (HACPO: GSPO; the guard still measures against solo_loss); the registry
    in sharing/__init__.py lists it.
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
        guarded = self.kinds and sharing.guard.enabled
        self.guard = Guard(sharing.guard, self.guard_max_ratio, self.guard_initial_trust) \
            if guarded else None
        # a loss of its own on own samples (HACPO's GSPO) is judged apart from the peers (mrl_trainer.guard);
        # neither capped nor projected against a memory, which are about what peers send
        self.own_guard = Guard(sharing.guard.model_copy(update={"max_ratio": 0.0, "memory": 0}),
                               default_initial_trust=self.guard_initial_trust, name="guard_own") \
            if guarded and not self.own_loss_is_solo else None

    def state(self) -> dict:
        """What the mode has learned during the run that a resumed trainer must keep (checkpointed with it):
        the guard's trust τ, its score m and memory (and the own guard's score). Plain values only."""
        if self.guard is None:
            return {}
        own = {} if self.own_guard is None else {"guard_own_score": self.own_guard.score}
        return {"guard_trust": self.guard.trust, "guard_score": self.guard.score,
                "guard_memory": [[list(prompt), ids] for prompt, ids in self.guard.memory.items()], **own}

    def restore(self, state: dict) -> None:
        """Take back a checkpoint's `state()` (a missing entry leaves its default: older checkpoints; one from before a
        mode's own guard, whose one τ judged its own loss and its peers together, leaves both trusts at τ_0)."""
        if self.guard is None:
            return
        if self.own_guard is not None and "guard_own_score" not in state:
            state = {"guard_memory": state.get("guard_memory", [])}   # one τ judged both: both start at τ_0
        if "guard_score" in state:
            self.guard.score = float(state["guard_score"])
        elif "guard_trust" in state:            # a checkpoint from before the score: the m that gives its τ
            self.guard.trust = float(state["guard_trust"])
        for prompt, ids in state.get("guard_memory", []):
            self.guard.keep(prompt, ids)
        if self.own_guard is not None and "guard_own_score" in state:
            self.own_guard.score = float(state["guard_own_score"])

    def guided_share(self) -> float:
        """async: the most of a batch's prompts its peers choose (sdk guided_batch): sharing.guided_share, times
        the guard's trust τ under `guard.guidance: trust` (so at τ = 0 the batch is solo's); unguarded or
        `guidance: full`, guided_share itself."""
        share = self.sharing.guided_share
        if self.guard is None or self.guard.config.guidance == "full":
            return share
        return share * self.guard.trust

    def own_totals(self, batch: StepBatch) -> dict:
        flat = [s for group in batch.samples for s in group]
        return dict(num_sequences=len(flat), num_tokens=sum(len(s.ids) for s in flat))

    def plan(self, batch: StepBatch, peers: PeerBatch, *, capability: float, verify: Verifier) -> Plan:
        """A_i = group-relative advantage within the own group (GRPO; Dr.GRPO without std)."""
        return Plan(solo_advantages(batch, self.loss), totals=self.own_totals(batch))

    def solo_loss(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, ref_logp: Tensor | None,
                  max_tokens: int, totals: dict) -> tuple[Tensor, dict[str, float]]:
        """The trainer's GRPO-family loss on own samples (level, clip, aggregation, β from the loss config), the
        loss `none` trains on: S / D with D = losses.normaliser(loss.aggregation, **totals), S independent of the
        totals. The guard's g_s is its gradient, whatever loss the mode puts on its own samples."""
        cfg = self.loss
        return policy_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, beta=cfg.beta, eps_low=cfg.eps_low,
                           eps_high=cfg.eps_high, level=cfg.level, aggregation=cfg.aggregation,
                           max_tokens=max_tokens, **totals)

    def own_loss(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, ref_logp: Tensor | None,
                 max_tokens: int, totals: dict) -> tuple[Tensor, dict[str, float]]:
        """The mode's loss on own samples at the plan's advantages and totals: solo's (a mode with a loss of its
        own, HACPO's GSPO, overrides it; the difference is then part of its peer term)."""
        return self.solo_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, max_tokens=max_tokens,
                              totals=totals)

    @property
    def own_loss_is_solo(self) -> bool:
        """Whether own_loss is solo_loss: a sample whose advantage the plan left as solo's then has the same
        per-token loss in both (mrl_trainer.update takes its part of g_s from its own gradient)."""
        return type(self).own_loss is SharingMode.own_loss

    @property
    def screens(self) -> bool:
        """Whether the update screens this mode's extras (`live`) before it forwards them with autograd: a mode
        whose loss gives some extras no gradient (a clipped ratio) says so; the default, False, forwards each
        extra once, with autograd."""
        return False

    def live(self, logp: Tensor, mask: Tensor, extras: list[Extra], *, update: int) -> Tensor:
        """Which extras' loss terms have a gradient at these log-probs (bool (n,)); asked only when `screens`.
        The update (mrl_trainer.update) forwards every extra once without autograd, which gives the loss's value
        and the statistics, then with autograd only the live ones, which give all of its gradient."""
        raise NotImplementedError(f"sharing mode {self.name!r} does not screen its extras")

    def extra_loss(self, logp: Tensor, mask: Tensor, extras: list[Extra], *, update: int, max_tokens: int,
                   totals: dict) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss term of a micro-batch of extras, and per-sequence statistics (name → (n,), detached).

        `update` = m, the optimizer updates already made this step; `totals` = the plan's extra_totals.
        """
        raise NotImplementedError(f"sharing mode {self.name!r} forwards no extra sequences")

    def summarize(self, per_sequence: dict[str, Tensor]) -> dict[str, float]:
        """The step's statistics from the extras' per-sequence values (all micro-batches concatenated)."""
        return {name: values.float().mean().item() for name, values in per_sequence.items()}
