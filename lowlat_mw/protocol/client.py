"""The client side of lowlat-mw connections as a sans-IO state machine.

One :class:`ClientProtocol` serves a client across reconnects: its open streams (what each has
received, what it acknowledged) and the resume token survive a dropped connection, so the next
connection's Hello asks for exactly what is missing. Per connection it negotiates compression,
runs the client's heartbeat, answers Pings, drops Deltas it already has (a resume replays from the
last seq it reported), spots gaps, and notes a GoAway. It never does I/O: the driver
(:mod:`lowlat_mw.client`) sends what it returns and hands the events to the waiting streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    CloseCode,
    ErrorCode,
    LocalProtocolError,
    NotDelivered,
    RemoteProtocolError,
    ResumeFailed,
    StreamError,
)
from ..settings import SUBPROTOCOL_PROTO
from . import events as ev
from .base import Protocol
from .compression import available_codecs
from .heartbeat import Heartbeat
from .state import CLIENT_RECEIVES, ConnState, handlers

__all__ = ["ACK_OVERHEAD", "CLIENT_NAME", "ClientProtocol", "ClientStream", "StreamBroken"]

CLIENT_NAME = "lowlat-mw-python/0.1"
ACK_OVERHEAD = 64  # bytes counted per consumed Delta on top of its chunk (the server's DELTA_OVERHEAD)


@dataclass(slots=True)
class ClientStream:
    """What the client knows of one stream it started."""

    request: ev.Request
    received_seq: int = 0  # seq of the last Delta received in order: a resume asks for what follows
    acked_seq: int = 0
    unacked: int = 0  # bytes consumed since the last Ack
    resends: int = 0  # times the Request was sent again because the server never saw it
    drain_resent: bool = False  # sent again after a GoAway refused it
    cancelled: bool = False  # the client sent a Cancel for it: End("cancelled") is the answer, else a cut stream
    inputs: list[ev.Input] = field(default_factory=list)  # (v1.3) every Input of the stream, kept for a resume
    sent_inputs: int = 0  # how many of them went out on this connection (a resume resets it to what the server has)
    flushing: bool = False  # a task is sending them

    @property
    def stream_id(self) -> int:
        return self.request.stream_id


@dataclass(frozen=True, slots=True)
class StreamBroken:
    """A stream's Deltas arrived out of order (a server bug): the stream fails with `message`."""

    stream_id: int
    message: str


