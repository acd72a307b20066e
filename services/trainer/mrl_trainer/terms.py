"""A loss term: sequences to forward under π_θ and the loss of any micro-batch of them (mrl_trainer.update).

    L(θ) = Σ_terms Σ_micro-batches term.loss(log π_θ(micro-batch), …)

Every normaliser a term's loss uses is a whole-step total, so its micro-batches' losses sum to the term's loss
and their gradients to its gradient, however the update splits them.
"""
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

__all__ = ["Term", "TermLoss"]

# loss(logp, mask, indices, m, old, ref) → (the micro-batch's loss, its statistics): logp, mask (n, T) of the
# sequences `indices` (into the term's); m = optimizer updates already made this step; old, ref (n, T): π_old's and
# the frozen reference's log-probs of own samples (None for a term that is not `own`, and ref None without a KL)
TermLoss = Callable[[Tensor, Tensor, list[int], int, Tensor | None, Tensor | None], tuple[Tensor, dict]]


@dataclass
class Term:
    """One term of a step's loss.

        prompts, completions   each sequence's token ids
        prompt_of              each sequence's prompt index in the step's batch (its mini-batch)
        loss                   TermLoss
        own                    own samples: `keys` index the step's own samples (π_old is taken once per sample),
                               and the loss gets old and reference log-probs
        part                   where its time is charged (update_<part>_s): "own" or "peer"
        stats                  "mean": the loss's statistics are floats, averaged over micro-batches by size;
                               "per_sequence": tensors (n,), joined over the step for SharingMode.summarize;
                               None: not reported
    """
    prompts: list[list[int]]
    completions: list[list[int]]
    prompt_of: list[int]
    loss: TermLoss
    own: bool = False
    keys: list[int] | None = None
    part: str = "own"
    stats: str | None = None

    def __len__(self) -> int:
        return len(self.completions)

    def lengths(self) -> list[int]:
        return [len(p) + len(c) for p, c in zip(self.prompts, self.completions)]
