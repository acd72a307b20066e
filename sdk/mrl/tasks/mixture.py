"""A skill mixture: the problems of K procedural tasks (its `parts`), interleaved under one prompt id space.

    name     "mixture-" + "-".join(part names)       e.g. mixture-arithmetic-L2-linear-L1
    problem  index i of a split is problem ⌊i / K⌋ of part i mod K in that split, under the mixture's id
             f"{name}:{split}:{seed}:{i}"; its question, answer and verifier are the part's, and meta["part"]
             names the part (so accuracy can be read per part)

Every part is drawn with the mixture's seed and answer format, so the spec holds one of each; a step's batch of
P prompts takes about P / K from each part. A mixture is what a controlled complementarity is built on: policies
warm-started on different parts (warm_start.task), then RL-trained on the whole.
"""
from mrl.tasks.base import Problem, Split, Task, TaskError, TaskSpec

__all__ = ["MixtureTask"]


class MixtureTask(Task):
    def __init__(self, spec: TaskSpec, parts: list[Task]):
        super().__init__("mixture-" + "-".join(part.name for part in parts), spec.seed, spec.answer_format)
        self.parts = parts
        self._by_name = {part.name: part for part in parts}
        if len(self._by_name) != len(parts):
            raise TaskError(f"task.parts names a task twice ({', '.join(p.name for p in parts)}): give each part once")

    def size(self, split: Split = "train") -> None:
        return None

    def problem(self, index: int, split: Split = "train") -> Problem:
        prompt_id = self._prompt_id(index, split)
        part = self.parts[index % len(self.parts)]
        inner = part.problem(index // len(self.parts), split)
        return Problem(prompt_id, inner.question, inner.answer, {**inner.meta, "part": part.name})

    def part_of(self, problem: Problem) -> Task:
        """The part a mixture problem was drawn from."""
        part = self._by_name.get(problem.meta.get("part"))
        if part is None:
            raise TaskError(f"{problem.prompt_id} names no part of {self.name} (meta {problem.meta})")
        return part

    def extract(self, problem: Problem, response: str) -> str | None:
        return self.part_of(problem).extract(problem, response)

    def _check(self, problem: Problem, response: str) -> bool:
        return self.part_of(problem)._check(problem, response)
