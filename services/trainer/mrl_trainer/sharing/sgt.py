"""SGT — Success-Gated Transfer (outcome level; the Mutual RL paper).

Rescue set: the prompts where policy k's own group failed (own success rate ≤ τ; τ = 0 is "all
failed") and a peer published a success. The receiver re-checks every peer success with ITS OWN
verifier — a peer's claimed reward is never trusted — and keeps at most `per_prompt` accepted
successes per rescued prompt. The loss is GRPO on own samples plus λ·NLL of the rescued
responses in k's own tokens (THL-retokenized):

    L = L_GRPO(own) + λ · (1/N) Σ_{y ∈ S} (1/|y|) Σ_t −log π_θ^k(y_t | x, y_<t)

where S is the accepted rescue set of the step (λ = 0.1 by default) and N, by `normalize`:

    responses   N = |S|: the mean NLL of the rescued responses (the paper). The term weighs λ whether
                one response was rescued or eight.
    prompts     N = P, the step's prompts: the term grows with how much was rescued (λ when every
                prompt of the step had one rescued response, as with per_prompt = 1).

With S empty (every own group had a success, or every peer success failed re-verification)
L = L_GRPO exactly.

With `rationalize: n` (n > 0) S holds the receiver's own words instead of the peer's: the trainer samples n
responses to each rescuable prompt with the peer's verified answer as a hint and keeps those its verifier
accepts on the prompt as posed (mrl_trainer.rationalize; STaR's rationalization).
Stats: sgt_rescued (prompts rescued), sgt_accepted, sgt_rejected (peer successes that failed
re-verification: a poisoned or differently-scored peer), sgt_nll (with rationalize the trainer also logs
sgt_rationalized, sgt_unrationalized and sgt_rationalized_truncated: sharing.Coordination).
"""
from typing import Literal

from pydantic import Field
from torch import Tensor

from mrl.algorithms import masked_seq_mean
from mrl.algorithms.sgt import rescue_nll
from mrl_trainer.experience import StepBatch
from mrl_trainer.section import Section
from mrl_trainer.sharing.base import Extra, PeerBatch, Plan, SharingMode, Verifier

__all__ = ["SGT", "SGTConfig"]


class SGTConfig(Section):
    lam: float = Field(0.1, ge=0, description="λ: weight of the NLL of rescued peer successes.")
    per_prompt: int = Field(1, ge=1, description="Most accepted peer successes used per rescued prompt.")
    tau: float = Field(0.0, ge=0, le=1, description="Gate: rescue a prompt when the own success rate is ≤ τ "
                                                    "(0: only when the whole own group failed).")
    normalize: Literal["responses", "prompts"] = Field(
        "responses", description="The NLL's divisor N: 'responses' = the rescued responses (a mean: λ however "
                                 "many), 'prompts' = the step's prompts (grows with what was rescued).")
    rationalize: int = Field(0, ge=0, le=64, description="Samples the receiver draws per rescuable prompt with the "
                                                         "peer's verified answer as a hint; SGT then trains on "
                                                         "those its verifier accepts, in its own words, not on "
                                                         "the peer's text (STaR's rationalization). 0: the "
                                                         "peer's response as written (the paper).")


class SGT(SharingMode):
    name = "sgt"
    title = "SGT — Success-Gated Transfer"
    kinds = ("success",)
    guard_max_ratio = 1.0   # its peer term is an NLL, whose gradient can dwarf the policy gradient (mrl_trainer.guard)
    Config = SGTConfig
    stats = {"sgt_rescued": "SGT prompts rescued", "sgt_accepted": "SGT peer successes accepted",
             "sgt_rejected": "SGT peer successes rejected", "sgt_nll": "SGT NLL of the rescued responses"}
    figures = {"sgt": ("sgt_rescued", "sgt_accepted", "sgt_rejected")}
    cumulative = frozenset({"sgt_rescued", "sgt_accepted", "sgt_rejected"})
    summary = {"sgt_rescued": "SGT rescues (cum.)", "sgt_rejected": "SGT rejections (cum.)"}

    def rationalizes(self) -> int:
        return self.sharing.sgt.rationalize

    def rescuable(self, batch: StepBatch) -> list[int]:
        """The prompts whose own success rate is ≤ τ: those a peer's success can rescue."""
        tau = self.sharing.sgt.tau
        return [p for p, rewards in enumerate(batch.rewards) if sum(r >= 1.0 for r in rewards) / len(rewards) <= tau]

    def plan(self, batch: StepBatch, peers: PeerBatch, *, capability: float, verify: Verifier) -> Plan:
        plan = super().plan(batch, peers, capability=capability, verify=verify)
        cfg = self.sharing.sgt
        rescued = accepted = rejected = 0
        for p in self.rescuable(batch):
            if not peers.successes.get(p):
                continue
            kept = []
            for success in peers.successes[p]:
                if verify(p, success.text) >= 1.0:
                    accepted += 1
                    if len(kept) < cfg.per_prompt and success.ids:
                        kept.append(Extra(prompt_index=p, ids=success.ids))
                else:
                    rejected += 1
            rescued += bool(kept)
            plan.extras += kept
        divisor = len(plan.extras) if cfg.normalize == "responses" else len(batch.rewards)
        plan.extra_totals = {"nll_divisor": divisor}
        plan.stats.update(sgt_rescued=rescued, sgt_accepted=accepted, sgt_rejected=rejected)
        return plan

    def extra_loss(self, logp, mask, extras, *, update, max_tokens, totals):
        loss = rescue_nll(logp, mask, self.sharing.sgt.lam, totals["nll_divisor"])
        return loss, {"sgt_nll": -masked_seq_mean(logp.detach(), mask)}
