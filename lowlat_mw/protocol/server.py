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
import json
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import CloseCode, ErrorCode, LocalProtocolError, RemoteProtocolError
from ..observability.metrics import FrameStats, Metrics, StreamTimer, subprotocol_label
from ..settings import SUBPROTOCOL_JSON, Settings
from . import events as ev
from .codec import codec_for
from .compression import CompressionSelector, available_codecs
from .heartbeat import Heartbeat, HeartbeatAction, IdleReaper
from .limits import TokenBucket
from .session import Session, StreamState

__all__ = [
    "Action",
    "Authenticate",
    "CancelStream",
    "CloseConnection",
    "ConnState",
    "ResumeSession",
    "SendFrame",
    "ServerConnection",
    "StartStream",
    "negotiate_subprotocol",
    "normalize_chunk",
]


# ------------------------------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send this WebSocket message (bytes: binary frame, str: text frame).

    `error` is the Error it carries, if any, so the driver can log it (the state machine does no I/O).
    """

    data: bytes | str
    error: ev.Error | None = None


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


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Run the authenticate hook for `hello`, then call ``conn.authenticated(principal, now)``."""

    hello: ev.Hello


@dataclass(frozen=True, slots=True)
class ResumeSession:
    """The client asks to resume: look the session up by token, then call ``conn.resume(...)``."""

    token: str
    session_id: str
    last_seq: Mapping[int, int]


Action = SendFrame | CloseConnection | StartStream | CancelStream | ResumeSession | Authenticate


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


