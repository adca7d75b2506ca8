from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    BAD_REQUEST: _ClassVar[ErrorCode]
    MODEL_ERROR: _ClassVar[ErrorCode]
    TOO_MANY_STREAMS: _ClassVar[ErrorCode]
    STREAM_ID_IN_USE: _ClassVar[ErrorCode]
    PROTOCOL_ERROR: _ClassVar[ErrorCode]
    INVALID_PAYLOAD: _ClassVar[ErrorCode]
    MESSAGE_TOO_BIG: _ClassVar[ErrorCode]
    UNSUPPORTED_COMPRESSION: _ClassVar[ErrorCode]
    UNSUPPORTED_MESSAGE: _ClassVar[ErrorCode]
    RESUME_FAILED: _ClassVar[ErrorCode]
    RATE_LIMITED: _ClassVar[ErrorCode]
    UNAUTHORIZED: _ClassVar[ErrorCode]
    INTERNAL: _ClassVar[ErrorCode]
    DRAINING: _ClassVar[ErrorCode]
    UNKNOWN_MODEL: _ClassVar[ErrorCode]
    CONTEXT_MISMATCH: _ClassVar[ErrorCode]
    CONTEXT_LIMIT: _ClassVar[ErrorCode]
ERROR_CODE_UNSPECIFIED: ErrorCode
BAD_REQUEST: ErrorCode
MODEL_ERROR: ErrorCode
TOO_MANY_STREAMS: ErrorCode
STREAM_ID_IN_USE: ErrorCode
PROTOCOL_ERROR: ErrorCode
INVALID_PAYLOAD: ErrorCode
MESSAGE_TOO_BIG: ErrorCode
UNSUPPORTED_COMPRESSION: ErrorCode
UNSUPPORTED_MESSAGE: ErrorCode
RESUME_FAILED: ErrorCode
RATE_LIMITED: ErrorCode
UNAUTHORIZED: ErrorCode
INTERNAL: ErrorCode
DRAINING: ErrorCode
UNKNOWN_MODEL: ErrorCode
CONTEXT_MISMATCH: ErrorCode
CONTEXT_LIMIT: ErrorCode

