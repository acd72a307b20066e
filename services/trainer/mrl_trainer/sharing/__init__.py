"""Sharing modes: how a policy turns its peers' experience into loss terms (DESIGN.md §5).

    none    solo GRPO / GSPO                                      takes nothing
    prp     Peer Rollout Pooling: pooled group, truncated ρ       takes rollout
    xgrpo   Cross-Policy GRPO: baseline pooled with group_stats   takes group_stats
    sgt     Success-Gated Transfer: λ·NLL of re-verified rescues  takes success
    hacpo   HACPO: capability-weighted baseline, GSPO + clipped
            exponential IS on peer samples                        takes rollout, policy_stats

Each policy chooses its mode in its own config (`sharing:`), so one run can mix modes. Every
policy publishes all four kinds whatever its mode. Coordination (trainer.py, peers.py): prompts
by global id; at step t a policy waits at most `peer_wait_s` for its peers' experience of its
batch, then goes on with what arrived; experience older than `max_staleness` versions is dropped.
"""
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mrl_trainer.sharing.base import Extra, PeerBatch, PeerSample, Plan, SharingMode, Verifier
from mrl_trainer.sharing.hacpo import HACPO, HACPOConfig
from mrl_trainer.sharing.none import NoSharing
from mrl_trainer.sharing.prp import PRP, PRPConfig
from mrl_trainer.sharing.sgt import SGT, SGTConfig
from mrl_trainer.sharing.xgrpo import XGRPO

__all__ = ["SharingConfig", "AlignConfig", "SHARING_MODES", "make_sharing", "Extra", "PeerBatch", "PeerSample",
           "Plan", "SharingMode", "Verifier"]

SharingName = Literal["none", "prp", "xgrpo", "sgt", "hacpo"]
SHARING_MODES: dict[str, type[SharingMode]] = {m.name: m for m in (NoSharing, PRP, XGRPO, SGT, HACPO)}


class AlignConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str = Field(description="host:port of the tokenizer alignment service (THL).")
    token: str | None = Field(None, description="Bearer token (default: the exchange's token, or env MRL_TOKEN).")


class SharingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: SharingName = Field("none", description="none | prp | xgrpo | sgt | hacpo.")
    peers: list[str] = Field(default_factory=list, description="Policies whose experience is used and waited for "
                                                               "([]: any producer; wait for at least one).")
    peer_wait_s: float = Field(30.0, ge=0, le=3600, description="At step t, wait at most this long for the peers' "
                                                                "experience of this batch, then go on without.")
    max_staleness: int = Field(1, ge=0, description="Drop peer experience whose policy version is below "
                                                    "(own step − max_staleness).")
    align: AlignConfig | None = Field(None, description="THL, to retokenize peers whose tokenizer differs.")
    prp: PRPConfig = PRPConfig()
    sgt: SGTConfig = SGTConfig()
    hacpo: HACPOConfig = HACPOConfig()


def make_sharing(sharing: SharingConfig, loss) -> SharingMode:
    return SHARING_MODES[sharing.mode](sharing, loss)
