"""none — solo GRPO / GSPO: no peer experience is used (the base SharingMode)."""
from pydantic import BaseModel, ConfigDict

from mrl_trainer.sharing.base import SharingMode

__all__ = ["NoSharing", "NoSharingConfig"]


class NoSharingConfig(BaseModel):
    """none has no knobs."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class NoSharing(SharingMode):
    name = "none"
    title = "none — solo GRPO / GSPO"
    kinds = ()
    Config = NoSharingConfig
    stats = {}
