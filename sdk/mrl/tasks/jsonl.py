"""GSM8K / MATH-style JSONL datasets, checked with math-verify.

Each non-blank line is a JSON object with
    the question   "question" or "problem"
    the reference  "answer": GSM8K style when it holds "####" (the final answer follows the last
                   "####"), else the whole field (a string or a number); or "solution": MATH
                   style, the content of its last \\boxed{...}
A missing or unreadable file, invalid JSON, a row without these fields or a file without rows
stop with a TaskError naming the file, the line and the fix.

Splits and order: row r is eval iff base.split_of(question_r) == "eval"; each split's rows are
permuted once by seeded_rng(f"{stem}:{split}:{seed}"), and index i is row perm[i mod n_split]
(epochs wrap). prompt_id = f"{stem}:{split}:{seed}:{index}"; meta = {"line": 1-based line number}.

Verification (math_verify 0.9):
    gold   = parse("$reference$")                              cached per reference
    pred   = for an answer region (base.answer_region): parse("$region$") if it looks like LaTeX
             (has \\, ^ or {), else parse(region) ("18 dollars" → 18), else, if that finds
             nothing, parse("$region$") ("(1,2)"); without a region: parse(response), math-verify
             finding the answer itself (\\boxed, "final answer is", the last number).
             Either text is cut to its last MAX_TEXT_CHARS characters; a text whose brackets nest
             deeper than MAX_NESTING is no answer (the parsers' time grows steeply with depth).
    reward = verify(gold, pred)
math-verify bounds its work with signal.alarm, which works on the main thread only: there each
call gets TIMEOUT_S; on other threads timeouts are off (parsing_timeout=None, timeout_seconds=None).
On every thread a prediction holding a power or a factorial-like function of a number above
MAX_ARGUMENT is refused before comparing (9^{9^{9^9}} would otherwise compare for hours).
"""
import functools
import json
import pathlib
import threading
from dataclasses import dataclass
from typing import get_args

import sympy
from math_verify import parse, verify
from sympy.functions.combinatorial.factorials import CombinatorialFunction

from mrl.tasks.base import (EVAL_BUCKETS, Problem, Split, Task, TaskError, TaskSpec, answer_region, check_split,
                                    last_boxed, seeded_rng, split_of)

__all__ = ["JsonlTask"]

TIMEOUT_S = 5           # per math-verify parse / comparison, main thread only
MAX_TEXT_CHARS = 200    # the most of a response math-verify reads (its latex parser is superlinear)
MAX_ARGUMENT = 1000     # largest numeric exponent / factorial argument in a prediction
MAX_NESTING = 16        # deepest bracket nesting a prediction may have ("(" * 200 took 1.3 s to parse)
_LATEX_MARKS = ("\\", "^", "{")


@dataclass(frozen=True)
class _Row:
    line: int
    question: str
    answer: str


def _reference(obj: dict, where: str) -> str:
    if "answer" in obj:
        value = obj["answer"]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TaskError(f"{where}: 'answer' must be a string or a number, not {type(value).__name__}")
        reference = str(value).rpartition("####")[2]
    elif "solution" in obj:
        reference = last_boxed(obj["solution"]) if isinstance(obj["solution"], str) else None
        if reference is None:
            raise TaskError(f"{where}: 'solution' must be a string with the final answer in \\boxed{{...}}")
    else:
        raise TaskError(f"{where}: no reference answer; add 'answer' (plain, or GSM8K style '... #### 42') or "
                        f"'solution' (MATH style, with \\boxed{{...}}); the row has {sorted(obj)}")
    if not reference.strip():
        raise TaskError(f"{where}: the reference answer is empty")
    return reference.strip()


def _load(path: pathlib.Path) -> list[_Row]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise TaskError(f"task file {path} does not exist; set task.path to a JSONL file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"task file {path} cannot be read as UTF-8 text: {exc}") from exc
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(obj, dict):
            raise TaskError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        question = obj.get("question", obj.get("problem"))
        if not isinstance(question, str) or not question.strip():
            raise TaskError(f"{where}: no question; add a non-empty string 'question' or 'problem' "
                            f"(the row has {sorted(obj)})")
        rows.append(_Row(number, question.strip(), _reference(obj, where)))
    if not rows:
        raise TaskError(f"task file {path} has no rows; expected one JSON object per line with 'question' "
                        f"(or 'problem') and 'answer' (or 'solution')")
    return rows


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=1 << 16)
def _gold(reference: str) -> list:
    return parse(f"${reference}$", parsing_timeout=_timeout())


def _small(value: sympy.Basic) -> bool:
    if value.free_symbols:
        return True
    try:
        return bool(abs(value.evalf(8)) <= MAX_ARGUMENT)
    except (TypeError, ValueError, ArithmeticError):
        return False


def _tame(expr) -> bool:
    """False if comparing expr exactly could take unbounded time (huge powers or factorials)."""
    if not isinstance(expr, sympy.Basic):
        return True
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow) and not _small(node.exp):
            return False
        if isinstance(node, CombinatorialFunction) and not all(_small(arg) for arg in node.args):
            return False
    return True


def _nesting(text: str) -> int:
    """The deepest nesting of (, [ and { in text (closing brackets need not match)."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(0, depth - 1)
    return deepest


def _parse(text: str) -> list:
    """math-verify's parse of text; nothing if it nests too deep."""
    return [] if _nesting(text) > MAX_NESTING else parse(text, parsing_timeout=_timeout())


def _prediction(response: str) -> list:
    region = answer_region(response)
    if region is None:
        pred = _parse(response[-MAX_TEXT_CHARS:])
    else:
        region = region[-MAX_TEXT_CHARS:]
        pred = [] if any(mark in region for mark in _LATEX_MARKS) else _parse(region)
        pred = pred or _parse(f"${region}$")
    return pred if all(_tame(p) for p in pred) else []


class JsonlTask(Task):
    answer_noun = "answer"

    def __init__(self, spec: TaskSpec):
        self.path = pathlib.Path(spec.path)
        super().__init__(self.path.stem, spec.seed, spec.answer_format)
        rows = _load(self.path)
        self._rows: dict[str, list[_Row]] = {}
        for split in get_args(Split):
            self._rows[split] = [row for row in rows if split_of(row.question) == split]
            seeded_rng(f"{self.name}:{split}:{self.seed}").shuffle(self._rows[split])

    def size(self, split: Split = "train") -> int:
        check_split(split)
        return len(self._rows[split])

    def problem(self, index: int, split: Split = "train") -> Problem:
        prompt_id = self._prompt_id(index, split)
        rows = self._rows[split]
        if not rows:
            raise TaskError(f"task file {self.path} has no {split} rows (a row is held out for eval iff "
                            f"split_of(question) == 'eval', about 1 in {EVAL_BUCKETS}); add rows")
        row = rows[index % len(rows)]
        return Problem(prompt_id, self.pose(row.question), row.answer, {"line": row.line})

    def extract(self, problem: Problem, response: str) -> str | None:
        return next((p for p in _prediction(response) if isinstance(p, str)), None)

    def _check(self, problem: Problem, response: str) -> bool:
        pred = _prediction(response)
        return bool(pred) and verify(_gold(problem.answer), pred, timeout_seconds=_timeout())
