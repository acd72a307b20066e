"""Verifiable tasks: procedural families and JSONL datasets, each with an exact verifier — what a lab needs to join
a run's task (its prompt ids, prompts, reference answers and verifier) without mrl's trainer: torch-free,
installed by `pip install "./sdk[trl]"` (or `./sdk[tasks]`); the trainer uses the same module.

    TaskError (mrl.errors.FailedPrecondition)   a bad spec or data file, or a broken verifier

Families (TASK_FAMILIES, keyed by the Literal `Family`):
    arithmetic   "What is a + b?", level = digits per operand           answer: an integer
    countdown    reach a target with L + 2 given numbers and + - * /    answer: an expression
    linear       "Solve for x: a·x + b = c", level = digits of x        answer: an integer
    jsonl        a GSM8K / MATH-style file, checked with math-verify    answer: any math-verify form
    mixture      the problems of two or more of the procedural ones,    answer: the part's
                 interleaved (mixture.py)

make_task(spec) validates a TaskSpec (or a dict of one) and builds its task; every problem is a
pure function of (name, seed, split, index) with prompt_id f"{name}:{split}:{seed}:{index}", so
policies that share the spec see the same prompts at the same step (base.py has the rules):

    task = make_task({"family": "linear", "level": 1, "seed": 0})
    for problem in task.batch(step, prompts_per_step):      # the run's step-t prompts, as every policy takes them
        problem.prompt_id, problem.question, problem.answer
        task.reward(problem, response)                      # 1.0 iff the response's final answer is right
"""
from pydantic import ValidationError

from mrl.tasks.arithmetic import ArithmeticTask
from mrl.tasks.base import Family, Problem, Split, Task, TaskError, TaskSpec
from mrl.tasks.countdown import CountdownTask
from mrl.tasks.jsonl import JsonlTask
from mrl.tasks.linear import LinearTask
from mrl.tasks.mixture import MixtureTask

__all__ = ["Family", "Split", "Problem", "Task", "TaskError", "TaskSpec", "TASK_FAMILIES", "make_task"]

TASK_FAMILIES: dict[Family, type[Task]] = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "linear": LinearTask,
    "jsonl": JsonlTask,
    "mixture": MixtureTask,
}


def make_task(spec: TaskSpec | dict) -> Task:
    """The task a spec describes; TaskError (naming the valid choices) for a bad spec or data file."""
    try:
        spec = TaskSpec.model_validate(spec)
    except ValidationError as exc:
        raise TaskError(f"invalid task spec: {exc}") from exc
    family = TASK_FAMILIES[spec.family]
    if spec.family == "mixture":
        parts = [make_task(part.model_copy(update={"seed": spec.seed, "answer_format": spec.answer_format}))
                 for part in spec.parts]
        return MixtureTask(spec, parts)
    if spec.level > family.max_level:
        raise TaskError(f"level {spec.level} is out of range for family {spec.family!r}: "
                        f"valid levels are 1..{family.max_level}")
    return family(spec)
