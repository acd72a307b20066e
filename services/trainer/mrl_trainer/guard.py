"""The no-harm guard: a receiver keeps from its peers only what does not work against its own learning.

Every sharing mode changes a policy's update by a peer term. With g_s the gradient of the solo loss (own
samples, own-group advantages, the solo normalisers: what the policy would do alone) and g_m the gradient of
the mode's whole loss (its own advantages and normalisers, plus its extra sequences), the peer term is

    d = g_m − g_s                 (PRP: pooled baselines + peer rollouts; XGRPO: pooled baselines;
                                   SGT: the rescue NLL; HACPO: the mixed baseline + weighted peer samples)

Evidence the receiver checks itself, on every optimizer step (mini-batch), from its own samples only:

    a    = cos(d, g_s)                                       agreement of the peer term with own learning
                                                             (logged; its sign decides the projection)

Projection (gradient surgery, as PCGrad): the conflicting component of d is removed,

    d⊥   = d − min(0, ⟨d, g_s⟩) / ‖g_s‖² · g_s               so ⟨d⊥, g_s⟩ ≥ 0

over the whole model (projection: model), or on each parameter tensor p on its own (projection: tensor:
d⊥_p = d_p − min(0, ⟨d_p, g_s,p⟩) / ‖g_s,p‖² · g_s,p, so ⟨d⊥_p, g_s,p⟩ ≥ 0 for every p).

Trust, learned in hindsight: does the direction the peers added at the last step agree with where the
receiver's own samples pull now?

    h_t     = cos(τ d⊥ of step t − 1, g_s of step t)        averaged over the step's optimizer steps
    τ_{t+1} = (1 − η) τ_t + η · 1[h_t ≥ 0]                  τ_0 = 1
    g       = g_s + τ_t · d⊥                                 what the optimizer steps on

so to first order the update improves the own objective at least as much as solo's would (⟨g, g_s⟩ ≥
‖g_s‖²); a peer whose contributions own learning keeps undoing (format drag) is turned down towards solo
(τ → 0), one whose contributions own learning confirms keeps its weight. A step whose own gradient is 0
(every own group uniform, no KL) has no evidence: d passes unchanged (⟨d, g_s⟩ = 0) and τ is not updated.
With τ = 1 and no conflict the update is the mode's own.

Costs: three gradient-sized buffers (g_s, d, the last step's direction), and computing g_s. An own sample
whose advantage the mode left as solo's (SGT's, whose peer term is only the rescue NLL; XGRPO's, PRP's and
HACPO's on prompts no peer reached) adds to the solo loss c times what it adds to the mode's own loss, where
c = D / D_solo is the ratio of the two normalisers (1 but for PRP and HACPO, which count the peer samples):
its part of g_s is c times a copy of its accumulated gradient, no extra compute. Each micro-batch of samples
whose advantage the mode changed takes one more backward (the solo loss, from the same forward; under torchrun
a forward and backward of its own); mrl_trainer.update sorts the samples on exact equality.

The guard sees the whole peer term of a step, so its trust is per mode (one τ per receiver): with several
peers it turns them down together. τ is checkpointed with the trainer (SharingMode.state); the last direction
is not, so the first step after a resume has no hindsight and leaves τ as it was.
"""
import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from mrl_trainer.distributed import Ranks, local

__all__ = ["GuardConfig", "Guard"]


class GuardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="The no-harm guard: project out the part of the peer term that "
                                            "conflicts with the own gradient, and scale the rest by a trust "
                                            "learned in hindsight (docs/algorithms.md).")
    trust_rate: float = Field(0.1, ge=0, le=1, description="η: how fast the trust τ follows the hindsight "
                                                           "evidence (0: τ stays 1, projection only).")
    projection: Literal["model", "tensor"] = Field(
        "model", description="Where the conflict is measured and removed: over the whole model's gradient "
                             "(model) or each parameter tensor on its own (tensor: a conflict in one layer is "
                             "removed even when the other layers agree).")


