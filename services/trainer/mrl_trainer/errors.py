"""The trainer's one error: bad config, data or model, and a run that cannot go on.

    TrainerError          (an mrl.errors.MrlError) a clear message; `mrl trainer run` prints it and
                          exits 2, the last checkpoint left intact
"""
from mrl.errors import FailedPrecondition

__all__ = ["TrainerError"]


class TrainerError(FailedPrecondition):
    """A trainer problem a person can act on (the message says what and how)."""
