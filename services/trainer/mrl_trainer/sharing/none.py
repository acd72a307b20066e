"""none — solo GRPO / GSPO: no peer experience is used (the base SharingMode)."""
from mrl_trainer.sharing.base import SharingMode

__all__ = ["NoSharing"]


class NoSharing(SharingMode):
    name = "none"