class Guard:
    """One receiver's guard: its trust τ, the last step's peer direction, and the combination of its solo and
    mode gradients."""
    stats = {"guard_agreement": "guard: cos(peer term, own gradient)",
             "guard_projected": "guard: share of updates projected",
             "guard_hindsight": "guard: cos(last step's peer term, own gradient)",
             "guard_trust": "guard: trust τ"}
    figures = {"guard": ("guard_agreement", "guard_hindsight", "guard_projected", "guard_trust")}
    cumulative = frozenset()
    summary = {"guard_trust": "mean guard trust τ"}

    def __init__(self, config: GuardConfig):
        self.config, self.trust = config, 1.0
        self.previous: list[torch.Tensor] | None = None      # the last step's Σ τ·d⊥, one tensor per parameter
        self._previous_ss = 0.0                              # ‖previous‖², over all ranks
        self._direction: list[torch.Tensor] | None = None    # this step's, so far

    def combine(self, params: list[torch.Tensor], solo: list[torch.Tensor | None], ranks: Ranks = Ranks()
                ) -> dict[str, float]:
        """p.grad ← g_s + τ·d⊥ in place, where p.grad holds g_m and `solo` g_s (None: 0). The evidence:
        agreement cos(d, g_s) and hindsight cos(last step's peer term, g_s) (nan without one), projected (0 or 1;
        projection: tensor, the share of parameter tensors projected).
        Parameter by parameter, so that no gradient-sized copy of the whole model is made; the inner products
        are float32 chunks summed in float64 (_dot). Under FSDP each rank holds its shards of the gradients:
        the inner products are summed over the ranks."""
        g_s = [local(s) if s is not None else torch.zeros_like(local(p)) for s, p in zip(solo, params)]
        d = [local(p.grad) - g if p.grad is not None else -g for p, g in zip(params, g_s)]
        n = len(params)
        tensor_dots = [_dot([x], [y]) for x, y in zip(d, g_s)] + [_dot([y], [y]) for y in g_s]
        products = tensor_dots + [_dot(d, d)]
        if self.previous is not None:
            products.append(_dot(self.previous, g_s))
        summed = ranks.sum(products)
        dots, sss, (dd, *hind) = summed[:n], summed[n:2 * n], summed[2 * n:]
        dot, ss = sum(dots), sum(sss)
        if self.config.projection == "model":
            coefficients = [dot / ss if dot < 0 and ss > 0 else 0.0] * n
        else:
            coefficients = [x / y if x < 0 and y > 0 else 0.0 for x, y in zip(dots, sss)]
        peer = d                                                   # τ·d⊥, made in place of d
        for p, gp, pp, c in zip(params, g_s, peer, coefficients):
            if c:
                pp.sub_(gp, alpha=c)
            pp.mul_(self.trust)
            if p.grad is None:
                p.grad = gp + pp
            else:
                local(p.grad).copy_(gp).add_(pp)
        if self._direction is None:
            self._direction = peer
        else:
            for total, pp in zip(self._direction, peer):
                total.add_(pp)
        projected = sum(c != 0 for c in coefficients) / max(n, 1)
        return {"agreement": _cos(dot, ss, dd), "projected": projected,
                "hindsight": _cos(hind[0], ss, self._previous_ss) if hind else math.nan}

    def observe(self, evidence: list[dict[str, float]], ranks: Ranks = Ranks()) -> dict[str, float]:
        """End of a step: τ ← (1 − η)τ + η·1[mean hindsight ≥ 0] (no change without hindsight); this step's
        peer direction becomes the next step's `previous`. The step's guard stats (τ as the step used it)."""
        stats = {"guard_trust": self.trust,
                 "guard_projected": sum(e["projected"] for e in evidence) / max(len(evidence), 1)}
        for key in ("agreement", "hindsight"):
            values = [e[key] for e in evidence if not math.isnan(e[key])]
            if values:
                stats[f"guard_{key}"] = sum(values) / len(values)
        if "guard_hindsight" in stats:
            eta = self.config.trust_rate
            self.trust = (1 - eta) * self.trust + eta * float(stats["guard_hindsight"] >= 0)
        if self._direction is not None:
            ss = ranks.sum([_dot(self._direction, self._direction)])[0]
            if ss > 0:
                self.previous, self._previous_ss = self._direction, ss
        self._direction = None
        return stats


def _dot(a: list[torch.Tensor], b: list[torch.Tensor], chunk: int = 1 << 16) -> float:
    """Σ_p ⟨a_p, b_p⟩ over the parameters: BLAS float32 dot products of `chunk` elements, summed in float64.
    Each chunk's rounding error is about √chunk·2⁻²⁴ of its magnitude (≈ 2e-5), far below what the guard's
    decisions (a sign, a cosine) need; converting to float64 instead cost 10× the time (buffers allocated and
    written per chunk) and was most of the guard's cost on a 135M-parameter model."""
    total = 0.0
    for x, y in zip(a, b):
        x, y = x.reshape(-1), y.reshape(-1)
        for i in range(0, x.numel(), chunk):
            total += float(torch.dot(x[i:i + chunk], y[i:i + chunk]))
    return total


def _cos(dot: float, aa: float, bb: float) -> float:
    return dot / math.sqrt(aa * bb) if aa > 0 and bb > 0 else math.nan
