from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class WhoAmIRequest(_message.Message):
    __slots__ = ("run_id", "policy")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy: str
    def __init__(self, run_id: _Optional[str] = ..., policy: _Optional[str] = ...) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("principal", "role", "policy", "auth", "service")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    principal: str
    role: str
    policy: str
    auth: bool
    service: str
    def __init__(self, principal: _Optional[str] = ..., role: _Optional[str] = ..., policy: _Optional[str] = ..., auth: _Optional[bool] = ..., service: _Optional[str] = ...) -> None: ...
