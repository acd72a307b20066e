"""The no-harm guard: a receiver keeps from its peers only what does not work against its own learning.

It wraps the update (mrl_trainer.update). There, g_s is the gradient of the solo loss (own samples, own-group
advantages and normalisers, the trainer's loss: what `none` trains on) and d = g_m − g_s the peer term, the
gradient of what the mode adds to it (changed advantages or normalisers, its extra sequences). On each optimizer
step:

    projection   d⊥ = d − min(0, ⟨d, g_s⟩) / ‖g_s‖² · g_s            over the whole model: ⟨d⊥, g_s⟩ ≥ 0
    cap          w  = min(τ, κ ‖g_s‖ / ‖d⊥‖)                          κ = max_ratio (0: none, w = τ)
    update       g  = g_s + w · d⊥                                    so ⟨g, g_s⟩ ≥ ‖g_s‖²

to first order never worse for the own objective than solo's step. Trust τ is learned in hindsight, from the
receiver's own samples only: did the direction the peers proposed at the last step point where its own samples
pull now, beyond what its own gradient already pointed to?

    r_t     = d⊥ − (⟨d⊥, g_s⟩ / ‖g_s‖²) · g_s          the peer direction beyond g_s, summed over step t's
                                                      optimizer steps, at any τ
    h_t     = cos(r_{t'}, g_s of step t)              averaged over the step's optimizer steps; t' the last step
                                                      before t whose r was not 0
    m_{t+1} = (1 − η) m_t + η · sign(h_t)              h_t = 0 (disjoint supports) is no evidence
    τ_t     = max(0, (m_t − σ_0) / (1 − σ_0))          σ_0 = √(η / (2 − η)); m_0 such that τ = τ_0

σ_0 is the settled standard deviation of m for signs that are fair coin flips, so a peer term that agrees with own
learning only by chance gets τ = 0, not a small τ (which Adam's normalisation would undo wherever the peer term
is a coordinate's only gradient). A peer term is judged whether or not it was applied, so trust can be earned
back, or earned first (τ_0 = 0). A step with g_s = 0 is no evidence: d passes at the current τ (or is cut to 0
by the cap). At τ = 0 the update is solo's exactly: an optimizer step where g = 0 and solo takes none is not
taken (`idle`), and under the async coupling the peers choose at most ⌊guided_share·τ·P⌋ of a batch's prompts
(`guidance: trust`; SharingMode.guided_share).

The guard sees a step's whole peer term: one τ per receiver, which turns several peers down together. The score
m is checkpointed (SharingMode.state); the last direction r is not, so the first step after a resume has no
hindsight. Costs: the solo loss's forward and backward (mrl_trainer.update), a gradient-sized buffer for g_s
(which holds r after the combination) and one for the last step's r; inner products are float32 per tensor,
summed in float64 and read back once.
"""
import math
from typing import Literal

import torch
from pydantic import Field

from mrl_trainer.distributed import Ranks, gradient_of, local
from mrl_trainer.section import Section

__all__ = ["GuardConfig", "Guard"]


class GuardConfig(Section):
    enabled: bool = Field(True, description="The no-harm guard: project out the part of the peer term that "
                                            "conflicts with the own gradient, and scale the rest by a trust "
                                            "learned in hindsight (docs/algorithms.md).")
    trust_rate: float = Field(0.1, ge=0, lt=1, description="η: how fast the trust τ follows the sign of the "
                                                           "hindsight evidence (0: τ stays at initial_trust).")
    max_ratio: float | None = Field(None, ge=0, description="κ: the peer term, after projection and trust, is "
                                                             "scaled down to at most κ times the own gradient's "
                                                             "norm (a step with no own gradient then takes "
                                                             "none). 0: no cap. Unset: the mode's default, 1 for "
                                                             "SGT (its peer term is an NLL, not a policy "
                                                             "gradient), no cap for PRP, XGRPO and HACPO.")
    initial_trust: float | None = Field(None, ge=0, le=1, description="τ_0, the trust before any evidence. Unset: "
                                                                        "the mode's default, 1 for PRP and SGT "
                                                                        "(their peer terms carry the peer's "
                                                                        "samples), 0 for XGRPO and HACPO (mostly "
                                                                        "a pooled baseline: trust is earned).")
    guidance: Literal["trust", "full"] = Field(
        "trust", description="async: how many of a batch's prompts the peers may choose. trust: at most "
                             "⌊guided_share·τ·P⌋, so a peer the guard has turned down to solo chooses none and the "
                             "batch is the task's own, as solo's; full: ⌊guided_share·P⌋ whatever τ.")


