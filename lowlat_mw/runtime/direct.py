"""Direct writes: WebSocket frames built here and written straight to the server's transport.

Through ASGI every frame the driver sends is a message dict that the server's WebSocket protocol
object turns into a frame and writes to its transport, one write per frame. A server that offers
the ASGI scope extension ``"lowlat.transport"`` (our uvicorn protocols do:
:mod:`lowlat_mw.servers.uvicorn`) hands the driver an object with four methods and a ``closing`` flag
(:class:`DirectTransport`) instead: the driver frames its messages itself (server frames are not
masked, RFC 6455 5.1) and writes everything a loop turn produced in one ``write``. The handshake
and the close still go through ASGI ``send``, after the driver wrote out what it holds, so the
server's WebSocket state machine sees the close and the order on the wire is the order of the
driver's calls. Setting ``direct_writes=False`` keeps every frame on the ASGI path.
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Awaitable, Callable, Generator
from functools import partial
from typing import Any, NamedTuple, Protocol

__all__ = ["BURST", "CORK_LIMIT", "EXTENSION", "DirectReads", "DirectTransport", "DropsCloses", "Expected",
           "apply_mask", "expected", "frame_header", "framed", "message_limit", "next_message", "parser_idle",
           "watch_parser"]

EXTENSION = "lowlat.transport"  # the key in scope["extensions"]
CORK_LIMIT = 64 * 1024  # bytes held for the end of the loop turn; more are written at once
BURST = 32  # messages of one socket read handled at once; the rest one per loop turn (fair to other connections)

_OP_TEXT, _OP_BINARY = 0x81, 0x82  # FIN + opcode
_SHORT = struct.Struct("!BBH").pack
_LONG = struct.Struct("!BBQ").pack


class DirectTransport(Protocol):
    """What a server offers as ``scope["extensions"]["lowlat.transport"]`` for an accepted WebSocket."""

    def write(self, data: bytes) -> None:
        """Write bytes made of whole WebSocket frames (the transport's ``write``: never blocks)."""

    def is_writable(self) -> bool:
        """False while the transport's flow control holds writes (its buffer is over the high-water mark)."""

    def wait_writable(self) -> Awaitable[object]:
        """Wait until the transport takes writes again (or the connection is lost)."""

    def is_closing(self) -> bool:
        """True once the connection is closing or closed (a close was sent or the transport is going)."""

    closing: bool
    """True once a close frame was sent on this connection or the connection was lost: no frame may follow.
    An attribute, read before every write; a ``write`` to a transport that closed otherwise may raise
    RuntimeError, which the driver takes as the same."""


class DropsCloses(Protocol):
    """What a server offers (on its ``lowlat.transport`` extension object; the thread bridge) when it drops a
    connection whose close is not over in time. Our uvicorn shims, daphne runner and Flask thread bridge do, with or
    without direct writes; a server without it (plain uvicorn, gunicorn's UvicornWorker, hypercorn) may keep such a
    socket for good, and the driver then releases the connection itself
    (:class:`~lowlat_mw.runtime.connection.ConnectionDriver`, docs/protocol.md 12)."""

    def close_within(self, seconds: float) -> None:
        """Abort this connection (its unsent output dropped, its socket closed) if it is still there `seconds` after
        its close began, ours or the peer's, and then report it gone (``websocket.disconnect``). The driver calls it
        once, as it takes the connection, with its endpoint's ``close_timeout``."""


class DirectReads(DirectTransport, Protocol):
    """A :class:`DirectTransport` that also delivers messages straight to the driver (optional).

    Without it every message goes through the ASGI queue: a message dict, the server pausing and
    resuming its reads around it, and a wake-up of the application's task. With it the server calls
    the receiver from its ``data_received``, as each message is complete.
    """

    def set_receiver(self, receiver: Callable[[bytes | str, int], None]) -> bool:
        """From now on call ``receiver(message, n)`` for each whole message (`n`: its place in the
        current socket read, from 1) instead of queueing it for ASGI ``receive``. Refused (False) when
        messages are queued already: they must be read first, so the connection keeps the ASGI path."""

    def pause_reading(self) -> None:
        """Stop reading the socket (the driver has messages waiting to be handled)."""

    def resume_reading(self) -> None:
        """Read the socket again."""

    expect: Expected | None
    """Optional: the message the driver awaits next (a heartbeat's Pong), set before its Ping is written. A socket
    read that is exactly that message in one masked frame goes to the receiver without the frame parser; any
    other read is parsed as usual. Only a shortcut: the message is the one the bytes carry either way."""


class Expected(NamedTuple):
    """A whole client frame known in advance but for its mask (:func:`expected`)."""

    size: int  # bytes of the frame: 2 header + 4 mask + payload
    b0: int  # FIN + opcode
    b1: int  # MASK + payload length
    payload: bytes  # unmasked
    message: bytes | str  # what it carries, as the receiver takes it


def expected(message: bytes | str) -> Expected | None:
    """`message` as a client's one-frame message (None past 125 bytes: the shortcut is for small frames)."""
    text = type(message) is str
    payload = message.encode() if text else message  # type: ignore[union-attr]
    n = len(payload)
    if n > 125:
        return None
    return Expected(n + 6, _OP_TEXT if text else _OP_BINARY, 0x80 | n, payload, message)  # type: ignore[arg-type]


def framed(message: bytes | str) -> bytes:
    """`message` as one unmasked server frame (binary for bytes, text for str)."""
    data = message.encode() if type(message) is str else message
    return frame_header(data, type(message) is str) + data  # type: ignore[arg-type]


def frame_header(data: bytes, text: bool) -> bytes:
    """The header of one unmasked, unfragmented server frame carrying `data` (RFC 6455 5.2)."""
    n = len(data)
    op = _OP_TEXT if text else _OP_BINARY
    if n < 126:
        return bytes((op, n))
    if n < 65536:
        return _SHORT(op, 126, n)
    return _LONG(op, 127, n)


try:  # websockets (its state constant, its C helper) is there wherever the client or uvicorn's websockets protocol is
    from websockets.protocol import OPEN as _WS_OPEN
except ImportError:  # pragma: no cover - depends on what is installed
    _WS_OPEN = None
try:
    from websockets.speedups import apply_mask as _apply_mask
except ImportError:  # pragma: no cover - depends on what is installed
    def _apply_mask(data: bytes, mask: bytes) -> bytes:
        n = len(data)
        key = int.from_bytes((mask * (n // 4 + 1))[:n], "little")
        return (int.from_bytes(data, "little") ^ key).to_bytes(n, "little")

apply_mask = _apply_mask
"""``apply_mask(payload, key)``: a client frame's payload unmasked (websockets' C helper where installed)."""


def next_message(data: bytes, pos: int, masked: bool, limit: int | None) -> tuple[bytes | str, int] | None:
    """The message of the WebSocket frame at ``data[pos:]``, and where the frame ends, if it is a whole
    unfragmented text or binary message of at most `limit` bytes, masked as `masked` says (frames from a
    client are, RFC 6455 5.1), text valid UTF-8, with no RSV bit (no extension); else None.

    The fast path of the readers of our server protocol and of the client: most messages are one small
    frame, and reading it here costs a tenth of a general parser. Whatever this returns None for (a
    partial frame, a control frame, a fragment, anything wrong) goes to the general parser, which
    answers it as the RFC says.
    """
    end = len(data)
    if end - pos < 2:
        return None
    b0 = data[pos]
    if b0 != _OP_BINARY and b0 != _OP_TEXT:
        return None
    b1 = data[pos + 1]
    if (b1 >= 0x80) != masked:
        return None
    n = b1 & 0x7F
    head = pos + 2
    if n == 126:
        if end - head < 2:
            return None
        n = (data[head] << 8) | data[head + 1]
        head += 2
    elif n == 127:
        return None
    if limit is not None and n > limit:
        return None
    if masked:
        stop = head + 4 + n
        if stop > end:
            return None
        payload = _apply_mask(data[head + 4:stop], data[head:head + 4])
    else:
        stop = head + n
        if stop > end:
            return None
        payload = data[head:stop]
    if b0 == _OP_TEXT:
        try:
            return payload.decode(), stop
        except UnicodeDecodeError:
            return None
    return payload, stop


def parser_idle(conn: Any) -> bool:
    """Whether websockets' sans-I/O protocol `conn` (watched: :func:`watch_parser`) waits between two messages with
    nothing buffered: open, no fragmented message in progress, no extension, and its parser at a frame boundary.
    Only then may :func:`next_message` read the frames that follow, in its place.

    An empty buffer alone is not enough: websockets takes a frame's header (and mask) out of its buffer as it
    reads them, so a socket read that ends right after a header leaves the buffer empty with the parser waiting
    for that frame's payload (a client that writes header and payload apart). None of this needs a clock or I/O;
    it costs a few attribute reads, and our uvicorn protocol asks once per read it parsed."""
    reader = conn.reader
    return (conn.state is _WS_OPEN and conn.current_size is None and not reader.buffer and not conn.extensions
            and getattr(reader, "lowlat_between_frames", False))


def watch_parser(conn: Any) -> None:
    """Let :func:`parser_idle` see when websockets' sans-I/O protocol `conn` waits at a frame boundary: its parser
    waits between two frames in its reader's ``at_eof`` (websockets' ``Protocol.parse``), looked up on the reader
    for each frame, so a wrapper of it set on the reader notes when the parser waits there
    (``lowlat_between_frames``). Call it as `conn` is made, before it reads frames (the handshake may be read
    already: it does not wait there); a parser that waits there already counts as idle from its next frame on.
    A websockets that waits elsewhere leaves the flag False: every read then goes to its parser, as it would."""
    reader = conn.reader
    reader.lowlat_between_frames = False
    reader.at_eof = partial(_at_eof_noted, weakref.ref(reader))  # (weak: no cycle reader -> wrapper -> reader)


def _at_eof_noted(ref: weakref.ref[Any]) -> Generator[None, None, bool]:
    """The reader's own ``at_eof``, with ``lowlat_between_frames`` True while it waits for data."""
    reader = ref()
    reader.lowlat_between_frames = True
    try:
        return (yield from type(reader).at_eof(reader))
    finally:
        reader.lowlat_between_frames = False


def message_limit(conn: Any) -> int | None:
    """The largest message websockets' protocol `conn` accepts in one frame (None: no limit)."""
    limit, fragment = conn.max_message_size, conn.max_fragment_size
    if fragment is not None:
        limit = fragment if limit is None else min(limit, fragment)
    return limit  # type: ignore[no-any-return]

