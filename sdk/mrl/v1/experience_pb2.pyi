import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExperienceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPERIENCE_KIND_UNSPECIFIED: _ClassVar[ExperienceKind]
    EXPERIENCE_KIND_ROLLOUT: _ClassVar[ExperienceKind]
    EXPERIENCE_KIND_GROUP_STATS: _ClassVar[ExperienceKind]
    EXPERIENCE_KIND_SUCCESS: _ClassVar[ExperienceKind]
    EXPERIENCE_KIND_POLICY_STATS: _ClassVar[ExperienceKind]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_CORRECT: _ClassVar[Verdict]
    VERDICT_INCORRECT: _ClassVar[Verdict]
    VERDICT_UNPARSEABLE: _ClassVar[Verdict]
EXPERIENCE_KIND_UNSPECIFIED: ExperienceKind
EXPERIENCE_KIND_ROLLOUT: ExperienceKind
EXPERIENCE_KIND_GROUP_STATS: ExperienceKind
EXPERIENCE_KIND_SUCCESS: ExperienceKind
EXPERIENCE_KIND_POLICY_STATS: ExperienceKind
VERDICT_UNSPECIFIED: Verdict
VERDICT_CORRECT: Verdict
VERDICT_INCORRECT: Verdict
VERDICT_UNPARSEABLE: Verdict

class Rollout(_message.Message):
    __slots__ = ("prompt_id", "prompt_text", "response_text", "token_ids", "logprobs", "reward", "verdict", "group_id", "tokenizer_id", "sample_index")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    prompt_text: str
    response_text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: float
    verdict: Verdict
    group_id: str
    tokenizer_id: str
    sample_index: int
    def __init__(self, prompt_id: _Optional[str] = ..., prompt_text: _Optional[str] = ..., response_text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., reward: _Optional[float] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., group_id: _Optional[str] = ..., tokenizer_id: _Optional[str] = ..., sample_index: _Optional[int] = ...) -> None: ...

class GroupStats(_message.Message):
    __slots__ = ("prompt_id", "group_id", "rewards")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    group_id: str
    rewards: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, prompt_id: _Optional[str] = ..., group_id: _Optional[str] = ..., rewards: _Optional[_Iterable[float]] = ...) -> None: ...

class VerifiedSuccess(_message.Message):
    __slots__ = ("prompt_id", "prompt_text", "response_text", "token_ids", "reward", "answer", "group_id", "tokenizer_id")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    prompt_text: str
    response_text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    reward: float
    answer: str
    group_id: str
    tokenizer_id: str
    def __init__(self, prompt_id: _Optional[str] = ..., prompt_text: _Optional[str] = ..., response_text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., reward: _Optional[float] = ..., answer: _Optional[str] = ..., group_id: _Optional[str] = ..., tokenizer_id: _Optional[str] = ...) -> None: ...

class PolicyStats(_message.Message):
    __slots__ = ("step", "batch_mean_reward", "capability", "window", "rollouts_per_s", "tokens_per_s", "rollouts_total")
    STEP_FIELD_NUMBER: _ClassVar[int]
    BATCH_MEAN_REWARD_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    step: int
    batch_mean_reward: float
    capability: float
    window: int
    rollouts_per_s: float
    tokens_per_s: float
    rollouts_total: int
    def __init__(self, step: _Optional[int] = ..., batch_mean_reward: _Optional[float] = ..., capability: _Optional[float] = ..., window: _Optional[int] = ..., rollouts_per_s: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., rollouts_total: _Optional[int] = ...) -> None: ...

class Experience(_message.Message):
    __slots__ = ("experience_id", "run_id", "producer", "policy_version", "created_at", "schema_version", "rollout", "group_stats", "success", "policy_stats")
    EXPERIENCE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    GROUP_STATS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    POLICY_STATS_FIELD_NUMBER: _ClassVar[int]
    experience_id: str
    run_id: str
    producer: str
    policy_version: int
    created_at: _timestamp_pb2.Timestamp
    schema_version: int
    rollout: Rollout
    group_stats: GroupStats
    success: VerifiedSuccess
    policy_stats: PolicyStats
    def __init__(self, experience_id: _Optional[str] = ..., run_id: _Optional[str] = ..., producer: _Optional[str] = ..., policy_version: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., schema_version: _Optional[int] = ..., rollout: _Optional[_Union[Rollout, _Mapping]] = ..., group_stats: _Optional[_Union[GroupStats, _Mapping]] = ..., success: _Optional[_Union[VerifiedSuccess, _Mapping]] = ..., policy_stats: _Optional[_Union[PolicyStats, _Mapping]] = ...) -> None: ...
