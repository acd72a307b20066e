"""Pick a variant from a registry keyed by its `Literal` name; an unknown name raises with the valid choices."""
from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


def choose(registry: Mapping[str, T], name: str, what: str) -> T:
    """registry[name], or ValueError naming `what`, the bad name and every valid choice."""
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; valid choices: {', '.join(map(repr, registry))}") from None