class Guard:
    """One receiver's guard: its trust τ (through the score m), the last step's peer direction, and the
    combination of the solo gradient and the peer term."""
    stats = {"guard_agreement": "guard: cos(peer term, own gradient)",
             "guard_projected": "guard: share of updates projected",
             "guard_hindsight": "guard: cos(last step's peer term beyond the own gradient, own gradient)",
             "guard_trust": "guard: trust τ",
             "guard_capped": "guard: share of updates whose peer term was cut to κ‖g_s‖"}
    figures = {"guard": ("guard_agreement", "guard_hindsight", "guard_projected", "guard_capped", "guard_trust")}
    cumulative = frozenset()
    summary = {"guard_trust": "mean guard trust τ"}

    def __init__(self, config: GuardConfig, default_max_ratio: float = 0.0, default_initial_trust: float = 1.0):
        """`default_max_ratio`, `default_initial_trust`: κ and τ_0 where the config leaves them unset (the
        mode's: SharingMode.guard_max_ratio, guard_initial_trust)."""
        unset = {"max_ratio": default_max_ratio, "initial_trust": default_initial_trust}
        self.config = config.model_copy(update={k: v for k, v in unset.items() if getattr(config, k) is None})
        self.trust = self.config.initial_trust               # sets the score m
        self.previous: list[torch.Tensor] | None = None      # the last step's Σ r, one tensor per parameter
        self._previous_ss = 0.0                              # ‖previous‖², over all ranks
        self._direction: list[torch.Tensor] | None = None    # this step's Σ r, so far

    @property
    def chance(self) -> float:
        """σ_0 = √(η / (2 − η))."""
        eta = self.config.trust_rate
        return math.sqrt(eta / (2 - eta))

    @property
    def trust(self) -> float:
        """τ = max(0, (m − σ_0) / (1 − σ_0))."""
        return max(0.0, (self.score - self.chance) / (1 - self.chance))

    @trust.setter
    def trust(self, tau: float) -> None:
        """m such that τ = tau (m = 0 for τ = 0)."""
        self.score = self.chance + tau * (1 - self.chance) if tau > 0 else 0.0

    def combine(self, params: list[torch.Tensor], solo: list[torch.Tensor | None], ranks: Ranks = Ranks(),
                gather: bool = True) -> dict[str, float]:
        """p.grad ← g_s + w·d⊥, where p.grad holds the peer term d (None: 0) and `solo` g_s (None: 0), which is
        consumed: its buffers hold r afterwards (a parameter with neither keeps p.grad None, as solo leaves it). The evidence: agreement cos(d, g_s) and hindsight cos(last
        step's r, g_s) (nan without them), projected (0 or 1), capped (with κ: 1 when w < τ) and idle (g_s = 0
        and nothing of d passed: the combination is exactly 0). `gather`: r joins the step's direction, the next
        step's hindsight (False: a combination that is not a step's, as mrl_trainer.update.gradient's). Under
        FSDP each rank holds its shards: the inner products are summed over the ranks, and each p.grad keeps its
        own storage."""
        none = [s is None and p.grad is None for s, p in zip(solo, params)]    # no gradient: left without one
        g_s = [local(s) if s is not None else torch.zeros_like(local(p)) for s, p in zip(solo, params)]
        d = [local(p.grad) if p.grad is not None else torch.zeros_like(g) for p, g in zip(params, g_s)]
        pairs = [(d, g_s), (g_s, g_s), (d, d)] + ([(self.previous, g_s)] if self.previous is not None else [])
        dot, ss, dd, *hind = ranks.sum(_dots(pairs))
        c = dot / ss if dot < 0 and ss > 0 else 0.0                  # d⊥ = d − c·g_s
        w = self.trust
        if self.config.max_ratio:
            peer = math.sqrt(max(dd - 2 * c * dot + c * c * ss, 0.0))   # ‖d⊥‖
            w = min(w, self.config.max_ratio * math.sqrt(ss) / peer) if peer > 0 else w
        k = (dot - c * ss) / ss if ss > 0 else 0.0                   # ⟨d⊥, g_s⟩ / ‖g_s‖²
        for p, gp, dp, empty in zip(params, g_s, d, none):
            if empty:                                                # g = r = 0, and AdamW skips p as solo's
                continue
            if c:
                dp.sub_(gp, alpha=c)
            combined = torch.add(gp, dp, alpha=w)                    # g = g_s + w·d⊥
            gp.mul_(-k).add_(dp)                                     # r = d⊥ − k·g_s, in g_s's buffer
            dp.copy_(combined)                                       # g, in p.grad's storage
            if p.grad is None:
                p.grad = gradient_of(p, dp)
        if gather and self._direction is None:
            self._direction = g_s
        elif gather:
            for total, r in zip(self._direction, g_s):
                total.add_(r)
        evidence = {"agreement": _cos(dot, ss, dd), "projected": float(c != 0),
                    "hindsight": _cos(hind[0], ss, self._previous_ss) if hind else math.nan,
                    "idle": ss == 0 and (w == 0 or dd == 0)}
        if self.config.max_ratio:
            evidence["capped"] = float(w < self.trust)
        return evidence

    def observe(self, evidence: list[dict[str, float]], ranks: Ranks = Ranks()) -> dict[str, float]:
        """End of a step: m ← (1 − η)m + η·sign(h), h the mean hindsight (no change without one, or at h = 0);
        this step's direction becomes the next step's `previous`. The step's guard stats (τ as the step used
        it)."""
        stats = {"guard_trust": self.trust,
                 "guard_projected": sum(e["projected"] for e in evidence) / max(len(evidence), 1)}
        for key in ("agreement", "hindsight", "capped"):
            values = [e[key] for e in evidence if key in e and not math.isnan(e[key])]
            if values:
                stats[f"guard_{key}"] = sum(values) / len(values)
        h = stats.get("guard_hindsight", 0.0)
        if h != 0:
            eta = self.config.trust_rate
            self.score = (1 - eta) * self.score + eta * math.copysign(1.0, h)
        if self._direction is not None:
            ss = ranks.sum(_dots([(self._direction, self._direction)]))[0]
            if ss > 0:
                self.previous, self._previous_ss = self._direction, ss
        self._direction = None
        return stats


def _dots(pairs: list[tuple[list[torch.Tensor], list[torch.Tensor]]]) -> list[float]:
    """Σ_p ⟨a_p, b_p⟩ for each pair of per-parameter tensor lists: float32 dot products per tensor, summed in
    float64 on the tensors' device and read back at once (one synchronisation on a GPU)."""
    sums = [torch.stack([torch.dot(x.reshape(-1), y.reshape(-1)).double() for x, y in zip(a, b)]).sum()
            if a else torch.zeros((), dtype=torch.float64) for a, b in pairs]
    return torch.stack(sums).tolist()


def _cos(dot: float, aa: float, bb: float) -> float:
    return dot / math.sqrt(aa * bb) if aa > 0 and bb > 0 else math.nan
