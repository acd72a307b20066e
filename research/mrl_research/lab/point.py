"""The testbed's axes (a sweep point) and its fixed settings; light to import (the CLI reads the defaults).

    gap          competence gap: share of the C contexts where exactly one policy is strong (half each way);
                 the rest half strong for both, half weak for both
    overlap      support overlap: share of b's answer mass written in a's format (plain "37"); the rest signed
                 ("+37"), which a's initial policy almost never writes (and b's initial policy writes plain
                 answers only with this weight)
    staleness    the peer experience a policy receives at step t was sampled by the peer's version t − k
    tokenizers   a's / b's tokenizer ids: different (gpt2 / mistral-v1: THL retokenizes) or the same
    group_size   G, own samples per context and step
    interference β: weight of a logit table shared by all contexts (0: none, each context its own table;
                 > 0: an update on one context moves the others, so a peer's format can drag a receiver)
    speed        a's steps per step of b under the async coupling (sharing.coupling: async); lockstep runs
                 both at one pace whatever it is
"""
import math
import os
from dataclasses import dataclass, replace

from mrl.errors import InvalidArgument

__all__ = ["Point", "Settings", "sweep_points", "default_workers"]


@dataclass(frozen=True)
class Point:
    """One sweep point: the axes of the testbed."""
    gap: float = 0.5                     # competence gap: share of contexts where exactly one policy is strong
    overlap: float = 0.5                 # support overlap: share of b's answer mass in a's (plain) format
    staleness: int = 0                   # peer experience from this many steps ago
    tokenizers: str = "gpt2/mistral-v1"  # a's / b's tokenizer ("gpt2/gpt2": no mismatch)
    group_size: int = 8                  # G
    interference: float = 0.0            # β, the shared table's weight (0: contexts independent)
    speed: int = 1                       # async: a's steps per step of b

    def __post_init__(self):
        _check(0 <= self.gap <= 1, "gap", self.gap, "a share of the contexts, in [0, 1]")
        _check(0 <= self.overlap <= 1, "overlap", self.overlap, "a share of b's answer mass, in [0, 1]")
        _check(self.staleness >= 0, "staleness", self.staleness, "steps ago, >= 0")
        _check(len(self.tokenizers.split("/")) == 2 and all(self.tokenizers.split("/")), "tokenizers",
               self.tokenizers, "a's and b's tokenizer ids, a/b (e.g. gpt2/mistral-v1)")
        _check(self.group_size >= 2, "group_size", self.group_size, "samples per context, >= 2")
        _check(0 <= self.interference < math.inf, "interference", self.interference, "a weight, >= 0")
        _check(self.speed >= 1, "speed", self.speed, "a's steps per step of b, >= 1")


@dataclass(frozen=True)
class Settings:
    """Everything else (fixed across the sweep)."""
    contexts: int = 8
    prompts_per_step: int = 4
    steps: int = 32
    eval_every: int = 4
    lr: float = 0.15
    max_new_tokens: int = 5
    micro_batch_tokens: int = 512
    probes: int = 4                      # R batches per gradient probe
    probe_at: tuple = (0.0, 0.5)         # probe steps, as fractions of `steps`
    p_strong: float = 0.5
    p_weak: float = 0.02
    p_distract: float = 0.5
    noise: float = 0.3

    def __post_init__(self):
        for name in ("contexts", "prompts_per_step", "steps", "eval_every", "max_new_tokens", "micro_batch_tokens"):
            _check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        _check(0 < self.lr < math.inf, "lr", self.lr, "a learning rate, > 0")
        for name in ("p_strong", "p_weak", "p_distract"):        # a favoured mass over 0.99 is scaled to 0.99
            _check(0 <= getattr(self, name) <= 1, name, getattr(self, name), "a probability, in [0, 1]")
        _check(0 <= self.noise < math.inf, "noise", self.noise, ">= 0")


def _check(ok: bool, name: str, value, expected: str) -> None:
    if not ok:
        raise InvalidArgument(f"{name} {value!r}: expected {expected}")


def sweep_points(base: Point) -> list[Point]:
    """The default point, then one axis at a time around it."""
    variations = [("gap", (0.0, 1.0)), ("overlap", (0.0, 1.0)), ("staleness", (2, 4)),
                  ("tokenizers", ("gpt2/gpt2",)), ("group_size", (4, 16)),
                  ("interference", (3.0, 10.0))]
    points = [base]
    for name, values in variations:
        points += [replace(base, **{name: v}) for v in values if v != getattr(base, name)]
    return points


def default_workers() -> int:
    """Every core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
