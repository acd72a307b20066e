"""Problems, tasks, the task spec and the final-answer extraction every family shares.

Determinism. A problem is a pure function of (task name, seed, split, index):

    prompt_id = f"{name}:{split}:{seed}:{index}"          e.g. "arithmetic-L2:train:0:17"
    rng       = random.Random(int(BLAKE2b-64(prompt_id)))  never Python's hash(), which is salted per process

so every policy and process that builds the same TaskSpec sees the same problem under the same id.

Splits are disjoint by content, not only by seed: a question is in the eval split iff

    int(BLAKE2b-64(question)) mod EVAL_BUCKETS == 0        (~10% of all questions)

and a procedural generator redraws from the same rng until its question lands in the requested
split, so no eval problem is ever trained on, even at a level with few distinct problems.

Final answers, lenient about where, exact about the value (docs/algorithms.md, "Tasks and verifiers"):
  1. the answer region: the first non-empty line after the last "Answer:" (any case), or, when
     there is none, the content of the last \\boxed{...} (a \\boxed{} inside the line wins too);
  2. numeric answers: in the region, the first number after its last "=" ("Answer: 23 + 34 = 57."
     → 57); without a region (or no number in it), the LAST number of the response, because a
     model restates the operands first.
Numbers may have thousands commas, a decimal part and a sign ("-" or "−"; a "-" right after a
letter, digit or ")" is an operator, not a sign); a trailing period is ignored. Garbage has no
number and scores 0; nothing a response contains can make a verifier raise.
"""
import abc
import hashlib
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mrl.errors import FailedPrecondition

__all__ = ["Family", "Split", "AnswerFormat", "TaskError", "TaskSpec", "Problem", "Task", "ProceduralTask",
           "check_split", "seeded_rng", "split_of", "last_boxed", "answer_region", "final_number"]

Family = Literal["arithmetic", "countdown", "linear", "jsonl", "mixture"]
Split = Literal["train", "eval"]
AnswerFormat = Literal["answer", "boxed"]

EVAL_BUCKETS = 10       # 1 in EVAL_BUCKETS questions is held out for eval
MAX_DRAWS = 1000        # redraws before a procedural task gives up (P(miss eval) = 0.9^1000 when it can)
MAX_NUMBER_CHARS = 100  # longer digit runs are not answers (and int() refuses > 4300 digits)

_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)
_NUMBER = re.compile(r"(?:(?<![\w)])[-−])?\d+(?:,\d{3})*(?:\.\d+)?")


class TaskError(FailedPrecondition):
    """A bad task spec or data file, or a verifier that broke (never a wrong or garbled response)."""


class TaskSpec(BaseModel):
    """One verifiable task: a procedural family at a level, or a JSONL file (family "jsonl"); a key it does not know,
    or a number that is inf or NaN, is an error that names it (as every section of a trainer config)."""
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    family: Family = Field(description="arithmetic | countdown | linear (procedural, infinite) | jsonl (a file) | "
                                       "mixture (the problems of `parts`, interleaved).")
    level: int = Field(1, ge=1, description="Difficulty; each family documents what it scales (jsonl: 1 only).")
    seed: int = Field(0, description="Picks the problem stream (procedural) or the row order (jsonl); policies "
                                     "that co-train must share it to see the same prompts at the same step.")
    path: str | None = Field(None, description="jsonl only: the GSM8K/MATH-style JSONL file.")
    parts: "list[TaskSpec] | None" = Field(None, description="mixture only: two or more procedural tasks (family "
                                                             "and level; seed and answer format are the mixture's), "
                                                             "e.g. [{family: arithmetic, level: 2}, {family: linear}].")
    answer_format: AnswerFormat = Field("answer", description="The format the question asks for: "
                                                              "answer: a last line 'Answer: ...'; boxed: \\boxed{...}. "
                                                              "Verifiers accept both.")

    @model_validator(mode="after")
    def _path_iff_jsonl(self):
        if self.family == "jsonl" and not self.path:
            raise ValueError("family 'jsonl' needs path: the JSONL file of questions and answers")
        if self.family != "jsonl" and self.path is not None:
            raise ValueError(f"path is only for family 'jsonl'; remove it for the procedural family {self.family!r}")
        if self.family == "mixture":
            if not self.parts or len(self.parts) < 2:
                raise ValueError("family 'mixture' needs parts: two or more tasks, e.g. "
                                 "[{family: arithmetic, level: 2}, {family: linear, level: 1}]")
            if self.level != 1:
                raise ValueError("a mixture has no level of its own: give each part its level")
            for part in self.parts:
                if part.family in ("mixture", "jsonl"):
                    raise ValueError(f"a mixture's parts are procedural tasks; {part.family!r} cannot be one")
                if part.seed != 0 or part.answer_format != "answer":
                    raise ValueError("a mixture's parts take its seed and answer format: set them on the mixture")
        elif self.parts is not None:
            raise ValueError(f"parts is only for family 'mixture'; remove it for {self.family!r}")
        return self


