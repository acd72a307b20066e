"""Aggregation, the second stage of every GRPO-family loss: per-token losses l_{i,t} -> one scalar.

With m_{i,t} in {0, 1} the response mask, |y_i| = sum_t m_{i,t} the response length, and the batch totals
N (`num_sequences`) and M = sum_i |y_i| (`num_tokens`) of the WHOLE batch:

    token-mean               L = sum_i sum_t m_{i,t} l_{i,t} / M                  DAPO (Yu et al. 2025)
    seq-mean-token-mean      L = (1/N) sum_i [ sum_t m_{i,t} l_{i,t} / |y_i| ]    GRPO (Shao et al. 2024)
    seq-mean-token-sum-norm  L = sum_i sum_t m_{i,t} l_{i,t} / (N * T_max)        Dr.GRPO (Liu et al. 2025)

T_max (`max_tokens`) is the generation budget (max_new_tokens), a constant, not the longest response in
the batch. Every normaliser is a whole-batch total, so when a caller splits the batch into micro-batches and
passes the totals, the micro-batch losses (and their gradients) sum to the full-batch ones exactly.
TRL 1.16 names: "dapo" and "bnpo" = token-mean, "grpo" = seq-mean-token-mean, "dr_grpo" = seq-mean-token-sum-norm.

Departures: positions outside the mask are selected away (`torch.where`), not multiplied by 0, so a NaN or
inf there never reaches the loss; an empty response counts in N and adds 0 (|y_i| is clamped to >= 1, as TRL).
"""
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from ._names import choose

__all__ = ["Aggregation", "aggregate", "masked_seq_mean", "normaliser"]

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def masked_seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """(1/|y_i|) sum_t m_{i,t} x_{i,t} per sequence: x, mask (N, T) -> (N,); an empty row gives 0."""
    mask = mask.bool()
    return torch.where(mask, x, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)


def _token_sum(token_sums, lengths):
    return token_sums.sum()


def _length_normalised_sum(token_sums, lengths):
    return (token_sums / lengths.clamp(min=1)).sum()


_NUMERATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "token-mean": _token_sum,
    "seq-mean-token-mean": _length_normalised_sum,
    "seq-mean-token-sum-norm": _token_sum,
}


def normaliser(aggregation: Aggregation, *, num_sequences, num_tokens, max_tokens: int | None = None):
    """D of L = S / D: M (token-mean), N (seq-mean-token-mean) or N · T_max (seq-mean-token-sum-norm). S depends
    only on the sequences at hand, so two losses of the same sequences under different totals differ by the
    factor D / D' (the trainer's guard relies on it)."""
    choose(_NUMERATORS, aggregation, "aggregation")
    if aggregation == "token-mean":
        return num_tokens
    if aggregation == "seq-mean-token-mean":
        return num_sequences
    if max_tokens is None or max_tokens <= 0:
        raise ValueError(f"max_tokens ({max_tokens}) must be > 0 for 'seq-mean-token-sum-norm' (Dr.GRPO divides "
                         "by the generation budget): pass the rollout's max_new_tokens")
    return num_sequences * max_tokens


def aggregate(per_token_loss: Tensor, mask: Tensor, aggregation: Aggregation = "seq-mean-token-mean", *,
              max_tokens: int | None = None, num_sequences: int | None = None,
              num_tokens: int | None = None) -> Tensor:
    """The scalar loss L of the module docstring.

    per_token_loss: (N, T), or (N, 1) broadcast over tokens; mask: (N, T). num_sequences / num_tokens: the whole
    batch's totals under micro-batching (default: this call's own N and M, clamped to >= 1).
    """
    numerator = choose(_NUMERATORS, aggregation, "aggregation")
    for name, value in (("num_sequences", num_sequences), ("num_tokens", num_tokens)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} ({value}) must be > 0: it is the whole batch's total")
    mask = mask.bool()
    token_sums = torch.where(mask, per_token_loss, 0.0).sum(-1)  # (N,)
    lengths = mask.sum(-1)  # (N,)
    num_sequences = max(len(lengths), 1) if num_sequences is None else num_sequences
    num_tokens = lengths.sum().clamp(min=1) if num_tokens is None else num_tokens
    return numerator(token_sums, lengths) / normaliser(aggregation, num_sequences=num_sequences,
                                                       num_tokens=num_tokens, max_tokens=max_tokens)
