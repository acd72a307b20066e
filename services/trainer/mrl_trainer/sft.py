"""Supervised warm start: a short teacher-forced pass that makes a policy built from scratch weak, not zero.

A policy of random weights (model.source "config") never samples a correct answer, so every GRPO
group has reward 0, advantage 0 and no gradient. `warm_start` first fits it, in place, to the
reference answers of the task's TRAIN split, in the exact form the rollout will see:

    x_i = prompt_ids(tokenizer, question_i, system_prompt)      the trainer's chat-template prompt
    y_i = tokens("Answer: " + answer_i) + [EOS]                 a response the verifier scores 1.0

    L(θ) = (1/B) Σ_i  −(1/|y_i|) Σ_t log π_θ(y_i,t | x_i, y_i,<t)      response tokens only, mean over the batch

Step s (0 ≤ s < steps) trains on task.batch(s, batch_size, split="train"), so the data are a pure
function of the task and the spec. The trainer hands in `warm_start.task` when set (e.g. one part of a
mixture: the policy is taught one skill, then RL-trained on all), else its RL task. AdamW (no weight decay, gradient norm clipped to 1), the
learning rate warmed up linearly over the first 5% of the steps, then decayed to 0 on a cosine.
Dropout is as the model has it (load_policy turns it off). The torch RNG is seeded with `seed`
inside a fork, so the caller's RNG state is the same whether the result was trained or loaded.

Caching (spec.cache): the weights are saved with safetensors in

    model_cache_dir() / f"sft-{cache_key}-{h}" / model.safetensors   (+ sft.json: spec, seed, losses, trained_with)
    h = sha256(SFT_VERSION, steps, lr, batch_size, task (when set), seed, system_prompt)[:12]

where `cache_key` is the caller's hash of the model spec and the spec of the task it trains on. The folder is written
in a temporary folder beside it and moved into place with os.replace, so a crash never leaves a
partial entry under that name; a later call with the same key, spec, seed and system prompt loads
it instead of training (stats["cached"] = True). With cache = False nothing is read or written.
Processes wanting the same entry at once (two arms of one seed in `mrl experiment compare`) train it
once: each holds an exclusive lock on model_cache_dir()/.locks/<entry name> while it looks, trains and
stores, so the others wait and then load what the first stored.

trained_with records what did the arithmetic: torch's version, its CPU kernels (AVX2, AVX512, …), the
thread count and the device. On one machine a warm start is reproducible bit for bit; under other kernels or
thread counts the same spec and seed sum in another order and can give other weights (one seed's warm start
scored 0.052 held-out accuracy in two sessions and 0.062 in a third), so runs compared across machines may
not start from the same policy.

`should_stop` (a callable) is asked before each supervised step and while waiting for that lock; once
it answers True the pass ends with WarmStartStopped, nothing cached, so a trainer asked to stop
(SIGINT/SIGTERM) does not finish a long warm start first.
"""
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import pathlib
import re
import tempfile
import time

import torch
from pydantic import Field, field_validator
from safetensors.torch import load_model, save_model

from mrl.assets import model_cache_dir
from mrl_trainer.errors import TrainerError
from mrl_trainer.logprobs import completion_logprobs
from mrl.prompts import prompt_ids
from mrl_trainer.section import Section
from mrl.tasks import Problem, Task, TaskSpec

__all__ = ["WarmStartConfig", "WarmStartStopped", "warm_start", "response_text", "response_ids", "response_nll",
           "cache_folder", "SFT_VERSION"]

log = logging.getLogger("mrl.trainer")
SFT_VERSION = 1          # bump when the objective or the target format changes: old cache entries are then ignored
WARMUP_FRACTION = 0.05   # of the steps, linear warm-up of the learning rate
MAX_GRAD_NORM = 1.0
_KEY = re.compile(r"[A-Za-z0-9._-]{1,128}")
LOCK_POLL_S = 0.5        # how often a process waiting for another's warm start asks should_stop


class WarmStartStopped(Exception):
    """should_stop answered True during the warm start: nothing was cached."""


class WarmStartConfig(Section):
    """A supervised warm start before RL (see mrl_trainer.sft)."""

    steps: int = Field(300, ge=1, description="Optimizer steps of the supervised pass, each on the next "
                                              "batch_size train-split problems.")
    lr: float = Field(1e-3, gt=0, description="Peak AdamW learning rate (linear warm-up over 5% of the steps, "
                                              "then cosine decay to 0).")
    batch_size: int = Field(32, ge=1, description="Problems per step; the loss is the mean over them of each "
                                                  "response's mean token negative log-likelihood.")
    task: TaskSpec | None = Field(None, description="The supervised pass's task (default: the RL task), e.g. one "
                                                    "part of a mixture: a policy taught one skill, then RL-trained "
                                                    "on all of them.")
    seed: int | None = Field(None, description="The seed of the supervised pass and of a from-scratch model's "
                                               "initial weights (default: the run's). Fixed, the runs of every RL "
                                               "seed start from the one cached warm start.")
    cache: bool = Field(True, description="Reuse the weights of an earlier identical warm start from the model "
                                          "cache (MRL_MODEL_CACHE), and store them there after training.")

    @field_validator("lr")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


def response_text(problem: Problem) -> str:
    """The target response: the reference answer in the form every task's verifier reads."""
    return f"Answer: {problem.answer}"


def response_ids(tokenizer, problem: Problem) -> list[int]:
    """The target response's token ids, ending with the tokenizer's EOS (the rollout stops there)."""
    return list(tokenizer.encode(response_text(problem), add_special_tokens=False)) + [tokenizer.eos_token_id]


