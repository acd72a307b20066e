"""Sharing modes: how a policy turns its peers' experience into loss terms (docs/algorithms.md).

    none    solo GRPO / GSPO                                      takes nothing
    prp     Peer Rollout Pooling: pooled group, truncated ρ       takes rollout
    xgrpo   Cross-Policy GRPO: baseline pooled with group_stats   takes group_stats
    sgt     Success-Gated Transfer: λ·NLL of re-verified rescues  takes success
    hacpo   HACPO: capability-weighted baseline, GSPO + clipped
            exponential IS on peer samples                        takes rollout, policy_stats

Each policy chooses its mode in its own config (`sharing:`), so one run can mix modes. Every
policy publishes all four kinds whatever its mode. Coordination (trainer.py, mrl.peers): prompts
by global id, in one of two couplings. lockstep: at step t a policy waits at most `peer_wait_s` for
its peers' experience of its batch, then goes on with what arrived. async: a policy never waits; it
uses what its peers have published for its batch's prompts, and up to `guided_share` (times the guard's trust) of a
batch are prompts its peers published. lockstep drops experience more than `max_staleness` versions behind its
own step; async drops a peer's groups more than `max_staleness` versions behind that peer's latest,
judged when the batch is chosen (a long rollout does not age them), and keeps verified successes however
old.

A mode describes itself in its class (name, title, kinds, Config, stats: see SharingMode) and is
registered in MODES; the `sharing:` config (SharingConfig), `mrl experiment compare` and the run
report are built from that registry. Adding a mode is one module and one line in MODES.
"""
from typing import Annotated, Literal, Union

from pydantic import Discriminator, Field, Tag, TypeAdapter, create_model, model_validator

from mrl_trainer.guard import Guard, GuardConfig
from mrl_trainer.section import Section

from mrl_trainer.sharing.base import Extra, PeerBatch, PeerSample, Plan, SharingMode, Verifier
from mrl_trainer.sharing.hacpo import HACPO
from mrl_trainer.sharing.none import NoSharing
from mrl_trainer.sharing.prp import PRP
from mrl_trainer.sharing.sgt import SGT
from mrl_trainer.sharing.xgrpo import XGRPO

__all__ = ["MODES", "SHARING_MODES", "COMMON_FIELDS", "mode_sections", "SharingConfig", "sharing_config", "AlignConfig", "Coordination",
           "STAT_SOURCES", "stat_labels", "make_sharing", "Extra", "PeerBatch", "PeerSample", "Plan", "SharingMode",
           "Verifier"]

MODES: tuple[type[SharingMode], ...] = (NoSharing, PRP, XGRPO, SGT, HACPO)
SHARING_MODES: dict[str, type[SharingMode]] = {m.name: m for m in MODES}


class Coordination:
    """Not a mode: the statistics the trainer logs, declared like a mode's, for every mode that takes peers'
    experience (peers.to_peer_batch; peer_guided and peer_recalled from Trainer.step; sgt_* from
    Trainer.rationalize): the wait for peers, what the async coupling dropped, chose and recalled, the THL
    residual of the retokenized responses, and SGT's rationalized rescues."""
    stats = {"peer_wait_s": "seconds waited for peers", "peers_complete": "fraction of peers in time",
             "peer_dropped": "peer experiences dropped as stale", "peer_guided": "prompts chosen from the peers'",
             "peer_recalled": "successes from the library", "thl_one_to_one": "THL share of 1:1 chunks", "thl_lossless": "THL share lossless",
             "thl_tokens_per_chunk": "THL tokens per chunk", "sgt_rationalized": "SGT prompts rationalized",
             "sgt_unrationalized": "SGT prompts whose hinted samples all failed",
             "sgt_rationalized_truncated": "SGT prompts rationalized only by responses cut at the limit"}
    figures = {"exchange": ("peer_wait_s", "peers_complete"),
               "coordination": ("peer_guided", "peer_dropped", "peer_recalled"),
               "thl": ("thl_one_to_one", "thl_lossless", "thl_tokens_per_chunk")}
    cumulative = frozenset({"peer_dropped", "peer_guided", "peer_recalled", "sgt_rationalized", "sgt_unrationalized",
                            "sgt_rationalized_truncated"})
    summary = {"thl_one_to_one": "mean THL 1:1 share"}


STAT_SOURCES = (*MODES, Coordination, Guard)    # everything that declares logged statistics, in report order


def stat_labels() -> dict[str, str]:
    """Every statistic the sharing modes and the coordination with peers log → its label."""
    return {key: label for source in STAT_SOURCES for key, label in source.stats.items()}