@dataclass(frozen=True)
class Problem:
    prompt_id: str   # global and deterministic: f"{task.name}:{split}:{seed}:{index}"
    question: str    # the user message, including the answer-format instruction
    answer: str      # the canonical reference answer
    meta: dict = field(default_factory=dict)  # JSON-serialisable data the verifier needs


def check_split(split: str) -> None:
    if split not in get_args(Split):
        raise TaskError(f"unknown split {split!r}: valid splits are {', '.join(get_args(Split))}")


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def seeded_rng(key: str) -> random.Random:
    return random.Random(_digest(key))


def split_of(question: str) -> Split:
    return "eval" if _digest(question) % EVAL_BUCKETS == 0 else "train"


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces balanced; None if there is none or it is unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    begin, depth = start + len("\\boxed{"), 0
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[begin:i]
            depth -= 1
    return None


def answer_region(response: str) -> str | None:
    """Step 1 of the module docstring: where the final answer was put, stripped of markup; None if nowhere."""
    matches = list(_ANSWER.finditer(response))
    if matches:
        line = next((ln for ln in response[matches[-1].end():].splitlines() if ln.strip()), "")
        region = last_boxed(line) or line
    else:
        region = last_boxed(response)
    if region is None:
        return None
    return region.strip().strip("*`$ ").rstrip(".").strip() or None


def _to_fraction(number: str) -> Fraction | None:
    number = number.replace(",", "").replace("−", "-")
    return Fraction(number) if len(number) <= MAX_NUMBER_CHARS else None


def final_number(response: str) -> Fraction | None:
    """Step 2 of the module docstring: the response's final numeric answer, exactly; None if it has none."""
    region = answer_region(response)
    if region is not None:
        numbers = _NUMBER.findall(region.rpartition("=")[2])
        if numbers:
            return _to_fraction(numbers[0])
    numbers = _NUMBER.findall(response)
    return _to_fraction(numbers[-1]) if numbers else None