class ClientProtocol(Protocol):
    """Client role: Hello, Welcome, Requests, the streams' Deltas, Acks, Pings and resume."""

    HANDLERS: Any = {}
    APPLICATION = frozenset({ev.Delta, ev.End, ev.Error, ev.GoAway, ev.Welcome})
    PEER_DEAD_REASON = "server did not answer"

    def __init__(self, subprotocol: str | None = SUBPROTOCOL_PROTO, *, compression: tuple[str, ...] | None = None,
                 flow_window: int = 1024 * 1024, max_frame_size: int = 16 * 1024 * 1024,
                 max_decompressed_size: int = 16 * 1024 * 1024, heartbeat_timeout: float = 10.0,
                 answer_pings: bool = True, auth: str = "", name: str = CLIENT_NAME,
                 meter: Callable[[], float] | None = None, history: bool = False) -> None:
        """`compression`: codecs to offer (default: every installed one; none on the JSON subprotocol);
        `meter`: a CPU clock the compressor times its own work with (None: its priors decide); `history`: ask
        the server to keep this session's turns for Request.continues (v1.3)."""
        super().__init__(subprotocol, state=ConnState.CLOSED, max_frame_size=max_frame_size,
                         max_decompressed_size=max_decompressed_size, meter=meter)
        self.offered = tuple(available_codecs() if compression is None else compression) if self.codec.binary else ()
        self.flow_window = flow_window
        self.heartbeat_timeout = heartbeat_timeout
        self.answer_pings = answer_pings
        self.auth = auth
        self.name = name
        self.history = history
        self.streams: dict[int, ClientStream] = {}  # open: started and not yet ended
        self.welcome: ev.Welcome | None = None
        self.goaway: ev.GoAway | None = None
        self.last_error: ev.Error | None = None
        self.connections = 0
        self.listening = False  # in push groups: the session is worth resuming with no stream open (v1.1)

    # ------------------------------------------------------------------ connection
    @property
    def can_resume(self) -> bool:
        """Whether a reconnect would resume: streams are open (or the session is in push groups, which the server
        keeps with it) and the server gave a resume token."""
        return bool((self.streams or self.listening) and self.welcome is not None and self.welcome.resume_token)

    def connect(self, now: float, *, resume: bool = False) -> bytes | str:
        """A new connection is open: its first message, the Hello (resuming the session if `resume`)."""
        self.state = ConnState.AWAIT_WELCOME
        self.close_code, self.close_reason = None, ""
        self.heartbeat = None
        self.compression, self.compressor = (), None
        self.goaway = None
        if resume and self.can_resume:
            assert self.welcome is not None
            hello = ev.Hello(client=self.name, compression=self.offered, flow_window=self.flow_window, auth=self.auth,
                             resume_token=self.welcome.resume_token, revision=ev.REVISION, history=self.history,
                             last_seq={sid: st.received_seq for sid, st in self.streams.items()})
        else:
            hello = ev.Hello(client=self.name, compression=self.offered, flow_window=self.flow_window, auth=self.auth,
                             revision=ev.REVISION, history=self.history)
        return self._frame(hello)

    def connection_lost(self) -> None:
        """The WebSocket is gone; open streams stay for the next connection's resume."""
        self.state = ConnState.CLOSED

    def _on_welcome(self, welcome: ev.Welcome, now: float) -> list[Any]:
        self.welcome = welcome
        self.connections += 1
        have = welcome.input_seq if welcome.resumed else {}
        for sid, st in self.streams.items():  # (v1.3) what to send (again) of each stream's input
            if st.inputs:
                st.sent_inputs = have.get(sid, 0)
        self._negotiated(tuple(c for c in welcome.compression if c in self.offered))
        interval = (welcome.heartbeat_interval_ms or 30_000) / 1000
        self.heartbeat = Heartbeat(interval, 4 * interval, self.heartbeat_timeout, now)
        self.state = ConnState.OPEN
        return [welcome]

    def _on_refused(self, error: ev.Error, now: float) -> list[Any]:
        self.state = ConnState.CLOSED
        return [error]

    # ------------------------------------------------------------------ streams
    @property
    def accepting(self) -> bool:
        """True when a Request may go out on this connection (open, and no GoAway received)."""
        return self.state is ConnState.OPEN and self.goaway is None

    def request(self, st: ClientStream) -> bytes | str:
        """Start stream `st` (or start it again, after :meth:`retry`): its Request message.

        The stream is open, and listed by a resume's Hello, until its End or Error arrives or it is
        forgotten. Sent on a connection that is going away, the resume brings it to the server.
        """
        self.streams[st.stream_id] = st
        return self._frame(st.request)

    def stream(self, stream_id: int) -> ClientStream | None:
        """The open stream `stream_id`, if any."""
        return self.streams.get(stream_id)

    def forget(self, stream_id: int) -> None:
        """The caller gave the stream up (it will not resume it)."""
        self.streams.pop(stream_id, None)

    def add_input(self, st: ClientStream, *, text: str | None = None, data: bytes | None = None,
                  tool_result: ev.ToolResult | None = None, end: bool = False) -> ev.Input:
        """(v1.3) More input for open stream `st`, numbered and kept until the stream ends (a resume sends again what
        the server lacks): send it with :meth:`input_frame`. LocalProtocolError if the server is older than v1.3."""
        revision = self.welcome.revision if self.welcome is not None else 0
        if revision < ev.DUPLEX_REVISION:
            raise LocalProtocolError(f"the server speaks protocol revision {revision}: stream input needs v1.3")
        inp = ev.Input(stream_id=st.stream_id, seq=len(st.inputs) + 1, text=text, data=data, tool_result=tool_result,
                       end=end)
        st.inputs.append(inp)
        return inp

    def input_frame(self, inp: ev.Input) -> bytes | str:
        """The message of Input `inp` on this connection."""
        return self._frame(inp)

    def cancel(self, stream_id: int) -> bytes | str:
        """Ask the server to stop a stream: the Cancel message."""
        st = self.streams.get(stream_id)
        if st is not None:
            st.cancelled = True
        return self._frame(ev.Cancel(stream_id=stream_id))

    def ping(self, ping_id: int) -> bytes | str:
        """A Ping of our own (the answer comes back as an ev.Pong event)."""
        return self._frame(ev.Ping(id=ping_id))

    def consumed(self, st: ClientStream, event: ev.Event) -> bytes | str | None:
        """The caller consumed `event` of stream `st`: the Ack to send, if one is due (flow control).

        A Delta counts its size; a quarter of the server's window consumed sends an Ack. The stream's
        End or Error is acknowledged at once (``done``), so the server forgets the stream.
        """
        window = self.welcome.flow_window if self.welcome is not None else 0
        if not window:
            return None
        if isinstance(event, ev.Delta):
            st.unacked += len(event.chunk) + ACK_OVERHEAD
            if st.unacked < window // 4:
                return None
            ack = ev.Ack(stream_id=st.stream_id, seq=event.seq)
        else:
            ack = ev.Ack(stream_id=st.stream_id, seq=st.received_seq, done=True)
        if self.state is not ConnState.OPEN:
            return None  # no connection: the next resume's last_seq acknowledges instead
        st.unacked = 0
        st.acked_seq = ack.seq
        return self._frame(ack)

    def retry(self, st: ClientStream, error: ev.Error, retries: int) -> str | None:
        """Whether an Error means the Request should be sent again, and when.

        "now": a resume found the stream unknown (the Request was lost in the drop), at most
        ``max(1, retries)`` times. "after_drain": the server was draining when it arrived; send it
        once more on the next connection. None: the Error ends the stream.
        """
        if not error.retryable or st.received_seq:
            return None
        if error.code is ErrorCode.RESUME_FAILED and st.resends < max(1, retries):
            st.resends += 1
            return "now"
        if error.code is ErrorCode.CONTEXT_MISMATCH and not st.request.continues and st.resends < 1:
            st.resends += 1  # a document the server lost (a refused patch, a resume elsewhere): its whole text
            return "now"  # went out when the refusal or the Welcome came, ahead of this resend
        if error.code is ErrorCode.DRAINING and not st.drain_resent:
            st.drain_resent = True
            return "after_drain"
        return None

    def failure(self, st: ClientStream, error: ev.Error) -> StreamError:
        """The exception a stream's Error ends it with (once :meth:`retry` said no more resends): StreamError,
        ResumeFailed for ``resume_failed``, and NotDelivered when the server never saw the Request however often it
        was sent again (resumes that found it unknown; nothing of it received), saying so, and how big it was."""
        if error.code is not ErrorCode.RESUME_FAILED:
            return StreamError(error.code, error.message, stream_id=error.stream_id, retryable=error.retryable)
        if not error.retryable or st.received_seq:
            return ResumeFailed(error.code, error.message, stream_id=error.stream_id, retryable=error.retryable)
        size = len(self._frame(st.request))
        limit = self.welcome.max_frame_size if self.welcome is not None else 0
        why = (f"its message is {size} bytes, over the server's max_frame_size of {limit}: send less"
               if limit and size > limit else
               f"its message is {size} bytes: a server or proxy that refuses a message that big drops the connection")
        return NotDelivered(error.code, f"stream {error.stream_id}: the request was not delivered: the server never "
                            f"received it, though it was sent {1 + st.resends} times and the connection dropped each "
                            f"time ({why})", stream_id=error.stream_id, retryable=True)

    # ------------------------------------------------------------------ input
    def _on_delta(self, delta: ev.Delta, now: float) -> list[Any]:
        st = self.streams.get(delta.stream_id)
        if st is None:
            return []  # a stream we gave up
        if delta.seq <= st.received_seq:
            return []  # already have it (replayed after a resume)
        if delta.seq != st.received_seq + 1:
            return [StreamBroken(delta.stream_id,
                                 f"stream {delta.stream_id}: got seq {delta.seq} after {st.received_seq}")]
        st.received_seq = delta.seq
        return [delta]

    def _on_terminal(self, event: ev.End | ev.Error, now: float) -> list[Any]:
        # Ended: no longer open for a resume's last_seq (the caller still reads it).
        st = self.streams.pop(event.stream_id, None)
        if st is None:
            return []
        if type(event) is ev.End and event.finish_reason == "cancelled" and not st.cancelled:
            # Stopped by the server (an older one, force-stopped), not at our asking: a cut stream, never a normal
            # end (docs/protocol.md 8.3: a server of today sends this Error itself).
            event = ev.Error(stream_id=event.stream_id, code=ErrorCode.INTERNAL, retryable=True,
                             message=f"the server cancelled stream {event.stream_id} after {event.last_seq} deltas, "
                                     "unasked: its output is incomplete")
        return [event]

    def _on_error(self, error: ev.Error, now: float) -> list[Any]:
        if error.stream_id:
            return self._on_terminal(error, now)
        self.last_error = error
        return [error]

    def _on_ping(self, ping: ev.Ping, now: float) -> list[Any]:
        return super()._on_ping(ping, now) if self.answer_pings else []

    def _on_pong(self, pong: ev.Pong, now: float) -> list[Any]:
        return [*super()._on_pong(pong, now), pong]

    def _pong_arrived(self, size: int, now: float) -> list[Any]:
        pong = ev.Pong(id=self.heartbeat.awaiting)  # type: ignore[union-attr,arg-type]
        return [*super()._pong_arrived(size, now), pong]

    def subscribe(self, sub_id: int, group: str, *, leave: bool = False) -> bytes | str:
        """Join (or leave) push group `group`: the Subscribe message; its answer comes as an ev.Subscribed event.
        A server of protocol v1.0 (Welcome without a revision) does not know it: check :attr:`pushes` first."""
        return self._frame(ev.Subscribe(id=sub_id, group=group, leave=leave))

    @property
    def pushes(self) -> bool:
        """Whether the server of this connection speaks protocol v1.1 (Subscribe, Push)."""
        return self.welcome is not None and self.welcome.revision >= 1

    def context(self, message: ev.Context) -> bytes | str:
        """A Context message (v1.3; its answer comes as an ev.ContextAck event): check :attr:`contexts` first."""
        return self._frame(message)

    @property
    def contexts(self) -> bool:
        """Whether the server of this connection speaks protocol v1.3 (context documents, continues)."""
        return self.welcome is not None and self.welcome.revision >= ev.CONTEXT_REVISION

    def _on_context_ack(self, ack: ev.ContextAck, now: float) -> list[Any]:
        return [ack]

    def _on_push(self, push: ev.Push, now: float) -> list[Any]:
        return [push]

    def _on_subscribed(self, subscribed: ev.Subscribed, now: float) -> list[Any]:
        return [subscribed]

    def _on_goaway(self, goaway: ev.GoAway, now: float) -> list[Any]:
        self.goaway = goaway
        return [goaway]

    def _too_big(self, size: int) -> list[Any]:
        return self._close(CloseCode.MESSAGE_TOO_BIG, f"frame of {size} bytes exceeds max_frame_size")

    def _bad_frame(self, exc: RemoteProtocolError) -> list[Any]:
        return self._close(exc.close_code or CloseCode.PROTOCOL_ERROR, str(exc)[:120])

    def _unexpected(self, event: ev.Event) -> list[Any]:
        if self.state is ConnState.AWAIT_WELCOME:
            return self._close(CloseCode.PROTOCOL_ERROR, f"expected welcome, got {type(event).__name__}")
        return []  # a message servers do not send: ignored

    # ------------------------------------------------------------------ time
    def next_deadline(self) -> float:
        """When :meth:`tick` next has something to do (the heartbeat; inf before Welcome and after close)."""
        return super().next_deadline() if self.state is ConnState.OPEN else math.inf

    def last_seq(self) -> Mapping[int, int]:
        """What a resume would report: the last seq received per open stream."""
        return {sid: st.received_seq for sid, st in self.streams.items()}


ClientProtocol.HANDLERS = handlers(ClientProtocol, CLIENT_RECEIVES)
