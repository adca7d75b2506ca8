"""Exceptions, close codes and error codes of lowlat-mw.

Exception tree::

    LowLatError
    ├── SettingsError            invalid or unknown setting (ValueError too)
    ├── ProtocolError            a frame broke the protocol; carries the close code to answer with
    │   ├── LocalProtocolError   we (the caller of the core) misused it
    │   └── RemoteProtocolError  the peer sent something wrong
    └── ClientError              raised by the Python client
        ├── StreamError          the server ended a stream with an Error frame
        │   └── ResumeFailed     a dropped stream could not be resumed
        │       └── NotDelivered the server never received the stream's Request
        ├── ConnectionClosed     the connection closed with a final code (no reconnect)
        │   └── HandshakeRefused the handshake was answered with an HTTP status (403, 404...): says why
        └── ReconnectFailed      every reconnect attempt failed (or the first connection was refused)
"""

from __future__ import annotations

import enum

__all__ = [
    "ClientError",
    "CloseCode",
    "ConnectionClosed",
    "ErrorCode",
    "HandshakeRefused",
    "LocalProtocolError",
    "LowLatError",
    "NotDelivered",
    "ProtocolError",
    "ReconnectFailed",
    "RemoteProtocolError",
    "ResumeFailed",
    "SettingsError",
    "StreamError",
]


class CloseCode(enum.IntEnum):
    """WebSocket close codes used by lowlat-mw (docs/protocol.md, "Close codes")."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    UNSUPPORTED_DATA = 1003
    INVALID_PAYLOAD = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013
    IDLE_TIMEOUT = 4000
    HEARTBEAT_TIMEOUT = 4001
    DRAINING = 4002
    SLOW_CONSUMER = 4003
    HANDSHAKE_TIMEOUT = 4004
    SESSION_EXPIRED = 4005

    @property
    def reconnect(self) -> bool:
        """True when a client should reconnect (with backoff) after this code."""
        return self in _RECONNECT


_RECONNECT = frozenset(
    {
        CloseCode.GOING_AWAY,
        CloseCode.INTERNAL_ERROR,
        CloseCode.TRY_AGAIN_LATER,
        CloseCode.IDLE_TIMEOUT,
        CloseCode.HEARTBEAT_TIMEOUT,
        CloseCode.DRAINING,
        CloseCode.SLOW_CONSUMER,
        CloseCode.HANDSHAKE_TIMEOUT,
        CloseCode.SESSION_EXPIRED,
    }
)


ALIAS_BASE = 4100


def app_close_code(code: int) -> int:
    """`code` as an application may send it everywhere: 1xxx codes other than 1000 become 41xx.

    Some WebSocket servers (daphne, through autobahn) refuse to send close codes other than 1000
    and 3000-4999 from applications; 4100 + (code - 1000) carries the same meaning there.
    """
    if 1000 < code < 1100:
        return ALIAS_BASE + code - 1000
    return code


def canonical_close_code(code: int | None) -> int | None:
    """Undo :func:`app_close_code`: 4101..4199 -> 1001..1099 (other codes unchanged)."""
    if code is not None and ALIAS_BASE < code < ALIAS_BASE + 100:
        return code - ALIAS_BASE + 1000
    return code


def close_code_reconnects(code: int | None) -> bool:
    """Whether a client should reconnect after close `code` (abnormal drops 1006/None do)."""
    code = canonical_close_code(code)
    if code is None or code in (1005, 1006, 1012, 1013, 1014):
        return True
    try:
        return CloseCode(code).reconnect
    except ValueError:
        return False


class ErrorCode(enum.IntEnum):
    """Codes carried by Error messages; JSON frames spell them in lower case."""

    UNSPECIFIED = 0
    BAD_REQUEST = 1
    MODEL_ERROR = 2
    TOO_MANY_STREAMS = 3
    STREAM_ID_IN_USE = 4
    PROTOCOL_ERROR = 5
    INVALID_PAYLOAD = 6
    MESSAGE_TOO_BIG = 7
    UNSUPPORTED_COMPRESSION = 8
    UNSUPPORTED_MESSAGE = 9
    RESUME_FAILED = 10
    RATE_LIMITED = 11
    UNAUTHORIZED = 12
    INTERNAL = 13
    DRAINING = 14
    UNKNOWN_MODEL = 15
    CONTEXT_MISMATCH = 16
    """v1.3: the server's context document (or kept turn) is not the one the client assumed: send it again."""
    CONTEXT_LIMIT = 17
    """v1.3: a Context over the session's max_contexts or max_context_bytes."""

    @property
    def wire_name(self) -> str:
        """The JSON spelling, e.g. ``"model_error"``."""
        return self.name.lower()

    @classmethod
    def from_wire_name(cls, name: str) -> ErrorCode:
        """Parse the JSON spelling; unknown names map to UNSPECIFIED (forward compatible)."""
        try:
            return cls[name.upper()]
        except KeyError:
            return cls.UNSPECIFIED


