"""Typed experience: kinds, constructors and the validation every service applies.

An `Experience` (proto/mrl/v1/experience.proto) is an envelope — id, run, producer,
policy version, created time, schema version — around one payload of four kinds:

    kind           payload field   used by
    rollout        rollout         PRP, HACPO
    group_stats    group_stats     XGRPO, HACPO
    success        success         SGT
    policy_stats   policy_stats    HACPO, dashboards

`validate` is the single definition of a well-formed experience: the exchange rejects
what it rejects (INVALID_ARGUMENT, nothing appended) and the clients call it before
sending, so a bad experience fails where it was made.

`step_experiences` builds what one training step of a policy publishes, from plain groups
(`Group`): the mrl trainer and the TRL integration (mrl.integrations.trl) both call it, so
every trainer of a run publishes the same four kinds with the same fields:

    rollout        every sample: prompt, response, token ids, behaviour log-probs, reward, verdict
    group_stats    each prompt's G rewards
    success        each sample whose reward passed the policy's verifier (reward >= 1)
    policy_stats   the step's batch mean reward, capability P̂ over the last `window` steps, throughput

Experience ids are deterministic, `<policy>.<step>.<kind>.<i>`: a trainer that re-publishes a
step (resumed from a checkpoint) is deduplicated by the exchange (idempotent publish).
"""
import math
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from mrl.errors import InvalidArgument
from mrl.v1 import experience_pb2 as pb

__all__ = ["Kind", "KINDS", "NAME_MAX", "SCHEMA_VERSION", "kind_of", "kind_enum", "kind_name", "new_experience",
           "validate", "validate_name", "check_text_id", "Limits", "Response", "Group", "capability", "verdict",
           "step_experiences"]

SCHEMA_VERSION = 1

Kind = Literal["rollout", "group_stats", "success", "policy_stats"]
KINDS: tuple[Kind, ...] = get_args(Kind)
_ENUM_OF: dict[str, int] = {
    "rollout": pb.EXPERIENCE_KIND_ROLLOUT,
    "group_stats": pb.EXPERIENCE_KIND_GROUP_STATS,
    "success": pb.EXPERIENCE_KIND_SUCCESS,
    "policy_stats": pb.EXPERIENCE_KIND_POLICY_STATS,
}
_NAME_OF = {v: k for k, v in _ENUM_OF.items()}

# Names become parts of Redis keys and consumer-group names: no braces, colons or spaces.
NAME_MAX = 64  # characters of a run id or policy id
_NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX - 1}}}")
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
_MAX_TEXT_ID = 256


class Limits:
    """Size limits of one experience; the exchange's settings fill them."""

    def __init__(self, max_experience_bytes: int = 1 << 20, max_tokens: int = 65536):
        self.max_experience_bytes = max_experience_bytes
        self.max_tokens = max_tokens


def kind_of(exp: pb.Experience) -> Kind:
    """The kind name of an experience's payload; InvalidArgument when none is set."""
    which = exp.WhichOneof("payload")
    if which is None:
        raise InvalidArgument(
            f"experience {exp.experience_id!r} has no payload: set one of {', '.join(KINDS)} "
            f"(a payload of a newer schema than v{SCHEMA_VERSION} is unknown to this exchange)")
    return which


def kind_enum(kind: str) -> int:
    try:
        return _ENUM_OF[kind]
    except KeyError:
        raise InvalidArgument(f"unknown experience kind {kind!r}; valid kinds: {', '.join(KINDS)}") from None


def kind_name(kind_value: int) -> Kind:
    try:
        return _NAME_OF[kind_value]
    except KeyError:
        valid = ", ".join(pb.ExperienceKind.Name(v) for v in _NAME_OF)
        raise InvalidArgument(f"unknown experience kind {kind_value}; valid kinds: {valid}") from None


