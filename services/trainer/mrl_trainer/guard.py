"""The no-harm guard: a receiver keeps from its peers only what does not work against its own learning.

Every sharing mode changes a policy's update by a peer term. With g_s the gradient of the solo loss (own
samples, own-group advantages, the solo normalisers, the trainer's loss: what `none` would do) and g_m the
gradient of the mode's whole loss (its own advantages, normalisers and own-sample loss, plus its extra
sequences), the peer term is

    d = g_m − g_s                 (PRP: pooled baselines + peer rollouts; XGRPO: pooled baselines;
                                   SGT: the rescue NLL; HACPO: the mixed baseline + weighted peer samples,
                                   and its own loss in place of the trainer's: below)

Evidence the receiver checks itself, on every optimizer step (mini-batch), from its own samples only:

    a    = cos(d, g_s)                                       agreement of the peer term with own learning
                                                             (logged; its sign decides the projection)

Projection (gradient surgery, as PCGrad): the conflicting component of d is removed,

    d⊥   = d − min(0, ⟨d, g_s⟩) / ‖g_s‖² · g_s               so ⟨d⊥, g_s⟩ ≥ 0

over the whole model (projection: model), or on each parameter tensor p on its own (projection: tensor:
d⊥_p = d_p − min(0, ⟨d_p, g_s,p⟩) / ‖g_s,p‖² · g_s,p, so ⟨d⊥_p, g_s,p⟩ ≥ 0 for every p).

Memory (`memory` > 0; off by default, as it moved no mode's final success on the testbed once trust was earned in
hindsight; A-GEM, Chaudhry et al. 2019, applied to the peer term): the receiver keeps its own verified successes
(reward ≥ 1), the newest per prompt, for the `memory` most recently solved prompts, and each step with a peer term
draws `memory_batch` of them, R = {(x_i, y_i)}. Their NLL's gradient

    g_r  = ∇ (1/|R|) Σ_i −(1/|y_i|) Σ_t log π_θ(y_i,t | x_i, y_i,<t)
    d⊥  ← d⊥ − min(0, ⟨d⊥, g_r⟩) / ‖g_r‖² · g_r              so ⟨d⊥, g_r⟩ ≥ 0 as well (per tensor, likewise)

so to first order the peer term cannot make the policy less likely to produce what it has solved before:
evidence on prompts outside the step's batch, where a peer's pull on shared parameters (format drag, a
push-down that spreads) shows, while the own gradient of the batch cannot see it.

Trust, learned in hindsight: did the direction the peers proposed at the last step point where the receiver's
own samples pull now, beyond what its own gradient already pointed to?

    r_t     = d⊥ − (⟨d⊥, g_s⟩ / ‖g_s‖²) · g_s                the peer direction beyond the own gradient, summed
                                                            over step t's optimizer steps, at any τ
    h_t     = cos(r_{t−1}, g_s of step t)                    averaged over the step's optimizer steps; r_{t−1}
                                                            is that of the last step whose r was not 0
    m_{t+1} = (1 − η) m_t + η · sign(h_t)                    h_t = 0 (disjoint supports) is no evidence
    τ_t     = max(0, (m_t − σ_0) / (1 − σ_0))                σ_0 = √(η / (2 − η)); m_0 such that τ = τ_0
                                                            (`initial_trust`, the mode's default: 1 or 0)
    g       = g_s + τ_t · d⊥                                 what the optimizer steps on

so to first order the update improves the own objective at least as much as solo's would (⟨g, g_s⟩ ≥
‖g_s‖²). The part of d⊥ along g_s is left out of the evidence: the projection made it non-negative and
consecutive own gradients point alike, so it would agree with the next own gradient whatever the peer sent.
The sign's running mean goes to 0 for a peer term that is noise (h_t > 0 half the time) and below 0 for one
own learning keeps undoing (format drag). σ_0 is the standard deviation, once settled, of that running mean for
signs that are fair coin flips, so a peer term that agrees with own learning only by chance gets τ = 0 rather
than a small τ: τ = 0 leaves the update solo's, which matters under Adam, whose normalisation undoes a small τ
wherever the peer term is a coordinate's only gradient. A peer term is judged whether or not it was applied, so
trust can be earned back (or earned first: τ_0 = 0). A step whose own gradient is 0 (every own group uniform, no
KL) has no evidence: d passes at the current τ (⟨d, g_s⟩ = 0) and m is not updated. With τ = 1 and no conflict
the update is the mode's own.

At τ = 0 the mode is solo, step for step and prompt for prompt: where g = 0 and solo takes no optimizer step
(`idle`, mrl_trainer.update) none is taken (AdamW would move the weights by its momentum), and under the async
coupling the peers choose at most ⌊guided_share·τ·P⌋ of a batch's prompts (`guidance: trust`;
SharingMode.guided_share): peer guidance changes what the receiver trains on, which the projection cannot see.

Size (`max_ratio` = κ > 0; unset, the mode's default: 1 for SGT, no cap for the others): the peer term may
not be larger than κ times the own gradient,

    g       = g_s + min(τ, κ ‖g_s‖ / ‖d⊥‖) · d⊥              ‖d⊥‖² from the inner products above, no extra pass

SGT's λ weighs an NLL against a policy gradient, quantities of different scale: the NLL of a peer's text in a
form the receiver does not write has a gradient many times a policy gradient's, and once the update is clipped
to max_grad_norm and Adam has normalised it, a step where that term dominates moves the policy as far as a
whole own step, in the peer's direction, whatever λ is (on a step with no own gradient Adam's first update is
lr·sign(d) for any λ > 0). The cap keeps the own signal at least 1/κ of the combination, and a step with no
own gradient then takes no peer term. PRP's, XGRPO's and HACPO's peer terms are policy gradients like the
own term; on the testbed the cap cost them up to 0.04 of final success (XGRPO at the strongest interference),
so they are not capped by default.

Costs: three gradient-sized buffers (g_s, in which the combination is made; the last step's direction; g_r; d,
d⊥ and r, the step's peer direction, are made in place of g_m), one forward and backward over the recalled
successes per step with a peer term (with a memory), and computing g_s. An own sample whose advantage the mode
left as solo's (SGT's, whose peer term is only the rescue NLL; XGRPO's and PRP's on prompts no peer reached)
adds to the solo loss c times what it adds to the mode's own loss, where c = D / D_solo is the ratio of the two
normalisers (1 but for PRP, which counts the peer samples): its part of g_s is c times a copy of its accumulated
gradient, no extra compute (not so under HACPO, whose own-sample loss, GSPO, is not solo's: each of its own
micro-batches takes the second backward below); where every own sample is such a one and c = 1 (SGT), the
accumulated gradient is g_s itself, moved out before the peer term's backward, which then leaves d alone. Each
micro-batch of samples whose advantage the mode changed takes one more backward (the solo loss, from the same
forward; under torchrun a forward and backward of its own); mrl_trainer.update sorts the samples on exact
equality.

A mode whose own-sample loss is not the trainer's (HACPO: GSPO) changes the update without any peer: that part
is judged apart, by a second guard of the same kind (SharingMode.own_guard, stats guard_own_*), so a peer term
never rides on trust the own loss earned, nor the own loss on the peers'. With g_o = ∇ of the mode's own loss at
solo advantages and solo normalisers (what the mode would do with no peer), each part is projected against g_s
and trusted apart:

    g = g_s + τ_own · (g_o − g_s)⊥g_s + τ · (g_m − g_o)⊥g_s          so ⟨g, g_s⟩ ≥ ‖g_s‖² still

each trust learned in hindsight against the next g_s as above, and guidance follows the peer guard's τ only. At
τ_own = τ = 0, g = g_s exactly. It costs one more backward per own micro-batch (g_o, from the same forward; under
torchrun a forward and backward of its own) and three more gradient-sized buffers, two of them only during the
combination (g_o's, which becomes the own guard's step direction, and the copy of g_s the sum is made in) and one
held between steps (the own guard's last direction).

The guard sees the whole peer term of a step, so its trust is per mode (one τ per receiver): with several
peers it turns them down together. m and the memory are checkpointed with the trainer (SharingMode.state); the
last direction is not, so the first step after a resume has no hindsight and leaves τ as it was.
"""
import math
import random
from collections import OrderedDict
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
    projection: Literal["model", "tensor"] = Field(
        "model", description="Where the conflict is measured and removed: over the whole model's gradient "
                             "(model) or each parameter tensor on its own (tensor: a conflict in one layer is "
                             "removed even when the other layers agree).")
    memory: int = Field(0, ge=0, le=4096, description="Own verified successes remembered (the newest per prompt, "
                                                      "for up to this many prompts); the peer term is also "
                                                      "projected so that it cannot lower their likelihood (A-GEM), "
                                                      "at the cost of a forward and backward per step. 0 (the "
                                                      "default): no memory; with the trust earned in hindsight it "
                                                      "moved no mode on the testbed (docs/algorithms.md).")
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
    memory_batch: int = Field(4, ge=1, le=256, description="Remembered successes whose gradient each step with "
                                                           "a peer term takes (one more forward and backward "
                                                           "over them).")


