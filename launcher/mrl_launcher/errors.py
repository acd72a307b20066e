"""The launcher's errors: what `mrl up`, `mrl experiment` and the reports raise (the CLI prints them).

    LauncherError   (InvalidArgument) a bad topology, metrics file or option; the message says what to do
    RunFailed       a run that did not complete: trainers that failed, a service that exited, a stop

The `mrl` command exits 1 on either, as the launcher always has.
"""
from mrl.errors import InvalidArgument, MrlError

__all__ = ["LauncherError", "RunFailed"]


class LauncherError(InvalidArgument):
    """A topology, metrics file or option that cannot be used, with what to do about it."""
    exit_code = 1


class RunFailed(MrlError):
    """A run that did not complete: its trainers failed (their logs say why), a service exited, or a stop."""
    exit_code = 1