class Envelope(_message.Message):
    __slots__ = ("hello", "welcome", "request", "delta", "end", "error", "cancel", "ping", "pong", "goaway", "ack", "subscribe", "subscribed", "push", "input", "context", "context_ack")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    GOAWAY_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ACK_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    welcome: Welcome
    request: Request
    delta: Delta
    end: End
    error: Error
    cancel: Cancel
    ping: Ping
    pong: Pong
    goaway: GoAway
    ack: Ack
    subscribe: Subscribe
    subscribed: Subscribed
    push: Push
    input: Input
    context: Context
    context_ack: ContextAck
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., request: _Optional[_Union[Request, _Mapping]] = ..., delta: _Optional[_Union[Delta, _Mapping]] = ..., end: _Optional[_Union[End, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ..., goaway: _Optional[_Union[GoAway, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., push: _Optional[_Union[Push, _Mapping]] = ..., input: _Optional[_Union[Input, _Mapping]] = ..., context: _Optional[_Union[Context, _Mapping]] = ..., context_ack: _Optional[_Union[ContextAck, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("client", "compression", "resume_token", "last_seq", "flow_window", "auth", "revision", "history")
    class LastSeqEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    FLOW_WINDOW_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    client: str
    compression: _containers.RepeatedScalarFieldContainer[str]
    resume_token: str
    last_seq: _containers.ScalarMap[int, int]
    flow_window: int
    auth: str
    revision: int
    history: bool
    def __init__(self, client: _Optional[str] = ..., compression: _Optional[_Iterable[str]] = ..., resume_token: _Optional[str] = ..., last_seq: _Optional[_Mapping[int, int]] = ..., flow_window: _Optional[int] = ..., auth: _Optional[str] = ..., revision: _Optional[int] = ..., history: _Optional[bool] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("session_id", "resume_token", "compression", "max_frame_size", "max_decompressed_size", "max_streams", "heartbeat_interval_ms", "idle_timeout_ms", "server", "resumed", "resume_window_ms", "flow_window", "revision", "input_seq", "contexts")
    class InputSeqEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class ContextsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_DECOMPRESSED_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_STREAMS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    RESUME_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    FLOW_WINDOW_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SEQ_FIELD_NUMBER: _ClassVar[int]
    CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    resume_token: str
    compression: _containers.RepeatedScalarFieldContainer[str]
    max_frame_size: int
    max_decompressed_size: int
    max_streams: int
    heartbeat_interval_ms: int
    idle_timeout_ms: int
    server: str
    resumed: bool
    resume_window_ms: int
    flow_window: int
    revision: int
    input_seq: _containers.ScalarMap[int, int]
    contexts: _containers.ScalarMap[str, int]
    def __init__(self, session_id: _Optional[str] = ..., resume_token: _Optional[str] = ..., compression: _Optional[_Iterable[str]] = ..., max_frame_size: _Optional[int] = ..., max_decompressed_size: _Optional[int] = ..., max_streams: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., idle_timeout_ms: _Optional[int] = ..., server: _Optional[str] = ..., resumed: _Optional[bool] = ..., resume_window_ms: _Optional[int] = ..., flow_window: _Optional[int] = ..., revision: _Optional[int] = ..., input_seq: _Optional[_Mapping[int, int]] = ..., contexts: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, items: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("stream_id", "model", "text", "data", "messages", "params", "warmup", "contexts", "continues")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FIELD_NUMBER: _ClassVar[int]
    CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    CONTINUES_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    model: str
    text: str
    data: bytes
    messages: ChatMessages
    params: _struct_pb2.Struct
    warmup: bool
    contexts: _containers.RepeatedScalarFieldContainer[str]
    continues: int
    def __init__(self, stream_id: _Optional[int] = ..., model: _Optional[str] = ..., text: _Optional[str] = ..., data: _Optional[bytes] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., warmup: _Optional[bool] = ..., contexts: _Optional[_Iterable[str]] = ..., continues: _Optional[int] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("stream_id", "seq", "text", "data", "tool_call")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    seq: int
    text: str
    data: bytes
    tool_call: ToolCall
    def __init__(self, stream_id: _Optional[int] = ..., seq: _Optional[int] = ..., text: _Optional[str] = ..., data: _Optional[bytes] = ..., tool_call: _Optional[_Union[ToolCall, _Mapping]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("stream_id", "seq", "text", "data", "tool_result", "end")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    seq: int
    text: str
    data: bytes
    tool_result: ToolResult
    end: bool
    def __init__(self, stream_id: _Optional[int] = ..., seq: _Optional[int] = ..., text: _Optional[str] = ..., data: _Optional[bytes] = ..., tool_result: _Optional[_Union[ToolResult, _Mapping]] = ..., end: _Optional[bool] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("id", "content", "is_error")
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    content: str
    is_error: bool
    def __init__(self, id: _Optional[str] = ..., content: _Optional[str] = ..., is_error: _Optional[bool] = ...) -> None: ...

class End(_message.Message):
    __slots__ = ("stream_id", "last_seq", "finish_reason", "timings_ms", "usage")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class UsageEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    last_seq: int
    finish_reason: str
    timings_ms: _containers.ScalarMap[str, float]
    usage: _containers.ScalarMap[str, int]
    def __init__(self, stream_id: _Optional[int] = ..., last_seq: _Optional[int] = ..., finish_reason: _Optional[str] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., usage: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("stream_id", "code", "message", "retryable")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    code: ErrorCode
    message: str
    retryable: bool
    def __init__(self, stream_id: _Optional[int] = ..., code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("stream_id",)
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    def __init__(self, stream_id: _Optional[int] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("stream_id", "seq", "done")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    seq: int
    done: bool
    def __init__(self, stream_id: _Optional[int] = ..., seq: _Optional[int] = ..., done: _Optional[bool] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("id", "group", "leave")
    ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    id: int
    group: str
    leave: bool
    def __init__(self, id: _Optional[int] = ..., group: _Optional[str] = ..., leave: _Optional[bool] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("id", "group", "leave", "code", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    group: str
    leave: bool
    code: ErrorCode
    message: str
    def __init__(self, id: _Optional[int] = ..., group: _Optional[str] = ..., leave: _Optional[bool] = ..., code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Push(_message.Message):
    __slots__ = ("topic", "text", "data")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    topic: str
    text: str
    data: bytes
    def __init__(self, topic: _Optional[str] = ..., text: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class Context(_message.Message):
    __slots__ = ("name", "version", "base_version", "text", "patches", "sha256", "drop")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PATCHES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    base_version: int
    text: str
    patches: _containers.RepeatedCompositeFieldContainer[ContextPatch]
    sha256: bytes
    drop: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., base_version: _Optional[int] = ..., text: _Optional[str] = ..., patches: _Optional[_Iterable[_Union[ContextPatch, _Mapping]]] = ..., sha256: _Optional[bytes] = ..., drop: _Optional[bool] = ...) -> None: ...

class ContextPatch(_message.Message):
    __slots__ = ("offset", "length", "text")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    text: str
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class ContextAck(_message.Message):
    __slots__ = ("name", "version", "code", "message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    code: ErrorCode
    message: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class GoAway(_message.Message):
    __slots__ = ("reason", "reconnect_after_ms")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RECONNECT_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    reconnect_after_ms: int
    def __init__(self, reason: _Optional[str] = ..., reconnect_after_ms: _Optional[int] = ...) -> None: ...
