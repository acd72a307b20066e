"""One policy update: μ passes over a step's own samples and its plan's extras, each pass in k mini-batches,
one optimizer step per mini-batch (μ·k steps; m = 0 … μ·k − 1 counts them, for HACPO's stepwise clip).

    active  = own samples with ids and (β > 0 or A_i ≠ 0 or, with a guard, A_solo,i ≠ 0)
    extras  = plan.extras with ids
    mini-batches: the step's prompts in k = loss.mini_batches contiguous parts; mini-batch b holds the active
              own samples and the extras of its prompts, split by micro_batches(lengths, loss.micro_batch_tokens)
    old     = π_old log-probs of every own micro-batch, before the first optimizer step, when μ·k > 1
              (else logp.detach(): on-policy, no extra forward)
    g_r     = with a guard memory: ∇ of the NLL of the own successes the guard recalls (the batch's own
              successes remembered first), a forward and backward of its own, before the first optimizer step
    for epoch in 0 .. μ−1, for b in 0 .. k−1 (a mini-batch with nothing to forward is skipped):
        w_b · Σ_micro  sharing.own_loss(logp, old, A[g], mask, ref_logp, max_tokens, totals=plan.totals) → backward
        guard:  g_s = ∇ w_b · Σ_micro  sharing.solo_loss(…, A_solo[g], …, totals=the solo totals), the solo loss
                (A_solo: own-group advantages; the trainer's loss, as `none` trains on it). Where the mode's own
                loss is solo's (all but HACPO, whose own loss is GSPO), a sample whose advantage the plan left as
                solo's (A_i = A_solo,i exactly) has the same per-token loss in both; only the normaliser D
                differs, so its part of g_s is c = D / D_solo times its part of the gradient
                (losses.normaliser): the mini-batch's unchanged samples are forwarded first, in micro-batches
                of their own, and g_s starts as c × the gradient they accumulated (a copy; when no sample
                changed and c = 1, that gradient itself, moved out of the parameters, so that the extras'
                backward leaves d alone there); each micro-batch of changed samples adds one more backward of
                the solo loss from the same forward (retain_graph; under FSDP, whose sharded parameters take
                gradients only from backward passes, the changed micro-batches' solo loss takes a forward and
                backward of its own)
        w_b · Σ_micro  sharing.extra_loss(logp, mask, extras[g], update=m, max_tokens, totals=plan.extra_totals)
                (a mode that `screens` — HACPO, whose clipped peer samples have no gradient — has its extras
                forwarded without autograd before the own samples, for the loss's value and the statistics;
                only those that sharing.live finds with a gradient are forwarded here, with autograd, in
                micro-batches of their own. Before the own backward, since FSDP2 keeps its root module
                unsharded after a forward until a backward: after the optimizer step it would be stale)
        guard:  grad ← guard.combine(g_m = grad (or d), g_s, g_r)   (mrl_trainer.guard; a mode whose own loss is
                not solo's also takes g_o, ∇ of its own loss at solo advantages, one more backward, and its own
                guard judges g_o − g_s apart from the peers' g_m − g_o: _combine); a mini-batch with no
                sample the solo loss forwards (solo skips it) whose peer term did not pass (τ = 0, or the size
                cap) takes no optimizer step: AdamW would move the weights by its momentum and weight decay
                where solo's leaves them, so at τ = 0 a guarded mode steps exactly as solo
        clip_grad_norm_(max_grad_norm); optimizer.step(); zero_grad; m += 1
    stats   = loss (the last pass, Σ over its mini-batches without the factor k), grad_norm (the last step's,
              before clipping), active share, extras, updates (μ·k minus skipped), plan.stats, the own_loss
              statistics (weighted by micro-batch size) and sharing.summarize(the extras' per-sequence
              statistics), both over the last pass; guard.observe(every optimizer step's evidence); and the
              seconds each part of the update took, over all passes (_Clock.PARTS, as update_<part>_s)

Every normaliser in a plan is a whole-step total, so the mini-batch losses L_b of one pass sum to the
whole-step loss L; mini-batch b, holding P_b of the step's P prompts, steps on w_b·L_b with w_b = P / P_b,
the whole-step loss estimated from its prompts (k·L_b for equal parts; the batch's prompts come in random
order), so k changes how many optimizer steps a step makes, not their scale. With k = 1 this is the plain
full-batch update.

With β = 0 a sample whose advantage is 0 adds exactly 0 to the loss and its gradient (the plan's
totals stay whole), so only the others are forwarded: same update, less compute. Screening does the same for
extras whose term is constant at the current parameters: the loss is a sum of per-sequence terms over
whole-step normalisers, so the live extras' terms carry all of its gradient (up to float rounding of a ratio
on the clip's edge, which the two forwards may put on different sides). One departure: a mini-batch whose
every term is constant steps the optimizer with no gradient (AdamW leaves the weights alone) where the plain
update steps it with a zero one (AdamW moves them by its momentum). The micro-batch losses
sum to the mini-batch loss and the accumulated gradient equals the mini-batch gradient.

Under torchrun (`ranks`, mrl_trainer.distributed) every rank runs this on the whole batch and plan but forwards
only its deal of each micro-batch; the ranks' gradients sum to the single process's.

The model enters only through `logprobs(prompts, completions) -> (logp, mask)` (and the same for the
frozen reference): the trainer passes its transformers model's (logprobs.completion_logprobs), the
bandit testbed (mrl lab bandit) its tiny policy's, so both run this one update.
"""
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mrl_trainer.distributed import Ranks, full, gradient_of, local
from mrl_trainer.errors import TrainerError
from mrl_trainer.experience import StepBatch
from mrl_trainer.losses import masked_seq_mean, normaliser
from mrl_trainer.sharing import Plan, SharingMode
from mrl_trainer.sharing.base import solo_advantages

