"""Child processes that cannot outlive their parent (Linux: PR_SET_PDEATHSIG).

A launcher killed with SIGKILL (a test timeout, the OOM killer) runs no cleanup; without
this its embedded redis-server and service children would be left running. The death
signal is delivered when the *thread* that started the child exits, so start children
from a thread that lives as long as they should.
"""
import ctypes
import ctypes.util
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl if sys.platform == "linux" else None


def die_with_parent() -> None:
    """A `preexec_fn` for subprocess.Popen: SIGTERM this child when its parent dies."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
