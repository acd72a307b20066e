"""none — solo GRPO / GSPO: no peer experience is used (the base SharingMode)."""
from mrl_trainer.section import Section
from mrl_trainer.sharing.base import SharingMode

__all__ = ["NoSharing", "NoSharingConfig"]


class NoSharingConfig(Section):
    """none has no knobs."""


class NoSharing(SharingMode):
    name = "none"
    title = "none — solo GRPO / GSPO"
    kinds = ()
    Config = NoSharingConfig
    stats = {}
