"""Protocol messages as frozen, validated dataclasses: what the codecs turn into bytes and back.

These are the only message types the core and the client handle; the Protobuf and JSON codecs
map them one to one (docs/protocol.md, "Messages").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ErrorCode, LocalProtocolError

__all__ = [
    "Ack",
    "Cancel",
    "ChatMessage",
    "Context",
    "ContextAck",
    "ContextPatch",
    "Delta",
    "End",
    "Error",
    "Event",
    "GoAway",
    "Hello",
    "Input",
    "Ping",
    "Pong",
    "Push",
    "Request",
    "Subscribe",
    "Subscribed",
    "ToolCall",
    "ToolResult",
    "Welcome",
]

REVISION = 3
"""The protocol revision this code implements: 3 is v1.3 (full-duplex streams: Input, Delta.tool_call; context
documents, Request.contexts and continues), 2 is v1.2 (Request.warmup), 1 is v1.1 (Subscribe, Subscribed, Push),
0 is v1.0."""
WARMUP_REVISION = 2
"""The revision that brought Request.warmup: a client sets it only after a Welcome of at least this revision (an
older server ignores the field and would run the model as a plain request)."""
CONTEXT_REVISION = 3
"""The revision that brought Context / ContextAck, Request.contexts and Request.continues, Hello.history and
Welcome.contexts: a client sends them only after a Welcome of at least this revision."""

DUPLEX_REVISION = 3
"""The revision that brought full-duplex streams (Input, Delta.tool_call, Welcome.input_seq): a server sends a
tool call only to a client of at least this revision, a client sends Input only after such a Welcome."""

_U32 = 0xFFFFFFFF


def _check_u32(name: str, value: int, *, positive: bool = False) -> None:
    if not isinstance(value, int) or value < (1 if positive else 0) or value > _U32:
        kind = "a positive" if positive else "a non-negative"
        raise LocalProtocolError(f"{name} must be {kind} 32-bit integer, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """Client's first message: what it can decode, and what to resume."""

    client: str = ""
    compression: tuple[str, ...] = ()
    resume_token: str = ""
    last_seq: Mapping[int, int] = field(default_factory=dict)
    flow_window: int = 0
    auth: str = field(default="", repr=False)
    revision: int = 0
    history: bool = False
    """v1.3: keep this session's turns (input and output) so that a Request can continue one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome:
    """Server's answer to Hello: session identity and the negotiated limits."""

    session_id: str
    resume_token: str = ""
    compression: tuple[str, ...] = ()
    max_frame_size: int = 0
    max_decompressed_size: int = 0
    max_streams: int = 0
    heartbeat_interval_ms: int = 0
    idle_timeout_ms: int = 0
    server: str = ""
    resumed: bool = False
    resume_window_ms: int = 0
    flow_window: int = 0
    revision: int = 0
    input_seq: Mapping[int, int] = field(default_factory=dict)
    """Revision 3 (v1.3), on a resume: stream id -> seq of the last Input the server holds for it."""
    contexts: Mapping[str, int] = field(default_factory=dict)
    """v1.3: the context documents the session holds (after a resume), name -> version."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatMessage:
    """One chat turn of a Request."""

    role: str
    content: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """Start stream `stream_id` with one of text, data or messages as input."""

    stream_id: int
    model: str = ""
    text: str | None = None
    data: bytes | None = None
    messages: tuple[ChatMessage, ...] | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    warmup: bool = False
    """Revision 2 (v1.2): only run the model's warm-up hook for this input; no Delta, End("warmup")."""
    contexts: tuple[str, ...] = ()
    """Revision 3 (v1.3): names of the session's context documents the model gets."""
    continues: int = 0
    """Revision 3 (v1.3): the earlier stream of this session whose input and output this request continues."""

    def __post_init__(self) -> None:
        _check_u32("stream_id", self.stream_id, positive=True)
        if (self.text is not None) + (self.data is not None) + (self.messages is not None) > 1:
            raise LocalProtocolError("a Request carries at most one of text, data, messages")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """Revision 3 (v1.3): the model asks the client to run tool `name` with `arguments` (JSON text) and answer
    with a :class:`ToolResult` of the same `id`. A model yields one as a chunk; it reaches the client as a Delta."""

    name: str
    arguments: str = "{}"
    id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not isinstance(self.arguments, str) or not isinstance(self.id, str):
            raise LocalProtocolError("a ToolCall's name, arguments and id are strings")

    def __len__(self) -> int:
        """Its size in characters, as a text chunk's: what a replay buffer and flow control count for it."""
        return len(self.id) + len(self.name) + len(self.arguments)

    @property
    def args(self) -> Any:
        """`arguments` parsed as JSON (ValueError if they are not JSON)."""
        return json.loads(self.arguments) if self.arguments else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Delta:
    """One chunk of a stream's output; exactly one of text, data or (v1.3) tool_call."""

    stream_id: int
    seq: int
    text: str | None = None
    data: bytes | None = None
    tool_call: ToolCall | None = None

    def __post_init__(self) -> None:
        if (self.text is None) + (self.data is None) + (self.tool_call is None) != 2:
            raise LocalProtocolError("a Delta carries exactly one of text, data, tool_call")

    @property
    def chunk(self) -> str | bytes | ToolCall:
        """The chunk: text, bytes or a tool call."""
        if self.text is not None:
            return self.text
        return self.data if self.data is not None else self.tool_call  # type: ignore[return-value]

    @classmethod
    def of(cls, stream_id: int, seq: int, chunk: str | bytes | ToolCall) -> Delta:
        """The Delta carrying `chunk` as text (str), data (bytes) or a tool call."""
        if isinstance(chunk, str):
            return cls(stream_id=stream_id, seq=seq, text=chunk)
        if type(chunk) is ToolCall:
            return cls(stream_id=stream_id, seq=seq, tool_call=chunk)
        return cls(stream_id=stream_id, seq=seq, data=chunk)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class End:
    """A stream finished normally ("stop"), by Cancel ("cancelled"), or as a warm-up request ("warmup", v1.2)."""

    stream_id: int
    last_seq: int = 0
    finish_reason: str = "stop"
    timings_ms: Mapping[str, float] = field(default_factory=dict)
    usage: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Error:
    """An error for one stream (ends it) or, with stream_id 0, for the connection."""

    stream_id: int = 0
    code: ErrorCode = ErrorCode.UNSPECIFIED
    message: str = ""
    retryable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel:
    """Ask the server to stop stream `stream_id`."""

    stream_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """Revision 3 (v1.3): the client's answer to :class:`ToolCall` `id`: its output, or (`is_error`) its error."""

    id: str = ""
    content: str = ""
    is_error: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Input:
    """Client (v1.3): more input for running stream `stream_id`: at most one of text, data or tool_result,
    and/or `end` (no more input). `seq` counts the stream's Inputs from 1; a resend of one the server has is
    ignored, so a client can send again everything after the Welcome's ``input_seq`` on a resume."""

    stream_id: int
    seq: int
    text: str | None = None
    data: bytes | None = None
    tool_result: ToolResult | None = None
    end: bool = False

    def __post_init__(self) -> None:
        _check_u32("stream_id", self.stream_id, positive=True)
        _check_u32("seq", self.seq, positive=True)
        items = (self.text is not None) + (self.data is not None) + (self.tool_result is not None)
        if items > 1 or (items == 0 and not self.end):
            raise LocalProtocolError("an Input carries one of text, data, tool_result, or end")

    @property
    def item(self) -> str | bytes | ToolResult | None:
        """What it carries (None for an end alone)."""
        if self.text is not None:
            return self.text
        return self.data if self.data is not None else self.tool_result


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping:
    """Heartbeat probe; the peer answers with Pong(id)."""

    id: int = 0

    def response(self) -> Pong:
        """The Pong that answers this Ping."""
        return Pong(id=self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong:
    """Answer to Ping(id)."""

    id: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """Client received every Delta of `stream_id` up to `seq` (and with `done`, its End/Error)."""

    stream_id: int
    seq: int = 0
    done: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GoAway:
    """The server is shutting down: finish, then reconnect after the hint."""

    reason: str = ""
    reconnect_after_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribe:
    """Client (v1.1): join the push group `group` (with `leave`: leave it); answered by Subscribed(`id`)."""

    id: int = 0
    group: str = ""
    leave: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribed:
    """Server (v1.1): Subscribe `id` is done (`code` UNSPECIFIED) or refused (`code`, `message`)."""

    id: int = 0
    group: str = ""
    leave: bool = False
    code: ErrorCode = ErrorCode.UNSPECIFIED
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Push:
    """Server (v1.1): a message published to `topic`; exactly one of text or data."""

    topic: str
    text: str | None = None
    data: bytes | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.data is None):
            raise LocalProtocolError("a Push carries exactly one of text, data")

    @property
    def body(self) -> str | bytes:
        """The message, text or bytes."""
        return self.text if self.text is not None else self.data  # type: ignore[return-value]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextPatch:
    """Replace `length` UTF-8 bytes at byte `offset` of a context document's text with `text` (v1.3)."""

    offset: int = 0
    length: int = 0
    text: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """Client (v1.3): set (base_version 0: `text` is the whole text), patch (`patches` on version `base_version`)
    or `drop` context document `name`, making its `version`; `sha256` of the resulting UTF-8 text (b"": unchecked)."""

    name: str
    version: int = 0
    base_version: int = 0
    text: str = ""
    patches: tuple[ContextPatch, ...] = ()
    sha256: bytes = b""
    drop: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextAck:
    """Server (v1.3): Context `name`/`version` is done (`code` UNSPECIFIED) or refused (`code`, `message`; the
    server then holds no such document)."""

    name: str = ""
    version: int = 0
    code: ErrorCode = ErrorCode.UNSPECIFIED
    message: str = ""


Event = (Hello | Welcome | Request | Delta | End | Error | Cancel | Ping | Pong | GoAway | Ack | Subscribe | Subscribed
         | Push | Input | Context | ContextAck)
