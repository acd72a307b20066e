from mrl.v1 import identity_pb2 as _identity_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TraceReduction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRACE_REDUCTION_UNSPECIFIED: _ClassVar[TraceReduction]
    TRACE_REDUCTION_SUM: _ClassVar[TraceReduction]
    TRACE_REDUCTION_ALL: _ClassVar[TraceReduction]
    TRACE_REDUCTION_MEAN: _ClassVar[TraceReduction]
    TRACE_REDUCTION_BROADCAST: _ClassVar[TraceReduction]
TRACE_REDUCTION_UNSPECIFIED: TraceReduction
TRACE_REDUCTION_SUM: TraceReduction
TRACE_REDUCTION_ALL: TraceReduction
TRACE_REDUCTION_MEAN: TraceReduction
TRACE_REDUCTION_BROADCAST: TraceReduction

class Trace(_message.Message):
    __slots__ = ("name", "values", "reduction")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    REDUCTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: _containers.RepeatedScalarFieldContainer[float]
    reduction: TraceReduction
    def __init__(self, name: _Optional[str] = ..., values: _Optional[_Iterable[float]] = ..., reduction: _Optional[_Union[TraceReduction, str]] = ...) -> None: ...

class AlignRequest(_message.Message):
    __slots__ = ("source_tokenizer_id", "source_ids", "traces", "target_tokenizer_id", "target_prompt_ids")
    SOURCE_TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IDS_FIELD_NUMBER: _ClassVar[int]
    TRACES_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    source_tokenizer_id: str
    source_ids: _containers.RepeatedScalarFieldContainer[int]
    traces: _containers.RepeatedCompositeFieldContainer[Trace]
    target_tokenizer_id: str
    target_prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, source_tokenizer_id: _Optional[str] = ..., source_ids: _Optional[_Iterable[int]] = ..., traces: _Optional[_Iterable[_Union[Trace, _Mapping]]] = ..., target_tokenizer_id: _Optional[str] = ..., target_prompt_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ResidualReport(_message.Message):
    __slots__ = ("lossless", "chunks", "one_to_one_share", "one_to_one_byte_share", "mean_source_tokens_per_chunk", "mean_target_tokens_per_chunk", "max_source_tokens_per_chunk", "max_target_tokens_per_chunk", "dropped_bytes", "invalid_utf8_bytes", "normalizer_mismatch", "mapped_specials", "dropped_specials", "truncated", "source_noncanonical")
    LOSSLESS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ONE_TO_ONE_SHARE_FIELD_NUMBER: _ClassVar[int]
    ONE_TO_ONE_BYTE_SHARE_FIELD_NUMBER: _ClassVar[int]
    MEAN_SOURCE_TOKENS_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    MEAN_TARGET_TOKENS_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    MAX_SOURCE_TOKENS_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    MAX_TARGET_TOKENS_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    INVALID_UTF8_BYTES_FIELD_NUMBER: _ClassVar[int]
    NORMALIZER_MISMATCH_FIELD_NUMBER: _ClassVar[int]
    MAPPED_SPECIALS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SPECIALS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NONCANONICAL_FIELD_NUMBER: _ClassVar[int]
    lossless: bool
    chunks: int
    one_to_one_share: float
    one_to_one_byte_share: float
    mean_source_tokens_per_chunk: float
    mean_target_tokens_per_chunk: float
    max_source_tokens_per_chunk: int
    max_target_tokens_per_chunk: int
    dropped_bytes: int
    invalid_utf8_bytes: int
    normalizer_mismatch: bool
    mapped_specials: int
    dropped_specials: int
    truncated: bool
    source_noncanonical: bool
    def __init__(self, lossless: _Optional[bool] = ..., chunks: _Optional[int] = ..., one_to_one_share: _Optional[float] = ..., one_to_one_byte_share: _Optional[float] = ..., mean_source_tokens_per_chunk: _Optional[float] = ..., mean_target_tokens_per_chunk: _Optional[float] = ..., max_source_tokens_per_chunk: _Optional[int] = ..., max_target_tokens_per_chunk: _Optional[int] = ..., dropped_bytes: _Optional[int] = ..., invalid_utf8_bytes: _Optional[int] = ..., normalizer_mismatch: _Optional[bool] = ..., mapped_specials: _Optional[int] = ..., dropped_specials: _Optional[int] = ..., truncated: _Optional[bool] = ..., source_noncanonical: _Optional[bool] = ...) -> None: ...

class AlignResponse(_message.Message):
    __slots__ = ("target_ids", "source_chunk", "target_chunk", "traces", "residual", "text", "response_start")
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_CHUNK_FIELD_NUMBER: _ClassVar[int]
    TARGET_CHUNK_FIELD_NUMBER: _ClassVar[int]
    TRACES_FIELD_NUMBER: _ClassVar[int]
    RESIDUAL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_START_FIELD_NUMBER: _ClassVar[int]
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    source_chunk: _containers.RepeatedScalarFieldContainer[int]
    target_chunk: _containers.RepeatedScalarFieldContainer[int]
    traces: _containers.RepeatedCompositeFieldContainer[Trace]
    residual: ResidualReport
    text: str
    response_start: int
    def __init__(self, target_ids: _Optional[_Iterable[int]] = ..., source_chunk: _Optional[_Iterable[int]] = ..., target_chunk: _Optional[_Iterable[int]] = ..., traces: _Optional[_Iterable[_Union[Trace, _Mapping]]] = ..., residual: _Optional[_Union[ResidualReport, _Mapping]] = ..., text: _Optional[str] = ..., response_start: _Optional[int] = ...) -> None: ...

class AlignBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[AlignRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[AlignRequest, _Mapping]]] = ...) -> None: ...

class AlignBatchResponse(_message.Message):
    __slots__ = ("responses", "aggregate")
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[AlignResponse]
    aggregate: ResidualReport
    def __init__(self, responses: _Optional[_Iterable[_Union[AlignResponse, _Mapping]]] = ..., aggregate: _Optional[_Union[ResidualReport, _Mapping]] = ...) -> None: ...

class RegisterTokenizerRequest(_message.Message):
    __slots__ = ("tokenizer_id", "path")
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    tokenizer_id: str
    path: str
    def __init__(self, tokenizer_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("tokenizer_id", "family", "vocab_size", "byte_exact", "content_sha256")
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    BYTE_EXACT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    tokenizer_id: str
    family: str
    vocab_size: int
    byte_exact: bool
    content_sha256: str
    def __init__(self, tokenizer_id: _Optional[str] = ..., family: _Optional[str] = ..., vocab_size: _Optional[int] = ..., byte_exact: _Optional[bool] = ..., content_sha256: _Optional[str] = ...) -> None: ...

class RegisterTokenizerResponse(_message.Message):
    __slots__ = ("tokenizer",)
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    tokenizer: TokenizerInfo
    def __init__(self, tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ...) -> None: ...

class ListTokenizersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTokenizersResponse(_message.Message):
    __slots__ = ("tokenizers",)
    TOKENIZERS_FIELD_NUMBER: _ClassVar[int]
    tokenizers: _containers.RepeatedCompositeFieldContainer[TokenizerInfo]
    def __init__(self, tokenizers: _Optional[_Iterable[_Union[TokenizerInfo, _Mapping]]] = ...) -> None: ...