def validate_name(what: str, value: str) -> str:
    """Run ids, policy ids: 1-NAME_MAX of [A-Za-z0-9._-], starting with a letter or digit."""
    if not _NAME_RE.fullmatch(value):
        raise InvalidArgument(
            f"{what} {value!r} is not a valid name: use 1-{NAME_MAX} characters of letters, digits, '.', '_' "
            f"or '-', starting with a letter or digit")
    return value


def new_experience(run_id: str, producer: str, policy_version: int, payload, experience_id: str | None = None
                   ) -> pb.Experience:
    """An envelope around `payload` (a Rollout, GroupStats, VerifiedSuccess or PolicyStats)."""
    field = {pb.Rollout: "rollout", pb.GroupStats: "group_stats", pb.VerifiedSuccess: "success",
             pb.PolicyStats: "policy_stats"}.get(type(payload))
    if field is None:
        raise InvalidArgument(f"payload of type {type(payload).__name__} is not an experience kind")
    exp = pb.Experience(experience_id=experience_id or uuid.uuid4().hex, run_id=run_id, producer=producer,
                        policy_version=policy_version, schema_version=SCHEMA_VERSION)
    exp.created_at.FromNanoseconds(time.time_ns())
    getattr(exp, field).CopyFrom(payload)
    return exp


def _check_finite(where: str, values: Iterable[float]) -> None:
    if math.isfinite(sum(values)):  # fast path: finite sum => finite terms (an overflow falls through)
        return
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise InvalidArgument(f"{where}[{i}] is {v}: rewards, log-probs and statistics must be finite")


def check_text_id(where: str, value: str) -> None:
    """Prompt ids: 1-256 characters."""
    if not value or len(value) > _MAX_TEXT_ID:
        raise InvalidArgument(f"{where} must be 1-{_MAX_TEXT_ID} characters, got {len(value)}")


def _check_tokens(where: str, ids, limits: Limits) -> None:
    # Token ids are uint32 on the wire: a negative id cannot be expressed; the vocabulary bound is THL's.
    if len(ids) > limits.max_tokens:
        raise InvalidArgument(f"{where} has {len(ids)} token ids; at most {limits.max_tokens} are accepted")


def validate(exp: pb.Experience, limits: Limits = Limits()) -> Kind:
    """Raise InvalidArgument naming the first problem of `exp`; return its kind otherwise."""
    eid = exp.experience_id
    if not _ID_RE.fullmatch(eid):
        raise InvalidArgument(
            f"experience_id {eid!r} is missing or malformed: use 1-128 characters of letters, digits, "
            f"'.', '_', ':', '/' or '-' (a UUID hex is a good choice)")
    where = f"experience {eid}"
    validate_name(f"{where}: run_id", exp.run_id)
    validate_name(f"{where}: producer", exp.producer)
    if exp.schema_version != SCHEMA_VERSION:
        raise InvalidArgument(f"{where}: schema_version {exp.schema_version} is not supported; "
                              f"this exchange speaks schema_version {SCHEMA_VERSION}")
    if not exp.HasField("created_at"):
        raise InvalidArgument(f"{where}: created_at is not set")
    size = exp.ByteSize()
    if size > limits.max_experience_bytes:
        raise InvalidArgument(f"{where} is {size} bytes; the limit is {limits.max_experience_bytes} bytes "
                              f"(MRL_MAX_EXPERIENCE_BYTES)")
    kind = kind_of(exp)
    if kind == "rollout":
        r = exp.rollout
        check_text_id(f"{where}: rollout.prompt_id", r.prompt_id)
        _check_finite(f"{where}: rollout.reward", [r.reward])
        _check_tokens(f"{where}: rollout.token_ids", r.token_ids, limits)
        if r.logprobs and len(r.logprobs) != len(r.token_ids):
            raise InvalidArgument(f"{where}: rollout has {len(r.token_ids)} token_ids but {len(r.logprobs)} "
                                  f"logprobs; send one behaviour log-prob per token id, or none")
        _check_finite(f"{where}: rollout.logprobs", r.logprobs)
    elif kind == "group_stats":
        g = exp.group_stats
        check_text_id(f"{where}: group_stats.prompt_id", g.prompt_id)
        if not g.rewards:
            raise InvalidArgument(f"{where}: group_stats.rewards is empty; send one reward per sample")
        _check_finite(f"{where}: group_stats.rewards", g.rewards)
    elif kind == "success":
        s = exp.success
        check_text_id(f"{where}: success.prompt_id", s.prompt_id)
        _check_finite(f"{where}: success.reward", [s.reward])
        _check_tokens(f"{where}: success.token_ids", s.token_ids, limits)
    else:
        p = exp.policy_stats
        _check_finite(f"{where}: policy_stats", [p.batch_mean_reward, p.capability, p.rollouts_per_s,
                                                 p.tokens_per_s])
    return kind