class ServerConnection:
    """Protocol state of one accepted WebSocket, driven by an I/O layer.

    Streams live in a :class:`~lowlat_mw.protocol.session.Session` that a later connection can take over
    (resume); everything here is about this one socket: codec, compression, heartbeat, idleness.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        subprotocol: str | None,
        now: float,
        session_id: str | None = None,
        clock: Callable[[], float] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """`clock` (e.g. time.perf_counter) turns on per-stage stream timings; `metrics` counts."""
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self._frame_at = 0.0  # clock value when the frame being handled arrived
        self.subprotocol = subprotocol
        self.codec = codec_for(subprotocol)
        self.state = ConnState.AWAIT_HELLO
        self._new_session_id = session_id or secrets.token_urlsafe(12)
        self.session: Session | None = None
        self.hello: ev.Hello | None = None
        self.heartbeat = Heartbeat(
            settings.heartbeat_interval, settings.heartbeat_max_interval, settings.heartbeat_timeout, now
        )
        self.reaper = IdleReaper(settings.idle_timeout, now)
        self.handshake_deadline = now + settings.handshake_timeout
        self.compression: tuple[str, ...] = ()
        self.compressor: CompressionSelector | None = None
        self.close_code: int | None = None
        self.close_reason = ""
        self.draining = False
        self.resumed = False  # Welcome continued an earlier session
        self.opened_at = now
        self.principal: object | None = None
        self.bucket = TokenBucket(settings.rate_limit, settings.rate_burst, now) if settings.rate_limit else None
        self.stats = FrameStats(subprotocol_label(subprotocol))  # frames and bytes by compression codec
        if metrics is not None:
            metrics.attach(self.stats)

    @property
    def session_id(self) -> str:
        """The session's id (a fresh one until a Hello resumes another)."""
        return self.session.session_id if self.session is not None else self._new_session_id

    @property
    def streams(self) -> dict[int, StreamState]:
        """Running streams of this connection's session (none once the connection is closed)."""
        if self.session is None or self.state is ConnState.CLOSED:
            return {}
        return self.session.running

    # ------------------------------------------------------------------ helpers
    def _send(self, event: ev.Event) -> SendFrame:
        data, raw, codec_id = self.codec.encode_frame(event, self.compressor)
        self.stats.count_sent(codec_id, raw, len(data) if isinstance(data, bytes) else raw)
        if isinstance(event, ev.Error):
            if self.metrics is not None:
                self.metrics.inc("errors", event.code.wire_name)
            return SendFrame(data, event)
        return SendFrame(data)

    def deliver(self, events: list[ev.Event], now: float) -> list[Action]:
        """Frames for events the session already recorded (an End/Error, output made while detached)."""
        if self.state is not ConnState.OPEN:
            return []
        self.reaper.touch(now)
        return [self._send(e) for e in events]

    @property
    def open(self) -> bool:
        """True between Welcome and close: frames can be sent."""
        return self.state is ConnState.OPEN

    def _close(self, code: int, reason: str) -> list[Action]:
        if self.state is ConnState.CLOSED:
            return []
        self.state = ConnState.CLOSED
        self.close_code, self.close_reason = code, reason
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
        if self.clock is not None:
            self._frame_at = self.clock()
        size = len(data) if isinstance(data, bytes | bytearray) or len(data) * 4 <= self.settings.max_frame_size \
            else len(data.encode("utf-8", "surrogatepass"))
        received = self.stats.received
        received[0] += 1
        received[1] += size
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
        # Ping, Pong and Ack only prove the peer alive.
        self.heartbeat.on_receive(now, application=isinstance(event, ev.Request | ev.Cancel))
        return self._handle(event, now)

    def _handle(self, event: ev.Event, now: float) -> list[Action]:
        if self.state is ConnState.AWAIT_HELLO:
            if not isinstance(event, ev.Hello) or self.hello is not None:
                return [
                    self._error(0, ErrorCode.PROTOCOL_ERROR, f"expected hello, got {type(event).__name__.lower()}"),
                    *self._close(CloseCode.PROTOCOL_ERROR, "expected hello"),
                ]
            return self._on_hello(event, now)
        session = self.session
        assert session is not None
        if isinstance(event, ev.Request):
            return self._on_request(event, now)
        if isinstance(event, ev.Ack):
            session.ack(event.stream_id, event.seq, event.done)
            return []
        if isinstance(event, ev.Cancel):
            self.reaper.touch(now)
            stream = session.streams.get(event.stream_id)
            if stream is None or not stream.running or stream.cancelling:
                return []  # already finished: the End/Error is on its way
            stream.cancelling = True
            return [CancelStream(event.stream_id)]
        if isinstance(event, ev.Ping):
            return [self._send(event.response())]
        if isinstance(event, ev.Pong):
            awaited = self.heartbeat.awaiting
            self.heartbeat.on_pong(event.id, now)
            if self.metrics is not None and awaited is not None and self.heartbeat.awaiting is None:
                self.metrics.observe("heartbeat_rtt_seconds", self.heartbeat.rtt or 0.0)
            return []
        if isinstance(event, ev.Error):
            return []  # the client reports a problem; nothing to answer
        return [self._error(0, ErrorCode.PROTOCOL_ERROR,
                            f"{type(event).__name__.lower()} is not sent by clients")]

    def _on_hello(self, hello: ev.Hello, now: float) -> list[Action]:
        self.hello = hello
        server_codecs = [c for c in self.settings.compression if c in available_codecs()]
        if self.codec.binary:
            self.compression = tuple(c for c in server_codecs if c in hello.compression)
        if self.compression:
            self.compressor = CompressionSelector(
                self.compression, min_size=self.settings.compression_min_size, link_mbps=self.settings.link_mbps
            )
        if self.settings.authenticate:
            return [Authenticate(hello)]
        return self._admitted(now)

    def authenticated(self, principal: object | None, now: float, reason: str = "") -> list[Action]:
        """Answer an :class:`Authenticate`: `principal` admits the client, None refuses it (1008)."""
        if self.state is not ConnState.AWAIT_HELLO or self.hello is None:
            return []
        if principal is None:
            return [self._error(0, ErrorCode.UNAUTHORIZED, reason or "authentication failed"),
                    *self._close(CloseCode.POLICY_VIOLATION, "unauthorized")]
        self.principal = principal
        return self._admitted(now)

    def _admitted(self, now: float) -> list[Action]:
        hello = self.hello
        assert hello is not None
        if hello.resume_token:
            return [ResumeSession(hello.resume_token, Session.session_id_of(hello.resume_token), hello.last_seq)]
        return self._welcome(Session(self.settings, now=now, session_id=self._new_session_id), now, resumed=False)

    def resume(self, session: Session | None, now: float) -> list[Action]:
        """Answer a :class:`ResumeSession`: `session` is what the store had for the token (or None).

        Returns Welcome (``resumed`` true or false), then everything the client missed, and
        CancelStream for streams the client no longer wants. A failed resume starts a new
        session and fails each stream the client listed with ``resume_failed``.
        """
        hello = self.hello
        assert hello is not None and self.state is ConnState.AWAIT_HELLO
        if (session is None or not session.token_matches(hello.resume_token)
                or (session.principal is not None and session.principal != self.principal)):
            if self.metrics is not None:
                self.metrics.inc("resumes", "failed")
            actions = self._welcome(Session(self.settings, now=now), now, resumed=False)
            actions += [self._error(sid, ErrorCode.RESUME_FAILED, "session expired or unknown")
                        for sid in hello.last_seq]
            if not hello.last_seq:
                actions.append(self._error(0, ErrorCode.RESUME_FAILED, "session expired or unknown"))
            return actions
        session.attach()
        if self.metrics is not None:
            self.metrics.inc("resumes", "resumed")
        actions = self._welcome(session, now, resumed=True)
        events, cancels = session.replay(hello.last_seq)
        actions += [self._send(e) for e in events]
        actions += [CancelStream(sid) for sid in cancels]
        return actions

    def _welcome(self, session: Session, now: float, *, resumed: bool) -> list[Action]:
        assert self.hello is not None
        self.session = session
        self.resumed = resumed
        if not resumed:
            session.principal = self.principal
        window = session.set_client_window(self.hello.flow_window)
        self.state = ConnState.OPEN
        self.reaper.touch(now)
        if self.metrics is not None:
            self.metrics.observe("handshake_seconds", now - self.opened_at)
        s = self.settings
        welcome = ev.Welcome(
            session_id=session.session_id,
            resume_token=session.resume_token,
            compression=self.compression,
            max_frame_size=s.max_frame_size,
            max_decompressed_size=s.max_decompressed_size,
            max_streams=s.max_streams,
            heartbeat_interval_ms=round(s.heartbeat_interval * 1000),
            idle_timeout_ms=round(s.idle_timeout * 1000),
            server=s.server_name,
            resumed=resumed,
            resume_window_ms=round(s.resume_window * 1000),
            flow_window=window,
        )
        # Welcome itself is never compressed: the client learns the codecs from it.
        compressor, self.compressor = self.compressor, None
        frame = self._send(welcome)
        self.compressor = compressor
        return [frame]

    def _on_request(self, req: ev.Request, now: float) -> list[Action]:
        self.reaper.touch(now)
        assert self.session is not None
        sid = req.stream_id
        if self.draining:
            return [self._error(sid, ErrorCode.DRAINING, "server is draining: retry after reconnecting",
                                retryable=True)]
        if self.bucket is not None and not self.bucket.take(now):
            return [self._error(sid, ErrorCode.RATE_LIMITED, retryable=True,
                                message=f"more than {self.settings.rate_limit:g} requests/s: "
                                        f"retry in {self.bucket.retry_after():.2f} s")]
        size = _request_size(req)
        if size > self.settings.max_request_size:
            return [self._error(sid, ErrorCode.MESSAGE_TOO_BIG,
                                f"request of {size} bytes exceeds max_request_size ({self.settings.max_request_size})")]
        error = self.session.start(req, now)
        if error is not None:
            return [self._send(error)]
        if self.clock is not None:
            timer = self.session.streams[sid].timer = StreamTimer(self.clock, self._frame_at)
            timer.lap("decode")
        return [StartStream(req)]

    # ------------------------------------------------------------------ model output
    def send_chunk(self, stream_id: int, chunk: str | bytes, now: float) -> list[Action]:
        """The model of `stream_id` produced `chunk`: frame it as one Delta (or several if huge)."""
        session = self.session
        stream = session.streams.get(stream_id) if session is not None else None
        if stream is None or not stream.running or self.state is ConnState.CLOSED:
            return []
        if type(chunk) is not str or not chunk.isascii():  # plain ASCII text (most tokens) needs no check
            chunk = normalize_chunk(chunk)
        self.reaper.touch(now)
        limit = self.settings.max_frame_size
        # The common case, far below the frame limit, is one piece without splitting.
        pending = [chunk] if len(chunk) * 4 <= limit - 32 else _split(chunk, limit - 32)[::-1]
        out: list[Action] = []
        while pending:
            piece = pending.pop()
            probe = ev.Delta.of(stream_id, stream.seq + 1, piece)
            data, raw, codec_id = self.codec.encode_frame(probe, self.compressor, stream.timer)
            # A text frame's size is its UTF-8 length (len(str) counts characters).
            size = len(data) if isinstance(data, bytes) else raw
            if size > limit and len(piece) > 1:
                # JSON escaping or base64 made it too big for one frame: halve and try again.
                halves = _split(piece, max(1, _encoded_len(piece) // 2))
                pending.extend(reversed(halves))
                continue
            session.record(stream_id, piece, now, probe)  # type: ignore[union-attr]
            self.stats.count_sent(codec_id, raw, size)
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
        if self.session is None:
            return []
        end = self.session.finish(stream_id, now, reason=reason, timings_ms=timings_ms)
        if end is None or self.state is ConnState.CLOSED:
            return []
        self.reaper.touch(now)
        return [self._send(end)]

    def fail_stream(self, stream_id: int, now: float, code: ErrorCode, message: str) -> list[Action]:
        """The model of `stream_id` failed: end the stream with an Error."""
        if self.session is None:
            return []
        err = self.session.fail(stream_id, now, code, message)
        if err is None or self.state is ConnState.CLOSED:
            return []
        self.reaper.touch(now)
        return [self._send(err)]

    # ------------------------------------------------------------------ time and teardown
    def _running_count(self) -> int:
        """Running streams, counted without building a dict (the timers ask on every heartbeat)."""
        return self.session.running_count() if self.session is not None else 0

    def next_deadline(self) -> float:
        """When :meth:`tick` next has something to do (inf when closed)."""
        if self.state is ConnState.CLOSED:
            return math.inf
        if self.state is ConnState.AWAIT_HELLO:
            return self.handshake_deadline  # no Pings before Welcome: see tick()
        running = self._running_count()
        lifetime = (self.opened_at + self.settings.max_session_lifetime
                    if self.settings.max_session_lifetime and not running else math.inf)
        return min(self.heartbeat.deadline(), self.reaper.deadline(running), lifetime)

    def tick(self, now: float) -> list[Action]:
        """Timers: handshake timeout, heartbeat pings and timeouts, idle reaping."""
        if self.state is ConnState.CLOSED:
            return []
        if self.state is ConnState.AWAIT_HELLO:
            # A client may send nothing but Hello before Welcome (protocol.md 7), so it could not
            # answer a Ping: until Welcome only the handshake timeout (4004) applies.
            if now >= self.handshake_deadline:
                return self._close(CloseCode.HANDSHAKE_TIMEOUT, "no hello within handshake_timeout")
            return []
        hb = self.heartbeat.poll(now)
        if hb is HeartbeatAction.PEER_DEAD:
            return self._close(CloseCode.HEARTBEAT_TIMEOUT, "no pong within heartbeat_timeout")
        running = self._running_count()
        if self.reaper.expired(now, running):
            return self._close(CloseCode.IDLE_TIMEOUT, "idle")
        lifetime = self.settings.max_session_lifetime
        if lifetime and not running and now >= self.opened_at + lifetime:
            return self._close(CloseCode.SESSION_EXPIRED, "max_session_lifetime reached")
        if hb is HeartbeatAction.SEND_PING:
            return [self._send(ev.Ping(id=self.heartbeat.ping_id))]
        return []

    def drain(self, reconnect_after_ms: int = 0) -> list[Action]:
        """Server shutdown begins: send GoAway and refuse new streams (running ones go on)."""
        if self.state is not ConnState.OPEN or self.draining:
            return []
        self.draining = True
        return [self._send(ev.GoAway(reason="server draining", reconnect_after_ms=reconnect_after_ms))]

    def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> list[Action]:
        """Close from our side (e.g. server shutdown)."""
        return self._close(code, reason)

    def connection_lost(self) -> list[Action]:
        """The peer went away and the session will not be resumed: cancel every running stream."""
        if self.state is ConnState.CLOSED:
            return []
        running = [CancelStream(sid) for sid in (self.session.running if self.session is not None else ())]
        self.state = ConnState.CLOSED
        return running


def normalize_chunk(chunk: object) -> str | bytes:
    """A model's chunk as str or bytes; LocalProtocolError for anything a frame cannot carry."""
    if isinstance(chunk, bytearray | memoryview):
        return bytes(chunk)
    if isinstance(chunk, bytes):
        return chunk
    if not isinstance(chunk, str):
        raise LocalProtocolError(f"model chunks must be str or bytes, got {type(chunk).__name__}")
    if not chunk.isascii():
        try:  # an unpaired surrogate cannot go out in a text frame (the send would fail and mute the socket)
            chunk.encode("utf-8")
        except UnicodeEncodeError:
            raise LocalProtocolError("model chunks must be valid Unicode text (unpaired surrogate)") from None
    return chunk


def _request_size(req: ev.Request) -> int:
    """Bytes of a Request's input, for max_request_size."""
    size = len(req.model)
    if req.text is not None:
        size += len(req.text.encode("utf-8", "surrogatepass"))
    if req.data is not None:
        size += len(req.data)
    if req.messages:
        size += sum(len(m.role) + len(m.content.encode("utf-8", "surrogatepass")) for m in req.messages)
    if req.params:
        size += len(json.dumps(req.params, default=str))
    return size


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
