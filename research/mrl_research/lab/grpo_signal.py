"""`mrl lab signal`: how much a policy's sampled groups can teach GRPO on its task, before a budget is spent.

GRPO learns only from a group whose rewards differ: with β = 0, a group that all failed (or all succeeded) has
A_i = 0 for every sample and adds nothing to the gradient. A comparison of sharing modes therefore needs a
budget where solo GRPO has signal, and that depends on the sampling settings as much as on the model. For a
trainer config, this samples G responses to the next P training prompts (the ones the run's next steps would
see: from its first step, or from the step its checkpoint resumes at) under each setting (temperature T,
max_new_tokens L), verifies them with the task's verifier, and reports per setting

    success      p̂ = mean reward (the share of verified successes, for 0/1 rewards)
    informative  share of prompts whose G rewards are not all equal (the groups GRPO learns from)
    expected     1 − Σ_prompts [p_x^G + (1 − p_x)^G] / P, with p_x the prompt's observed share of successes
                 (reward ≥ 1): the chance that the next draw of G from that rate is informative. Per prompt
                 it is never above the draw's own figure (one success in 8 counts 0.66, not 1), and by
                 Jensen's inequality it runs below the true chance: a conservative figure
    truncated    share of responses cut at L tokens (the verifier reads a cut answer as it stands)
    tokens       mean response length; seconds: wall time of the setting's rollout

and, before those, a greedy row per L (T = 0, one response per prompt: decoded as the held-out evaluation
decodes, on training prompts). The policy is built as the trainer would build it (the latest checkpoint in
checkpoint.dir when there is one and checkpoint.resume holds; else a configured `warm_start`, which trains and
is cached the first time, as for the run), with sharing off: no RL step, nothing published or checkpointed.
"""
import pathlib
import tempfile
import time

from pydantic import ValidationError

from mrl_trainer.config import RolloutConfig, load_config
from mrl_trainer.errors import TrainerError

__all__ = ["measure", "probe_trainer", "informative_share", "expected_informative"]


def informative_share(rewards: list[list[float]]) -> float:
    """Share of groups whose rewards are not all equal."""
    return sum(len(set(group)) > 1 for group in rewards) / max(len(rewards), 1)


def expected_informative(rewards: list[list[float]]) -> float:
    """1 − mean over groups of p^G + (1 − p)^G, p the group's success rate (reward ≥ 1), G its size."""
    total = 0.0
    for group in rewards:
        p, g = sum(r >= 1.0 for r in group) / len(group), len(group)
        total += 1.0 - p ** g - (1.0 - p) ** g
    return total / max(len(rewards), 1)


def _row(batch, seconds: float, **setting) -> dict:
    samples = [s for group in batch.samples for s in group]
    rewards = [r for group in batch.rewards for r in group]
    return {**setting, "samples": len(samples), "success": sum(rewards) / len(rewards),
            "informative": informative_share(batch.rewards), "expected": expected_informative(batch.rewards),
            "truncated": sum(s.truncated for s in samples) / len(samples),
            "tokens": sum(len(s.ids) for s in samples) / len(samples), "seconds": seconds}


def probe_trainer(config_path: str, overrides: dict | None, scratch: str):
    """(config, trainer) of the trainer config at `config_path` with `overrides`, built to be probed: sharing off,
    no exchange, scheduler, tracker or Prometheus port, its metrics file in `scratch`; the policy as the run would
    start it (its latest checkpoint when it resumes, else its warm start). The caller closes the trainer."""
    from mrl_trainer.trainer import build_trainer
    solo = {**(overrides or {}), "sharing.mode": "none", "exchange": None, "scheduler": None,
            "metrics.jsonl": str(pathlib.Path(scratch) / "metrics.jsonl"), "metrics.progress": False,
            "metrics.prometheus_port": None, "tracking.report_to": []}
    config = load_config(config_path, solo)
    return config, build_trainer(config)


def measure(config_path: str, temperatures: list[float], lengths: list[int] | None = None, *, prompts: int,
            overrides: dict | None = None, on_row=lambda row: None) -> dict:
    """For the policy of the trainer config at `config_path` (with `overrides`, as `mrl trainer run --set`) on the
    `prompts` training prompts of its next step: a greedy row per max_new_tokens L in `lengths` (default: the
    config's), then a row per (T, L), G = the config's rollout.group_size; `on_row` sees each row as it is
    measured."""
    if prompts < 1:
        raise TrainerError(f"--prompts {prompts}: give at least one prompt")
    if not temperatures:
        raise TrainerError("no temperature given: name at least one (greedy is always measured as well)")
    if lengths is not None and not lengths:
        raise TrainerError("no max_new_tokens given: name at least one length")
    for name, values in (("temperature", temperatures), ("max_new_tokens", lengths or [])):
        for value in values:                 # each as a trainer config's rollout section would take it
            try:
                RolloutConfig(**{name: value})
            except ValidationError as exc:
                greedy = " (greedy is always measured as well)" if name == "temperature" else ""
                raise TrainerError(f"{name} {value}: {exc.errors()[0]['msg']}{greedy}") from None
    with tempfile.TemporaryDirectory(prefix="mrl-signal-") as scratch:
        config, trainer = probe_trainer(config_path, overrides, scratch)
        lengths = lengths or [config.rollout.max_new_tokens]
        step = trainer.state.step
        try:
            problems = trainer.task.batch(step, prompts)
            rows = []
            for temperature, tokens, group in [*((0.0, n, 1) for n in lengths),
                                               *((t, n, config.rollout.group_size) for t in temperatures
                                                 for n in lengths)]:
                # model_copy skips validation: temperature 0 is the engine's greedy decoding, as in evaluation
                rollout = config.rollout.model_copy(update={"temperature": temperature, "max_new_tokens": tokens,
                                                            "group_size": group})
                trainer.cfg = config.model_copy(update={"rollout": rollout})
                start = time.perf_counter()
                batch = trainer.rollout(step, problems)
                rows.append(_row(batch, time.perf_counter() - start, temperature=temperature,
                                 max_new_tokens=tokens, group_size=group))
                on_row(rows[-1])
        finally:
            trainer.close()
    return {"policy": config.policy, "task": trainer.task.name, "prompts": prompts,
            "group_size": config.rollout.group_size, "resumed_from": str(trainer.resumed_from or "") or None,
            "step": step, "rows": rows}
