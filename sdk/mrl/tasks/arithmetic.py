"""Multi-digit arithmetic: "What is a ∘ b?", level L = digits per operand.

    a, b ~ U[lo, 10^L − 1]        lo = 0 at L = 1, else 10^(L−1) (exactly L digits)
    ∘    ~ U(OPS[L])              L1–L2: "+" only (the learning demo trains SmolLM2-135M on 2-digit
                                  addition, docs/results/smollm2-arithmetic.md); L3: "+", "-"; L ≥ 4: "+", "-", "*"
    answer = a ∘ b                an integer, negative when b > a under "-"

Checked by the shared numeric verifier (base.final_number).
"""
import operator
import random

from mrl.tasks.base import NumericTask

__all__ = ["ArithmeticTask"]

_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _ops(level: int) -> str:
    return "+" if level <= 2 else "+-" if level == 3 else "+-*"


class ArithmeticTask(NumericTask):
    max_level = 9

    def _generate(self, rng: random.Random) -> tuple[str, str, dict]:
        lo, hi = (0 if self.level == 1 else 10 ** (self.level - 1)), 10 ** self.level - 1
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(_ops(self.level))
        return f"What is {a} {op} {b}?", str(_APPLY[op](a, b)), {"a": a, "b": b, "op": op}
