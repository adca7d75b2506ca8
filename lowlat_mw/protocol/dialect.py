"""The dialect seam: what a wire protocol implements to run on lowlat-mw's stream engine.

A dialect is a sans-IO machine (:class:`ServerMachine`: messages and `now` in, actions out) plus a
:class:`Dialect` record that names it, says which WebSocket subprotocols it answers to and makes its machine.
The engine talks to every machine in stream events, never in one dialect's frames: a request comes in as a
:class:`~lowlat_mw.protocol.actions.StartStream` of an :class:`~lowlat_mw.protocol.events.Request`, a stop as a
:class:`~lowlat_mw.protocol.actions.CancelStream`; a model's output goes back to the machine as chunks
(:meth:`ServerMachine.send_chunk`) and its end as an ending (:meth:`ServerMachine.finish_stream`), which the
machine frames in its own wire format. lowlat.v1 (:class:`~lowlat_mw.protocol.server.ServerProtocol`) is one
dialect, :data:`LOWLAT_V1`; docs/architecture.md ("Adding a dialect") shows another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..errors import CloseCode, ErrorCode
from ..settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings
from . import events as ev
from .base import CloseConnection, FrameStats, SendFrame
from .heartbeat import Heartbeat, HeartbeatFrames, MadePing
from .selector import CompressionSelector
from .server import ServerProtocol, negotiate_subprotocol
from .session import Session
from .state import ConnState

__all__ = ["LOWLAT_V1", "Dialect", "MachineFactory", "Negotiate", "ServerMachine", "pick"]


@runtime_checkable
class ServerMachine(Protocol):
    """The server side of one connection in some dialect: every member the runtime (ConnectionDriver) uses.

    Each input returns the actions to carry out (SendFrame, CloseConnection, StartStream, CancelStream,
    DeliverInput, Measured, Membership, ResumeSession, Authenticate: the driver's one action table). A machine
    reads no clock, draws no randomness and does no I/O. A minimal dialect subclasses this class and inherits the
    defaults below the line "lowlat.v1 features" (no heartbeat Pong, compression, resume, push or auth hook); the
    runtime reads those at connection open or off the per-message path, never through ``getattr``.
    """

    # ------------------------------------------------------------------ required
    state: ConnState
    """AWAIT_HELLO/ADMITTING before the handshake, OPEN once streams may run (the session exists), CLOSED at the end."""
    session_id: str
    """The session's id, for logs and the push hub (the driver draws it and hands it to the factory)."""
    session: Session | None
    """The streams of this connection (StreamState per stream, numbering, ends): the runner's ``Session``."""
    subprotocol: str | None
    """The WebSocket subprotocol the connection was accepted with (None: none), for logs."""
    stats: FrameStats
    """Frames and bytes in and out, counted by the machine; its ``label`` is the metrics' ``subprotocol`` label."""
    close_code: int | None
    """The close code this side chose (None: not closed by the server); decides keep-or-end with ``resumable``."""
    close_reason: str
    """The reason that went with ``close_code``, for logs."""
    deadline_moved: bool
    """Set when :meth:`next_deadline` may have moved earlier: the driver re-arms its timer and calls deadline_seen."""

    def receive_data(self, data: bytes | str, now: float) -> list[Any]:
        """One WebSocket message from the client (bytes: binary, str: text): the actions it causes."""
        ...

    def send_chunk(self, stream_id: int, chunk: Any, now: float) -> list[bytes | str]:
        """A model's chunk (str, bytes or ToolCall) of `stream_id`: the frames to write (no action objects)."""
        ...

    def finish_stream(self, stream_id: int, now: float, *, reason: str = "stop",
                      timings_ms: Mapping[str, float] | None = None,
                      error: ev.Error | ev.End | None = None) -> list[Any]:
        """The model ended (`reason`: stop, cancelled, warmup) or failed (`error`): the actions framing its end."""
        ...

    def tick(self, now: float) -> list[Any]:
        """The connection's timer fired (at or after :meth:`next_deadline`): timeouts, keepalives."""
        ...

    def next_deadline(self, answered: bool = False) -> float:
        """When :meth:`tick` next has work (inf: never); `answered` only matters with a heartbeat (lowlat.v1)."""
        ...

    def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> list[Any]:
        """Close from the server (shutdown, slow consumer): its CloseConnection (nothing if closed already)."""
        if self.state is ConnState.CLOSED:
            return []
        self.state = ConnState.CLOSED
        self.close_code, self.close_reason = code, reason
        return [CloseConnection(code, reason)]

    def connection_lost(self) -> list[Any]:
        """The socket is gone: state CLOSED (the runner, not these actions, stops or keeps the models)."""
        self.state = ConnState.CLOSED
        return []

    def deadline_seen(self) -> None:
        """The driver put its timer at :meth:`next_deadline`: clear ``deadline_moved``."""
        self.deadline_moved = False

    @property
    def closed(self) -> bool:
        """True once closed or lost (drains and the thread bridge skip it)."""
        return self.state is ConnState.CLOSED

    # ------------------------------------------------------------------ lowlat.v1 features (defaults: none)
    resumable: ClassVar[bool] = False
    """Whether a dropped connection's session waits ``resume_window`` for a resume; False: its models stop."""
    resumed: bool = False
    """True when the handshake continued an earlier session (logs, tracing)."""
    principal: object | None = None
    """Who the authenticate hook admitted (None: nobody): push's ``user:`` key, the resume check."""
    compression: tuple[str, ...] = ()
    """The negotiated compression codecs, for logs and tracing."""
    compressor: CompressionSelector | None = None
    """Read on sampled Deltas only, to split encode from compress time (None: no compression)."""
    heartbeat: Heartbeat | None = None
    """The Ping/Pong heartbeat, read when the transport awaits a Pong (None: no heartbeat)."""
    pong_frame: bytes | str | None = None
    """The awaited Pong's message, compared by identity in feed (None: never equal to a message)."""
    ping_made: MadePing | None = None
    """The last Ping, if made once for the loop's connections (the corked writer's shortcut)."""

    def pong_arrived(self, now: float) -> float:
        """The awaited Pong (``pong_frame``) arrived whole: its RTT. Never called while ``pong_frame`` is None."""
        raise NotImplementedError

    def drain(self, reconnect_after_ms: int = 0) -> list[Any]:
        """Server shutdown begins: refuse new streams and tell the client if the dialect can (default: nothing)."""
        return []

    def join(self, group: str, joined: bool, now: float) -> list[Any]:
        """The server put the session in push group `group` (``lowlat_mw.join``): Membership actions (default: none)."""
        return []

    def push(self, topic: str, body: str | bytes) -> SendFrame | None:
        """A push to the session: its SendFrame, or None to skip it (default: the dialect has no push)."""
        return None

    def refuse_input(self, stream_id: int, now: float, code: ErrorCode, message: str) -> list[Any]:
        """End `stream_id` with an Error: its model cannot take an input; needed by a dialect emitting DeliverInput."""
        raise NotImplementedError

    def authenticated(self, principal: object | None, now: float, reason: str = "") -> list[Any]:
        """The authenticate hook's answer (None: refused); needed by a dialect emitting Authenticate."""
        raise NotImplementedError

    def resume(self, session: Session | None, now: float) -> list[Any]:
        """The stored session to resume (None: unknown); needed by a dialect emitting ResumeSession."""
        raise NotImplementedError


class MachineFactory(Protocol):
    """Makes a connection's machine; the driver calls it once per accepted WebSocket (ServerProtocol is one)."""

    def __call__(self, settings: Settings, *, subprotocol: str | None, now: float, session_id: str, secret: str,
                 meter: Callable[[], float] | None = None,
                 heartbeats: HeartbeatFrames | None = None) -> ServerMachine:
        """`session_id`/`secret`: a new session's (drawn by the driver); `meter`, `heartbeats`: lowlat.v1's."""
        ...


Negotiate = Callable[[Sequence[str], Settings], tuple[bool, str | None]]
"""(offered subprotocols, settings) -> (accept?, the subprotocol to answer with)."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """A wire protocol the engine serves: its `name`, the WebSocket `subprotocols` it answers to and its `machine`.

    `negotiate` picks the subprotocol (default: none offered is accepted without one; else the first offered that
    is in `subprotocols`; else refused with 403). Which path serves it is the app's choice (LowLatASGI's
    ``dialects``)."""

    name: str
    machine: MachineFactory
    subprotocols: tuple[str, ...] = ()
    negotiate: Negotiate | None = None

    def choose(self, offered: Sequence[str], settings: Settings) -> tuple[bool, str | None]:
        """(accept?, subprotocol) for a handshake offering `offered` (Endpoint.admit asks)."""
        if self.negotiate is not None:
            return self.negotiate(offered, settings)
        if not offered:
            return True, None
        for sp in offered:
            if sp in self.subprotocols:
                return True, sp
        return False, None


LOWLAT_V1 = Dialect("lowlat.v1", ServerProtocol, (SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON), negotiate_subprotocol)
"""lowlat.v1 (docs/protocol.md): the subprotocols the ``subprotocols`` setting serves, ServerProtocol's machine."""


def pick(dialects: Sequence[Dialect], offered: Sequence[str], settings: Settings) -> Dialect:
    """The dialect of `dialects` (those at one path, in order) for a handshake offering `offered`: the first that
    accepts it, else the first (whose admission then refuses it)."""
    for dialect in dialects:
        if dialect.choose(offered, settings)[0]:
            return dialect
    return dialects[0]