def _nll(model, prompts: list[list[int]], targets: list[list[int]], pad_id: int) -> torch.Tensor:
    logp, mask = completion_logprobs(model, prompts, targets, pad_id)
    return -((logp * mask).sum(-1) / mask.sum(-1)).mean()


def response_nll(model, tokenizer, problems: list[Problem], system_prompt: str | None = None) -> torch.Tensor:
    """L(θ) of the module docstring on these problems (a scalar tensor with its graph)."""
    return _nll(model, [prompt_ids(tokenizer, p.question, system_prompt) for p in problems],
                [response_ids(tokenizer, p) for p in problems], tokenizer.pad_token_id)


def cache_folder(spec: WarmStartConfig, *, system_prompt: str | None, seed: int, cache_key: str) -> pathlib.Path:
    """Where the result of this warm start is cached (whether or not it is there)."""
    if not _KEY.fullmatch(cache_key):
        raise TrainerError(f"warm-start cache_key {cache_key!r} must be 1-128 letters, digits, '.', '_' or '-'")
    identity = {"version": SFT_VERSION, **spec.model_dump(exclude={"cache"}, exclude_none=True), "seed": seed,
                "system_prompt": system_prompt}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return model_cache_dir() / f"sft-{cache_key}-{digest[:12]}"


def _lr_factor(step: int, steps: int) -> float:
    warmup = max(1, round(WARMUP_FRACTION * steps))
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _train(model, tokenizer, task: Task, spec: WarmStartConfig, system_prompt: str | None,
           should_stop) -> tuple[float, float]:
    """Run the supervised pass in place; (first, last) batch loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, spec.steps))
    was_training = model.training
    model.train()
    losses = []
    try:
        for step in range(spec.steps):
            if should_stop():
                raise WarmStartStopped(f"stopped at warm-start step {step} of {spec.steps}")
            loss = response_nll(model, tokenizer, task.batch(step, spec.batch_size, split="train"), system_prompt)
            if not torch.isfinite(loss):
                raise TrainerError(f"warm start: non-finite loss ({loss.item()}) at step {step}; lower warm_start.lr")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    finally:
        optimizer.zero_grad(set_to_none=True)
        model.train(was_training)
    return losses[0], losses[-1]


def _store(model, folder: pathlib.Path, meta: dict) -> None:
    """Write the entry beside `folder` and move it into place; a failure leaves no entry (and is only logged)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.") as tmp:
            out = pathlib.Path(tmp) / "out"
            out.mkdir()
            save_model(model, str(out / "model.safetensors"))
            (out / "sft.json").write_text(json.dumps(meta, indent=1) + "\n")
            try:
                os.replace(out, folder)
            except OSError:            # another process stored the same entry first
                if not (folder / "sft.json").exists():
                    raise
    except OSError as exc:
        log.warning("warm start: could not cache the result in %s (%s); it will be trained again next time",
                    folder, exc)


def _load(model, folder: pathlib.Path, device) -> dict:
    try:
        meta = json.loads((folder / "sft.json").read_text())
        load_model(model, str(folder / "model.safetensors"), strict=True, device=str(device))
    except (OSError, RuntimeError, ValueError) as exc:
        raise TrainerError(f"cannot load the cached warm start {folder}: {exc}; it may come from another "
                           f"model (remove the folder to train it again)") from exc
    return meta


@contextlib.contextmanager
def _exclusive(folder: pathlib.Path, should_stop):
    """Hold the lock of cache entry `folder` (module docstring); WarmStartStopped if asked to stop while waiting.
    Without a writable cache folder there is no lock (and _store will only log that it cannot cache)."""
    locks = folder.parent / ".locks"
    try:
        locks.mkdir(parents=True, exist_ok=True)
        handle = open(locks / folder.name, "a")
    except OSError:
        handle = None
    if handle is None:
        yield
        return
    with handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if should_stop():
                    raise WarmStartStopped("stopped while another process trained the same warm start") from None
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def warm_start(model, tokenizer, task: Task, spec: WarmStartConfig, *, system_prompt: str | None, seed: int,
               cache_key: str, device, should_stop=lambda: False) -> dict:
    """Fit `model` in place to the task's reference responses (module docstring), or load the cached result.

    Returns {"steps", "initial_loss", "final_loss", "seconds", "cached"}: the losses are those of the
    first and last batch (of the run that trained, when cached), seconds are this call's. Raises
    WarmStartStopped once `should_stop()` is True (the model is then part-trained: discard it).
    """
    start = time.perf_counter()
    folder = cache_folder(spec, system_prompt=system_prompt, seed=seed, cache_key=cache_key) if spec.cache else None
    with _exclusive(folder, should_stop) if folder else contextlib.nullcontext():
        if folder and (folder / "sft.json").exists():
            meta = _load(model, folder, device)
            return {"steps": spec.steps, "initial_loss": meta["initial_loss"], "final_loss": meta["final_loss"],
                    "seconds": time.perf_counter() - start, "cached": True}
        device = torch.device(device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            initial, final = _train(model, tokenizer, task, spec, system_prompt, should_stop)
        seconds = time.perf_counter() - start
        if folder:
            _store(model, folder, {"version": SFT_VERSION, "cache_key": cache_key, "spec": spec.model_dump(),
                                   "seed": seed, "system_prompt": system_prompt, "initial_loss": initial,
                                   "final_loss": final, "seconds": seconds, "trained_with": {
                                       "torch": torch.__version__,
                                       "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                                       "threads": torch.get_num_threads(), "device": str(device)}})
    return {"steps": spec.steps, "initial_loss": initial, "final_loss": final, "seconds": seconds,
            "cached": False}
