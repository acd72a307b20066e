from mrl.v1 import experience_pb2 as _experience_pb2
from mrl.v1 import identity_pb2 as _identity_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StartPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    START_POSITION_UNSPECIFIED: _ClassVar[StartPosition]
    START_POSITION_LATEST: _ClassVar[StartPosition]
    START_POSITION_EARLIEST: _ClassVar[StartPosition]
START_POSITION_UNSPECIFIED: StartPosition
START_POSITION_LATEST: StartPosition
START_POSITION_EARLIEST: StartPosition

class PublishRequest(_message.Message):
    __slots__ = ("experiences",)
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    experiences: _containers.RepeatedCompositeFieldContainer[_experience_pb2.Experience]
    def __init__(self, experiences: _Optional[_Iterable[_Union[_experience_pb2.Experience, _Mapping]]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("accepted", "duplicates", "duplicate_ids")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_IDS_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    duplicate_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., duplicate_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("run_id", "subscriber", "kinds", "producers", "include_own", "start", "max_in_flight", "min_policy_version", "max_version_lag", "visibility_timeout_ms", "max_response_bytes", "lag_exempt_kinds")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_OWN_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_LAG_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAG_EXEMPT_KINDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    subscriber: str
    kinds: _containers.RepeatedScalarFieldContainer[_experience_pb2.ExperienceKind]
    producers: _containers.RepeatedScalarFieldContainer[str]
    include_own: bool
    start: StartPosition
    max_in_flight: int
    min_policy_version: int
    max_version_lag: int
    visibility_timeout_ms: int
    max_response_bytes: int
    lag_exempt_kinds: _containers.RepeatedScalarFieldContainer[_experience_pb2.ExperienceKind]
    def __init__(self, run_id: _Optional[str] = ..., subscriber: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[_experience_pb2.ExperienceKind, str]]] = ..., producers: _Optional[_Iterable[str]] = ..., include_own: _Optional[bool] = ..., start: _Optional[_Union[StartPosition, str]] = ..., max_in_flight: _Optional[int] = ..., min_policy_version: _Optional[int] = ..., max_version_lag: _Optional[int] = ..., visibility_timeout_ms: _Optional[int] = ..., max_response_bytes: _Optional[int] = ..., lag_exempt_kinds: _Optional[_Iterable[_Union[_experience_pb2.ExperienceKind, str]]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("delivery_id", "experience", "redelivered", "appended_at_ms")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCE_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    APPENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    experience: _experience_pb2.Experience
    redelivered: bool
    appended_at_ms: int
    def __init__(self, delivery_id: _Optional[str] = ..., experience: _Optional[_Union[_experience_pb2.Experience, _Mapping]] = ..., redelivered: _Optional[bool] = ..., appended_at_ms: _Optional[int] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("subscription_id", "deliveries")
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    subscription_id: str
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, subscription_id: _Optional[str] = ..., deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("run_id", "subscriber", "subscription_id", "delivery_ids")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    subscriber: str
    subscription_id: str
    delivery_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., subscriber: _Optional[str] = ..., subscription_id: _Optional[str] = ..., delivery_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class GetSuccessesRequest(_message.Message):
    __slots__ = ("run_id", "subscriber", "prompt_ids", "producers", "max_per_prompt", "max_response_bytes")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    subscriber: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[str]
    producers: _containers.RepeatedScalarFieldContainer[str]
    max_per_prompt: int
    max_response_bytes: int
    def __init__(self, run_id: _Optional[str] = ..., subscriber: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[str]] = ..., producers: _Optional[_Iterable[str]] = ..., max_per_prompt: _Optional[int] = ..., max_response_bytes: _Optional[int] = ...) -> None: ...

class GetSuccessesResponse(_message.Message):
    __slots__ = ("successes", "truncated", "prompts_answered")
    SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    successes: _containers.RepeatedCompositeFieldContainer[_experience_pb2.Experience]
    truncated: bool
    prompts_answered: int
    def __init__(self, successes: _Optional[_Iterable[_Union[_experience_pb2.Experience, _Mapping]]] = ..., truncated: _Optional[bool] = ..., prompts_answered: _Optional[int] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class Topic(_message.Message):
    __slots__ = ("run_id", "kind", "producer")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    kind: _experience_pb2.ExperienceKind
    producer: str
    def __init__(self, run_id: _Optional[str] = ..., kind: _Optional[_Union[_experience_pb2.ExperienceKind, str]] = ..., producer: _Optional[str] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[Topic]
    def __init__(self, topics: _Optional[_Iterable[_Union[Topic, _Mapping]]] = ...) -> None: ...

class GetTopicStatsRequest(_message.Message):
    __slots__ = ("run_id", "kind", "producer")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    kind: _experience_pb2.ExperienceKind
    producer: str
    def __init__(self, run_id: _Optional[str] = ..., kind: _Optional[_Union[_experience_pb2.ExperienceKind, str]] = ..., producer: _Optional[str] = ...) -> None: ...

class ConsumerGroupStats(_message.Message):
    __slots__ = ("subscriber", "pending", "lag", "last_delivered_id", "consumers")
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    LAST_DELIVERED_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    subscriber: str
    pending: int
    lag: int
    last_delivered_id: str
    consumers: int
    def __init__(self, subscriber: _Optional[str] = ..., pending: _Optional[int] = ..., lag: _Optional[int] = ..., last_delivered_id: _Optional[str] = ..., consumers: _Optional[int] = ...) -> None: ...

class TopicStats(_message.Message):
    __slots__ = ("topic", "length", "last_id", "latest_policy_version", "groups")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    LATEST_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    length: int
    last_id: str
    latest_policy_version: int
    groups: _containers.RepeatedCompositeFieldContainer[ConsumerGroupStats]
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ..., length: _Optional[int] = ..., last_id: _Optional[str] = ..., latest_policy_version: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[ConsumerGroupStats, _Mapping]]] = ...) -> None: ...

class GetTopicStatsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicStats]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicStats, _Mapping]]] = ...) -> None: ...
