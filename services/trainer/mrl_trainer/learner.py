"""What a policy does with a batch it has sampled, whoever sampled it and however it met its peers: the step's
books, its sharing mode's plan, the update. The trainer (Trainer.step) and the bandit testbed (mrl_research.lab)
both step through a Learner, so this part of the step exists once.

    note(batch)          books: R̄_t = the batch's mean reward, the last K kept (K = sharing.window); rollouts
    plan(batch, peers)   sharing.plan at the capability P̂ = mean of the kept R̄ (mrl.experience.capability),
                         with the policy's own verifier
    learn(batch, plan)   mrl_trainer.update.update on the policy's log-probs; the update's statistics

The books are any object with `batch_rewards` and `rollouts_total` (the trainer's TrainState, which checkpoints
them; the testbed's policy).
"""
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mrl.experience import capability
from mrl_trainer.distributed import Ranks
from mrl_trainer.experience import StepBatch
from mrl_trainer.sharing import PeerBatch, Plan, SharingMode, Verifier
from mrl_trainer.update import LogProbs, update

__all__ = ["Learner"]


@dataclass
class Learner:
    """One policy's sharing mode, update and books. `reward(problem, text)` is its own verifier's reward;
    `logprobs` (and `reference`, the frozen KL anchor's) its model's (mrl_trainer.update.LogProbs)."""
    sharing: SharingMode
    logprobs: LogProbs
    params: list[torch.Tensor]
    optimizer: torch.optim.Optimizer
    loss: object                                   # the trainer's LossConfig
    books: object
    reward: Callable[[object, str], float]
    max_tokens: int
    reference: LogProbs | None = None
    ranks: Ranks = field(default_factory=Ranks)

    @property
    def window(self) -> int:
        return self.sharing.sharing.window

    def capability(self) -> float:
        """P̂ = the mean batch reward over the last K steps."""
        return capability(self.books.batch_rewards, self.window)

    def note(self, batch: StepBatch) -> None:
        """The books of a sampled batch: its mean reward (the last K kept) and its rollouts."""
        rewards = [r for group in batch.rewards for r in group]
        self.books.batch_rewards = (list(self.books.batch_rewards) + [sum(rewards) / len(rewards)])[-self.window:]
        self.books.rollouts_total += len(rewards)

    def plan(self, batch: StepBatch, peers: PeerBatch) -> Plan:
        """The sharing mode's plan of the batch and its peers' experience (PeerBatch() for none)."""
        return self.sharing.plan(batch, peers, capability=self.capability(), verify=Verifier(batch, self.reward))

    def learn(self, batch: StepBatch, plan: Plan) -> dict[str, float]:
        """The update on the batch and the plan; its statistics ({"skipped": 1, …} when nothing had a
        gradient)."""
        return update(self.logprobs, self.params, self.optimizer, self.sharing, self.loss, batch, plan,
                      max_tokens=self.max_tokens, reference=self.reference, ranks=self.ranks)
