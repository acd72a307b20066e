"""Argument types shared by the launcher's commands: comma-separated lists that argparse refuses with exit 2."""
import argparse

__all__ = ["at_step", "floats", "ints"]


def _numbers(kind, example: str):
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated {kind.__name__}s, "
                                             f"e.g. {example}") from None
    return parse


floats, ints = _numbers(float, "1.0,0.7"), _numbers(int, "1,2,3")


def at_step(text: str) -> int | dict[str, int]:
    """`N` (every policy at step N) or `policy=N[,policy=N …]` (the named policies each at its own step)."""
    try:
        if "=" not in text:
            return int(text)
        steps = {}
        for part in text.split(","):
            policy, _, step = part.partition("=")
            if not policy or policy in steps:
                raise ValueError
            steps[policy] = int(step)
        return steps
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a step (16) or policy=step pairs, each policy once "
                                         f"(policy-a=16,policy-b=96)") from None
