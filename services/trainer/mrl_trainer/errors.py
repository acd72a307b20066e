"""The trainer's one error base: bad config, data or model, and a run that cannot go on.

    TrainerError          a clear message; `mrl trainer run` prints it and exits 2, the last
                          checkpoint left intact
"""
__all__ = ["TrainerError"]


class TrainerError(Exception):
    """A trainer problem a person can act on (the message says what and how)."""
