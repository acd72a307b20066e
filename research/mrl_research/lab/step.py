"""`mrl lab step CONFIG`: what one policy update does to the answers it rewards, at several step sizes; with
`--curve N`, what N solo GRPO steps at the config's own settings do to the same tuning answers.

GRPO's update raises the probability of a group's verified samples to first order only: a step too long for the
policy's loss surface lowers the very answer it rewards. For the trainer config's policy as its run would start
(checkpoint, else warm start: grpo_signal.probe_trainer), on its next training batch with a signal (a group
holding a verified and a failed sample), each rule r makes one update (μ = k = 1) from the same weights on the same
batch:

    adamw:η   a fresh AdamW at learning rate η and the config's weight decay, built as a run builds it
              (mrl_trainer.optimizer.adamw): a run's first update, which moves every coordinate that has a
              gradient by about η (m̂/√v̂ = g/|g|)
    sgd:η     plain gradient descent, θ − η·clip(g), which moves the weights by η·min(‖g‖₂, max_grad_norm)

and gives

    p_rewarded(r) = mean over the batch's verified samples y of π(y|x)   (and logp_rewarded(r), of log π(y|x):
                    the scale on which a long response's change shows)
    p_tuning(r)   = mean over P tuning problems of π(y*|x)   (and per part of a mixture)
    moved(r)      = ‖θ_r − θ_0‖₂

where π(y|x) = Π_t π(y_t | x, y_<t), at the rollout's temperature, is the probability that one sample is exactly
y, and y* is the reference response ("Answer: <answer>" and EOS, mrl_trainer.sft.response_ids): for a policy that
answers in that form (a warm-started one) p_tuning is a noise-free stand-in for its sampled accuracy. The tuning
problems are training-split problems from index TUNING_FROM on, past every prompt a run takes (a procedural task's;
a dataset's training split wraps, so one is refused), and never held-out ones: a learning rate chosen here is not
chosen on the evaluation. Nothing is published or checkpointed.
"""
import contextlib
import math
import tempfile

import torch

from mrl.prompts import prompt_ids
from mrl_research.lab.grpo_signal import probe_trainer
from mrl_trainer.errors import TrainerError
from mrl_trainer.optimizer import adamw
from mrl_trainer.sft import response_ids

__all__ = ["measure_step", "measure_curve", "parse_rule", "TUNING_FROM"]

TUNING_FROM = 1_000_000     # index of the first tuning problem in the training split
RULES = ("adamw", "sgd")


def parse_rule(text: str) -> tuple[str, float]:
    """'adamw:2e-5' → ("adamw", 2e-5)."""
    name, _, size = text.partition(":")
    try:
        eta = float(size)
    except ValueError:
        eta = math.nan
    if name not in RULES or not (eta > 0 and math.isfinite(eta)):
        raise TrainerError(f"step rule {text!r}: write adamw:LR or sgd:LR with LR > 0, e.g. adamw:2e-5")
    return name, eta


def _probe(config_path: str, overrides: dict | None, scratch: str, problems: int):
    """(config, trainer, tuning scorer) of the config, built as grpo_signal.probe_trainer builds it, one update a
    step; the scorer gives {p_tuning, p_tuning_parts} of the current weights."""
    if problems < 1:
        raise TrainerError(f"--problems {problems}: give at least one tuning problem")
    config, trainer = probe_trainer(config_path, {**(overrides or {}), "loss.updates_per_step": 1,
                                                  "loss.mini_batches": 1}, scratch)
    if trainer.task.size() is not None:
        trainer.close()
        raise TrainerError(f"task {trainer.task.name!r} is a dataset: its training split wraps, so no tuning "
                           "problem lies past the prompts a run trains on; use a procedural task")
    tuning = [trainer.task.problem(TUNING_FROM + i) for i in range(problems)]
    references = [(p, response_ids(trainer.tokenizer, p)) for p in tuning]
    parts = [p.meta.get("part") for p in tuning]

    def score() -> dict:
        p = _logprob(trainer, config, references).exp()
        by_part = {part: p[[i for i, x in enumerate(parts) if x == part]].mean().item()
                   for part in dict.fromkeys(parts) if part}
        return {"p_tuning": p.mean().item(), "p_tuning_parts": by_part}
    return config, trainer, score


