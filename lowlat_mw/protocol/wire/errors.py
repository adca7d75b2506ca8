"""The three ways a frame is refused, as both codecs raise them (docs/protocol.md, "Errors")."""

from __future__ import annotations

from ...errors import CloseCode, ErrorCode, RemoteProtocolError

__all__ = ["bad_request", "invalid", "unsupported"]


def invalid(msg: str, code: int = CloseCode.INVALID_PAYLOAD) -> RemoteProtocolError:
    """The frame cannot be read (bad bytes, wrong JSON types): an error and the close code `code`."""
    return RemoteProtocolError(msg, error_code=ErrorCode.INVALID_PAYLOAD, close_code=code)


def bad_request(msg: str, stream_id: int = 0) -> RemoteProtocolError:
    """The frame parsed but its content is not acceptable: answer with an Error, keep the connection.
    The Error names the Request's stream when it has a usable id, so the client knows which failed."""
    sid = stream_id if isinstance(stream_id, int) and 0 < stream_id <= 0xFFFFFFFF else 0
    return RemoteProtocolError(msg, error_code=ErrorCode.BAD_REQUEST, close_code=None, stream_id=sid)


def unsupported(kind: str) -> RemoteProtocolError:
    """A message kind this revision does not know: an Error, the connection stays."""
    return RemoteProtocolError(
        f"unsupported message type {kind!r}", error_code=ErrorCode.UNSUPPORTED_MESSAGE, close_code=None
    )