class Task(abc.ABC):
    """A deterministic stream of problems with an exact verifier; reward ∈ {0, 1}."""

    max_level: int = 1           # valid levels are 1..max_level
    answer_noun: str = "number"  # the placeholder in 'Answer: <...>'

    def __init__(self, name: str, seed: int, answer_format: AnswerFormat):
        self.name, self.seed, self.answer_format = name, seed, answer_format

    @abc.abstractmethod
    def size(self, split: Split = "train") -> int | None:
        """Distinct problems in the split; None for an infinite procedural stream."""

    @abc.abstractmethod
    def problem(self, index: int, split: Split = "train") -> Problem:
        """The index-th problem of the split: a pure function of (name, seed, split, index)."""

    @abc.abstractmethod
    def extract(self, problem: Problem, response: str) -> str | None:
        """The final answer the verifier reads in the response (for logs and peers); None if none."""

    @abc.abstractmethod
    def _check(self, problem: Problem, response: str) -> bool:
        """True iff the response solves the problem; must not raise on any response."""

    def batch(self, step: int, batch_size: int, split: Split = "train") -> list[Problem]:
        """Problems step·batch_size … (step+1)·batch_size − 1 of the split (finite datasets wrap)."""
        if step < 0 or batch_size < 1:
            raise TaskError(f"batch(step={step}, batch_size={batch_size}): step must be >= 0 and batch_size >= 1")
        return [self.problem(step * batch_size + i, split) for i in range(batch_size)]

    def find(self, prompt_id: str) -> Problem | None:
        """The training problem a prompt id names, or None when it is not one of this task's training ids (another
        task, seed or split, or no index): a peer's prompt id is only ever a key into this task's own problems."""
        prefix = self._prompt_id(0, "train")[:-1]
        index = prompt_id[len(prefix):] if prompt_id.startswith(prefix) else ""
        if not (index.isascii() and index.isdigit() and len(index) <= 15 and str(int(index)) == index):
            return None
        try:
            return self.problem(int(index), "train")
        except TaskError:        # e.g. a procedural index with no training problem: not one of this task's
            return None

    def reward(self, problem: Problem, response: str) -> float:
        """1.0 if the response solves the problem, else 0.0; TaskError only if the verifier itself breaks."""
        if not isinstance(response, str):
            raise TaskError(f"the response to {problem.prompt_id} is a {type(response).__name__}, not a str")
        try:
            return 1.0 if self._check(problem, response) else 0.0
        except TaskError:
            raise
        except Exception as exc:
            raise TaskError(f"the verifier of {self.name} broke on {problem.prompt_id} ({type(exc).__name__}: "
                            f"{exc}); the problem or the task is corrupt, not the response") from exc

    def pose(self, body: str) -> str:
        """The question text: the body, then the fixed answer-format instruction."""
        if self.answer_format == "boxed":
            return f"{body} Put the final answer in \\boxed{{}}."
        return f"{body} Give the final answer on the last line as 'Answer: <{self.answer_noun}>'."

    def _prompt_id(self, index: int, split: Split) -> str:
        check_split(split)
        if not isinstance(index, int) or index < 0:
            raise TaskError(f"problem index {index!r} must be an int >= 0")
        return f"{self.name}:{split}:{self.seed}:{index}"


class ProceduralTask(Task):
    """An infinite generated stream of problems drawn by `_generate`."""

    def __init__(self, spec: TaskSpec):
        super().__init__(f"{spec.family}-L{spec.level}", spec.seed, spec.answer_format)
        self.level = spec.level

    @abc.abstractmethod
    def _generate(self, rng: random.Random) -> tuple[str, str, dict] | None:
        """(question body, answer, meta) drawn from rng, or None to draw again."""

    def size(self, split: Split = "train") -> None:
        return None

    def problem(self, index: int, split: Split = "train") -> Problem:
        prompt_id = self._prompt_id(index, split)
        rng = seeded_rng(prompt_id)
        for _ in range(MAX_DRAWS):
            drawn = self._generate(rng)
            if drawn is not None and split_of(drawn[0]) == split:
                body, answer, meta = drawn
                return Problem(prompt_id, self.pose(body), answer, meta)
        raise TaskError(f"{self.name} drew no {split} problem in {MAX_DRAWS} tries: the level has too few "
                        f"distinct problems; use a higher level")


class NumericTask(ProceduralTask):
    """A procedural task whose answer is one number, read by final_number and compared exactly."""

    def extract(self, problem: Problem, response: str) -> str | None:
        value = final_number(response)
        return None if value is None else str(value)

    def _check(self, problem: Problem, response: str) -> bool:
        return final_number(response) == Fraction(problem.answer)
