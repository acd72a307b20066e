import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from mrl.v1 import identity_pb2 as _identity_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaseEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_EVENT_TYPE_UNSPECIFIED: _ClassVar[LeaseEventType]
    LEASE_EVENT_TYPE_GRANTED: _ClassVar[LeaseEventType]
    LEASE_EVENT_TYPE_RELEASED: _ClassVar[LeaseEventType]
    LEASE_EVENT_TYPE_EXPIRED: _ClassVar[LeaseEventType]
    LEASE_EVENT_TYPE_REVOKED: _ClassVar[LeaseEventType]
LEASE_EVENT_TYPE_UNSPECIFIED: LeaseEventType
LEASE_EVENT_TYPE_GRANTED: LeaseEventType
LEASE_EVENT_TYPE_RELEASED: LeaseEventType
LEASE_EVENT_TYPE_EXPIRED: LeaseEventType
LEASE_EVENT_TYPE_REVOKED: LeaseEventType

class Device(_message.Message):
    __slots__ = ("device_id", "node", "index", "memory_bytes", "kind", "lease_id", "leased")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    node: str
    index: int
    memory_bytes: int
    kind: str
    lease_id: str
    leased: bool
    def __init__(self, device_id: _Optional[str] = ..., node: _Optional[str] = ..., index: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., kind: _Optional[str] = ..., lease_id: _Optional[str] = ..., leased: _Optional[bool] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("run_id", "policy", "worker", "phase", "devices", "min_memory_bytes", "same_node", "ttl_ms", "wait_timeout_ms", "step_cost", "device_ids")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    MIN_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SAME_NODE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_COST_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy: str
    worker: str
    phase: str
    devices: int
    min_memory_bytes: int
    same_node: bool
    ttl_ms: int
    wait_timeout_ms: int
    step_cost: float
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., policy: _Optional[str] = ..., worker: _Optional[str] = ..., phase: _Optional[str] = ..., devices: _Optional[int] = ..., min_memory_bytes: _Optional[int] = ..., same_node: _Optional[bool] = ..., ttl_ms: _Optional[int] = ..., wait_timeout_ms: _Optional[int] = ..., step_cost: _Optional[float] = ..., device_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "fencing_token", "devices", "expires_at", "policy", "worker", "phase")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    fencing_token: int
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    expires_at: _timestamp_pb2.Timestamp
    policy: str
    worker: str
    phase: str
    def __init__(self, lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., policy: _Optional[str] = ..., worker: _Optional[str] = ..., phase: _Optional[str] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("lease_id", "fencing_token", "ttl_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    fencing_token: int
    ttl_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "fencing_token")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    fencing_token: int
    def __init__(self, lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class InventoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InventoryResponse(_message.Message):
    __slots__ = ("devices", "leases", "queued")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    queued: int
    def __init__(self, devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., queued: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: str
    def __init__(self, policy: _Optional[str] = ...) -> None: ...

class LeaseEvent(_message.Message):
    __slots__ = ("type", "lease", "at")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    type: LeaseEventType
    lease: Lease
    at: _timestamp_pb2.Timestamp
    def __init__(self, type: _Optional[_Union[LeaseEventType, str]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
