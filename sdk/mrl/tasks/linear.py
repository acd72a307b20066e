"""Linear equations: "Solve for x: a·x + b = c", with an integer solution x.

Level L, m = 10^L − 1:

    x ~ U[0, m] at L1, else U[−m, m]
    a ~ U[1, L + 2], negated with probability 1/2 for L ≥ 2
    b ~ U[0, m] at L1, else U[−m, m]
    c = a·x + b                     answer = x

Written as a person would: "x + 4 = 13", "3x - 4 = 17", "-2x = 8". Checked by the shared
numeric verifier (base.final_number), so "x = 7" and "Answer: 7" both read 7.
"""
import random

from mrl.tasks.base import NumericTask

__all__ = ["LinearTask"]


def _equation(a: int, b: int, c: int) -> str:
    ax = "x" if a == 1 else "-x" if a == -1 else f"{a}x"
    plus_b = "" if b == 0 else f" + {b}" if b > 0 else f" - {-b}"
    return f"{ax}{plus_b} = {c}"


class LinearTask(NumericTask):
    max_level = 6

    def _generate(self, rng: random.Random) -> tuple[str, str, dict]:
        m = 10 ** self.level - 1
        lo = 0 if self.level == 1 else -m
        x, a, b = rng.randint(lo, m), rng.randint(1, self.level + 2), rng.randint(lo, m)
        if self.level >= 2 and rng.random() < 0.5:
            a = -a
        c = a * x + b
        return f"Solve for x: {_equation(a, b, c)}.", str(x), {"a": a, "b": b, "c": c}
