"""What one training step publishes to the exchange (docs/architecture.md, "Typed experience"): the four experience kinds.

    rollout        every sample: prompt, response, token ids, behaviour log-probs, reward, verdict
    group_stats    each prompt's G rewards
    success        each sample whose reward passed this policy's verifier (reward == 1)
    policy_stats   the step's batch mean reward, capability P̂ over the last `window` steps, throughput

Experience ids are deterministic, `<policy>.<step>.<kind>.<i>`: a trainer resumed from a
checkpoint that re-publishes a step is deduplicated by the exchange (idempotent publish).
"""
from dataclasses import dataclass

from mrl.experience import new_experience
from mrl.v1 import experience_pb2 as pb
from mrl_trainer.rollout.base import Sample
from mrl_trainer.tasks import Problem

__all__ = ["StepBatch", "step_experiences", "capability"]


@dataclass
class StepBatch:
    """One step's prompts, each with its G samples, their rewards and extracted answers."""
    step: int
    problems: list[Problem]
    samples: list[list[Sample]]      # (P, G)
    rewards: list[list[float]]       # (P, G)
    answers: list[list[str | None]]  # (P, G): the verifier's extracted final answer, None if none


def capability(batch_rewards: list[float], window: int) -> float:
    """P̂ = mean of the batch mean reward over the last `window` steps (current included)."""
    recent = batch_rewards[-window:]
    return sum(recent) / len(recent) if recent else 0.0


def _verdict(reward: float, answer: str | None) -> int:
    if answer is None:
        return pb.VERDICT_UNPARSEABLE
    return pb.VERDICT_CORRECT if reward >= 1.0 else pb.VERDICT_INCORRECT


def step_experiences(batch: StepBatch, *, run_id: str, policy: str, version: int, tokenizer_id: str,
                     batch_rewards: list[float], window: int, rollouts_per_s: float, tokens_per_s: float,
                     rollouts_total: int) -> list[pb.Experience]:
    out = []

    def add(kind: str, i: int, payload) -> None:
        out.append(new_experience(run_id, policy, version, payload, f"{policy}.{batch.step}.{kind}.{i}"))

    k = 0
    for p, problem in enumerate(batch.problems):
        text = problem.question
        group_id = f"{policy}.{batch.step}.{p}"
        add("group_stats", p, pb.GroupStats(prompt_id=problem.prompt_id, group_id=group_id, rewards=batch.rewards[p]))
        for i, (sample, reward, answer) in enumerate(zip(batch.samples[p], batch.rewards[p], batch.answers[p])):
            add("rollout", k, pb.Rollout(
                prompt_id=problem.prompt_id, prompt_text=text, response_text=sample.text, token_ids=sample.ids,
                logprobs=sample.logprobs, reward=reward, verdict=_verdict(reward, answer), group_id=group_id,
                tokenizer_id=tokenizer_id, sample_index=i))
            if reward >= 1.0:
                add("success", k, pb.VerifiedSuccess(
                    prompt_id=problem.prompt_id, prompt_text=text, response_text=sample.text, token_ids=sample.ids,
                    reward=reward, answer=answer or "", group_id=group_id, tokenizer_id=tokenizer_id))
            k += 1
    add("policy_stats", 0, pb.PolicyStats(
        step=batch.step, batch_mean_reward=batch_rewards[-1], capability=capability(batch_rewards, window),
        window=window, rollouts_per_s=rollouts_per_s, tokens_per_s=tokens_per_s, rollouts_total=rollouts_total))
    return out
