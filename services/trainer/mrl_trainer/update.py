"""One policy update: μ passes over a step's loss terms, each pass in k mini-batches, one optimizer step per
mini-batch (μ·k steps; m = 0 … μ·k − 1 counts them, for HACPO's stepwise clip).

    own, peer = sharing.terms(batch, plan)          mrl_trainer.terms: with a guard, own = the solo loss's terms
                                                    and peer = what the mode adds to them; without, own + peer is
                                                    the mode's loss
    old       = π_old log-probs of every own sample, before the first optimizer step, when μ·k > 1
                (else logp.detach(): on-policy, no extra forward)
    for epoch in 0 .. μ−1, for mini-batch b in 0 .. k−1 (the step's prompts in k contiguous parts):
        unguarded:  grad = ∇ w_b · Σ_{own + peer terms} Σ_micro loss
        guarded:    g_s  = ∇ w_b · Σ_{own terms} Σ_micro loss,   d = ∇ w_b · Σ_{peer terms} Σ_micro loss
                    grad = guard.combine(d, g_s)                  mrl_trainer.guard: g_s + w·d⊥
        clip_grad_norm_(max_grad_norm); optimizer.step(); zero_grad; m += 1

Every normaliser is a whole-step total, so the mini-batch losses L_b of one pass sum to the whole-step loss L;
mini-batch b, holding P_b of the step's P prompts, steps on w_b·L_b with w_b = P / P_b, so k changes how many
optimizer steps a step makes, not their scale. Each term's sequences of a mini-batch are forwarded in
micro-batches of at most loss.micro_batch_tokens padded tokens; their losses sum to the mini-batch's and their
gradients accumulate to its gradient. A mini-batch with nothing to forward takes no optimizer step (AdamW would
move the weights by its momentum and weight decay); guarded, neither does one where solo forwards nothing and
nothing of d passed, so that at τ = 0 a guarded mode steps exactly as solo.

Statistics (the last pass's): loss, grad_norm, active (the share of own samples forwarded), extras, updates, the
plan's, the own loss's (clip fractions, ratio, KL: under a guard the solo loss's, the one g_s comes from), the extras'
(SharingMode.summarize), the guard's, and seconds per part (TIMINGS).

Under torchrun (`ranks`, mrl_trainer.distributed) every rank runs this on the whole batch and plan but forwards
only its deal of each micro-batch; the ranks' gradients sum to the single process's.

The model enters only through `logprobs(prompts, completions) -> (logp, mask)` (and the same for the frozen
reference): the trainer passes its transformers model's (logprobs.completion_logprobs), the bandit testbed its
tiny policy's, so both run this one update.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from mrl_trainer.distributed import Ranks, full, local
from mrl_trainer.errors import TrainerError
from mrl_trainer.experience import StepBatch
from mrl_trainer.terms import Term

if TYPE_CHECKING:
    from mrl_trainer.sharing import Plan, SharingMode

__all__ = ["micro_batches", "update", "gradient", "LogProbs", "TIMINGS"]

LogProbs = Callable[[list[list[int]], list[list[int]]], tuple[torch.Tensor, torch.Tensor]]
PARTS = ("own", "peer", "guard", "optimizer")
TIMINGS = tuple(f"update_{part}_s" for part in PARTS)   # seconds per part: the own and peer terms' forwards and
                                                       # backwards (π_old with own), the guard, the optimizer


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


class _Clock:
    """Seconds per part of an update (PARTS); on a GPU each lap first waits for the device's queued work."""

    def __init__(self, device: torch.device):
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._wait = torch.cuda.synchronize if device.type == "cuda" else None
        self._last = time.perf_counter()

    def lap(self, part: str) -> None:
        if self._wait is not None:
            self._wait()
        now = time.perf_counter()
        self.seconds[part] += now - self._last
        self._last = now