class Guard:
    """One receiver's guard: its trust τ, the last step's peer direction, and the combination of its solo and
    mode gradients."""
    stats = {"guard_agreement": "guard: cos(peer term, own gradient)",
             "guard_projected": "guard: share of updates projected",
             "guard_hindsight": "guard: cos(last step's peer term beyond the own gradient, own gradient)",
             "guard_trust": "guard: trust τ",
             "guard_remembered": "guard: share of updates projected against the remembered successes",
             "guard_capped": "guard: share of updates whose peer term was cut to κ‖g_s‖",
             "guard_own_agreement": "guard: cos(own loss's change, solo gradient)",
             "guard_own_projected": "guard: share of updates whose own loss's change was projected",
             "guard_own_hindsight": "guard: cos(last step's own loss's change beyond g_s, g_s)",
             "guard_own_trust": "guard: trust τ_own in the mode's own loss"}
    figures = {"guard": ("guard_agreement", "guard_hindsight", "guard_projected", "guard_remembered",
                         "guard_capped", "guard_trust", "guard_own_hindsight", "guard_own_trust")}
    cumulative = frozenset()
    summary = {"guard_trust": "mean guard trust τ", "guard_own_trust": "mean guard trust τ_own"}

    def __init__(self, config: GuardConfig, default_max_ratio: float = 0.0, default_initial_trust: float = 1.0,
                 name: str = "guard"):
        """`default_max_ratio`, `default_initial_trust`: κ and τ_0 when the config leaves them unset (the mode's,
        SharingMode.guard_max_ratio and guard_initial_trust); `name`: its stats' prefix (guard_own: the own loss's
        guard)."""
        unset = {"max_ratio": default_max_ratio, "initial_trust": default_initial_trust}
        config = config.model_copy(update={k: v for k, v in unset.items() if getattr(config, k) is None})
        self.config, self.name = config, name
        self.trust = config.initial_trust                    # sets the score m (m_0 such that τ = τ_0)
        self.previous: list[torch.Tensor] | None = None      # the last step's Σ r, one tensor per parameter
        self._previous_ss = 0.0                              # ‖previous‖², over all ranks
        self._direction: list[torch.Tensor] | None = None    # this step's, so far
        self.memory: OrderedDict[tuple[int, ...], list[int]] = OrderedDict()   # prompt ids → newest own success
        self._rng = random.Random(0)

    @property
    def chance(self) -> float:
        """σ_0 = √(η / (2 − η)): the standard deviation, once settled, of the running mean m of signs that are fair
        coin flips (a peer term that is noise)."""
        eta = self.config.trust_rate
        return math.sqrt(eta / (2 - eta))

    @property
    def trust(self) -> float:
        """τ = max(0, (m − σ_0) / (1 − σ_0)): the trust the peer term is scaled by (1 at m = 1, 0 while m is
        within σ_0 of a fair coin's)."""
        return max(0.0, (self.score - self.chance) / (1 - self.chance))

    @trust.setter
    def trust(self, value: float) -> None:
        """m such that τ = value (0: m = 0)."""
        self.score = self.chance + value * (1 - self.chance) if value > 0 else 0.0

    def remember(self, batch) -> None:
        """Keep each prompt's newest own success (reward ≥ 1) of the step's batch, for the `memory` most recently
        solved prompts."""
        if not self.config.memory:
            return
        for group, rewards in zip(batch.samples, batch.rewards):
            solved = [s for s, r in zip(group, rewards) if r >= 1.0 and s.ids]
            if solved:
                self.keep(group[0].prompt_ids, solved[-1].ids)

    def keep(self, prompt: list[int], ids: list[int]) -> None:
        """Remember `ids` as the prompt's newest success, forgetting the least recently solved prompts beyond
        `memory` (a checkpoint's memory is restored through it too, so a smaller `memory` holds on resume)."""
        key = tuple(prompt)
        self.memory.pop(key, None)
        self.memory[key] = list(ids)
        while len(self.memory) > self.config.memory:
            self.memory.popitem(last=False)

    def recall(self) -> tuple[list[list[int]], list[list[int]]]:
        """`memory_batch` remembered successes drawn at random (all of them when fewer): prompts, completions."""
        chosen = self._rng.sample(list(self.memory), min(len(self.memory), self.config.memory_batch))
        return [list(key) for key in chosen], [self.memory[key] for key in chosen]

    def combine(self, params: list[torch.Tensor], solo: list[torch.Tensor | None], ranks: Ranks = Ranks(),
                remembered: list[torch.Tensor | None] | None = None, peer_only: bool = False,
                gather: bool = True, base: list[torch.Tensor] | None = None) -> dict[str, float]:
        """p.grad ← g_s + w·d⊥ (w = τ, with max_ratio min(τ, κ‖g_s‖/‖d⊥‖)), where p.grad holds g_m (with
        `peer_only`, d itself: the update moved the own gradient out as g_s before the peer term's backward) and
        `solo` g_s (None: 0), and `remembered` g_r, the gradient of the remembered successes' NLL (None: no
        memory): d⊥ is then also projected against it. The evidence: agreement cos(d, g_s) and hindsight
        cos(last step's peer term, g_s) (nan without one), projected (0 or 1; projection: tensor, the share of
        parameter tensors projected), with a memory remembered (0 or 1, or that share: d⊥ lowered the
        likelihood of the remembered successes), with max_ratio capped (1: w < τ), and idle (True: g_s = 0 and
        nothing of d passed, so the combination is exactly 0). `gather`: r is added to the
        step's peer direction, the next step's hindsight evidence (False: a combination that is not a step's, e.g.
        mrl_trainer.update.gradient's). With `base` (this rank's tensors, one per parameter) the trusted d⊥ is added
        to it instead, p.grad ← base + w·d⊥ in base's buffer, and r = d⊥ − k·g_s made from g_s, which is left as it
        was (the own guard's chain, mrl_trainer.update._combine: both terms projected against, and judged by, g_s).

        No gradient-sized buffer is allocated (but under FSDP, below): d and then d⊥ are made in place of g_m
        (peer_only: they are in p.grad already), g_s + w·d⊥ in g_s's buffer, which becomes p.grad, and then
        r = d⊥ − k·g_s (k = ⟨d⊥, g_s⟩/‖g_s‖², 0 when g_s = 0) = (1 + k·w)·d⊥ − k·(g_s + w·d⊥) in place of d⊥, the
        peer direction for the next step's hindsight (`solo` is consumed). A sharded parameter's p.grad (FSDP)
        keeps its own storage: there g_s + w·d⊥ is made in a new buffer of the shard's size and copied into it,
        and r into g_s's buffer (the same arithmetic, two passes more). r's rounding error grows with k·w
        (relative error about k·w times the precision), which only a cosine's sign is taken from. The inner
        products are float32 chunks summed in float64, each tensor read once per chunk (_products). Under FSDP
        each rank holds its shards of the gradients: the inner products are summed over the ranks."""
        g_s = [local(s) if s is not None else torch.zeros_like(local(p)) for s, p in zip(solo, params)]
        if peer_only:
            d = [local(p.grad) if p.grad is not None else torch.zeros_like(g) for p, g in zip(params, g_s)]
        else:
            d = [local(p.grad).sub_(g) if p.grad is not None else -g for p, g in zip(params, g_s)]
        g_r = None if remembered is None else \
            [local(r) if r is not None else torch.zeros_like(local(p)) for r, p in zip(remembered, params)]
        n = len(params)
        tensor_dots, dd, hind = _products(d, g_s, g_r, self.previous)
        summed = ranks.sum(tensor_dots + [dd] + ([hind] if hind is not None else []))
        parts = [summed[i * n:(i + 1) * n] for i in range(len(tensor_dots) // n)]
        dd, *hind = summed[len(tensor_dots):]
        dots, sss = parts[0], parts[1]
        dot, ss = sum(dots), sum(sss)
        coefficients = _projection(self.config.projection, dots, sss)
        remembered_coefficients = [0.0] * n
        if g_r is not None:       # ⟨d − c·g_s, g_r⟩ per tensor, then the same projection against g_r
            d_r, s_r, rr = parts[2], parts[3], parts[4]
            remembered_coefficients = _projection(self.config.projection,
                                                  [x - c * y for x, c, y in zip(d_r, coefficients, s_r)], rr)
        weight = self.trust
        if self.config.max_ratio:
            peer = math.sqrt(_projected_norm_squared(dd, parts, coefficients, remembered_coefficients))
            weight = min(weight, self.config.max_ratio * math.sqrt(ss) / peer) if peer > 0 else weight
        direction = []
        k = _along(dots, sss, coefficients, parts[3] if g_r is not None else None, remembered_coefficients) / ss \
            if ss > 0 else 0.0
        for i, (p, gp, dp, c, c_r, gr) in enumerate(zip(params, g_s, d, coefficients, remembered_coefficients,
                                                        g_r if g_r is not None else g_s)):   # no g_r: every c_r is 0
            if c:
                dp.sub_(gp, alpha=c)
            if c_r:
                dp.sub_(gr, alpha=c_r)
            if base is not None:                  # base + w·d⊥ in base's buffer; r = d⊥ − k·g_s, g_s kept
                p.grad = gradient_of(p, base[i].add_(dp, alpha=weight))
                if k:
                    dp.sub_(gp, alpha=k)
                direction.append(dp)
                continue
            sharded = local(p) is not p           # FSDP: p.grad keeps its own storage, dp
            combined = torch.add(gp, dp, alpha=weight) if sharded else gp.add_(dp, alpha=weight)
            if k:                                 # r = d⊥ − k·g_s = (1 + k·w)·d⊥ − k·(g_s + w·d⊥)
                dp.mul_(1 + k * weight).sub_(combined, alpha=k)
            if sharded:
                gp.copy_(dp)                      # r, in g_s's buffer
                dp.copy_(combined)                # g_s + w·d⊥, in p.grad
                if p.grad is None:
                    p.grad = gradient_of(p, dp)
                direction.append(gp)
            else:
                p.grad = combined                 # g_s + w·d⊥, in g_s's buffer
                direction.append(dp)              # r, in g_m's
        if gather and self._direction is None:
            self._direction = direction
        elif gather:
            for total, pp in zip(self._direction, direction):
                total.add_(pp)
        evidence = {"agreement": _cos(dot, ss, dd), "projected": sum(c != 0 for c in coefficients) / max(n, 1),
                    "hindsight": _cos(hind[0], ss, self._previous_ss) if hind else math.nan,
                    "idle": ss == 0 and (weight == 0 or dd == 0)}
        if self.config.max_ratio:
            evidence["capped"] = float(weight < self.trust)
        if g_r is not None:
            evidence["remembered"] = sum(c != 0 for c in remembered_coefficients) / max(n, 1)
        return evidence

    def observe(self, evidence: list[dict[str, float]], ranks: Ranks = Ranks()) -> dict[str, float]:
        """End of a step: m ← (1 − η)m + η·sign(h), h the mean hindsight (no change without one, or at h = 0),
        τ = max(0, (m − σ_0)/(1 − σ_0)); this step's peer direction r becomes the next step's `previous`. The
        step's guard stats (τ as the step used it)."""
        name = self.name
        stats = {f"{name}_trust": self.trust,
                 f"{name}_projected": sum(e["projected"] for e in evidence) / max(len(evidence), 1)}
        for key in ("remembered", "capped"):
            values = [e[key] for e in evidence if key in e]
            if values:
                stats[f"{name}_{key}"] = sum(values) / len(values)
        for key in ("agreement", "hindsight"):
            values = [e[key] for e in evidence if not math.isnan(e[key])]
            if values:
                stats[f"{name}_{key}"] = sum(values) / len(values)
        if f"{name}_hindsight" in stats:
            eta = self.config.trust_rate
            h = stats[f"{name}_hindsight"]
            if h != 0:
                self.score = (1 - eta) * self.score + eta * math.copysign(1.0, h)
        if self._direction is not None:
            ss = ranks.sum([_dot(self._direction, self._direction)])[0]
            if ss > 0:
                self.previous, self._previous_ss = self._direction, ss
        self._direction = None
        return stats


def _along(dots: list[float], sss: list[float], c: list[float], sr: list[float] | None, c_r: list[float]) -> float:
    """⟨d⊥, g_s⟩ = Σ_p (⟨d_p, g_s,p⟩ − c_p ‖g_s,p‖² − c_r,p ⟨g_s,p, g_r,p⟩) from the per-tensor products (without
    g_r, `sr` None: the last term is 0)."""
    total = sum(x - y * z for x, y, z in zip(dots, c, sss))
    return total - sum(y * z for y, z in zip(c_r, sr)) if sr is not None else total


def _projected_norm_squared(dd: float, parts: list[list[float]], c: list[float], c_r: list[float]) -> float:
    """‖d⊥‖² for d⊥_p = d_p − c_p g_s,p − c_r,p g_r,p, from ‖d‖² and the per-tensor products `parts`
    (⟨d, g_s⟩, ‖g_s‖², and with g_r ⟨d, g_r⟩, ⟨g_s, g_r⟩, ‖g_r‖²):

        ‖d⊥‖² = ‖d‖² + Σ_p [c_p² ‖g_s,p‖² − 2c_p ⟨d_p, g_s,p⟩
                           + c_r,p (c_r,p ‖g_r,p‖² − 2⟨d_p, g_r,p⟩ + 2c_p ⟨g_s,p, g_r,p⟩)]
    """
    total = dd + sum(x * x * ss - 2 * x * ds for x, ds, ss in zip(c, parts[0], parts[1]))
    if len(parts) > 2:
        total += sum(y * (y * rr - 2 * dr + 2 * x * sr) for x, y, dr, sr, rr in zip(c, c_r, *parts[2:]))
    return max(total, 0.0)


def _projection(where: str, dots: list[float], norms: list[float]) -> list[float]:
    """Per parameter tensor, the coefficient c of d⊥ = d − c·g from ⟨d_p, g_p⟩ and ‖g_p‖²: min(0, ⟨d, g⟩) / ‖g‖²
    over the whole model (model) or per tensor (tensor)."""
    if where == "model":
        dot, ss = sum(dots), sum(norms)
        return [dot / ss if dot < 0 and ss > 0 else 0.0] * len(dots)
    return [x / y if x < 0 and y > 0 else 0.0 for x, y in zip(dots, norms)]


CHUNK = 1 << 16    # elements per float32 dot product


def _products(d: list[torch.Tensor], g_s: list[torch.Tensor], g_r: list[torch.Tensor] | None,
              previous: list[torch.Tensor] | None) -> tuple[list[float], float, float | None]:
    """The guard's inner products, each tensor read once per chunk of CHUNK elements (the chunk's other products
    then come from the cache):

        per parameter tensor p   ⟨d_p, g_s,p⟩ …, then ‖g_s,p‖² …, and with g_r ⟨d_p, g_r,p⟩ …, ⟨g_s,p, g_r,p⟩ …,
                                 ‖g_r,p‖² … (each list over the tensors, in order)
        over the model           ‖d‖², and with `previous` ⟨previous, g_s⟩ (else None)

    each a sum of float32 BLAS dot products of a chunk, summed in float64 in the order _dot sums them. Tensors
    on a GPU take _products_on_device: reading a product back per chunk would wait for the GPU each time."""
    if d and d[0].device.type != "cpu":
        return _products_on_device(d, g_s, g_r, previous)
    n = len(d)
    names = ("d·s", "s·s") + (("d·r", "s·r", "r·r") if g_r is not None else ())
    per_tensor = {name: [0.0] * n for name in names}
    dd, hind = 0.0, (0.0 if previous is not None else None)
    for i in range(n):
        x, s = d[i].reshape(-1), g_s[i].reshape(-1)
        r = g_r[i].reshape(-1) if g_r is not None else None
        q = previous[i].reshape(-1) if previous is not None else None
        for a in range(0, x.numel(), CHUNK):
            xc, sc = x[a:a + CHUNK], s[a:a + CHUNK]
            per_tensor["d·s"][i] += float(torch.dot(xc, sc))
            per_tensor["s·s"][i] += float(torch.dot(sc, sc))
            dd += float(torch.dot(xc, xc))
            if r is not None:
                rc = r[a:a + CHUNK]
                per_tensor["d·r"][i] += float(torch.dot(xc, rc))
                per_tensor["s·r"][i] += float(torch.dot(sc, rc))
                per_tensor["r·r"][i] += float(torch.dot(rc, rc))
            if q is not None:
                hind += float(torch.dot(q[a:a + CHUNK], sc))
    return [v for name in names for v in per_tensor[name]], dd, hind


def _products_on_device(d: list[torch.Tensor], g_s: list[torch.Tensor], g_r: list[torch.Tensor] | None,
                        previous: list[torch.Tensor] | None) -> tuple[list[float], float, float | None]:
    """_products' sums for tensors on a GPU: each product is formed there (_chunk_dot) and all of them are read
    back at once. The CPU loop reads each chunk's products as it goes, which on a GPU is one synchronisation
    per chunk and product (about 10,000 a step for a 135M-parameter model: 5.6 s of SmolLM2's step on an H200,
    against 0.2 s for its own update)."""
    pairs = [(d, g_s), (g_s, g_s)] + ([(d, g_r), (g_s, g_r), (g_r, g_r)] if g_r is not None else [])
    sums = [_chunk_dot(x, y) for a, b in pairs for x, y in zip(a, b)]
    sums.append(torch.stack([_chunk_dot(x, x) for x in d]).sum())
    if previous is not None:
        sums.append(torch.stack([_chunk_dot(q, s) for q, s in zip(previous, g_s)]).sum())
    values = torch.stack(sums).tolist()
    n = len(pairs) * len(d)
    return values[:n], values[n], values[n + 1] if previous is not None else None


def _chunk_dot(x: torch.Tensor, y: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """Σ over chunks of `chunk` elements of ⟨x_c, y_c⟩ in float32, summed in float64: a 0-dim tensor on x's
    device, nothing read back. The whole chunks go as one batched product (k × (1 × chunk)·(chunk × 1)), the
    rest as one dot product."""
    x, y = x.reshape(-1), y.reshape(-1)
    k = x.numel() // chunk
    whole = torch.bmm(x[:k * chunk].view(k, 1, chunk), y[:k * chunk].view(k, chunk, 1)).double().sum()
    return whole + torch.dot(x[k * chunk:], y[k * chunk:]).double()


def _dot_on_device(a: list[torch.Tensor], b: list[torch.Tensor], chunk: int = CHUNK) -> float:
    """_dot for tensors on a GPU: the per-tensor sums of _chunk_dot, read back once."""
    return float(torch.stack([_chunk_dot(x, y, chunk) for x, y in zip(a, b)]).sum())


def _dot(a: list[torch.Tensor], b: list[torch.Tensor], chunk: int = CHUNK) -> float:
    """Σ_p ⟨a_p, b_p⟩ over the parameters: BLAS float32 dot products of `chunk` elements, summed in float64.
    Each chunk's rounding error is about √chunk·2⁻²⁴ of its magnitude (≈ 2e-5), far below what the guard's
    decisions (a sign, a cosine) need; converting to float64 instead cost 10× the time (buffers allocated and
    written per chunk) and was most of the guard's cost on a 135M-parameter model. On a GPU: _dot_on_device."""
    if a and a[0].device.type != "cpu":
        return _dot_on_device(a, b, chunk)
    total = 0.0
    for x, y in zip(a, b):
        x, y = x.reshape(-1), y.reshape(-1)
        for i in range(0, x.numel(), chunk):
            total += float(torch.dot(x[i:i + chunk], y[i:i + chunk]))
    return total


def _cos(dot: float, aa: float, bb: float) -> float:
    return dot / math.sqrt(aa * bb) if aa > 0 and bb > 0 else math.nan
