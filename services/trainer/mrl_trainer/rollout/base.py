"""The rollout-engine interface: sample G responses per prompt with their behaviour log-probs.

An engine returns, per generated token, log π_old(y_t | x, y_<t) under the sampling
distribution (logits / temperature), so that the trainer's ratio π_θ/π_old compares like with
like and peers receive the producer's behaviour log-probs with each rollout.
"""
from dataclasses import dataclass
from typing import Protocol

__all__ = ["SamplingParams", "Sample", "RolloutEngine", "stop_token_ids"]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0       # 0: greedy
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Sample:
    """One sampled response: its ids end at (and include) the first stop token, if any."""
    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    text: str                      # decoded, special tokens skipped
    truncated: bool                # max_new_tokens reached before a stop token


def stop_token_ids(model, tokenizer) -> set[int]:
    """Where a response ends: the model's and the tokenizer's EOS, and every other special token.

    A chat response has no special token inside it. SmolLM2-Instruct, for one, sometimes emits
    <|endoftext|> (its unk/document boundary, not its chat EOS <|im_end|>) and then babbles on; cut
    there, the verifier reads the answer and peers get a response THL can carry losslessly.
    """
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos if isinstance(eos, list) else [eos]
    return {i for i in [*eos, tokenizer.eos_token_id, *tokenizer.all_special_ids] if i is not None}


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        """n samples for each prompt (token ids, chat template applied), in prompt order."""

    def sync_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights (after an optimizer step)."""
