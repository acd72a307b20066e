"""The base of every section of a trainer config (its own, its model's, task's, warm start's, sharing mode's)."""
from pydantic import BaseModel, ConfigDict

__all__ = ["Section"]


class Section(BaseModel):
    """A config section: a key it does not know, or a number that is inf or NaN, is an error that names it."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
