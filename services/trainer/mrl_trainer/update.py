"""One policy update: μ optimizer steps of the sharing mode's loss on a step's own samples and its plan's extras.

    active  = own samples with ids and (β > 0 or A_i ≠ 0)       extras = plan.extras with ids
    own / peer Sequences, split by micro_batches(lengths, loss.micro_batch_tokens)
    old     = π_old log-probs per own micro-batch when updates_per_step > 1 (else logp.detach())
    for m in 0 .. μ−1:
        Σ_micro  sharing.own_loss(logp, old, A[g], mask, ref_logp, max_tokens, totals=plan.totals)    → backward
        Σ_micro  sharing.extra_loss(logp, mask, extras[g], update=m, max_tokens, totals=plan.extra_totals) → backward
        clip_grad_norm_(max_grad_norm); optimizer.step(); zero_grad
    stats   = loss, grad_norm (before clipping), active share, extras, plan.stats, the own_loss statistics
              (weighted by micro-batch size), sharing.summarize(the extras' per-sequence statistics)

With β = 0 a sample whose advantage is 0 adds exactly 0 to the loss and its gradient (the plan's
totals stay whole), so only the others are forwarded: same update, less compute. Every normaliser is
a whole-update total, so the micro-batch losses sum to the full-batch loss and the accumulated
gradient equals the full-batch gradient.

The model enters only through `logprobs(prompts, completions) -> (logp, mask)` (and the same for the
frozen reference): the trainer passes its transformers model's (logprobs.completion_logprobs), the
bandit testbed (mrl lab bandit) its tiny policy's, so both run this one update.
"""
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mrl_trainer.errors import TrainerError
from mrl_trainer.experience import StepBatch
from mrl_trainer.sharing import Plan, SharingMode

__all__ = ["Sequences", "micro_batches", "update", "gradient", "LogProbs"]

LogProbs = Callable[[list[list[int]], list[list[int]]], tuple[torch.Tensor, torch.Tensor]]


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive index groups whose padded size (count × longest) stays within `budget` tokens."""
    groups, current, longest = [], [], 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > budget:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    return groups + ([current] if current else [])


@dataclass
class Sequences:
    """Prompt and completion token ids of the sequences one update forwards (own samples or extras)."""
    prompts: list[list[int]]
    completions: list[list[int]]

    def lengths(self) -> list[int]:
        return [len(p) + len(c) for p, c in zip(self.prompts, self.completions)]

    def take(self, indices: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        return [self.prompts[i] for i in indices], [self.completions[i] for i in indices]


@dataclass
class _Work:
    """What one update forwards: the active own samples and their advantages, the extras, their micro-batches."""
    n_samples: int
    active: list[int]
    advantages: torch.Tensor
    own: Sequences
    extras: list
    peer: Sequences
    own_groups: list[list[int]]
    extra_groups: list[list[int]]


def _work(batch: StepBatch, plan: Plan, loss_cfg) -> _Work:
    flat = [s for group in batch.samples for s in group]
    own_prompts = [group[0].prompt_ids for group in batch.samples]
    active = [i for i, s in enumerate(flat) if s.ids and (loss_cfg.beta > 0 or plan.advantages[i] != 0)]
    extras = [e for e in plan.extras if e.ids]
    own = Sequences([flat[i].prompt_ids for i in active], [flat[i].ids for i in active])
    peer = Sequences([own_prompts[e.prompt_index] for e in extras], [e.ids for e in extras])
    budget = loss_cfg.micro_batch_tokens
    return _Work(len(flat), active, plan.advantages[active], own, extras, peer,
                 micro_batches(own.lengths(), budget), micro_batches(peer.lengths(), budget))


def _backward(loss: torch.Tensor, step: int) -> float:
    if not torch.isfinite(loss):
        raise TrainerError(f"non-finite loss ({loss.item()}) at step {step}: no update was "
                           f"applied; lower loss.lr or check the rewards and the model's dtype")
    loss.backward()
    return loss.item()


def _accumulate(logprobs: LogProbs, sharing: SharingMode, plan: Plan, work: _Work, old, m: int, *, max_tokens: int,
                reference: LogProbs | None, step: int):
    """One pass over every micro-batch (backward on each): the loss, own-loss statistics, extras' statistics."""
    loss_total, sums, per_sequence = 0.0, {}, {}
    for k, g in enumerate(work.own_groups):
        prompts, completions = work.own.take(g)
        logp, mask = logprobs(prompts, completions)
        ref = None
        if reference is not None:
            with torch.no_grad():
                ref = reference(prompts, completions)[0]
        loss, stats = sharing.own_loss(logp, logp.detach() if old is None else old[k],
                                       work.advantages[g].to(logp.device), mask, ref_logp=ref,
                                       max_tokens=max_tokens, totals=plan.totals)
        loss_total += _backward(loss, step)
        for name, value in stats.items():
            sums[name] = sums.get(name, 0.0) + value * len(g) / len(work.active)
    for g in work.extra_groups:
        logp, mask = logprobs(*work.peer.take(g))
        loss, stats = sharing.extra_loss(logp, mask, [work.extras[i] for i in g], update=m, max_tokens=max_tokens,
                                         totals=plan.extra_totals)
        loss_total += _backward(loss, step)
        for name, values in stats.items():
            per_sequence.setdefault(name, []).append(values.detach().cpu())
    return loss_total, sums, per_sequence


def update(logprobs: LogProbs, params: list[torch.Tensor], optimizer, sharing: SharingMode, loss_cfg,
           batch: StepBatch, plan: Plan, *, max_tokens: int, reference: LogProbs | None = None) -> dict[str, float]:
    """μ = loss_cfg.updates_per_step optimizer updates on the batch and the plan's extras; the step's statistics
    (the last update's). {"skipped": 1, ...} and no update when nothing has a gradient."""
    work = _work(batch, plan, loss_cfg)
    if not work.active and not work.extras:
        return {"skipped": 1.0, "extras": 0, **plan.stats}
    old = None
    if loss_cfg.updates_per_step > 1:
        with torch.no_grad():
            old = [logprobs(*work.own.take(g))[0] for g in work.own_groups]
    for m in range(loss_cfg.updates_per_step):
        loss_total, sums, per_sequence = _accumulate(logprobs, sharing, plan, work, old, m, max_tokens=max_tokens,
                                                     reference=reference, step=batch.step)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, loss_cfg.max_grad_norm)
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise TrainerError(f"non-finite gradient norm at step {batch.step}: no update was applied")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if per_sequence:
        sums.update(sharing.summarize({k: torch.cat(v) for k, v in per_sequence.items()}))
    return {"loss": loss_total, "grad_norm": float(grad_norm), "active": len(work.active) / work.n_samples,
            "extras": len(work.extras), **plan.stats, **sums}


def gradient(logprobs: LogProbs, params: list[torch.Tensor], sharing: SharingMode, loss_cfg, batch: StepBatch,
             plan: Plan, *, max_tokens: int, reference: LogProbs | None = None) -> torch.Tensor:
    """ĝ = ∇_θ of the update's first pass (m = 0), before clipping, flattened (float64); zeros when nothing
    is forwarded. No optimizer step; the parameters' gradients are cleared before and after."""
    work = _work(batch, plan, loss_cfg)
    for p in params:
        p.grad = None
    if work.active or work.extras:
        _accumulate(logprobs, sharing, plan, work, None, 0, max_tokens=max_tokens, reference=reference,
                    step=batch.step)
    out = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params])
    for p in params:
        p.grad = None
    return out