@dataclass(frozen=True)
class Response:
    """One sampled response: its text, the token ids the policy generated, and their behaviour log-probs
    (log π_old(y_t | x, y_<t), one per id; empty if unknown)."""
    text: str
    token_ids: Sequence[int]
    logprobs: Sequence[float] = ()


@dataclass(frozen=True)
class Group:
    """One prompt of a step with its G responses, their rewards and the verifier's extracted answers
    (None: no answer could be extracted; "" when the verifier extracts none but judged the response)."""
    prompt_id: str
    prompt_text: str
    responses: Sequence[Response]
    rewards: Sequence[float]
    answers: Sequence[str | None]


def capability(batch_rewards: list[float], window: int) -> float:
    """P̂ = mean of the batch mean reward over the last `window` steps (current included)."""
    recent = batch_rewards[-window:]
    return sum(recent) / len(recent) if recent else 0.0


def verdict(reward: float, answer: str | None) -> int:
    """UNPARSEABLE without an answer, else CORRECT when the reward is 1 (the verifier passed it), else INCORRECT."""
    if answer is None:
        return pb.VERDICT_UNPARSEABLE
    return pb.VERDICT_CORRECT if reward >= 1.0 else pb.VERDICT_INCORRECT


def step_experiences(groups: Iterable[Group], *, run_id: str, policy: str, step: int, version: int,
                     tokenizer_id: str, batch_rewards: list[float], window: int, rollouts_per_s: float,
                     tokens_per_s: float, rollouts_total: int) -> list[pb.Experience]:
    """The experiences of one step (module docstring), at policy version `version`; `batch_rewards`: the batch
    mean reward of the recent steps, this one last."""
    out = []

    def add(kind: str, i: int, payload) -> None:
        out.append(new_experience(run_id, policy, version, payload, f"{policy}.{step}.{kind}.{i}"))

    k = 0
    for p, g in enumerate(groups):
        group_id = f"{policy}.{step}.{p}"
        add("group_stats", p, pb.GroupStats(prompt_id=g.prompt_id, group_id=group_id, rewards=list(g.rewards)))
        for i, (r, reward, answer) in enumerate(zip(g.responses, g.rewards, g.answers)):
            add("rollout", k, pb.Rollout(
                prompt_id=g.prompt_id, prompt_text=g.prompt_text, response_text=r.text, token_ids=r.token_ids,
                logprobs=r.logprobs, reward=reward, verdict=verdict(reward, answer), group_id=group_id,
                tokenizer_id=tokenizer_id, sample_index=i))
            if reward >= 1.0:
                add("success", k, pb.VerifiedSuccess(
                    prompt_id=g.prompt_id, prompt_text=g.prompt_text, response_text=r.text, token_ids=r.token_ids,
                    reward=reward, answer=answer or "", group_id=group_id, tokenizer_id=tokenizer_id))
            k += 1
    add("policy_stats", 0, pb.PolicyStats(
        step=step, batch_mean_reward=batch_rewards[-1], capability=capability(batch_rewards, window),
        window=window, rollouts_per_s=rollouts_per_s, tokens_per_s=tokens_per_s, rollouts_total=rollouts_total))
    return out