def _logprob(trainer, config, pairs) -> torch.Tensor:
    """log π(y|x) of each (problem, y) under the trainer's policy, at its rollout temperature."""
    prompts = [prompt_ids(trainer.tokenizer, p.question, config.system_prompt) for p, _ in pairs]
    with torch.no_grad():
        logp, mask = trainer.learner.logprobs(prompts, [list(ids) for _, ids in pairs])
    return (logp * mask).sum(-1)


def measure_step(config_path: str, rules: list[str], *, problems: int = 64, search: int = 16,
                 overrides: dict | None = None, on_row=lambda row: None) -> dict:
    """{policy, task, step, rewarded: [prompt ids], verified_samples, tuning_problems, rows: [{rule, p_rewarded,
    logp_rewarded, p_tuning, p_tuning_parts, moved, grad_norm}]}, the first row the policy before any update
    (rule "none"); `on_row` sees each row as it is measured."""
    parsed = [parse_rule(rule) for rule in rules]
    if not parsed or search < 1:
        raise TrainerError(f"{len(parsed)} step rules, --search {search}: give at least one rule and one step")
    with tempfile.TemporaryDirectory(prefix="mrl-step-") as scratch:
        config, trainer, tuning = _probe(config_path, overrides, scratch, problems)
        with contextlib.closing(trainer):
            first = trainer.state.step
            batch = next((b for b in map(trainer.rollout, range(first, first + search))
                          if any(0 < sum(r >= 1 for r in g) < len(g) for g in b.rewards)), None)
            if batch is None:
                raise TrainerError(f"none of the {search} training batches from step {first} has a group with a "
                                   "verified and a failed sample: no update to measure (a larger --search, or a "
                                   "stronger policy)")
            trainer.learner.note(batch)
            verified = [(p, s.ids) for p, samples, rewards in zip(batch.problems, batch.samples, batch.rewards)
                        for s, r in zip(samples, rewards) if r >= 1]
            start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}

            def row(rule: str, stats: dict) -> dict:
                moved = math.sqrt(sum(((p.detach() - start[name]) ** 2).sum().item()
                                      for name, p in trainer.model.named_parameters()))
                rewarded = _logprob(trainer, config, verified)
                out = {"rule": rule, "p_rewarded": rewarded.exp().mean().item(),
                       "logp_rewarded": rewarded.mean().item(), **tuning(), "moved": moved,
                       "grad_norm": stats.get("grad_norm")}
                on_row(out)
                return out

            rows = [row("none", {})]
            for (name, eta), rule in zip(parsed, rules):
                with torch.no_grad():
                    for key, p in trainer.model.named_parameters():
                        p.copy_(start[key])
                trainer.optimizer = (adamw(trainer.model, config.loss.model_copy(update={"lr": eta}))
                                     if name == "adamw" else torch.optim.SGD(trainer.learner.params, lr=eta))
                rows.append(row(rule, trainer.update(batch)))
    return {"policy": config.policy, "task": trainer.task.name, "step": batch.step,
            "rewarded": sorted({p.prompt_id for p, _ in verified}), "verified_samples": len(verified),
            "tuning_problems": problems, "rows": rows}


def measure_curve(config_path: str, steps: int, *, problems: int = 64, overrides: dict | None = None,
                  on_row=lambda row: None) -> dict:
    """{policy, task, lr, tuning_problems, rows: [{step, reward_mean, updated, p_tuning, p_tuning_parts}]}: the
    tuning answers before and after each of `steps` solo GRPO steps (the trainer's own step, one update each, at
    the config's optimizer), the first row at the start (reward_mean None)."""
    if steps < 1:
        raise TrainerError(f"--curve {steps}: give at least one step")
    with tempfile.TemporaryDirectory(prefix="mrl-step-") as scratch:
        config, trainer, tuning = _probe(config_path, overrides, scratch, problems)
        with contextlib.closing(trainer):
            rows = [{"step": trainer.state.step, "reward_mean": None, "updated": None, **tuning()}]
            on_row(rows[-1])
            for _ in range(steps):
                record = trainer.step()
                rows.append({"step": trainer.state.step, "reward_mean": record["reward_mean"],
                             "updated": "skipped" not in record, **tuning()})
                on_row(rows[-1])
    return {"policy": config.policy, "task": trainer.task.name, "lr": config.loss.lr, "tuning_problems": problems,
            "rows": rows}