class AlignConfig(Section):
    target: str = Field(description="host:port of the tokenizer alignment service (THL).")
    token: str | None = Field(None, description="Bearer token (default: the exchange's token, or env MRL_TOKEN).")


class _Sharing(Section):
    """The fields of `sharing:` common to every mode."""
    mode: str
    peers: list[str] = Field(default_factory=list, description="Policies whose experience is used and waited for "
                                                               "([]: any producer; wait for at least one).")
    coupling: Literal["lockstep", "async"] = Field(
        "lockstep", description="lockstep: every policy trains on the same prompts at step t and waits up to "
                                "peer_wait_s for its peers' experience of them; async: no policy waits, each uses "
                                "what its peers have published for its batch's prompts (docs/algorithms.md).")
    peer_wait_s: float = Field(30.0, ge=0, le=3600, description="lockstep: at step t, wait at most this long for the "
                                                                "peers' experience of this batch, then go on without.")
    max_staleness: int = Field(1, ge=0, description="lockstep: drop peer experience whose policy version is below "
                                                    "(own step − max_staleness); async: drop a peer's group once "
                                                    "its version is below (that peer's latest − max_staleness), "
                                                    "judged when the batch is chosen.")
    guided_share: float = Field(0.5, ge=0, le=1, description="async: the most of a batch's prompts taken from those "
                                                             "the peers have published (their successes this "
                                                             "policy has not solved first), times the guard's "
                                                             "trust τ (guard.guidance); the rest follow the "
                                                             "task's own order.")
    window: int = Field(5, ge=1, description="K: steps in the capability window P̂ (the mean batch reward over the "
                                             "last K steps), published in policy_stats and HACPO's ω.")
    max_age_s: float = Field(0, ge=0, description="async: also drop a peer's group older than this (its created_at; "
                                                  "0: no age limit).")
    max_prompts: int = Field(4096, gt=0, description="async: the most prompts with peer experience kept in memory "
                                                     "(the least recently published go first).")
    align: AlignConfig | None = Field(None, description="THL, to retokenize peers whose tokenizer differs.")
    guard: GuardConfig = Field(default_factory=GuardConfig, description="The no-harm guard (on by default).")

    @model_validator(mode="before")
    @classmethod
    def _own_knobs_only(cls, value):
        """Another mode's knobs section is a mistake the config would otherwise hide: say which."""
        if isinstance(value, dict):
            mode = value.get("mode", "none")
            others = [k for k in value if k not in mode_sections(value, mode)]
            if others:
                raise ValueError(f"sharing.{others[0]} sets the knobs of mode {others[0]!r}, but sharing.mode is "
                                 f"{mode!r}: remove the section or change the mode")
        return value


COMMON_FIELDS: frozenset[str] = frozenset(_Sharing.model_fields) - {"mode"}   # the fields of every mode's `sharing:`


def _member(mode: type[SharingMode]) -> type[_Sharing]:
    """`sharing:` in this mode: the common fields, `mode: <name>`, and the mode's own knobs section (`sgt:` …)
    when it has knobs; another mode's section is an error (mode_sections drops them where an override changes
    the mode)."""
    own = {mode.name: (mode.Config, mode.Config())} if mode.Config.model_fields else {}
    return create_model(f"SharingConfig[{mode.name}]", __base__=_Sharing, __doc__=f"sharing: {mode.title}",
                        mode=(Literal[mode.name], Field(mode.name, description=mode.title)), **own)


def mode_sections(sharing: dict, mode: str) -> dict:
    """A `sharing:` mapping whose mode is being set to `mode` (an override, a compared arm), without the knobs
    sections of the other modes, which no longer apply."""
    return {k: v for k, v in sharing.items() if k == mode or k not in SHARING_MODES}


def _mode_of(value) -> str | None:
    """The discriminator: the `mode` of a `sharing:` mapping ("none" when it names none) or of a model."""
    return value.get("mode", "none") if isinstance(value, dict) else getattr(value, "mode", None)


SharingConfig = Annotated[
    Union[tuple(Annotated[_member(m), Tag(m.name)] for m in MODES)],
    Discriminator(_mode_of, custom_error_type="sharing_mode",
                  custom_error_message=f"sharing.mode must be one of the registered modes {', '.join(SHARING_MODES)}"),
]
_ADAPTER = TypeAdapter(SharingConfig)


def sharing_config(**fields) -> _Sharing:
    """A validated `sharing:` section, e.g. sharing_config(mode="sgt", sgt={"lam": 0.2}); mode none by default."""
    return _ADAPTER.validate_python(fields)


def make_sharing(sharing: _Sharing, loss) -> SharingMode:
    return SHARING_MODES[sharing.mode](sharing, loss)