class LowLatError(Exception):
    """Base class of every exception lowlat-mw raises on purpose."""


class SettingsError(LowLatError, ValueError):
    """A setting is unknown or has an invalid value; the message names it."""


class ProtocolError(LowLatError):
    """A protocol violation, with the Error code and close code the I/O layer answers with."""

    def __init__(
        self,
        message: str,
        *,
        error_code: ErrorCode = ErrorCode.PROTOCOL_ERROR,
        close_code: int | None = CloseCode.PROTOCOL_ERROR,
        stream_id: int = 0,
    ) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.close_code = close_code
        self.stream_id = stream_id


class LocalProtocolError(ProtocolError):
    """The caller of the core used it wrongly (a bug on our side of the wire)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something that breaks the protocol."""


class ClientError(LowLatError):
    """Base class for errors raised by the Python client."""


class StreamError(ClientError):
    """The server ended a stream with an Error message."""

    def __init__(self, code: ErrorCode, message: str, *, stream_id: int = 0, retryable: bool = False):
        super().__init__(f"{code.wire_name}: {message}")
        self.code = code
        self.message = message
        self.stream_id = stream_id
        self.retryable = retryable


class ResumeFailed(StreamError):
    """The connection dropped and the stream could not be resumed (window or buffer exceeded)."""


class NotDelivered(ResumeFailed):
    """The server never received the stream's Request: it was sent again after each dropped connection, and each time
    the connection dropped before the server had it (a message larger than the server or a proxy takes is dropped
    so). The model never ran: sending the request again is safe, as it is, if something else made the drops."""


class ConnectionClosed(ClientError):
    """The connection was closed with a code after which the client does not reconnect."""

    def __init__(self, code: int | None, reason: str = ""):
        self.raw_code = code
        code = canonical_close_code(code)
        try:
            name = CloseCode(code).name.lower() if code is not None else "abnormal"
        except ValueError:
            name = {1005: "no status", 1006: "abnormal closure", 1012: "service restart",
                    1013: "try again later", 1014: "bad gateway"}.get(code, "unknown")
        super().__init__(f"connection closed with code {code} ({name}){': ' + reason if reason else ''}")
        self.code = code
        self.reason = reason


class HandshakeRefused(ConnectionClosed):
    """The server, or a proxy in front of it, answered the WebSocket handshake with HTTP `status` instead of accepting
    it. `reason` is the text it sent (lowlat-mw names the check that refused: the Origin, the subprotocol), or else
    what the status most likely means at `path` (:func:`refusal_hint`). Final: the client does not retry."""

    def __init__(self, status: int, reason: str = "", *, path: str = "/") -> None:
        super().__init__(None, reason)
        self.status = status
        self.path = path
        self.args = (f"handshake refused with HTTP {status}: {reason or refusal_hint(status, path)}",)


def refusal_hint(status: int, path: str) -> str:
    """What HTTP `status` answering a WebSocket handshake for `path` most likely means, when the answer says nothing
    (lowlat.js's ``refusalHint`` says the same)."""
    if status == 404:
        return f"no WebSocket endpoint at {path}: check the URL's path (the endpoint's `path` setting, /ws by default)"
    if status == 403:
        return (f"no reason given: no WebSocket route at {path} (Starlette and FastAPI refuse an unknown path with "
                "403), an Origin the server does not allow (allowed_origins), or no subprotocol it serves")
    if status in (401, 407):
        return "authentication required, by the app or a proxy in front of the endpoint"
    return "the server, or a proxy in front of it, does not take WebSocket handshakes at this URL"


class ReconnectFailed(ClientError):
    """The client gave up connecting: every attempt failed, or the first connection was refused (nothing listens)."""