class _Pass:
    """The forwards and backwards of one update: the micro-batches of each term's part of a mini-batch, π_old, the
    statistics of the last pass."""

    def __init__(self, logprobs: LogProbs, reference: LogProbs | None, budget: int, step: int, ranks: Ranks,
                 clock: _Clock):
        self.logprobs, self.reference, self.budget, self.step = logprobs, reference, budget, step
        self.ranks, self.clock = ranks, clock
        self.old: dict[int, torch.Tensor] | None = None      # own sample key → π_old log-probs (1-d)
        self.loss, self.means, self.sizes, self.per_sequence = 0.0, {}, {}, {}

    def groups(self, term: Term, part: range) -> list[tuple[list[int], float]]:
        """This rank's deal of each micro-batch of the term's sequences in prompts `part`, and its weight N (a
        rank dealt nothing forwards the micro-batch's first sequence with weight 0, so that FSDP's collectives
        stay in step)."""
        members = [i for i, p in enumerate(term.prompt_of) if p in part]
        lengths = term.lengths()
        out = []
        for group in micro_batches([lengths[i] for i in members], self.budget):
            whole = [members[j] for j in group]
            mine = self.ranks.deal(whole)
            out.append((mine, float(self.ranks.world)) if mine else (whole[:1], 0.0))
        return out

    def keep_old(self, terms: list[Term], parts: list[range]) -> None:
        """π_old of every own sample this rank forwards, before the first optimizer step (every rank forwards
        the same micro-batches: FSDP's collectives stay in step)."""
        self.old = {}
        with torch.no_grad():
            for part in parts:
                for term in terms:
                    for indices, _ in self.groups(term, part):
                        logp, mask = self.logprobs(*_take(term, indices))
                        for i, row, n in zip(indices, logp, mask.sum(-1).long().tolist()):
                            self.old.setdefault(term.keys[i], row[:n].clone())

    def backward(self, terms: list[Term], part: range, m: int, scale: float) -> bool:
        """Backward of scale × each micro-batch loss of the terms' sequences in prompts `part`, the gradient
        accumulating in p.grad; whether anything was forwarded."""
        forwarded = False
        for term in terms:
            for indices, weight in self.groups(term, part):
                forwarded = True
                prompts, completions = _take(term, indices)
                logp, mask = self.logprobs(prompts, completions)
                old = ref = None
                if term.own:
                    old = logp.detach() if self.old is None else _padded(
                        [self.old[term.keys[i]] for i in indices], logp)
                    if self.reference is not None:
                        with torch.no_grad():
                            ref = self.reference(prompts, completions)[0]
                loss, stats = term.loss(logp, mask, indices, m, old, ref)
                value = loss.item()
                if not math.isfinite(value):
                    raise TrainerError(f"non-finite loss ({value}) at step {self.step}: no update was "
                                       f"applied; lower loss.lr or check the rewards and the model's dtype")
                (loss * scale * weight).backward()         # weight 0 too: FSDP's collectives stay in step
                if weight:
                    self.loss += value
                    self._note(term, stats, len(indices))
                self.clock.lap(term.part)
        return forwarded

    def _note(self, term: Term, stats: dict, n: int) -> None:
        if term.stats == "mean":
            for name, value in stats.items():
                self.means[name] = self.means.get(name, 0.0) + value * n
                self.sizes[name] = self.sizes.get(name, 0) + n
        elif term.stats == "per_sequence":
            for name, values in stats.items():
                self.per_sequence.setdefault(name, []).append(values.detach().cpu())

    def restart(self) -> None:
        """A new pass: its statistics replace the last one's."""
        self.loss, self.means, self.sizes, self.per_sequence = 0.0, {}, {}, {}


