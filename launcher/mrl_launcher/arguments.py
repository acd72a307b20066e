"""Argument types shared by the launcher's commands: comma-separated lists that argparse refuses with exit 2."""
import argparse

__all__ = ["floats", "ints"]


def _numbers(kind, example: str):
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated {kind.__name__}s, "
                                             f"e.g. {example}") from None
    return parse


floats, ints = _numbers(float, "1.0,0.7"), _numbers(int, "1,2,3")
