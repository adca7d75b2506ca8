"""The server side of one lowlat-mw connection as a sans-IO state machine.

Drivers feed it received WebSocket messages, the model's output and the time; it answers with
actions (send these bytes, start or cancel a model, close with this code). It owns the handshake,
the streams of its session (numbering, recording for resume, End and Error), flow control, the
heartbeat, idle reaping and the codec. It reads no clock, draws no random numbers and records no
metric: session ids and secrets are given to it, measurements come out as data (its
:class:`~lowlat_mw.protocol.base.FrameStats`, :class:`~lowlat_mw.protocol.base.Measured` actions, the
Errors in :class:`~lowlat_mw.protocol.base.SendFrame`). Which message it accepts in which state is the
table in :mod:`~lowlat_mw.protocol.state`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from fnmatch import fnmatchcase
from typing import Any, get_args

from ..errors import CloseCode, ErrorCode, RemoteProtocolError
from ..settings import Settings
from . import events as ev
from .actions import Action, Authenticate, CancelStream, DeliverInput, Membership, ResumeSession, StartStream
from .base import CloseConnection, Measured, SendFrame
from .handshake import ServerHandshake, negotiate_subprotocol
from .heartbeat import Heartbeat, HeartbeatAction, HeartbeatFrames, IdleReaper
from .limits import TokenBucket
from .session import Session, StreamState, encoded_len, normalize_chunk, split_chunk, tool_call_for
from .state import SERVER_RECEIVES, ConnState, handlers
from .wire import ParamsMemo, params_size

__all__ = [
    "Action",
    "Authenticate",
    "CancelStream",
    "CloseConnection",
    "ConnState",
    "DeliverInput",
    "Measured",
    "Membership",
    "ResumeSession",
    "SendFrame",
    "ServerProtocol",
    "StartStream",
    "negotiate_subprotocol",
    "normalize_chunk",
    "split_chunk",
]


MAX_GROUP_NAME = 200  # characters of a push group's name


def group_problem(group: str) -> str | None:
    """Why `group` cannot name a push group (None: it can)."""
    if not group or len(group) > MAX_GROUP_NAME:
        return f"a group name is 1 to {MAX_GROUP_NAME} characters"
    if not group.isprintable():
        return "a group name holds no control characters"
    return None


# ------------------------------------------------------------------------------------ the machine
class ServerProtocol(ServerHandshake):
    """Protocol state of one accepted WebSocket, driven by an I/O layer.

    Streams live in a :class:`~lowlat_mw.protocol.session.Session` that a later connection can take
    over (resume); everything else here is about this one socket: codec, compression, heartbeat,
    idleness. ``deadline_moved`` is set when :meth:`next_deadline` may have moved earlier (the driver
    then re-arms its timer and clears it); otherwise it only moves later, and a timer that fires
    early finds nothing to do.
    """

    HANDLERS: Any = {}
    resumable = True  # a dropped connection's session waits for a resume (the dialect seam: ServerMachine)
    APPLICATION = frozenset({ev.Request, ev.Cancel, ev.Context})  # Hello, Ping, Pong and Ack only prove the peer alive
    # Budgeted by control_rate_limit: every kind but Request (rate_limit's) and Hello (once per connection).
    CONTROL = frozenset(get_args(ev.Event)) - {ev.Request, ev.Hello}

    def __init__(self, settings: Settings, *, subprotocol: str | None, now: float, session_id: str, secret: str,
                 meter: Callable[[], float] | None = None, heartbeats: HeartbeatFrames | None = None) -> None:
        """`session_id` and `secret` name the session a Hello without a (valid) resume token starts;
        `meter`: a CPU clock the compressor times its own work with (None: its priors decide); `heartbeats`: where
        Pings are made once, shared with the other connections of the loop (None: this machine's own)."""
        super().__init__(subprotocol, state=ConnState.AWAIT_HELLO, max_frame_size=settings.max_frame_size,
                         max_decompressed_size=settings.max_decompressed_size, meter=meter, heartbeats=heartbeats)
        self.settings = settings
        self.params = ParamsMemo()  # (this connection's own: a client repeats its params, no other sees them)
        self._new_session = (session_id, secret)
        self.session_id = session_id  # the session's id (the one a new session gets, until Welcome says which)
        self.session: Session | None = None
        self.hello: ev.Hello | None = None
        self.heartbeat = Heartbeat(settings.heartbeat_interval, settings.heartbeat_max_interval,
                                   settings.heartbeat_timeout, now)
        self.reaper = IdleReaper(settings.idle_timeout, now)
        self.handshake_deadline = now + settings.handshake_timeout
        self.draining = False
        self.resumed = False  # Welcome continued an earlier session
        self.opened_at = now
        self.principal: object | None = None
        self.bucket = TokenBucket(settings.rate_limit, settings.rate_burst, now) if settings.rate_limit else None
        if settings.control_rate_limit:
            self.control = TokenBucket(settings.control_rate_limit, settings.control_rate_burst, now)
        # Whether Welcome, or the last running stream's end, can bring next_deadline() before the deadline it
        # replaces (the handshake's; the heartbeat's): only then is deadline_moved set (see Protocol).
        s = settings
        self._welcome_moves = (s.heartbeat_interval < s.handshake_timeout or s.idle_timeout < s.handshake_timeout
                               or 0 < s.max_session_lifetime < s.handshake_timeout)
        self._idle_moves = (s.idle_timeout < s.heartbeat_max_interval + s.heartbeat_timeout
                            or s.max_session_lifetime > 0)

    @property
    def streams(self) -> dict[int, StreamState]:
        """Running streams of this connection's session (none once the connection is closed)."""
        if self.session is None or self.state is ConnState.CLOSED:
            return {}
        return self.session.running

    # ------------------------------------------------------------------ helpers
    def _error(self, stream_id: int, code: ErrorCode, message: str, *, retryable: bool = False) -> SendFrame:
        return self._send_error(ev.Error(stream_id=stream_id, code=code, message=message, retryable=retryable))

    def _send_error(self, error: ev.Error) -> SendFrame:
        return SendFrame(self._frame(error), error)

    def _send(self, event: ev.Event) -> SendFrame:
        return self._send_error(event) if type(event) is ev.Error else SendFrame(self._frame(event))

    def _too_big(self, size: int) -> list[Any]:
        return [self._error(0, ErrorCode.MESSAGE_TOO_BIG,
                            f"frame of {size} bytes exceeds max_frame_size ({self.settings.max_frame_size})"),
                *self._close(CloseCode.MESSAGE_TOO_BIG, "frame too big")]

    def _flooded(self) -> list[Any]:
        rate = self.settings.control_rate_limit
        return [self._error(0, ErrorCode.RATE_LIMITED, f"more than {rate:g} messages/s that are not requests"),
                *self._close(CloseCode.POLICY_VIOLATION, "message flood")]

    def _bad_frame(self, exc: RemoteProtocolError) -> list[Any]:
        actions: list[Any] = [self._error(exc.stream_id, exc.error_code, str(exc))]
        if exc.close_code is not None:
            actions += self._close(exc.close_code, exc.error_code.wire_name)
        return actions

    def _unexpected(self, event: ev.Event) -> list[Any]:
        if self.state is ConnState.OPEN:
            return [self._error(0, ErrorCode.PROTOCOL_ERROR, f"{type(event).__name__.lower()} is not sent by clients")]
        return [self._error(0, ErrorCode.PROTOCOL_ERROR, f"expected hello, got {type(event).__name__.lower()}"),
                *self._close(CloseCode.PROTOCOL_ERROR, "expected hello")]

    # ------------------------------------------------------------------ client messages
    def _on_request(self, req: ev.Request, now: float) -> list[Any]:
        self.reaper.touch(now)
        session = self.session
        assert session is not None
        sid = req.stream_id
        if self.draining:
            return [self._error(sid, ErrorCode.DRAINING, "server is draining: retry after reconnecting",
                                retryable=True)]
        control = self.control
        if control is not None and control.tokens < control.burst:
            # A stream's own messages (its Ack{done}, a Cancel) are paid by its Request: a client streaming
            # thousands of short replies a second (rate_limit 0) never meets the budget, a flood without
            # Requests does.
            control.tokens = min(control.burst, control.tokens + STREAM_MESSAGES)
        bucket = self.bucket
        if bucket is not None and not bucket.take(now):
            return [self._error(sid, ErrorCode.RATE_LIMITED, retryable=True,
                                message=f"more than {self.settings.rate_limit:g} requests/s: "
                                        f"retry in {bucket.retry_after():.2f} s")]
        size = request_size(req, self.params.size)
        if size > self.settings.max_request_size:
            return [self._error(sid, ErrorCode.MESSAGE_TOO_BIG,
                                f"request of {size} bytes exceeds max_request_size ({self.settings.max_request_size})")]
        if req.contexts or req.continues:  # (protocol v1.3) the documents and turns its model gets
            given = session.contexts().resolve(req, session.keeps_turns)
            if type(given) is ev.Error:
                return [self._send_error(given)]
            error = session.start(req, now)
            if error is not None:
                return [self._send_error(error)]
            session.context.started(req, given)  # type: ignore[union-attr,arg-type]
            session.streams[sid].parent = given[2]  # type: ignore[index]
            return [StartStream(req)]
        error = session.start(req, now)
        if error is not None:
            return [self._send_error(error)]
        return [StartStream(req)]

    def _on_ack(self, ack: ev.Ack, now: float) -> list[Any]:
        self.session.ack(ack.stream_id, ack.seq, ack.done)  # type: ignore[union-attr]
        return []

    def _on_cancel(self, cancel: ev.Cancel, now: float) -> list[Any]:
        self.reaper.touch(now)
        stream = self.session.streams.get(cancel.stream_id)  # type: ignore[union-attr]
        if stream is None or not stream.move("cancel"):
            return []  # already finished or cancelling: the End/Error is on its way
        return [CancelStream(cancel.stream_id)]

    def _on_input(self, inp: ev.Input, now: float) -> list[Any]:
        """(v1.3) More input for a running stream: delivered once, in seq order; a resend of one it has is ignored."""
        if self.hello is None or self.hello.revision < ev.DUPLEX_REVISION:  # (as a v1.2 server answers)
            return [self._error(0, ErrorCode.UNSUPPORTED_MESSAGE, "input is protocol v1.3: send Hello.revision 3")]
        self.reaper.touch(now)
        sid = inp.stream_id
        st = self.session.streams.get(sid)  # type: ignore[union-attr]
        if st is None or not st.accepts("input") or inp.seq <= st.input_seq:
            return []  # ended (its End is on its way), or a resend after a resume
        problem = None
        if inp.seq != st.input_seq + 1:
            problem = f"input seq {inp.seq} after {st.input_seq}: inputs are numbered 1, 2, 3... per stream"
        elif st.input_ended:
            problem = "input after the stream's input ended"
        else:
            size = input_size(inp)
            if size > self.settings.max_request_size:
                return self.refuse_input(sid, now, ErrorCode.MESSAGE_TOO_BIG, f"input of {size} bytes exceeds "
                                         f"max_request_size ({self.settings.max_request_size})")
        if problem is not None:
            return self.refuse_input(sid, now, ErrorCode.BAD_REQUEST, problem)
        st.input_delivered(inp)
        return [DeliverInput(inp)]

    def refuse_input(self, stream_id: int, now: float, code: ErrorCode, message: str) -> list[Any]:
        """End running stream `stream_id` with Error(`code`, `message`) and stop its model: an input it cannot take
        (out of order, too big; or, from the driver, more than ``max_unread_inputs`` its model has not read)."""
        error = self.session.refuse(stream_id, now, code, message) if self.session is not None else None
        if error is None:
            return []  # not running: its End or Error is on its way
        if self.state is not ConnState.OPEN:
            return [CancelStream(stream_id)]
        return [self._send_error(error), CancelStream(stream_id)]

    def _on_peer_error(self, error: ev.Error, now: float) -> list[Any]:
        return []  # the client reports a problem; nothing to answer

    # ------------------------------------------------------------------ push (v1.1)
    def _on_subscribe(self, sub: ev.Subscribe, now: float) -> list[Any]:
        if self.hello is None or self.hello.revision < 1:  # (what a v1.0 server answers: protocol.md 2)
            return [self._error(0, ErrorCode.UNSUPPORTED_MESSAGE, "subscribe is protocol v1.1: send Hello.revision 1")]
        group, groups = sub.group, self.session.groups  # type: ignore[union-attr]
        code, problem = ErrorCode.BAD_REQUEST, group_problem(group)
        if problem is None and not sub.leave and group not in groups:
            if not any(fnmatchcase(group, pattern) for pattern in self.settings.push_groups):
                code, problem = ErrorCode.UNAUTHORIZED, f"group {group!r} is not one clients may join (push_groups)"
            elif len(groups) >= self.settings.max_groups:
                problem = f"a session is in at most {self.settings.max_groups} groups (max_groups)"
        if problem is not None:  # (a name too long is not echoed whole)
            return [self._send(ev.Subscribed(id=sub.id, group=group[:MAX_GROUP_NAME], leave=sub.leave, code=code,
                                             message=problem))]
        return [*self.join(group, not sub.leave, now),
                self._send(ev.Subscribed(id=sub.id, group=group, leave=sub.leave))]

    # ------------------------------------------------------------------ context (v1.3)
    def _on_context(self, msg: ev.Context, now: float) -> list[Any]:
        if self.hello is None or self.hello.revision < ev.CONTEXT_REVISION:  # (what a v1.2 server answers)
            return [self._error(0, ErrorCode.UNSUPPORTED_MESSAGE, "context is protocol v1.3: send Hello.revision 3")]
        self.reaper.touch(now)
        return [self._send(self.session.contexts().apply(msg))]  # type: ignore[union-attr]

    def join(self, group: str, joined: bool, now: float) -> list[Any]:
        """Put the session in push group `group` (`joined` false: take it out), for a client's Subscribe or the
        server's own ``lowlat_mw.join``: a :class:`Membership` action if that changed anything."""
        session = self.session
        if session is None or self.state is not ConnState.OPEN or not session.join(group, joined):
            return []
        if not session.groups:  # listening until now: idle from now on, not since long ago
            self.reaper.touch(now)
            self.deadline_moved = True
        return [Membership(group, joined)]

    def push(self, topic: str, body: str | bytes) -> SendFrame | None:
        """The Push frame of `body`, published to `topic`; None when the connection is not open or the client
        did not say it speaks v1.1 (its Hello's revision): a v1.0 client is never sent a kind it does not know."""
        hello = self.hello
        if self.state is not ConnState.OPEN or hello is None or hello.revision < 1:
            return None
        if type(body) is str:
            return SendFrame(self._frame(ev.Push(topic=topic, text=body)))
        return SendFrame(self._frame(ev.Push(topic=topic, data=body)))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ model output
    def send_chunk(self, stream_id: int, chunk: str | bytes, now: float) -> list[bytes | str]:
        """The model of `stream_id` produced `chunk`: its Delta frame (several if it is huge), recorded for resume."""
        session = self.session
        if session is None:
            return []
        if self.state is not ConnState.OPEN:  # closing: the output is kept for a resume
            session.keep(stream_id, chunk, now)
            return []
        st = session.streams.get(stream_id)
        if st is None or st.terminal is not None:
            return []
        if type(chunk) is str and chunk.isascii():  # plain ASCII text (most tokens) needs no check
            n = len(chunk)  # (its size in bytes)
        else:
            chunk = normalize_chunk(chunk)
            if type(chunk) is ev.ToolCall:  # (v1.3) one Delta of its own, never split or merged
                return self._tool_call(stream_id, chunk, now)
            n = encoded_len(chunk)
        self.reaper.last_activity = now  # (the reaper's field, set as IdleReaper.touch sets it: a call per Delta costs)
        limit = self.max_frame_size
        if len(chunk) * 4 <= limit - 32:  # the common case, far below the frame limit: one Delta as it is
            data, raw, codec_id = self.codec.encode_delta(stream_id, st.seq + 1, chunk, self.compressor)
            size = len(data) if type(data) is bytes else raw  # a text frame's size is its UTF-8 length
            if size <= limit or len(chunk) <= 1:
                session.record_in(st, stream_id, chunk, n, now)
                self.stats.count_sent(codec_id, raw, size)
                return [data]
            pending = [chunk]  # a tiny frame limit and a long envelope: split below
        else:
            pending = split_chunk(chunk, limit - 32)[::-1]
        out: list[bytes | str] = []
        while pending:
            piece = pending.pop()
            data, raw, codec_id = self.codec.encode_delta(stream_id, st.seq + 1, piece, self.compressor)
            size = len(data) if type(data) is bytes else raw  # a text frame's size is its UTF-8 length
            if size > limit and len(piece) > 1:
                # JSON escaping or base64 made it too big for one frame: halve and try again.
                pending.extend(reversed(split_chunk(piece, max(1, encoded_len(piece) // 2))))
                continue
            session.record(stream_id, piece, now)
            self.stats.count_sent(codec_id, raw, size)
            out.append(data)
        return out

    def _tool_call(self, stream_id: int, call: ev.ToolCall, now: float) -> list[bytes | str]:
        session = self.session
        call = tool_call_for(session, stream_id, call)  # type: ignore[arg-type]
        self.reaper.touch(now)
        seq = session.record(stream_id, call, now)  # type: ignore[union-attr]
        return [self._frame(ev.Delta(stream_id=stream_id, seq=seq, tool_call=call))] if seq is not None else []

    def finish_stream(self, stream_id: int, now: float, *, reason: str = "stop",
                      timings_ms: Mapping[str, float] | None = None,
                      error: ev.Error | ev.End | None = None) -> list[Any]:
        """The model of `stream_id` finished (reason "stop"; "warmup" for a warm-up request) or was cancelled
        ("cancelled"): its End; or it
        failed: `error`, its Error (or a followed stream's End, as made elsewhere). Recorded in the session (for
        a resume) and framed while the socket is open."""
        session = self.session
        if session is None:
            return []
        event = session.finish(stream_id, now, reason=reason, timings_ms=timings_ms, error=error)
        if event is None or self.state is ConnState.CLOSED:
            return []
        self.reaper.touch(now)
        if not session.active and self._idle_moves:
            self.deadline_moved = True  # idle from now: the reaper's (or the lifetime's) deadline may be sooner
        return [SendFrame(self._frame(event), event if type(event) is ev.Error else None)]

    def fail_stream(self, stream_id: int, now: float, code: ErrorCode, message: str) -> list[Any]:
        """The model of `stream_id` failed: end the stream with an Error (see :meth:`finish_stream`)."""
        return self.finish_stream(stream_id, now, error=ev.Error(stream_id=stream_id, code=code, message=message))

    # ------------------------------------------------------------------ time and teardown
    def next_deadline(self, answered: bool = False) -> float:
        """When :meth:`tick` next has something to do (inf when closed); `answered`: as if the Ping out were
        answered now (for a driver that watches that Pong's timeout apart, see ``AsyncScheduler.watch``)."""
        state = self.state
        if state is ConnState.CLOSED:
            return math.inf
        if state is not ConnState.OPEN:
            return self.handshake_deadline  # no Pings before Welcome: see tick()
        session = self.session
        running, groups = (session.active, session.groups) if session is not None else (0, ())
        when = self.heartbeat.deadline(answered)
        idle = self.reaper.deadline(running, groups)
        if idle < when:
            when = idle
        if self.settings.max_session_lifetime:  # (no limit: no lifetime deadline to ask for; called per timer)
            end = self._lifetime_end(running)
            if end < when:
                when = end
        return when

    def _lifetime_end(self, running: int) -> float:
        """When ``max_session_lifetime`` closes the connection (never while a stream runs, nor without the limit)."""
        lifetime = self.settings.max_session_lifetime
        return self.opened_at + lifetime if lifetime and not running else math.inf

    def tick(self, now: float) -> list[Any]:
        """Timers: handshake timeout, heartbeat pings and timeouts, idle reaping, session lifetime."""
        state = self.state
        if state is ConnState.CLOSED:
            return []
        if state is not ConnState.OPEN:
            # A client may send nothing but Hello before Welcome (protocol.md 7), so it could not
            # answer a Ping: until Welcome only the handshake timeout (4004) applies.
            if now >= self.handshake_deadline:
                return self._close(CloseCode.HANDSHAKE_TIMEOUT, "no hello within handshake_timeout")
            return []
        action = self.heartbeat.poll(now)
        if action is not HeartbeatAction.PEER_DEAD:  # (a dead peer is closed as such, idle or not)
            session = self.session
            running, groups = (session.active, session.groups) if session is not None else (0, ())
            if self.reaper.expired(now, running, groups):
                return self._close(CloseCode.IDLE_TIMEOUT, "idle")
            if now >= self._lifetime_end(running):
                return self._close(CloseCode.SESSION_EXPIRED, "max_session_lifetime reached")
        return self._heartbeat_answer(action)

    def drain(self, reconnect_after_ms: int = 0) -> list[Any]:
        """Server shutdown begins: send GoAway and refuse new streams (running ones go on)."""
        if self.state is not ConnState.OPEN or self.draining:
            return []
        self.draining = True
        return [self._send(ev.GoAway(reason="server draining", reconnect_after_ms=reconnect_after_ms))]

    def connection_lost(self) -> list[Any]:
        """The peer went away: the running streams, to cancel unless the session waits for a resume."""
        if self.state is ConnState.CLOSED:
            return []
        cancels = []
        if self.session is not None:
            for sid, st in self.session.streams.items():
                if st.terminal is None:
                    cancels.append(CancelStream(sid))
        self.state = ConnState.CLOSED
        return cancels


ServerProtocol.HANDLERS = handlers(ServerProtocol, SERVER_RECEIVES)


STREAM_MESSAGES = 2  # control-budget tokens a Request brings: its stream's Ack{done} and a Cancel


def input_size(inp: ev.Input) -> int:
    """Bytes of an Input's item (v1.3), for max_request_size."""
    item = inp.item
    if item is None:
        return 0
    if type(item) is ev.ToolResult:
        return len(item.id) + len(item.content.encode("utf-8", "surrogatepass"))
    return len(item.encode("utf-8", "surrogatepass")) if isinstance(item, str) else len(item)


def request_size(req: ev.Request, measure: Callable[[Mapping[str, Any]], int] = params_size) -> int:
    """Bytes of a Request's input, for max_request_size; `measure` gives its params' (the connection's
    :meth:`ParamsMemo.size <lowlat_mw.protocol.wire.fast.ParamsMemo.size>`: a size kept from the decoding)."""
    size = len(req.model)
    if req.text is not None:
        size += len(req.text) if req.text.isascii() else len(req.text.encode("utf-8", "surrogatepass"))
    if req.data is not None:
        size += len(req.data)
    if req.messages:
        size += sum(len(m.role) + len(m.content.encode("utf-8", "surrogatepass")) for m in req.messages)
    if req.params:
        size += measure(req.params)
    return size