def _take(term: Term, indices: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    return [term.prompts[i] for i in indices], [term.completions[i] for i in indices]


def _padded(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """1-d rows right-padded with 0 to `like`'s shape (n, T)."""
    out = torch.zeros_like(like)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def _take_gradient(params: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """The gradient accumulated so far (this rank's shards), moved out of the parameters."""
    taken = [None if p.grad is None else local(p.grad) for p in params]
    for p in params:
        p.grad = None
    return taken


def _parts(n_prompts: int, mini_batches: int) -> list[range]:
    k = min(mini_batches, max(n_prompts, 1))
    return [range(b * n_prompts // k, (b + 1) * n_prompts // k) for b in range(k)]


def update(logprobs: LogProbs, params: list[torch.Tensor], optimizer, sharing: SharingMode, loss_cfg,
           batch: StepBatch, plan: Plan, *, max_tokens: int, reference: LogProbs | None = None,
           ranks: Ranks = Ranks()) -> dict[str, float]:
    """μ = loss_cfg.updates_per_step passes of k = loss_cfg.mini_batches optimizer steps on the step's loss
    terms, each through the mode's guard when it has one; the step's statistics (the last pass's). {"skipped": 1,
    ...} and no update when nothing has a gradient. Under several `ranks` (every rank calls it with the whole batch
    and plan) each forwards its deal, and the statistics are the whole step's."""
    guard = sharing.guard
    own, peer = sharing.terms(batch, plan, max_tokens=max_tokens)
    if not any(len(t) for t in own + peer):
        return {"skipped": 1.0, "extras": 0, **plan.stats}
    clock = _Clock(params[0].device)
    work = _Pass(logprobs, reference, loss_cfg.micro_batch_tokens, batch.step, ranks, clock)
    n_prompts = len(batch.samples)
    parts = _parts(n_prompts, loss_cfg.mini_batches)
    if loss_cfg.updates_per_step * len(parts) > 1:
        work.keep_old([t for t in own + peer if t.own], parts)
        clock.lap("own")
    m, evidence, grad_norm = 0, [], None
    for _ in range(loss_cfg.updates_per_step):
        work.restart()
        for part in parts:
            scale = n_prompts / max(len(part), 1)
            if guard is None:
                if not work.backward(own + peer, part, m, scale):
                    continue
            else:
                solo_forwarded = work.backward(own, part, m, scale)
                solo = _take_gradient(params)
                if not work.backward(peer, part, m, scale) and not solo_forwarded:
                    continue                                        # nothing here: no step, no evidence
                evidence.append(guard.combine(params, solo, ranks))
                clock.lap("guard")
                if not solo_forwarded and evidence[-1]["idle"]:     # solo takes no step here: neither does this
                    optimizer.zero_grad(set_to_none=True)
                    continue
            grad_norm = full(torch.nn.utils.clip_grad_norm_(params, loss_cfg.max_grad_norm))
            if not torch.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                raise TrainerError(f"non-finite gradient norm at step {batch.step}: no update was applied")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            m += 1
            clock.lap("optimizer")
    stats = _gathered(work, ranks)
    if work.per_sequence:
        stats.update(sharing.summarize({name: torch.cat(v) for name, v in work.per_sequence.items()}))
    if guard is not None:
        stats.update(guard.observe(evidence, ranks))
    stepped = {"grad_norm": float(grad_norm)} if m else {"skipped": 1.0}
    forwarded = {key for t in own + peer if t.own for key in t.keys}        # own samples either loss forwards
    active = len(forwarded) / max(sum(len(g) for g in batch.samples), 1)
    return {**stats, **stepped, "active": active, "extras": len(plan.extras), "updates": m, **plan.stats,
            **dict(zip(TIMINGS, clock.seconds.values()))}


def _gathered(work: _Pass, ranks: Ranks) -> dict[str, float]:
    """The last pass's loss and mean statistics over the ranks (their per-sequence statistics joined into
    work.per_sequence)."""
    parts = ranks.gather([(work.loss, work.means, work.sizes, work.per_sequence)]) if ranks.world > 1 else \
        [(work.loss, work.means, work.sizes, work.per_sequence)]
    loss, means, sizes, per_sequence = 0.0, {}, {}, {}
    for part_loss, part_means, part_sizes, part_sequences in parts:
        loss += part_loss
        for name, value in part_means.items():
            means[name] = means.get(name, 0.0) + value
            sizes[name] = sizes.get(name, 0) + part_sizes[name]
        for name, values in part_sequences.items():
            per_sequence.setdefault(name, []).extend(values)
    work.per_sequence = per_sequence
    return {"loss": loss, **{name: value / sizes[name] for name, value in means.items() if sizes[name]}}


def gradient(logprobs: LogProbs, params: list[torch.Tensor], sharing: SharingMode, loss_cfg, batch: StepBatch,
             plan: Plan, *, max_tokens: int, reference: LogProbs | None = None) -> torch.Tensor:
    """ĝ = the direction the update steps on for the whole-step loss (one mini-batch, m = 0; through the mode's
    guard at its current trust, not learning from it), before clipping, flattened (float64); zeros when nothing is
    forwarded. The parameters' gradients are cleared before and after."""
    own, peer = sharing.terms(batch, plan, max_tokens=max_tokens)
    for p in params:
        p.grad = None
    work = _Pass(logprobs, reference, loss_cfg.micro_batch_tokens, batch.step, Ranks(), _Clock(params[0].device))
    everything = range(len(batch.samples))
    if sharing.guard is None:
        work.backward(own + peer, everything, 0, 1.0)
    else:
        work.backward(own, everything, 0, 1.0)
        solo = _take_gradient(params)
        work.backward(peer, everything, 0, 1.0)
        sharing.guard.combine(params, solo, gather=False)
    out = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params])
    for p in params:
        p.grad = None
    return out
