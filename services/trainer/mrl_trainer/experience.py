"""What one training step publishes to the exchange (docs/architecture.md, "Typed experience"): the four experience kinds.

    rollout        every sample: prompt, response, token ids, behaviour log-probs, reward, verdict
    group_stats    each prompt's G rewards
    success        each sample whose reward passed this policy's verifier (reward == 1)
    policy_stats   the step's batch mean reward, capability P̂ over the last `window` steps, throughput

Built by the SDK's mrl.experience.step_experiences (which the TRL integration calls too); experience ids
are deterministic, `<policy>.<step>.<kind>.<i>`: a trainer resumed from a checkpoint that re-publishes a
step is deduplicated by the exchange (idempotent publish).
"""
from dataclasses import dataclass

from mrl.experience import Group, Response, capability
from mrl.experience import step_experiences as group_step_experiences
from mrl.v1 import experience_pb2 as pb
from mrl_trainer.rollout.base import Sample
from mrl.tasks import Problem

__all__ = ["StepBatch", "step_experiences", "capability"]


@dataclass
class StepBatch:
    """One step's prompts, each with its G samples, their rewards and extracted answers."""
    step: int
    problems: list[Problem]
    samples: list[list[Sample]]      # (P, G)
    rewards: list[list[float]]       # (P, G)
    answers: list[list[str | None]]  # (P, G): the verifier's extracted final answer, None if none


def step_experiences(batch: StepBatch, *, run_id: str, policy: str, version: int, tokenizer_id: str,
                     batch_rewards: list[float], window: int, rollouts_per_s: float, tokens_per_s: float,
                     rollouts_total: int) -> list[pb.Experience]:
    """The step's experiences (mrl.experience.step_experiences) of a StepBatch."""
    groups = [Group(prompt_id=problem.prompt_id, prompt_text=problem.question,
                    responses=[Response(s.text, s.ids, s.logprobs) for s in samples], rewards=rewards, answers=answers)
              for problem, samples, rewards, answers in zip(batch.problems, batch.samples, batch.rewards, batch.answers)]
    return group_step_experiences(groups, run_id=run_id, policy=policy, step=batch.step, version=version,
                                  tokenizer_id=tokenizer_id, batch_rewards=batch_rewards, window=window,
                                  rollouts_per_s=rollouts_per_s, tokens_per_s=tokens_per_s,
                                  rollouts_total=rollouts_total)
