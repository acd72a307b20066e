"""`mrl lab step CONFIG`: what one policy update does to the answers it rewards, at several step sizes.

GRPO's update raises the probability of a group's verified samples to first order only: a step too long for the
policy's loss surface lowers the very answer it rewards. For the trainer config's policy as its run would start
(checkpoint, else warm start: grpo_signal.probe_trainer), on its first training batch t ≥ 0 with a signal (a group
holding a verified and a failed sample), each rule r makes one update from the same weights on the same batch:

    adamw:η   a fresh AdamW at learning rate η, as a run's first update (its first step moves every coordinate
              that has a gradient by about η: m̂/√v̂ = g/|g|)
    sgd:η     plain gradient descent, θ − η·clip(g), which moves the weights by η·min(‖g‖₂, max_grad_norm)

and gives

    p_rewarded(r) = mean over the batch's verified samples y of π(y|x)   (and logp_rewarded(r), of log π(y|x):
                    the scale on which a long response's change shows)
    p_tuning(r)   = mean over P tuning problems of π(y*|x)
    moved(r)      = ‖θ_r − θ_0‖₂

where π(y|x) = Π_t π(y_t | x, y_<t), at the rollout's temperature, is the probability that one sample is exactly
y, and y* is the reference response ("Answer: <answer>" and EOS, mrl_trainer.sft.response_ids): for a policy that
answers in that form (a warm-started one) p_tuning is a noise-free stand-in for its sampled accuracy. The tuning
problems are
training-split problems from index TUNING_FROM on, past every prompt a run takes, and never held-out ones: a
learning rate chosen here is not chosen on the evaluation. Nothing is published or checkpointed.
"""
import contextlib
import math
import tempfile

import torch

from mrl.prompts import prompt_ids
from mrl_research.lab.grpo_signal import probe_trainer
from mrl_trainer.errors import TrainerError
from mrl_trainer.sft import response_ids

__all__ = ["measure_step", "parse_rule", "TUNING_FROM"]

TUNING_FROM = 1_000_000     # index of the first tuning problem in the training split
OPTIMIZERS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def parse_rule(text: str) -> tuple[str, float]:
    """'adamw:2e-5' → ("adamw", 2e-5)."""
    name, _, size = text.partition(":")
    try:
        eta = float(size)
    except ValueError:
        eta = math.nan
    if name not in OPTIMIZERS or not eta > 0:
        raise TrainerError(f"step rule {text!r}: write adamw:LR or sgd:LR with LR > 0, e.g. adamw:2e-5")
    return name, eta


def measure_step(config_path: str, rules: list[str], *, problems: int = 64, search: int = 16,
                 overrides: dict | None = None, on_row=lambda row: None) -> dict:
    """{policy, task, step, rewarded: [prompt ids], verified_samples, tuning_problems, rows: [{rule, p_rewarded,
    logp_rewarded, p_tuning, moved, grad_norm}]}, the first row the policy before any update (rule "none");
    `on_row` sees each row as it is measured."""
    parsed = [parse_rule(rule) for rule in rules]
    if problems < 1 or search < 1:
        raise TrainerError(f"--problems {problems}, --search {search}: give at least one of each")
    with tempfile.TemporaryDirectory(prefix="mrl-step-") as scratch:
        config, trainer = probe_trainer(config_path, overrides, scratch)
        with contextlib.closing(trainer):
            batch = next((b for b in map(trainer.rollout, range(search))
                          if any(0 < sum(r >= 1 for r in g) < len(g) for g in b.rewards)), None)
            if batch is None:
                raise TrainerError(f"none of the first {search} training batches has a group with a verified and a "
                                   "failed sample: no update to measure (a larger --search, or a stronger policy)")
            trainer.learner.note(batch)
            verified = [(p, s.ids) for p, samples, rewards in zip(batch.problems, batch.samples, batch.rewards)
                        for s, r in zip(samples, rewards) if r >= 1]
            tuning = [trainer.task.problem(TUNING_FROM + i) for i in range(problems)]
            references = [(p, response_ids(trainer.tokenizer, p)) for p in tuning]

            def logprob(pairs) -> torch.Tensor:
                """log π(y|x) of each (problem, y)."""
                prompts = [prompt_ids(trainer.tokenizer, p.question, config.system_prompt) for p, _ in pairs]
                with torch.no_grad():
                    logp, mask = trainer.learner.logprobs(prompts, [list(ids) for _, ids in pairs])
                return (logp * mask).sum(-1)

            start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}

            def row(rule: str, stats: dict) -> dict:
                moved = math.sqrt(sum(((p.detach() - start[name]) ** 2).sum().item()
                                      for name, p in trainer.model.named_parameters()))
                rewarded, reference = logprob(verified), logprob(references)
                out = {"rule": rule, "p_rewarded": rewarded.exp().mean().item(),
                       "logp_rewarded": rewarded.mean().item(), "p_tuning": reference.exp().mean().item(),
                       "moved": moved, "grad_norm": stats.get("grad_norm")}
                on_row(out)
                return out

            rows = [row("none", {})]
            for (name, eta), rule in zip(parsed, rules):
                with torch.no_grad():
                    for key, p in trainer.model.named_parameters():
                        p.copy_(start[key])
                trainer.optimizer = OPTIMIZERS[name](trainer.learner.params, lr=eta)
                rows.append(row(rule, trainer.update(batch)))
    return {"policy": config.policy, "task": trainer.task.name, "step": batch.step,
            "rewarded": sorted({p.prompt_id for p, _ in verified}), "verified_samples": len(verified),
            "tuning_problems": problems, "rows": rows}