__all__ = ["Sequences", "micro_batches", "update", "gradient", "LogProbs", "TIMINGS"]

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


def _grouped(members: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """`members` (indices into `lengths`) in micro-batches of at most `budget` padded tokens."""
    return [[members[j] for j in g] for g in micro_batches([lengths[i] for i in members], budget)]


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
    """What one update forwards: the active own samples and their advantages, the extras, and per mini-batch
    their micro-batches (index groups into own / peer)."""
    n_samples: int
    active: list[int]
    advantages: torch.Tensor
    own: Sequences
    extras: list
    peer: Sequences
    own_groups: list[list[list[int]]]       # [mini-batch][micro-batch] → indices into own
    extra_groups: list[list[list[int]]]     # [mini-batch][micro-batch] → indices into peer
    weights: list[float]                    # [mini-batch] → w_b = P / P_b
    solo_advantages: torch.Tensor | None    # the guard's: own-group advantages of the active samples
    solo_totals: dict | None                # and the solo loss's normalisers
    solo_scale: float                       # c = D / D_solo: the solo loss of a sample the plan left alone is
                                            # c × its own loss (losses.normaliser of the two totals); 1 where
                                            # the mode's own loss is not solo's (no sample is left alone)
    changed_from: list[int]                 # [mini-batch] → its first micro-batch of samples whose advantage
                                            # the plan changed (the ones before hold only unchanged samples)
    budget: int                             # loss.micro_batch_tokens: the most padded tokens per micro-batch
    solo_idle: list[bool]                   # [mini-batch] → it holds no sample solo's loss forwards (the guard's)

    def has_peer_term(self) -> bool:
        """Whether the mode's update can differ from solo's: extras, changed advantages or normalisers, or an
        own-sample loss of its own (then every own micro-batch counts as changed)."""
        return bool(self.extras) or self.solo_scale != 1.0 or \
            any(first < len(groups) for first, groups in zip(self.changed_from, self.own_groups))


class _Clock:
    """Seconds per part of an update: lap(part) charges the time since the previous lap to `part`. On a GPU
    each lap first waits for the work queued on the device (torch.cuda.synchronize), so a part is charged
    for its own kernels, not for the ones before it.

        own       π_old log-probs (μ·k > 1) and the own loss's forwards and backwards
        solo      the guard's g_s: the scaled copies and the solo loss's second backwards (FSDP: its passes)
        extras    the plan's extras' forwards and backwards
        memory    the guard's g_r (the recalled successes' forward and backward)
        guard     guard.combine
        optimizer gradient clipping and the optimizer's step"""
    PARTS = ("own", "solo", "extras", "memory", "guard", "optimizer")

    def __init__(self, device: torch.device = torch.device("cpu")):
        self.seconds = dict.fromkeys(self.PARTS, 0.0)
        self._wait = torch.cuda.synchronize if device.type == "cuda" else None
        self._last = time.perf_counter()

    def lap(self, part: str) -> None:
        if self._wait is not None:
            self._wait()
        now = time.perf_counter()
        self.seconds[part] += now - self._last
        self._last = now

    def stats(self) -> dict[str, float]:
        return dict(zip(TIMINGS, self.seconds.values()))


TIMINGS = tuple(f"update_{part}_s" for part in _Clock.PARTS)   # the update's statistics that are seconds


def _split(indices: list[int], prompt_of: list[int], parts: list[range]) -> list[list[int]]:
    """`indices` by the part of the prompts each one's prompt falls in."""
    return [[i for i in indices if prompt_of[i] in part] for part in parts]


def _work(batch: StepBatch, plan: Plan, loss_cfg, mini_batches: int = 1, sharing: SharingMode | None = None) -> _Work:
    """With `sharing` (its guard on), the solo loss's advantages and normalisers too, the own samples that
    either loss needs, and each mini-batch's own samples in two runs of micro-batches: first those whose
    advantage the plan left as solo's (exactly), then those it changed (all of them, when the mode's own loss is
    not solo's: sharing.own_loss_is_solo)."""
    flat = [s for group in batch.samples for s in group]
    flat_prompt = [p for p, group in enumerate(batch.samples) for _ in group]
    own_prompts = [group[0].prompt_ids for group in batch.samples]
    solo = solo_advantages(batch, loss_cfg) if sharing is not None else torch.zeros_like(plan.advantages)
    active = [i for i, s in enumerate(flat)
              if s.ids and (loss_cfg.beta > 0 or plan.advantages[i] != 0 or solo[i] != 0)]
    extras = [e for e in plan.extras if e.ids]
    own = Sequences([flat[i].prompt_ids for i in active], [flat[i].ids for i in active])
    peer = Sequences([own_prompts[e.prompt_index] for e in extras], [e.ids for e in extras])
    n_prompts, k = len(batch.samples), min(mini_batches, max(len(batch.samples), 1))
    parts = [range(b * n_prompts // k, (b + 1) * n_prompts // k) for b in range(k)]
    own_lengths, peer_lengths = own.lengths(), peer.lengths()
    budget = loss_cfg.micro_batch_tokens
    own_parts = _split(list(range(len(active))), [flat_prompt[i] for i in active], parts)
    peer_parts = _split(list(range(len(extras))), [e.prompt_index for e in extras], parts)
    advantages, solo = plan.advantages[active], solo[active]
    own_groups, changed_from, scale, solo_totals = [], [], 1.0, None
    if sharing is None:
        own_groups = [_grouped(part, own_lengths, budget) for part in own_parts]
    else:
        solo_totals, unchanged = sharing.own_totals(batch), [False] * len(active)
        if sharing.own_loss_is_solo:    # else (HACPO's GSPO) no sample's own loss is its solo loss
            scale = float(normaliser(loss_cfg.aggregation, **plan.totals, max_tokens=1)    # Dr.GRPO's T_max cancels
                          / normaliser(loss_cfg.aggregation, **solo_totals, max_tokens=1))
            if advantages.dtype == solo.dtype:
                unchanged = (advantages == solo).tolist()
        for part in own_parts:
            kept = _grouped([i for i in part if unchanged[i]], own_lengths, budget)
            own_groups.append(kept + _grouped([i for i in part if not unchanged[i]], own_lengths, budget))
            changed_from.append(len(kept))
    solo_idle = [not any(loss_cfg.beta > 0 or solo[i] != 0 for i in part) for part in own_parts]
    return _Work(len(flat), active, advantages, own, extras, peer, own_groups,
                 [_grouped(part, peer_lengths, budget) for part in peer_parts],
                 [n_prompts / max(len(part), 1) for part in parts],
                 solo if sharing is not None else None, solo_totals, scale, changed_from, budget, solo_idle)


def _finite(loss: torch.Tensor, step: int) -> float:
    """The loss's value; a TrainerError when it is not finite."""
    value = loss.item()
    if not math.isfinite(value):
        raise TrainerError(f"non-finite loss ({value}) at step {step}: no update was "
                           f"applied; lower loss.lr or check the rewards and the model's dtype")
    return value


def _backward(loss: torch.Tensor, scale: float, step: int, retain_graph: bool = False) -> float:
    """Backward on scale × loss; the loss, or 0 for a loss of weight 0 (a rank's idle forward)."""
    value = _finite(loss, step)
    (loss * scale if scale != 1.0 else loss).backward(retain_graph=retain_graph)
    return value if scale else 0.0


def _own_forward(logprobs: LogProbs, work: _Work, g: list[int], old, reference: LogProbs | None):
    """(logp, π_old log-probs, mask, reference log-probs or None) of own samples g."""
    prompts, completions = work.own.take(g)
    logp, mask = logprobs(prompts, completions)
    ref = None
    if reference is not None:
        with torch.no_grad():
            ref = reference(prompts, completions)[0]
    return logp, logp.detach() if old is None else old[tuple(g)], mask, ref


def _solo_loss(sharing: SharingMode, work: _Work, g: list[int], logp, old_logp, mask, ref, max_tokens: int,
               own: bool = False):
    """The guard's solo loss of own samples g: own-group advantages, the solo normalisers, solo's loss (`own`: the
    mode's own loss at them, whose gradient is the own guard's g_o)."""
    loss = sharing.own_loss if own else sharing.solo_loss
    return loss(logp, old_logp, work.solo_advantages[g].to(logp.device), mask, ref_logp=ref, max_tokens=max_tokens,
                totals=work.solo_totals)[0]


def _accumulate(logprobs: LogProbs, sharing: SharingMode, plan: Plan, work: _Work, b: int, old, m: int, *,
                max_tokens: int, reference: LogProbs | None, step: int, sums: dict, per_sequence: dict,
                clock: _Clock, scale: float = 1.0, solo: list | None = None, changed: list | None = None,
                own: list | None = None, own_changed: list | None = None, params: list | None = None,
                ranks: Ranks = Ranks()) -> tuple[float, bool]:
    """One pass over mini-batch b's micro-batches (backward on scale × each loss): its loss (unscaled), and whether
    the parameters' gradients then hold the peer term d alone (see below). Adds the
    own-loss statistics (weighted by their share of all active samples) to `sums` and the extras' per-sequence
    statistics to `per_sequence`. With `solo` (the guard's buffers, one per param, None), also puts in it g_s, ∇
    of scale × the solo loss (own-group advantages, solo normalisers):

        g_s = c · Σ_{unchanged micro-batches} g_own  +  Σ_{changed micro-batches} ∇ solo loss

    the first term a scaled copy of the gradient accumulated over the unchanged micro-batches (this rank's
    shards), taken when they are done (work.solo_scale: where the mode's own loss is solo's, a sample whose
    advantage the plan left alone has the same per-token loss in both, only the normaliser differs; HACPO has no
    unchanged micro-batch); the second `changed` when given (under FSDP:
    _sharded_solo), else, per changed micro-batch, a second backward (autograd.grad) of the solo loss from the
    same forward. Where nothing changed and c = 1 (SGT, whose peer term is only its rescues' NLL; a mini-batch no
    peer reached), g_s is the own gradient itself: it is moved out of the parameters, not copied, so the extras'
    backward leaves d = g_m − g_s alone in their gradients (returned True; Guard.combine's peer_only). With `own`
    (the own guard's buffers: a mode whose own loss is not solo's, every micro-batch changed) it puts g_o in it
    likewise, ∇ of scale × the mode's own loss at solo advantages and normalisers: `own_changed` when given (FSDP),
    else a third backward from the same forward. Under several ranks each forwards its deal of every micro-batch
    (_dealt), scaled by N to undo FSDP's average, and adds its share."""
    groups, first_changed = work.own_groups[b], work.changed_from[b] if solo is not None else 0
    terms = dict(m=m, max_tokens=max_tokens, step=step, scale=scale, ranks=ranks, clock=clock)
    extra_groups, loss_total = work.extra_groups[b], 0.0
    if sharing.screens:     # before the own backward: FSDP2 leaves its root unsharded after a forward without one
        live = []
        with torch.no_grad():
            loss_total += _extra_terms(logprobs, sharing, plan, work, extra_groups, **terms,
                                       per_sequence=per_sequence, live=live)
        extra_groups = _grouped(sorted(set(ranks.gather(live))), work.peer.lengths(), work.budget)
    second = solo is not None and changed is None
    if second:
        changed = [None] * len(params)
        own_changed = None if own is None else [None] * len(params)
    for j, whole in enumerate(groups):
        if solo is not None and j == first_changed:
            _take_scaled(solo, params, work.solo_scale)
            clock.lap("solo")
        retain = second and j >= first_changed
        g, weight = _dealt(whole, ranks, scale)
        logp, old_logp, mask, ref = _own_forward(logprobs, work, g, old, reference)
        loss, stats = sharing.own_loss(logp, old_logp, work.advantages[g].to(logp.device), mask, ref_logp=ref,
                                       max_tokens=max_tokens, totals=plan.totals)
        loss_total += _backward(loss, weight, step, retain_graph=retain)
        for name, value in stats.items():
            sums[name] = sums.get(name, 0.0) + value * len(g) / len(work.active) * bool(weight)
        clock.lap("own")
        if retain:
            solo_loss = _solo_loss(sharing, work, g, logp, old_logp, mask, ref, max_tokens)
            _add(changed, torch.autograd.grad(solo_loss * weight, params, allow_unused=True,
                                              retain_graph=own is not None))
            if own is not None:
                own_loss = _solo_loss(sharing, work, g, logp, old_logp, mask, ref, max_tokens, own=True)
                _add(own_changed, torch.autograd.grad(own_loss * weight, params, allow_unused=True))
            clock.lap("solo")
    peer_only = solo is not None and first_changed >= len(groups) and work.solo_scale == 1.0
    if solo is not None:
        if peer_only:
            solo[:] = _take_and_clear(params, copy=False)
        else:
            if first_changed >= len(groups):
                _take_scaled(solo, params, work.solo_scale)
            _add(solo, changed)
        if own is not None:
            _add(own, own_changed)
        clock.lap("solo")
    if sharing.screens:     # the live extras' gradient; their loss and statistics came from the screening pass
        _extra_terms(logprobs, sharing, plan, work, extra_groups, **terms)
        return loss_total, peer_only
    return loss_total + _extra_terms(logprobs, sharing, plan, work, extra_groups, **terms,
                                     per_sequence=per_sequence), peer_only


def _extra_terms(logprobs: LogProbs, sharing: SharingMode, plan: Plan, work: _Work, groups: list[list[int]], *,
                 m: int, max_tokens: int, step: int, scale: float, ranks: Ranks, clock: _Clock,
                 per_sequence: dict | None = None, live: list | None = None) -> float:
    """The extras' loss over micro-batches `groups` (indices into work.peer), backward on scale × each one when
    autograd is on; the extras' per-sequence statistics into `per_sequence` and, with `live`, the indices of those
    whose term has a gradient (sharing.live) into it, when given. Their loss (unscaled)."""
    loss_total = 0.0
    for whole in groups:
        g, weight = _dealt(whole, ranks, scale)
        logp, mask = logprobs(*work.peer.take(g))
        extras = [work.extras[i] for i in g]
        loss, stats = sharing.extra_loss(logp, mask, extras, update=m, max_tokens=max_tokens,
                                         totals=plan.extra_totals)
        loss_total += _backward(loss, weight, step) if torch.is_grad_enabled() else _finite(loss, step) * bool(weight)
        if weight and per_sequence is not None:
            for name, values in stats.items():
                per_sequence.setdefault(name, []).append(values.detach().cpu())
        if weight and live is not None:
            live += [i for i, keep in zip(g, sharing.live(logp, mask, extras, update=m).tolist()) if keep]
        clock.lap("extras")
    return loss_total


def _take_scaled(solo: list, params: list, c: float) -> None:
    """solo ← c × the gradient accumulated so far (this rank's shards), a copy."""
    solo[:] = [None if p.grad is None else local(p.grad) * c for p in params]


def _add(buffers: list, grads) -> None:
    """buffers[i] += grads[i] (in place: the buffers are the update's own), where a None is 0. A gradient becomes a
    buffer as it is unless another buffer already holds the same tensor (autograd hands one tensor to both inputs of
    an addition) or it is a broadcast view (stride 0, as autograd gives a sum's input): those are copied, since the
    buffers are summed and combined in place."""
    held = {id(b) for b in buffers if b is not None}
    for i, g in enumerate(grads):
        if g is None:
            continue
        if buffers[i] is not None:
            buffers[i].add_(g)
        elif id(g) in held or 0 in g.stride():
            buffers[i] = g.clone(memory_format=torch.contiguous_format)
        else:
            buffers[i] = g
            held.add(id(g))


def _sharded_solo(logprobs: LogProbs, sharing: SharingMode, work: _Work, b: int, old, params: list, *,
                  max_tokens: int, reference: LogProbs | None, step: int, scale: float, ranks: Ranks,
                  own: bool = False) -> list:
    """The changed micro-batches' part of the guard's g_s of mini-batch b when FSDP shards the parameters (`own`:
    of the own guard's g_o): a sharded parameter gets its gradient only from a backward pass (not from
    autograd.grad), so their solo loss takes a forward and backward of its own; its gradient (this rank's shards)
    is returned and cleared."""
    for whole in work.own_groups[b][work.changed_from[b]:]:
        g, weight = _dealt(whole, ranks, scale)
        logp, old_logp, mask, ref = _own_forward(logprobs, work, g, old, reference)
        _backward(_solo_loss(sharing, work, g, logp, old_logp, mask, ref, max_tokens, own), weight, step)
    return _take_and_clear(params)


def _combine(sharing: SharingMode, params: list, solo: list, own: list | None, ranks: Ranks,
             remembered: list | None, peer_only: bool, gather: bool = True) -> tuple[dict, dict | None]:
    """p.grad ← the guarded update (mrl_trainer.guard): Guard.combine of g_m (in p.grad; peer_only: g_m − g_s) and
    g_s = `solo`; with an own guard (`own` = g_o), the mode's own loss's change and the peers' term each projected
    against g_s and trusted apart,

        p.grad ← g_o, d = g_m − g_o aside;  own_guard.combine → g_1 = g_s + τ_own·(g_o − g_s)⊥g_s
        p.grad ← d;                          guard.combine     → g   = g_1 + τ·(g_m − g_o)⊥g_s

    so ⟨g, g_s⟩ ≥ ‖g_s‖² still. g_1 is made in a copy of g_s (Guard.combine's `base`), d in place of g_m, and the
    own guard's step direction in g_o's buffer. The peer guard's evidence (idle only if the own guard's is too) and
    the own guard's (None without one)."""
    guard, own_guard = sharing.guard, sharing.own_guard
    if own_guard is None:
        return guard.combine(params, solo, ranks, remembered, peer_only, gather), None
    g_s = [local(s) if s is not None else torch.zeros_like(local(p)) for s, p in zip(solo, params)]
    peer = []
    for p, s, o in zip(params, g_s, own):
        d = local(p.grad) if p.grad is not None else torch.zeros_like(s)
        if peer_only:
            d.add_(s)
        if o is not None:
            d.sub_(o)
        peer.append(d)
        p.grad = None if o is None else gradient_of(p, o)
    base = [s.clone() for s in g_s]
    own_evidence = own_guard.combine(params, g_s, ranks, gather=gather, base=base)
    for p, d in zip(params, peer):
        p.grad = gradient_of(p, d)
    evidence = guard.combine(params, g_s, ranks, remembered, peer_only=True, gather=gather, base=base)
    return {**evidence, "idle": evidence["idle"] and own_evidence["idle"]}, own_evidence


def _remembered_gradient(logprobs: LogProbs, params: list, guard, work: _Work, budget: int, step: int,
                         ranks: Ranks) -> list | None:
    """g_r = ∇ of the NLL of the successes the guard recalls, (1/n) Σ_i −(1/|y_i|) Σ_t log π_θ(y_i,t | x_i, y_i,<t)
    (this rank's shards), returned and cleared; None without a memory, before anything is remembered, or when
    the step has no peer term to project. A forward and backward of its own, before the first micro-batch."""
    if guard is None or not guard.config.memory or not guard.memory or not work.has_peer_term():
        return None
    prompts, completions = guard.recall()
    remembered = Sequences(prompts, completions)
    for whole in micro_batches(remembered.lengths(), budget):
        g, weight = _dealt(whole, ranks, 1.0)
        logp, mask = logprobs(*remembered.take(g))
        _backward(-masked_seq_mean(logp, mask).sum() / len(completions), weight, step)
    return _take_and_clear(params)


def _take_and_clear(params: list, copy: bool = True) -> list:
    """The gradient accumulated so far (this rank's shards), a copy (copy=False: the tensors themselves, where
    nothing else holds them); the parameters' gradients are cleared, so that a pass of its own leaves nothing
    behind for the update's passes."""
    taken = [None if p.grad is None else local(p.grad).clone() if copy else local(p.grad) for p in params]
    for p in params:
        p.grad = None
    return taken


def _dealt(group: list[int], ranks: Ranks, scale: float) -> tuple[list[int], float]:
    """This rank's deal of a micro-batch and the weight of its loss: scale × N; a rank dealt nothing forwards
    the micro-batch's first sequence with weight 0 (so that FSDP's collectives stay in step)."""
    mine = ranks.deal(group)
    return (mine, scale * ranks.world) if mine else (group[:1], 0.0)


def update(logprobs: LogProbs, params: list[torch.Tensor], optimizer, sharing: SharingMode, loss_cfg,
           batch: StepBatch, plan: Plan, *, max_tokens: int, reference: LogProbs | None = None,
           ranks: Ranks = Ranks()) -> dict[str, float]:
    """μ = loss_cfg.updates_per_step passes of k = loss_cfg.mini_batches optimizer steps on the batch and the
    plan's extras, each through the mode's guard when it has one (mrl_trainer.guard); the step's statistics
    (the last pass's). {"skipped": 1, ...} and no update when nothing has a gradient. Under several `ranks`
    (every rank calls it with the whole batch and plan) each forwards its deal and the statistics are the
    whole step's."""
    guard = sharing.guard
    if guard is not None:
        guard.remember(batch)
    work = _work(batch, plan, loss_cfg, loss_cfg.mini_batches, sharing if guard is not None else None)
    if not work.active and not work.extras:
        return {"skipped": 1.0, "extras": 0, **plan.stats}
    clock = _Clock(params[0].device)
    old = None
    if loss_cfg.updates_per_step * len(work.own_groups) > 1:
        with torch.no_grad():
            old = {tuple(g): logprobs(*work.own.take(g))[0]
                   for part in work.own_groups for whole in part for g in [_dealt(whole, ranks, 1.0)[0]]}
        clock.lap("own")
    remembered = _remembered_gradient(logprobs, params, guard, work, loss_cfg.micro_batch_tokens, batch.step, ranks)
    if remembered is not None:
        clock.lap("memory")
    m, evidence, own_evidences = 0, [], []
    for _ in range(loss_cfg.updates_per_step):
        loss_total, sums, per_sequence = 0.0, {}, {}
        for b in range(len(work.own_groups)):
            if not work.own_groups[b] and not work.extra_groups[b]:
                continue
            solo = [None] * len(params) if guard is not None else None
            own = [None] * len(params) if sharing.own_guard is not None else None
            changed = own_changed = None
            if solo is not None and ranks.sharded:
                sharded = dict(max_tokens=max_tokens, reference=reference, step=batch.step, scale=work.weights[b],
                               ranks=ranks)
                changed = _sharded_solo(logprobs, sharing, work, b, old, params, **sharded)
                if own is not None:
                    own_changed = _sharded_solo(logprobs, sharing, work, b, old, params, **sharded, own=True)
                clock.lap("solo")
            loss, peer_only = _accumulate(logprobs, sharing, plan, work, b, old, m, max_tokens=max_tokens,
                                          reference=reference, step=batch.step, sums=sums,
                                          per_sequence=per_sequence, clock=clock, scale=work.weights[b], solo=solo,
                                          changed=changed, own=own, own_changed=own_changed, params=params,
                                          ranks=ranks)
            loss_total += loss
            if guard is not None:
                peer_evidence, own_evidence = _combine(sharing, params, solo, own, ranks, remembered, peer_only)
                evidence.append(peer_evidence)
                if own_evidence is not None:
                    own_evidences.append(own_evidence)
                clock.lap("guard")
                if work.solo_idle[b] and evidence[-1]["idle"]:   # g = 0 where solo takes no step: none either
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
    if ranks.world > 1:      # the whole step's statistics: the ranks' shares summed, their sequences joined
        parts = ranks.gather([(loss_total, sums, per_sequence)])
        loss_total, sums, per_sequence = 0.0, {}, {}
        for part_loss, part_sums, part_sequences in parts:
            loss_total += part_loss
            for name, value in part_sums.items():
                sums[name] = sums.get(name, 0.0) + value
            for name, values in part_sequences.items():
                per_sequence.setdefault(name, []).extend(values)
    if per_sequence:
        sums.update(sharing.summarize({name: torch.cat(v) for name, v in per_sequence.items()}))
    if guard is not None:
        sums.update(guard.observe(evidence, ranks))
    if sharing.own_guard is not None:
        sums.update(sharing.own_guard.observe(own_evidences, ranks))
    # the guard let nothing through: no optimizer step was taken, and no gradient norm to report (as solo's skip)
    stepped = {"grad_norm": float(grad_norm)} if m else {"skipped": 1.0}
    return {"loss": loss_total, **stepped, "active": len(work.active) / work.n_samples,
            "extras": len(work.extras), "updates": m, **plan.stats, **sums, **clock.stats()}


def gradient(logprobs: LogProbs, params: list[torch.Tensor], sharing: SharingMode, loss_cfg, batch: StepBatch,
             plan: Plan, *, max_tokens: int, reference: LogProbs | None = None) -> torch.Tensor:
    """ĝ = the direction the update steps on for the whole-step loss (one mini-batch, m = 0; through the mode's
    guard, at its current trust, when it has one), before clipping, flattened (float64); zeros when nothing is
    forwarded. No optimizer step, no trust update; the parameters' gradients are cleared before and after."""
    guard = sharing.guard
    work = _work(batch, plan, loss_cfg, sharing=sharing if guard is not None else None)
    for p in params:
        p.grad = None
    if work.active or work.extras:
        remembered = _remembered_gradient(logprobs, params, guard, work, loss_cfg.micro_batch_tokens, batch.step,
                                          Ranks())
        solo = [None] * len(params) if guard is not None else None
        own = [None] * len(params) if sharing.own_guard is not None else None
        _, peer_only = _accumulate(logprobs, sharing, plan, work, 0, None, 0, max_tokens=max_tokens,
                                   reference=reference, step=batch.step, sums={}, per_sequence={}, clock=_Clock(),
                                   solo=solo, own=own, params=params)
        if guard is not None:           # not a step: the guards' step directions are left as they were
            _combine(sharing, params, solo, own, Ranks(), remembered, peer_only, gather=False)
    out = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params])
    for p in params:
        p.grad = None
    return out
