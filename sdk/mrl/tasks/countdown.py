"""Countdown: reach a target with the given numbers, each used at most once, and + - * / ( ).

Generation, level L (so a solution always exists):

    n = L + 2 numbers ~ U[1, 10·L]
    repeat until one term is left: take two terms (u, v) at random and replace them by
        u + v  |  u − v (larger first, u ≠ v)  |  u · v  |  u / v (v > 1, v divides u)
    target = the last term, kept iff 1 ≤ target ≤ MAX_TARGET and target is not a given number
    answer = the expression that built it, with only the parentheses it needs, e.g. "(7 - 3) * 9"

Verification, exact and safe:
  1. the expression: the answer region (base.answer_region), else the last line that holds a
     binary expression; only the text before its first "=" counts ("(7 - 3) * 9 = 36").
     ×, ÷, −, ·, \\times, \\div and \\cdot are read as * / - *.
  2. the text must be at most MAX_EXPRESSION_CHARS of digits, spaces, + - * / ( ), and its `ast`
     may hold only int literals, binary + - * /, unary minus and parentheses (no **, //, names,
     calls or attributes: nothing is ever evaluated by Python);
  3. the multiset of literals used ⊆ the multiset of given numbers;
  4. the value, computed with fractions.Fraction (division is exact; by zero scores 0), == target.
"""
import ast
import operator
import random
import re
from collections import Counter
from fractions import Fraction

from mrl.tasks.base import Problem, ProceduralTask, answer_region

__all__ = ["CountdownTask"]

MAX_TARGET = 1000
MAX_EXPRESSION_CHARS = 200   # bounds ast depth and work; a real answer is far shorter

_SYMBOLS = {"×": "*", "÷": "/", "−": "-", "·": "*", "\\times": "*", "\\div": "/", "\\cdot": "*"}
_ALLOWED_CHARS = re.compile(r"[\d\s+\-*/()]+")
_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def parse_expression(text: str) -> ast.expr | None:
    """Steps 1–2: the safe arithmetic tree of the text before its first "=", or None."""
    for symbol, ascii_op in _SYMBOLS.items():
        text = text.replace(symbol, ascii_op)
    text = text.partition("=")[0].strip()
    if not text or len(text) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(text):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return tree if _is_arithmetic(tree) else None


def _is_arithmetic(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub) and _is_arithmetic(node.operand)
    if isinstance(node, ast.BinOp):
        return type(node.op) in _SYMBOL and _is_arithmetic(node.left) and _is_arithmetic(node.right)
    return False


def _evaluate(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return -_evaluate(node.operand)
    return _APPLY[_SYMBOL[type(node.op)]](_evaluate(node.left), _evaluate(node.right))


def _literals(node: ast.expr) -> list[int]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]


class CountdownTask(ProceduralTask):
    max_level = 5
    answer_noun = "expression"

    def _generate(self, rng: random.Random) -> tuple[str, str, dict] | None:
        numbers = [rng.randint(1, 10 * self.level) for _ in range(self.level + 2)]
        terms = [(Fraction(n), str(n)) for n in numbers]   # (value, expression)
        while len(terms) > 1:
            (u, eu), (v, ev) = terms.pop(rng.randrange(len(terms))), terms.pop(rng.randrange(len(terms)))
            if u < v:
                (u, eu), (v, ev) = (v, ev), (u, eu)
            ops = ["+", "*"] + (["-"] if u != v else []) + (["/"] if v > 1 and u % v == 0 else [])
            op = rng.choice(ops)
            terms.append((_APPLY[op](u, v), f"({eu} {op} {ev})"))
        target, expression = terms[0]
        if not 1 <= target <= MAX_TARGET or target in numbers:
            return None
        question = (f"Using the numbers {numbers}, write an arithmetic expression that equals {target}. "
                    f"Use +, -, *, / and parentheses; each number may be used at most once.")
        return question, ast.unparse(ast.parse(expression, mode="eval")), {"numbers": numbers, "target": int(target)}

    def _expression(self, response: str) -> ast.expr | None:
        """Step 1: the answer region's expression, else the last line's binary expression."""
        region = answer_region(response)
        tree = parse_expression(region) if region is not None else None
        if tree is not None:
            return tree
        for line in reversed(response.splitlines()):
            tree = parse_expression(line)
            if isinstance(tree, ast.BinOp):
                return tree
        return None

    def extract(self, problem: Problem, response: str) -> str | None:
        tree = self._expression(response)
        return None if tree is None else ast.unparse(tree)

    def _check(self, problem: Problem, response: str) -> bool:
        tree = self._expression(response)
        if tree is None or Counter(_literals(tree)) - Counter(problem.meta["numbers"]):
            return False
        try:
            return _evaluate(tree) == problem.meta["target"]
        except ZeroDivisionError:
            return False
