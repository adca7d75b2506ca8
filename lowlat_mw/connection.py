"""The server side of one lowlat-mw connection as a sans-IO state machine.

Drivers feed it received WebSocket messages, model output and the time; it answers with
actions (send these bytes, start/cancel a model stream, close with this code). It owns the
handshake, stream bookkeeping, heartbeat, idle reaping and the codec, and never does I/O.

States::

    AWAIT_HELLO --Hello--> OPEN --close/error/timeout--> CLOSED
         \\--------------- timeout / bad frame -------------^
"""

from __future__ import annotations

import enum
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import events as ev
from .codec import codec_for
from .compression import CompressionSelector, available_codecs
from .errors import CloseCode, ErrorCode, LocalProtocolError, RemoteProtocolError
from .heartbeat import Heartbeat, HeartbeatAction, IdleReaper
from .settings import SUBPROTOCOL_JSON, Settings

__all__ = [
    "Action",
    "CancelStream",
    "CloseConnection",
    "ConnState",
    "SendFrame",
    "ServerConnection",
    "StartStream",
    "negotiate_subprotocol",
]


# ------------------------------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send this WebSocket message (bytes: binary frame, str: text frame)."""

    data: bytes | str


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the WebSocket with `code` and `reason`; cancel every running stream."""

    code: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StartStream:
    """Run the model for `request`; report its chunks with ``send_chunk`` and its end."""

    request: ev.Request


@dataclass(frozen=True, slots=True)
class CancelStream:
    """Stop the model of `stream_id`, then call ``finish_stream(reason="cancelled")``."""

    stream_id: int


Action = SendFrame | CloseConnection | StartStream | CancelStream


class ConnState(enum.Enum):
    """Where the connection is in its life."""

    AWAIT_HELLO = "await_hello"
    OPEN = "open"
    CLOSED = "closed"


def negotiate_subprotocol(offered: list[str] | tuple[str, ...], settings: Settings) -> tuple[bool, str | None]:
    """Pick the subprotocol: (accept?, subprotocol to answer with).

    The first offered subprotocol the server serves wins. No offer means JSON without a
    subprotocol header (if JSON is served). Offers of which none is served are refused.
    """
    if not offered:
        return (SUBPROTOCOL_JSON in settings.subprotocols), None
    for sp in offered:
        if sp in settings.subprotocols:
            return True, sp
    return False, None


@dataclass(slots=True)
class _Stream:
    started_at: float
    seq: int = 0
    first_chunk_at: float | None = None
    out_bytes: int = 0
    cancelling: bool = False


@dataclass(slots=True)
class _Stats:
    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    raw_bytes_out: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class ServerConnection:
    """Protocol state of one accepted WebSocket, driven by an I/O layer."""

    def __init__(
        self,
        settings: Settings,
        *,
        subprotocol: str | None,
        now: float,
        session_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.subprotocol = subprotocol
        self.codec = codec_for(subprotocol)
        self.state = ConnState.AWAIT_HELLO
        self.session_id = session_id or secrets.token_urlsafe(12)
        self.streams: dict[int, _Stream] = {}
        self.heartbeat = Heartbeat(
            settings.heartbeat_interval, settings.heartbeat_max_interval, settings.heartbeat_timeout, now
        )
        self.reaper = IdleReaper(settings.idle_timeout, now)
        self.handshake_deadline = now + settings.handshake_timeout
        self.compression: tuple[str, ...] = ()
        self.compressor: CompressionSelector | None = None
        self.close_code: int | None = None
        self.close_reason = ""
        self.stats = _Stats()

    # ------------------------------------------------------------------ helpers
    def _send(self, event: ev.Event) -> SendFrame:
        data = self.codec.encode(event, self.compressor)
        self.stats.frames_out += 1
        self.stats.bytes_out += len(data)
        return SendFrame(data)

    def _close(self, code: int, reason: str) -> list[Action]:
        if self.state is ConnState.CLOSED:
            return []
        self.state = ConnState.CLOSED
        self.close_code, self.close_reason = code, reason
        self.streams.clear()
        return [CloseConnection(code, reason)]

    def _error(self, stream_id: int, code: ErrorCode, message: str, *, retryable: bool = False) -> SendFrame:
        return self._send(ev.Error(stream_id=stream_id, code=code, message=message, retryable=retryable))

    @property
    def closed(self) -> bool:
        """True once a CloseConnection was returned or the peer went away."""
        return self.state is ConnState.CLOSED

    # ------------------------------------------------------------------ input
    def receive(self, data: bytes | str, now: float) -> list[Action]:
        """Handle one WebSocket message from the client."""
        if self.state is ConnState.CLOSED:
            return []
        self.stats.frames_in += 1
        size = len(data) if isinstance(data, bytes | bytearray) or len(data) * 4 <= self.settings.max_frame_size \
            else len(data.encode("utf-8", "surrogatepass"))
        self.stats.bytes_in += size
        if size > self.settings.max_frame_size:
            self.heartbeat.on_receive(now)
            return [
                self._error(0, ErrorCode.MESSAGE_TOO_BIG,
                            f"frame of {size} bytes exceeds max_frame_size ({self.settings.max_frame_size})"),
                *self._close(CloseCode.MESSAGE_TOO_BIG, "frame too big"),
            ]
        try:
            event = self.codec.decode(
                data, limit=self.settings.max_decompressed_size, allowed=self.compression
            )
        except RemoteProtocolError as exc:
            self.heartbeat.on_receive(now)
            actions: list[Action] = [self._error(exc.stream_id, exc.error_code, str(exc))]
            if exc.close_code is not None:
                actions += self._close(exc.close_code, exc.error_code.wire_name)
            return actions
        # Requests and Cancels are application traffic (they stretch the ping interval); Hello,
        # Ping and Pong only prove the peer alive.
        self.heartbeat.on_receive(now, application=isinstance(event, ev.Request | ev.Cancel))
        return self._handle(event, now)

    def _handle(self, event: ev.Event, now: float) -> list[Action]:
        if self.state is ConnState.AWAIT_HELLO:
            if not isinstance(event, ev.Hello):
                return [
                    self._error(0, ErrorCode.PROTOCOL_ERROR, f"expected hello, got {type(event).__name__.lower()}"),
                    *self._close(CloseCode.PROTOCOL_ERROR, "expected hello"),
                ]
            return self._on_hello(event, now)
        if isinstance(event, ev.Request):
            return self._on_request(event, now)
        if isinstance(event, ev.Cancel):
            self.reaper.touch(now)
            stream = self.streams.get(event.stream_id)
            if stream is None or stream.cancelling:
                return []  # already finished: the End/Error is on its way
            stream.cancelling = True
            return [CancelStream(event.stream_id)]
        if isinstance(event, ev.Ping):
            return [self._send(event.response())]
        if isinstance(event, ev.Pong):
            self.heartbeat.on_pong(event.id, now)
            return []
        if isinstance(event, ev.Error):
            return []  # the client reports a problem; nothing to answer
        return [self._error(0, ErrorCode.PROTOCOL_ERROR,
                            f"{type(event).__name__.lower()} is not sent by clients")]

    def _on_hello(self, hello: ev.Hello, now: float) -> list[Action]:
        server_codecs = [c for c in self.settings.compression if c in available_codecs()]
        if self.codec.binary:
            self.compression = tuple(c for c in server_codecs if c in hello.compression)
        if self.compression:
            self.compressor = CompressionSelector(
                self.compression, min_size=self.settings.compression_min_size, link_mbps=self.settings.link_mbps
            )
        self.state = ConnState.OPEN
        self.reaper.touch(now)
        s = self.settings
        welcome = ev.Welcome(
            session_id=self.session_id,
            compression=self.compression,
            max_frame_size=s.max_frame_size,
            max_decompressed_size=s.max_decompressed_size,
            max_streams=s.max_streams,
            heartbeat_interval_ms=round(s.heartbeat_interval * 1000),
            idle_timeout_ms=round(s.idle_timeout * 1000),
            server=s.server_name,
        )
        # Welcome itself is never compressed: the client learns the codecs from it.
        compressor, self.compressor = self.compressor, None
        frame = self._send(welcome)
        self.compressor = compressor
        return [frame]

    def _on_request(self, req: ev.Request, now: float) -> list[Action]:
        self.reaper.touch(now)
        sid = req.stream_id
        if sid in self.streams:
            # On stream 0: an Error on `sid` would mean "stream sid ended", and it has not.
            return [self._error(0, ErrorCode.STREAM_ID_IN_USE, f"stream {sid} is already running")]
        if len(self.streams) >= self.settings.max_streams:
            return [self._error(sid, ErrorCode.TOO_MANY_STREAMS,
                                f"at most {self.settings.max_streams} concurrent streams per connection",
                                retryable=True)]
        self.streams[sid] = _Stream(started_at=now)
        return [StartStream(req)]

    # ------------------------------------------------------------------ model output
    def send_chunk(self, stream_id: int, chunk: str | bytes, now: float) -> list[Action]:
        """The model of `stream_id` produced `chunk`: frame it as one Delta (or several if huge)."""
        stream = self.streams.get(stream_id)
        if stream is None or self.state is ConnState.CLOSED:
            return []
        if not isinstance(chunk, str | bytes | bytearray | memoryview):
            raise LocalProtocolError(f"model chunks must be str or bytes, got {type(chunk).__name__}")
        if isinstance(chunk, bytearray | memoryview):
            chunk = bytes(chunk)
        if stream.first_chunk_at is None:
            stream.first_chunk_at = now
        self.reaper.touch(now)
        out: list[Action] = []
        limit = self.settings.max_frame_size
        pending = _split(chunk, limit - 32)
        pending.reverse()
        while pending:
            piece = pending.pop()
            seq = stream.seq + 1
            delta = (ev.Delta(stream_id=stream_id, seq=seq, text=piece) if isinstance(piece, str)
                     else ev.Delta(stream_id=stream_id, seq=seq, data=piece))
            data = self.codec.encode(delta, self.compressor)
            # A text frame's size is its UTF-8 length (len(str) counts characters).
            size = len(data) if isinstance(data, bytes) or len(data) * 4 <= limit else _encoded_len(data)
            if size > limit and len(piece) > 1:
                # JSON escaping or base64 made it too big for one frame: halve and try again.
                halves = _split(piece, max(1, _encoded_len(piece) // 2))
                pending.extend(reversed(halves))
                continue
            stream.seq = seq
            n = _encoded_len(piece)
            stream.out_bytes += n
            self.stats.raw_bytes_out += n
            self.stats.frames_out += 1
            self.stats.bytes_out += size
            out.append(SendFrame(data))
        return out

    def finish_stream(
        self,
        stream_id: int,
        now: float,
        *,
        reason: str = "stop",
        timings_ms: Mapping[str, float] | None = None,
    ) -> list[Action]:
        """The model of `stream_id` finished (reason "stop") or was cancelled ("cancelled")."""
        stream = self.streams.pop(stream_id, None)
        if stream is None or self.state is ConnState.CLOSED:
            return []
        self.reaper.touch(now)
        timings = {"total": (now - stream.started_at) * 1000}
        if stream.first_chunk_at is not None:
            timings["first_delta"] = (stream.first_chunk_at - stream.started_at) * 1000
        if timings_ms:
            timings.update(timings_ms)
        return [self._send(ev.End(stream_id=stream_id, last_seq=stream.seq, finish_reason=reason,
                                  timings_ms=timings,
                                  usage={"deltas": stream.seq, "output_bytes": stream.out_bytes}))]

    def fail_stream(self, stream_id: int, now: float, code: ErrorCode, message: str) -> list[Action]:
        """The model of `stream_id` failed: end the stream with an Error."""
        stream = self.streams.pop(stream_id, None)
        if stream is None or self.state is ConnState.CLOSED:
            return []
        self.reaper.touch(now)
        return [self._error(stream_id, code, message)]

    # ------------------------------------------------------------------ time and teardown
    def next_deadline(self) -> float:
        """When :meth:`tick` next has something to do (inf when closed)."""
        if self.state is ConnState.CLOSED:
            return math.inf
        if self.state is ConnState.AWAIT_HELLO:
            return self.handshake_deadline  # no Pings before Welcome: see tick()
        return min(self.heartbeat.deadline(), self.reaper.deadline(len(self.streams)))

    def tick(self, now: float) -> list[Action]:
        """Timers: handshake timeout, heartbeat pings and timeouts, idle reaping."""
        if self.state is ConnState.CLOSED:
            return []
        if self.state is ConnState.AWAIT_HELLO:
            # A client may send nothing but Hello before Welcome (protocol.md 7), so it could not
            # answer a Ping: until Hello only the handshake timeout (4004) applies.
            if now >= self.handshake_deadline:
                return self._close(CloseCode.HANDSHAKE_TIMEOUT, "no hello within handshake_timeout")
            return []
        if self.state is ConnState.AWAIT_HELLO:
            return []  # no Pings before Welcome: the handshake timeout covers this phase
        hb = self.heartbeat.poll(now)
        if hb is HeartbeatAction.PEER_DEAD:
            return self._close(CloseCode.HEARTBEAT_TIMEOUT, "no pong within heartbeat_timeout")
        if self.state is ConnState.OPEN and self.reaper.expired(now, len(self.streams)):
            return self._close(CloseCode.IDLE_TIMEOUT, "idle")
        if hb is HeartbeatAction.SEND_PING:
            return [self._send(ev.Ping(id=self.heartbeat.ping_id))]
        return []

    def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> list[Action]:
        """Close from our side (e.g. server shutdown)."""
        return self._close(code, reason)

    def connection_lost(self) -> list[Action]:
        """The peer went away: every running stream must be cancelled."""
        running = [CancelStream(sid) for sid in self.streams]
        self.state = ConnState.CLOSED
        self.streams.clear()
        return running


def _encoded_len(piece: str | bytes) -> int:
    return len(piece) if isinstance(piece, bytes) else len(piece.encode("utf-8", "surrogatepass"))


def _split(chunk: str | bytes, limit: int) -> list[str | bytes]:
    """Split a chunk so each piece's encoded size fits in `limit` bytes (at character boundaries)."""
    if isinstance(chunk, bytes):
        if len(chunk) <= limit:
            return [chunk]
        return [chunk[i:i + limit] for i in range(0, len(chunk), limit)]
    if len(chunk) * 4 <= limit:
        return [chunk]
    raw = chunk.encode()
    if len(raw) <= limit:
        return [chunk]
    pieces: list[str | bytes] = []
    start = 0
    while start < len(raw):
        end = min(start + limit, len(raw))
        while end < len(raw) and (raw[end] & 0xC0) == 0x80:  # don't cut inside a UTF-8 sequence
            end -= 1
        if end == start:  # `limit` is smaller than this character: take the whole character
            end += 1
            while end < len(raw) and (raw[end] & 0xC0) == 0x80:
                end += 1
        pieces.append(raw[start:end].decode())
        start = end
    return pieces
