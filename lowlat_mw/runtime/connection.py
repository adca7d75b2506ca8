"""The connection driver: one :class:`ConnectionDriver` per WebSocket (its session's models: :mod:`.streams`).

The driver owns what the protocol machine may not: the socket's ASGI ``send``, the clocks, the
tasks and the timers. Two objects, because a session outlives a connection:

* :class:`ConnectionDriver` runs one WebSocket: it feeds the frames it receives and the time to its
  :class:`~lowlat_mw.protocol.server.ServerProtocol` and carries out the actions that come back
  (write these frames, start or cancel a model, close), and it is the one way out for model output.
* :class:`ModelRunner` runs one session's models, one task per stream, and hands each chunk to
  the session's current driver in one call (:meth:`ConnectionDriver.chunk`), or, while no
  connection is attached, keeps it in the session for a resume. It waits for the flow-control
  window and, once the connection dropped, for the resume window to end.

Every adapter runs connections through it: the ASGI app (Starlette/FastAPI), the Channels consumer,
and through the thread bridge (:mod:`~lowlat_mw.runtime.threads`) Flask. Timers come from the loop's
one :class:`~lowlat_mw.runtime.timers.AsyncScheduler`. Server shutdown: :func:`drain_all`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from ..endpoint import Endpoint, new_session_ids
from ..errors import CloseCode, ErrorCode, close_code_reconnects
from ..model import (
    SessionInfo,
)
from ..observability import tracing
from ..observability.logs import CLIENT_LOGS
from ..observability.metrics import Metrics
from ..observability.timing import StreamTimer
from ..protocol import events as ev
from ..protocol.base import CloseConnection, Measured, SendFrame
from ..protocol.server import (
    Authenticate,
    CancelStream,
    ConnState,
    DeliverInput,
    Membership,
    ResumeSession,
    ServerProtocol,
    StartStream,
)
from ..protocol.session import Session
from ..security import Handshake, load_authenticator
from . import push
from .auth import run_authenticator
from .direct import BURST, CORK_LIMIT, DirectTransport, DropsCloses, Expected, Turns, expected, frame_header, framed
from .push import principal_name
from .shared import SharedSessions, principal_key, process_id, shared_sessions
from .streams import ModelRunner, error_of
from .timers import AsyncScheduler, cpu_clock

__all__ = ["ConnectionDriver"]

log = logging.getLogger("lowlat_mw")

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# Heartbeat Pings made once (see ConnectionDriver.on_timer): Ping message -> (its frame, the Pong that answers it,
# that Pong as the transport awaits it). Bounded: every connection numbers its Pings 1, 2, 3..., so a few serve all.
_PINGS: dict[bytes | str, tuple[bytes, bytes | str | None, Expected | None]] = {}
_PINGS_MAX = 8192

# Seconds past close_timeout that a server which does not drop unanswered closes gets to report the socket gone before
# the driver lets the connection go itself (ConnectionDriver._unreported).
CLOSE_SLACK = 1.0
_SAID_CANNOT_DROP = False  # (said once per process)
CANNOT_DROP = (
    "this server cannot drop a WebSocket whose peer does not take its close (uvicorn's own --ws protocols, gunicorn's "
    "UvicornWorker, hypercorn...): such connections are released %.1f s after their close, but their sockets stay "
    "open until the peer reads or goes. lowlat-mw's uvicorn shims (lowlat-mw serve, --ws "
    "lowlat_mw.servers.uvicorn:WebSocketProtocol), daphne runner and Flask bridge drop them (docs/security.md)")

# Close codes after which the session is kept for resume (the client will reconnect).
_RESUMABLE = frozenset({None, 1001, 1005, 1006, 1011, 1012, 1013, 1014,
                        CloseCode.HEARTBEAT_TIMEOUT, CloseCode.DRAINING, CloseCode.SLOW_CONSUMER})

PUSH_BACKLOG = 4 * 1024 * 1024  # bytes of pushes a connection may have waiting for its output; more are skipped
PUSH_LISTEN_WAIT = 5.0  # seconds a Subscribe's answer waits for this process to listen to the shared push channel
RELOAD_AFTER = (0.02, 0.06)  # seconds between looks for a session the shared store does not have (yet): it writes
# every 10 ms (shared.WRITE_EVERY), so a session whose first Request came just before the drop may be on its way


# ================================================================================ the connection driver
class ConnectionDriver:
    """Runs one WebSocket: frames in, frames out through the ASGI `send`, its timers from the loop's scheduler.

    `send` takes ASGI messages (``websocket.send`` and ``websocket.close``): the ASGI server's own,
    or an adapter's that speaks to its socket the same way. With `direct` (a server's
    :class:`~lowlat_mw.runtime.direct.DirectTransport`) frames are built here and written to it, the
    frames of one loop turn in one write; the close still goes through `send`. The endpoint admitted
    the connection.

    `closes`: the server's :class:`~lowlat_mw.runtime.direct.DropsCloses`, where it drops a connection whose close is
    not over within the endpoint's ``close_timeout`` (told here) and then reports it gone (:meth:`disconnected`). A
    server without it may never report a connection whose peer does not take the close (plain uvicorn waits for a
    paused transport before it writes the close frame): the driver then lets the connection go itself, CLOSE_SLACK
    seconds after that bound (:meth:`_unreported`).
    """

    # Slots: a connection's attributes in a fixed array, not a dict of ~1.5 KB per connection. (__dict__ only
    # for what a test may set, e.g. a fake `monotonic`; none is made otherwise.)
    __slots__ = ("__dict__", "__weakref__", "_answered", "_arrived", "_close_sent", "_closing", "_cork", "_corked",
                 "_drops", "_expects", "_gone", "_handshake_span", "_inbox", "_push_backlog", "_scheduled",
                 "_send", "_send_since", "_sender", "_stuck_task", "_superseded", "_timer_tasks", "_turn", "_turns",
                 "_unreported_at", "_waiters", "_welcomed", "_writing", "address", "direct", "endpoint", "info", "loop",
                 "member", "metrics", "opened_at", "protocol", "receiving", "runner", "scheduler", "settings", "timed",
                 "tracer")

    monotonic: Callable[[], float] = staticmethod(time.monotonic)  # the machine's `now` (a test may fake it)
    clock: Callable[[], float] = staticmethod(time.perf_counter)  # stage timings

    def __init__(self, endpoint: Endpoint, *, send: Send, subprotocol: str | None, address: str | None = None,
                 client: tuple[str, int] | None = None, headers: Mapping[str, str] | None = None, user: Any = None,
                 extra: Mapping[str, Any] | None = None, direct: DirectTransport | None = None,
                 closes: DropsCloses | None = None) -> None:
        """`address`: what the endpoint admitted the connection as (released when it ends); `client`,
        `headers`, `user` and `extra`: what models and the authenticate hook see of it (SessionInfo)."""
        settings = self.settings = endpoint.settings
        self.endpoint = endpoint
        self.metrics: Metrics | None = endpoint.metrics
        self.tracer = tracing.tracer() if settings.tracing else None
        self.timed = settings.stage_timings or self.metrics is not None or self.tracer is not None
        session_id, secret = new_session_ids()
        self.opened_at = now = self.monotonic()
        self.protocol = ServerProtocol(settings, subprotocol=subprotocol, now=now, session_id=session_id,
                                       secret=secret, meter=cpu_clock)
        self._send = send
        self.direct = direct
        self._cork: list[bytes] = []  # frames (header, payload, ...) held for one write at the end of the loop turn
        self._inbox: deque[bytes | str] | None = None  # direct reads waiting for an earlier message to be handled
        self._corked = 0
        self._turn = -1  # the loop turn (Turns.turn) of this connection's last direct write
        self.address = address
        self.info = SessionInfo(session_id=session_id, subprotocol=subprotocol, client=client, headers=headers or {},
                                user=user, extra=extra or {})
        self.loop = loop = asyncio.get_running_loop()
        self._turns = Turns.of(loop) if direct is not None else None  # (only direct writes hold frames)
        scheduler = AsyncScheduler.by_loop.get(loop)
        self.scheduler = scheduler if scheduler is not None else AsyncScheduler.current()
        self.runner: ModelRunner | None = None
        self._arrived = 0.0  # when the frame being handled arrived (perf_counter), for a Request's stage timer
        # One writer at a time holds the connection's output (frames of one write stay together, a close
        # goes after what was written before it): a flag, and a queue only while writes wait (_acquire).
        self._writing = False
        self._waiters: deque[asyncio.Future[None]] | None = None
        # The send in progress (the task holding the output) and when it began: on_timer closes the
        # connection when one stays blocked for slow_consumer_timeout, without a loop timer per frame.
        self._sender: asyncio.Task[Any] | None = None
        self._send_since = math.inf
        self._stuck_task: asyncio.Task[Any] | None = None  # the sender on_timer cancelled
        self._timer_tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._close_sent = False
        self._gone = False
        close_within = getattr(closes, "close_within", None)
        if close_within is not None:
            close_within(settings.close_timeout)  # (this endpoint's, not another app's of the process)
        self._drops = close_within is not None
        self._unreported_at: asyncio.TimerHandle | None = None
        self.receiving: asyncio.Task[Any] | None = None
        """The task reading this connection's ASGI ``receive`` (LowLatASGI.serve), if it says so: ended when the
        driver lets the connection go itself (:meth:`_unreported`)."""
        self._welcomed = False
        self._superseded = False  # a resume moved this connection's session to another connection
        self.member = False  # in push's index of users and groups (push.HUB.add): it leaves it when it closes
        self._push_backlog = 0  # bytes of pushes waiting for the connection's output (PUSH_BACKLOG bounds them)
        self._handshake_span = tracing.start_handshake(self.tracer, subprotocol) if self.tracer else None
        # Where offered, messages skip the ASGI queue too (ASGI receive still brings the disconnect).
        reads = direct is not None and self.read_directly()
        self._expects = reads and hasattr(direct, "expect")  # (DirectReads.expect: the heartbeat's Pong awaited)
        if self.metrics is not None:
            self.metrics.connection_opened(self.protocol.stats, direct is not None, reads)
        endpoint.connection_started(self)  # drains reach it from now on
        self._scheduled = self.protocol.handshake_deadline
        self._answered = math.nan  # where on_timer put the timer for a Ping's Pong to come (nan: equal to nothing)
        self.scheduler.schedule(self, self._scheduled)

    @property
    def tasks(self) -> dict[int, asyncio.Task[None]]:
        """Model tasks of the session this connection carries."""
        return self.runner.tasks if self.runner is not None else {}

    # ------------------------------------------------------------------ from the socket
    async def receive(self, data: bytes | str) -> None:
        """Feed one WebSocket message from the client."""
        if self._superseded:
            return  # stale socket: its session lives on another connection (the resume listed what it needs)
        proto = self.protocol
        if self.timed:
            self._arrived = self.clock()
        actions = proto.receive_data(data, self.monotonic())
        if actions:
            await self._act(actions)
        runner = self.runner
        if runner is not None and runner.waiting:
            runner.window_changed()
        if proto.deadline_moved:
            self.reschedule()

    def read_directly(self) -> bool:
        """Have the server hand messages straight to :meth:`feed` (the transport's optional
        :class:`~lowlat_mw.runtime.direct.DirectReads`); False: they keep coming through ASGI ``receive``."""
        set_receiver = getattr(self.direct, "set_receiver", None)
        return set_receiver is not None and bool(set_receiver(self.feed))

    def feed(self, data: bytes | str, burst: int) -> None:
        """One message, from the server's ``data_received`` (direct reads; `burst`: its place in the socket
        read). Handled at once, without a task or a loop turn, when nothing earlier is still being handled
        and what it causes needs no waiting (:meth:`_act_now`); otherwise a task finishes it (a paused
        transport, a close, the authenticate hook, a resume) while the messages after it wait in order,
        reading paused. Past BURST messages of one socket read the rest go one per loop turn, as through
        ASGI: a flood does not hold the loop."""
        inbox = self._inbox
        if inbox is not None:
            inbox.append(data)
            return
        if burst > BURST:
            self._inbox = deque((data,))
            self._pause_reading()
            self._spawn(self._read_inbox())
            return
        if self._superseded:
            return
        proto = self.protocol
        try:
            if data is proto.pong_frame and proto.state is ConnState.OPEN:  # the Pong on_timer's transport awaited
                self._pong(proto)
                return
            if self.timed:
                self._arrived = self.clock()
            actions = proto.receive_data(data, self.monotonic())
            if actions and not self._act_now(actions):
                self._inbox = deque()
                self._pause_reading()
                self._spawn(self._fed(actions))
                return
            runner = self.runner
            if runner is not None and runner.waiting:
                runner.window_changed()
            if proto.deadline_moved:
                self.reschedule()
        except Exception:
            self._spawn(self._failed())

    def _pong(self, proto: ServerProtocol) -> None:
        """The heartbeat's Pong, known by identity (:meth:`feed`): its RTT measured, without decoding it or the general
        path's action list (once per heartbeat of every idle connection). The timer is already where the Pong puts
        it (on_timer, `_answered`), unless something moved it since: only then is the deadline computed again."""
        moved = proto.deadline_moved  # (something else moved it, and its reschedule is still to come)
        rtt = proto.pong_arrived(self.monotonic())
        metrics = self.metrics
        if metrics is not None:
            h = metrics.heartbeat_rtt or metrics.rtt_hist()
            h.counts[bisect_left(h.bounds, rtt)] += 1  # (_Hist.observe, written out)
            h.sum += rtt
        if self._scheduled == self._answered and not moved:  # (where on_timer put it for this Pong: nothing to do)
            proto.deadline_seen()
        else:
            self.reschedule()

    async def _fed(self, actions: list[Any]) -> None:
        """Carry out what a fed message caused that has to wait, then the messages that came meanwhile."""
        try:
            await self._act(actions)
            runner = self.runner
            if runner is not None and runner.waiting:
                runner.window_changed()
            if self.protocol.deadline_moved:
                self.reschedule()
        except Exception:
            self._inbox = None
            await self._failed()
            return
        await self._read_inbox()

    async def _failed(self) -> None:
        """A message could not be handled (a bug of ours): as an ASGI app's failure, logged and closed with 1011."""
        log.exception("failed handling a message of %s", self.protocol.session_id,
                      extra={"session_id": self.protocol.session_id})
        await self.close(CloseCode.INTERNAL_ERROR, "internal error")

    def _act_now(self, actions: Sequence[Any]) -> bool:
        """Carry out `actions` here and now if none of them has to wait (frames the direct transport takes at
        once, streams to start or cancel, measurements); else do nothing and return False. Once the Welcome
        is out, the first call logs the open connection and times the handshake."""
        direct = self.direct
        if len(actions) == 1 and self._welcomed:  # (one frame or one measurement: a heartbeat's Ping, its RTT; one
            # stream to start: a Request)
            action = actions[0]
            kind = type(action)
            if kind is Measured:
                if self.metrics is not None:
                    self.metrics.observe(action.name, action.value)
                return True
            if kind is SendFrame and action.error is None:
                if direct is None or self._writing or not direct.is_writable():
                    return False
                if not self._closing:
                    self._hold([action.data])
                return True
            if kind is StartStream and self.runner is not None:  # (a Request: the loops below, for one action)
                self.runner.start(action.request, self._arrived if self.timed else None)
                return True
        writable = direct is not None and not self._writing and direct.is_writable()
        for action in actions:
            kind = type(action)
            if kind is SendFrame:
                if not writable:
                    return False
            elif kind is Membership:
                if not self._member_now():
                    return False
            elif kind is not StartStream and kind is not CancelStream and kind is not Measured \
                    and kind is not DeliverInput:
                return False
        frames: list[bytes | str] = []
        for action in actions:
            kind = type(action)
            if kind is SendFrame:
                frames.append(action.data)
                if action.error is not None:
                    self._sent_error(action.error)
                continue
            if frames:
                if not self._closing:
                    self._hold(frames)
                frames = []
            if kind is StartStream:
                runner = self.runner
                if runner is None:
                    if self._superseded or self.protocol.session is None:
                        continue
                    runner = self.runner = ModelRunner(self.protocol.session, self)
                runner.start(action.request, self._arrived if self.timed else None)
            elif kind is CancelStream:
                if self.runner is not None:
                    self.runner.cancel(action.stream_id)
            elif kind is DeliverInput:
                self._deliver(action.input)
            elif kind is Membership:
                self._membership(action)
            elif self.metrics is not None:  # Measured
                self.metrics.observe(action.name, action.value)
        if frames and not self._closing:
            self._hold(frames)
        proto = self.protocol
        if not self._welcomed and proto.state is ConnState.OPEN:  # the Welcome went out: log it, time the handshake
            self._welcomed = True
            if self.settings.session_store and not proto.resumed and proto.session is not None:
                # Shared sessions: in the store from the start, so a client whose first Request was lost in a drop
                # resumes elsewhere into a known session, which asks it to send the Request again (protocol 14.2).
                shared = shared_sessions(self.endpoint)
                if shared is not None:
                    shared.share(proto.session, proto.session.principal, hold=False)
            if self.info.session_id != proto.session_id:
                self.info = dataclasses.replace(self.info, session_id=proto.session_id)
            # Reachable by pushes from now on: by its session; by its user and groups too, if any (_reachable).
            push.HUB.sessions[proto.session_id] = self
            if proto.principal is not None or proto.session.groups:  # type: ignore[union-attr]
                self._reachable()
            log.info("connection %s open: %s, compression %s%s", proto.session_id, proto.subprotocol or "json",
                     ",".join(proto.compression) or "none", " (resumed)" if proto.resumed else "",
                     extra={"session_id": proto.session_id, "subprotocol": proto.subprotocol,
                            "client": self.info.client, "resumed": proto.resumed})
            if self.metrics is not None:
                self.metrics.handshake_done(self.monotonic() - self.opened_at)
            if self._handshake_span is not None:
                self._end_handshake()
        return True

    def _deliver(self, inp: ev.Input) -> None:
        """(v1.3) An Input for a running stream: to its model, or the stream fails (the model is not reading)."""
        problem = self.runner.deliver(inp) if self.runner is not None else None
        if problem is not None:
            actions = self.protocol.refuse_input(inp.stream_id, self.monotonic(), ErrorCode.BAD_REQUEST, problem)
            if not self._act_now(actions):  # (the socket is busy: in order, after what is being written)
                self._spawn(self._act(actions))

    async def _read_inbox(self) -> None:
        inbox = self._inbox
        try:
            while inbox:
                await asyncio.sleep(0)  # one message per loop turn
                await self.receive(inbox.popleft())
        except Exception:
            await self._failed()
        finally:
            self._inbox = None
            try:  # (closing too: the server reads the peer's close frame)
                self.direct.resume_reading()  # type: ignore[union-attr]
            except Exception:  # the transport is gone
                pass

    def _pause_reading(self) -> None:
        try:
            self.direct.pause_reading()  # type: ignore[union-attr]
        except Exception:  # the transport is closing
            pass

    async def disconnected(self, code: int | None = None) -> None:
        """The socket is gone (`code`: the peer's close code, if any): keep or end the session."""
        if self._gone:
            return
        self._gone = True
        self._closing = True
        if self._unreported_at is not None:
            self._unreported_at.cancel()
            self._unreported_at = None
        self._cork = []  # (if it is in Turns.held, the end of the turn finds nothing to write)
        proto = self.protocol
        by = "server" if proto.close_code is not None else "client"
        final = proto.close_code if proto.close_code is not None else (code or 1006)
        log.info("connection %s closed by %s: %s %s", proto.session_id, by, final, proto.close_reason,
                 extra={"session_id": proto.session_id, "close_code": final, "closed_by": by,
                        "client": self.info.client})
        if self._handshake_span is not None:  # never got past Hello: the handshake failed with this close
            self._end_handshake(final)
        if self.metrics is not None:
            self.metrics.connection_closed(proto.stats, final, by)
        self.endpoint.connection_ended(self)
        sessions = push.HUB.sessions
        if sessions.get(proto.session_id) is self:
            del sessions[proto.session_id]
        if self.member:
            push.HUB.discard(self)
        self.protocol.connection_lost()
        self.scheduler.cancel(self)
        self._scheduled = math.inf
        runner = self.runner
        if self.protocol.close_code is not None:
            code = self.protocol.close_code  # we closed: our reason decides
        resumable = code in _RESUMABLE and close_code_reconnects(code)
        if runner is None and resumable and self._welcomed and not self._superseded \
                and proto.session is not None and self.endpoint.store.get(proto.session_id) is None:
            # A drop before any stream: the client may have sent a Request the drop lost. The session waits a
            # little (Session.EMPTY_WINDOW), so its resume is told to send it again rather than "expired".
            runner = self.runner = ModelRunner(proto.session, self)
        if runner is None or runner.driver is not self:
            return
        if resumable:
            runner.detach(self.monotonic())
        else:
            runner.destroy()
            if runner.tasks:
                await runner.wait_closed()

    # ------------------------------------------------------------------ from the models
    async def chunk(self, sid: int, chunk: Any, timer: StreamTimer | None) -> None:
        """The model of stream `sid` produced `chunk`: frame it, record it for resume, write it.

        Timed (`timer`): a sampled Delta (a stream's first two, then two in `timer.every`) reads the clock
        where the chunk arrived, where its frames were built and where they were handed over
        (StreamTimer.tick); the others only count down to the next sample."""
        proto = self.protocol
        produced: float | None = None
        if timer is not None:
            left = timer.left - 1
            if left:
                timer.left = left
            else:  # sampled
                clock = self.clock
                produced = clock()
                compressor = proto.compressor
                spent = compressor.spent if compressor is not None else 0.0
        frames = proto.send_chunk(sid, chunk, self.monotonic())
        if produced is not None:
            encoded = clock()
        try:
            if frames:  # (_write's direct path, written out: no coroutine per Delta)
                direct = self.direct
                if direct is not None and not self._closing and not self._writing and direct.is_writable():
                    self._hold(frames)
                else:
                    await self._write(frames)
        finally:  # recorded, so it counts as sent even if a cancel lands while the socket write is finishing
            if produced is not None:
                timer.tick(produced, encoded, clock(),  # type: ignore[union-attr]
                           compressor.spent - spent if compressor is not None else 0.0)

    def first_delta_out(self) -> bool:
        """A stream's first Delta went out through this connection: whether its model's next step should wait for
        the next loop turn, because another stream's first Delta went out in this turn too (a burst of Requests;
        docs/architecture.md, "Fair scheduling"). Counted only where the driver writes directly, in a turn that
        wrote (the turn's end resets the count); through ASGI ``send``, never."""
        turns = self._turns
        if turns is None or not turns.scheduled:
            return False
        turns.started += 1
        return turns.started > 1

    async def end_stream(self, sid: int, ending: tuple[Any, ...], timings_ms: dict[str, float] | None, span: Any,
                         timer: StreamTimer | None) -> None:
        """The model of `sid` ended: ("stop",) or ("cancelled",) with `timings_ms`, or (code, message[, retryable]).
        The machine records and frames the End or Error, the stream's span ends with it, and it goes out."""
        proto = self.protocol
        now = self.monotonic()
        if len(ending) == 1 and type(ending[0]) is not str:  # a followed stream's own End or Error
            actions = proto.finish_stream(sid, now, error=ending[0])
        elif len(ending) == 1:
            actions = proto.finish_stream(sid, now, reason=ending[0], timings_ms=timings_ms)
        else:
            actions = proto.finish_stream(sid, now, error=error_of(sid, ending))
        if span is not None:
            st = proto.session.streams.get(sid) if proto.session is not None else None
            tracing.end_stream(span, st.terminal if st is not None else None, timer)
        if actions:
            await self._act(actions)
        if proto.deadline_moved:
            self.reschedule()

    # ------------------------------------------------------------------ actions
    async def _act(self, actions: list[Any]) -> None:
        """Carry out the machine's actions (consecutive frames go out in one locked write)."""
        if self._act_now(actions):
            return
        frames: list[bytes | str] = []
        for action in actions:
            kind = type(action)
            if kind is SendFrame:
                frames.append(action.data)
                if action.error is not None:
                    self._sent_error(action.error)
                continue
            if frames:
                await self._write(frames)
                frames = []
            if kind is CloseConnection:
                await self._close_socket(action.code, action.reason)
            elif kind is ResumeSession:
                await self._resume(action)
            elif kind is Authenticate:
                await self._authenticate(action)
            elif kind is Membership:
                await self._listening()
                self._membership(action)
            else:  # a stream to start or cancel, a measurement: nothing to wait for
                self._act_now([action])
        if frames:
            await self._write(frames)
        if not self._welcomed and self.protocol.state is ConnState.OPEN:
            self._act_now(())  # (nothing left to do: it notes the Welcome)

    async def _authenticate(self, action: Authenticate) -> None:
        hook = load_authenticator(self.settings.authenticate)
        principal, reason = await run_authenticator(hook, Handshake.from_info(self.info, action.hello.auth),
                                                     self.endpoint.executor)
        if principal is not None:
            self.info = dataclasses.replace(self.info, principal=principal)
        else:
            CLIENT_LOGS.log(log, logging.WARNING, self.address, "refused client %s: %s", self.info.client, reason,
                            extra={"session_id": self.protocol.session_id, "client": self.info.client})
        await self._act(self.protocol.authenticated(principal, self.monotonic(), reason))

    async def _resume(self, action: ResumeSession) -> None:
        found = self.endpoint.store.get(action.session_id)
        runner = found if isinstance(found, ModelRunner) and not found.destroyed else None
        shared = shared_sessions(self.endpoint)
        remote: tuple[Session, dict[int, str], Any] | None = None
        if shared is not None and (runner is None
                                   or await shared.owner(action.session_id) not in (None, "", process_id())):
            # Not here, or it moved to another process since: the shared store's copy is the one to resume.
            remote = await self._remote_session(shared, action)
            if remote is not None:
                runner = None  # (else: the store could not give it; the one here, if any, is resumed)
        if self.protocol.state is not ConnState.ADMITTING:  # it closed (a timeout, the client) while the store answered
            return
        if runner is not None and runner.destroyed:
            runner = None
        session = runner.session if runner is not None else remote[0] if remote is not None else None
        actions = self.protocol.resume(session, self.monotonic())
        if remote is not None and self.protocol.session is remote[0]:
            runner = ModelRunner(remote[0], self)  # (this process holds the session from now on)
        resumed = runner is not None and self.protocol.session is runner.session
        if self.metrics is not None:
            self.metrics.inc("resumes", "resumed" if resumed else "failed")
        old: ConnectionDriver | None = None
        if resumed:
            assert runner is not None
            old = runner.driver
            self.runner = runner
            self.info = dataclasses.replace(self.info, session_id=runner.session.session_id)
            runner.attach(self)  # from now on the model tasks send through this connection
            if old is not None and old is not self:
                old.runner = None  # its socket is stale: it must not touch the session any more
                old._superseded = True  # nor start a second runner for it (see _start_stream)
                if old.member:
                    push.HUB.discard(old)  # (its session's key is this connection's now)
            log.info("session %s resumed", runner.session.session_id, extra={"session_id": runner.session.session_id})
        # Welcome and the replay go out before any await lets a model task run: the live Deltas
        # it now sends through this connection must follow them (never a Delta before Welcome).
        await self._act(actions)
        if resumed and remote is not None:
            self._follow_remote(remote, shared)  # type: ignore[arg-type]
        if old is not None and old is not self:
            await old.close(CloseCode.GOING_AWAY, "session resumed on another connection")
        if self.runner is not None:
            self.runner.window_changed()

    async def _remote_session(self, shared: SharedSessions,
                              action: ResumeSession) -> tuple[Session, dict[int, str], Any] | None:
        """The session `action` resumes, from the shared store (None: not there, or not this client's)."""
        found = await shared.load(action.session_id, action.token)
        for delay in RELOAD_AFTER:  # written behind the socket: a session a moment old may not be there yet
            if found is not None or shared.down:
                break
            await asyncio.sleep(delay)
            found = await shared.load(action.session_id, action.token)
        if found is None or found.principal != principal_key(self.protocol.principal):
            return None
        session, follow = found.to_session(self.settings, action.token, self.monotonic())
        session.belongs_to(self.protocol.principal)
        return session, follow, found.last_id

    def _follow_remote(self, remote: tuple[Session, dict[int, str], Any], shared: SharedSessions) -> None:
        """After a resume from the shared store: relay the streams still running in another process, and end
        (unsent) those the client no longer wants."""
        session, follow, last_id = remote
        runner = self.runner
        assert runner is not None
        now = self.monotonic()
        for sid, writer in follow.items():
            st = session.streams.get(sid)
            if st is None or st.terminal is not None:
                continue
            if st.cancelling:
                session.finish(sid, now, reason="cancelled")
                shared.cancel_elsewhere(session.session_id, sid)
                continue
            runner.follow(sid, shared.follow(session.session_id, sid, last_id, st.seq, writer))

    # ------------------------------------------------------------------ push (v1.1)
    @property
    def reachable(self) -> bool:
        """Whether pushes may reach this connection: open, and its session not moved to another one."""
        return not self._gone and not self._superseded

    def _reachable(self) -> None:
        """The Welcome went out: pushes to who authenticated and to the session's groups reach this connection."""
        name = principal_name(self.protocol.principal)
        keys = [f"group:{group}" for group in self.protocol.session.groups]  # type: ignore[union-attr]
        if name is not None:
            keys.append(f"user:{name}")
        push.HUB.add(self, keys)

    def _member_now(self) -> bool:
        """Whether a Membership can be carried out without waiting: no shared store, or its listener is on (or
        failing: Redis is down, and waiting would not bring it back)."""
        if not self.settings.shares_sessions:
            return True
        listener = push.HUB.listen(self.settings.session_store)
        return listener.ready.is_set() or listener.failing

    async def _listening(self) -> None:
        """Wait (bounded, PUSH_LISTEN_WAIT) while this process starts listening to the shared push channel, so
        that the Subscribed answer that follows means: pushes published from now on reach this connection."""
        waited = 0.0
        while not self._member_now() and waited < PUSH_LISTEN_WAIT:
            await asyncio.sleep(0.01)
            waited += 0.01

    def _membership(self, change: Membership) -> None:
        """The session joined or left a push group: index this connection as the session is now (a later change may
        have overtaken this one); keep a session in groups for a resume, as one with streams; tell the store."""
        session = self.protocol.session
        if session is None or self._superseded:
            return
        key = (f"group:{change.group}",)
        if change.group in session.groups:
            push.HUB.add(self, key)
            if self.runner is None:  # (what keeps a session for a resume, here and in Redis: docs/push.md)
                self.runner = ModelRunner(session, self)
        else:
            push.HUB.discard(self, key)
        shared = shared_sessions(self.endpoint)
        if shared is not None:
            shared.groups_changed(session)

    def push(self, topic: str, body: str | bytes) -> None:
        """A push published to `topic` reached this connection (on its loop): send it, if it can go now."""
        frame = None if self._closing or self._superseded else self.protocol.push(topic, body)
        size = 0
        if frame is not None:
            data = frame.data
            size = len(data) if type(data) is bytes or data.isascii() else len(data.encode("utf-8", "surrogatepass"))
            if size > self.settings.max_frame_size:  # (JSON's base64 or escapes): a client may not take more
                frame = None
            elif self._push_backlog and self._push_backlog + size > PUSH_BACKLOG:  # a slow client: at most once
                frame = None
        if self.metrics is not None:
            self.metrics.inc("pushes", "sent" if frame is not None else "skipped")
        if frame is None:
            return
        direct = self.direct
        if (not self._push_backlog and direct is not None and not self._writing and not self._waiters
                and direct.is_writable()):
            self._hold([frame.data])  # nothing before it waits: out with this loop turn's other frames
            return
        self._push_backlog += size  # (a task per push, started in arrival order: pushes go out in the order they came)
        self._spawn(self._push_later(frame.data, size))

    async def _push_later(self, data: bytes | str, size: int) -> None:
        try:
            await self._write([data])
        finally:
            self._push_backlog -= size

    def join_group(self, group: str, joined: bool) -> None:
        """The server put this connection's session in push group `group` (or took it out): ``lowlat_mw.join``."""
        if self._closing or self._superseded:
            return
        actions = self.protocol.join(group, joined, self.monotonic())
        if actions:
            self._spawn(self._act(actions))
        if self.protocol.deadline_moved:
            self.reschedule()

    # ------------------------------------------------------------------ output
    async def _acquire(self) -> None:
        """Wait until no other write holds the connection's output, then hold it (in arrival order, as an
        asyncio.Lock would; release with :meth:`_release`)."""
        if not self._writing and not self._waiters:
            self._writing = True
            return
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = deque()
        fut = self.loop.create_future()
        waiters.append(fut)
        try:
            try:
                await fut
            finally:
                waiters.remove(fut)
        except asyncio.CancelledError:
            if not self._writing:  # woken, then cancelled: the next in line goes
                self._wake_next()
            raise
        self._writing = True

    def _release(self) -> None:
        self._writing = False
        if self._waiters:
            self._wake_next()

    def _wake_next(self) -> None:
        waiters = self._waiters
        if waiters:
            fut = waiters[0]
            if not fut.done():
                fut.set_result(None)

    async def _write(self, frames: list[bytes | str]) -> None:
        if self._closing:
            return
        direct = self.direct
        send = self._send
        try:
            if self._writing or self._waiters:  # another write holds the output: wait for it, in order
                await self._acquire()
            elif direct is not None and direct.is_writable():
                self._hold(frames)
                return
            else:
                self._writing = True
            try:
                if self._closing:  # closed while this waited
                    return
                # No loop timer per send (asyncio.timeout costs a TimerHandle each time): the
                # connection's own timer checks _send_since. Its next deadline is normally the
                # heartbeat's; if none is due before this send's, arm one, so a stuck send is
                # caught between 1x and 1.5x slow_consumer_timeout after it began.
                self._sender = asyncio.current_task(self.loop)
                self._send_since = since = self.monotonic()
                timeout = self.settings.slow_consumer_timeout
                if self._scheduled > since + 1.5 * timeout:
                    self._scheduled = since + timeout
                    self.scheduler.schedule(self, self._scheduled)
                if direct is not None:  # held back by the transport's flow control
                    while not direct.is_writable() and not direct.is_closing():
                        await direct.wait_writable()
                    self._hold(frames)
                    return
                for data in frames:
                    if type(data) is bytes:
                        await send({"type": "websocket.send", "bytes": data})
                    else:
                        await send({"type": "websocket.send", "text": data})
            finally:
                self._sender = None
                self._writing = False  # (_release, written out: the one call per ASGI send it would add)
                if self._waiters:
                    self._wake_next()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task is not self._stuck_task:
                raise
            self._stuck_task = None
            if task.uncancel() > 0:  # also cancelled for another reason
                raise
            CLIENT_LOGS.log(log, logging.WARNING, self.address, "send blocked for %g s: closing slow consumer %s",
                            self.settings.slow_consumer_timeout, self.info.client,
                            extra={"session_id": self.protocol.session_id, "client": self.info.client})
            self.protocol.close(CloseCode.SLOW_CONSUMER, "send blocked")
            # (Not disconnected yet: the socket is there until the server closes or aborts it, close_timeout at most,
            # and it counts against the connection limits until the server says it is gone.)
            await self._close_socket(CloseCode.SLOW_CONSUMER, "send blocked", locked=False)
        except Exception as exc:  # the socket went away under us
            log.debug("send failed, treating as disconnect: %r", exc)
            self._closing = True

    def _hold(self, frames: list[bytes | str]) -> None:
        """Frame `frames` for the direct transport. The first output of a loop turn is written at once (a
        reply's first frame waits for nothing); what follows in the same turn is held and written in one
        piece when the turn ends (at once past CORK_LIMIT bytes; see Turns). Nothing for a closing transport."""
        direct = self.direct
        if direct.closing:  # type: ignore[union-attr]
            self._closing = True
            return
        turns: Turns = self._turns  # type: ignore[assignment]
        cork = self._cork
        first = self._turn != turns.turn and not cork
        if first:  # the first output of this turn: written at once
            self._turn = turns.turn
            if not turns.scheduled:  # the turn ends when the loop has run what is ready now
                turns.scheduled = True
                self.loop.call_soon(turns.end)
            if len(frames) == 1:  # (most often a single Delta)
                data = frames[0]
                text = type(data) is not bytes
                if text:
                    data = data.encode()
                try:
                    direct.write(frame_header(data, text) + data)  # type: ignore[union-attr,arg-type]
                except RuntimeError:  # the transport closed under us (see DirectTransport.closing)
                    self._closing = True
                return
        elif not cork:  # held until the turn ends
            turns.held.append(self)
        size = self._corked
        for data in frames:
            if type(data) is bytes:
                cork.append(frame_header(data, False))
            else:
                data = data.encode()
                cork.append(frame_header(data, True))
            cork.append(data)
            size += len(data)
        self._corked = size
        if first or size >= CORK_LIMIT:
            self._write_held()

    def _write_held(self) -> None:
        """Write what `_hold` holds now (at the end of the turn, or before anything goes out through ASGI
        `send`, so the order holds)."""
        cork = self._cork
        if not cork:
            return
        self._cork = []
        self._corked = 0
        direct = self.direct
        assert direct is not None
        if direct.closing:
            self._closing = True
            return
        try:
            direct.write(b"".join(cork))
        except RuntimeError:  # the transport closed under us (see DirectTransport.closing)
            self._closing = True

    async def close(self, code: int = CloseCode.GOING_AWAY, reason: str = "server shutdown") -> None:
        """Close the WebSocket from the server side with `code` (idempotent)."""
        await self._act(self.protocol.close(code, reason))

    async def _close_socket(self, code: int, reason: str, *, locked: bool = True) -> None:
        """Hand the server the close (`locked`: after the writes before it). It always goes, within close_timeout:
        a write blocked on a peer that does not read is not waited for past it (the close goes behind what the
        transport holds), and the server then drops a connection its peer does not close within close_timeout
        (docs/protocol.md 12). The socket counts as open until the server says it is gone (:meth:`disconnected`)."""
        self._closing = True
        self.scheduler.cancel(self)
        self._scheduled = math.inf
        if self._close_sent:
            return
        self._close_sent = True
        log.debug("closing connection %s: %s %s", self.protocol.session_id, code, reason,
                  extra={"session_id": self.protocol.session_id, "close_code": code})
        # A plain int: servers may check type(code) is int (daphne/autobahn refuse an IntEnum).
        message = {"type": "websocket.close", "code": int(code), "reason": reason}
        timeout = self.settings.close_timeout
        try:
            if locked:
                try:
                    async with asyncio.timeout(timeout):
                        await self._acquire()
                except TimeoutError:  # the write holding the output is stuck: the close goes without it
                    locked = False
                    log.debug("connection %s: output blocked for %.1f s, closing without it", self.protocol.session_id,
                              timeout, extra={"session_id": self.protocol.session_id})
            try:
                if self._cork:
                    self._write_held()  # what was sent before the close goes out before it
                async with asyncio.timeout(timeout):
                    await self._send(message)
            finally:
                if locked:
                    self._release()
        except Exception as exc:
            log.debug("close failed: %r", exc)
        runner = self.runner
        if runner is not None and runner.driver is self:
            if not close_code_reconnects(code):
                # A final close (protocol error, idle...): nothing to resume, stop the models now.
                runner.destroy()
            elif code in _RESUMABLE:
                # The client will resume: the session waits for it from now on, as once the socket is gone (which
                # may take close_timeout), its models paused when the replay buffer is full.
                runner.detach(self.monotonic())
        if not self._drops and not self._gone:  # a server that may never say the socket is gone
            self._unreported_at = self.loop.call_later(timeout + CLOSE_SLACK, self._unreported)

    def _unreported(self) -> None:
        """close_timeout and CLOSE_SLACK after our close, a server that does not drop unanswered closes has not
        reported the socket gone: for a peer that stopped reading it never will (plain uvicorn's close waits behind
        the paused transport). The connection is let go here (its place in the limits, its session: as if the socket
        had dropped, 1006) and the task reading its ``receive`` ends; the socket is the server's."""
        global _SAID_CANNOT_DROP
        self._unreported_at = None
        if self._gone:
            return
        if not _SAID_CANNOT_DROP:
            _SAID_CANNOT_DROP = True
            log.warning(CANNOT_DROP, self.settings.close_timeout + CLOSE_SLACK)
        log.debug("connection %s: no disconnect %.1f s after its close, released", self.protocol.session_id,
                  self.settings.close_timeout + CLOSE_SLACK, extra={"session_id": self.protocol.session_id})
        self._spawn(self._let_go())

    async def _let_go(self) -> None:
        await self.disconnected(1006)
        receiving, self.receiving = self.receiving, None
        if receiving is not None and not receiving.done():
            receiving.cancel()  # (LowLatASGI.serve takes it, `receiving` cleared, as the end of the connection)

    # ------------------------------------------------------------------ time
    def on_timer(self, now: float) -> float:
        """Called by the scheduler when a deadline is due."""
        sender = self._sender
        if sender is not None and self._stuck_task is None \
                and now >= self._send_since + self.settings.slow_consumer_timeout:
            self._stuck_task = sender
            sender.cancel()  # _write turns this into the slow-consumer close
        proto = self.protocol
        actions = proto.tick(now)
        if actions:
            action = actions[0]
            direct = self.direct
            if len(actions) == 1 and type(action) is SendFrame and action.error is None and direct is not None \
                    and self._welcomed and not self._cork and not self._writing and not self._closing \
                    and not direct.closing and direct.is_writable():
                # A timer's one frame is a heartbeat's Ping: written now (nothing of this connection is held, so
                # the order holds), its frame made once per Ping message, and its Pong awaited by the transport.
                ping = action.data
                pong = proto.pong_frame
                made = _PINGS.get(ping)
                if made is None or made[1] is not pong:
                    made = (framed(ping), pong, expected(pong) if pong is not None else None)
                    if len(_PINGS) < _PINGS_MAX:
                        _PINGS[ping] = made
                if self._expects:
                    direct.expect = made[2]  # type: ignore[attr-defined]
                try:
                    direct.write(made[0])
                except RuntimeError:  # the transport closed under us (see DirectTransport.closing)
                    self._closing = True
                else:
                    if self._expects and pong is not None:
                        # The transport knows the Pong (feed, _pong). Its timeout, if sooner than where the Pong
                        # will put this timer, is watched apart, and the timer goes there now: the Pong moves nothing.
                        hb = proto.heartbeat
                        timeout = hb.last_ping_at + hb.timeout  # type: ignore[union-attr]
                        proto.deadline_seen()  # (_next_deadline(True), written out: no send is under way)
                        answered = proto.next_deadline(True)
                        if timeout < answered:
                            self.scheduler.watch(self, timeout, pong, now)
                            self._scheduled = self._answered = answered
                            return answered
                        self._answered = math.nan  # (the timeout comes first: the timer goes there, below)
            elif not self._act_now(actions):  # a close (idle, dead peer) goes out in a task
                self._spawn(self._act(actions))
        self._scheduled = self._next_deadline()
        return self._scheduled

    def on_watch(self, now: float, pong: object) -> None:
        """The timeout of the Pong that `pong` is (on_timer's watch): if it is still awaited, the timer is due now
        (unless the connection ended: its timer was cancelled, `_scheduled` is inf)."""
        if self.protocol.pong_frame is pong and self._scheduled != math.inf:
            self.scheduler.schedule(self, now)  # (the scheduler runs it right after this, in the same wake-up)

    def _next_deadline(self, answered: bool = False) -> float:
        self.protocol.deadline_seen()
        when = self.protocol.next_deadline(answered)
        if self._sender is not None and self._stuck_task is None:
            when = min(when, self._send_since + self.settings.slow_consumer_timeout)
        return when

    def reschedule(self) -> None:
        """Move this connection's timer to its deadline, if that moved (earlier; or later, e.g. a Pong arrived:
        the scheduler then does not wake this connection at the Pong's timeout for nothing)."""
        when = self._next_deadline()
        if when != self._scheduled:
            self._scheduled = when
            self.scheduler.schedule(self, when)

    def _spawn(self, coro: Awaitable[None]) -> None:
        """Run `coro` as a task of this connection's own, kept referenced until it is done."""
        task = self.loop.create_task(coro)  # type: ignore[arg-type]
        self._timer_tasks.add(task)
        task.add_done_callback(self._timer_tasks.discard)

    # ------------------------------------------------------------------ shutdown
    async def drain(self, grace: float | None = None, reconnect_after_ms: int = 0) -> None:
        """GoAway, let running streams finish for up to `grace` seconds (default: the ``drain_grace``
        setting), then close with 4002."""
        await self._act(self.protocol.drain(reconnect_after_ms))
        deadline = self.monotonic() + (self.settings.drain_grace if grace is None else grace)
        runner = self.runner
        shared = runner.shared if runner is not None else None
        if runner is not None and shared is not None and not shared.down and runner.models_running():
            # Shared sessions: the client moves to another process now and resumes there, which relays these
            # streams from the shared store while they go on here, detached, until they end or the grace is over.
            await self.close(CloseCode.DRAINING, "server shutting down")
            while runner.models_running() and self.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if runner.driver is None:  # (unless a resume took it here meanwhile)
                runner.destroy()  # what is still running ends in the store too, for its follower
            await shared.flushed()
            return
        # Wait on the model tasks, not the session's running count: a task ends only after its
        # End/Error went out, so the 4002 close never overtakes a stream's last message.
        while self.runner is not None and self.runner.tasks and self.monotonic() < deadline:
            if self.protocol.closed:
                return
            await asyncio.sleep(0.05)
        await self.close(CloseCode.DRAINING, "server shutting down")

    # ------------------------------------------------------------------ logs and metrics
    def _sent_error(self, error: ev.Error) -> None:
        """Count an Error sent to the client, and log it at INFO within its address's budget (CLIENT_LOGS: a client
        cannot flood the log). Model failures are logged where they happen, with the traceback."""
        if self.metrics is not None:
            self.metrics.inc("errors", error.code.wire_name)
        if error.code is ErrorCode.MODEL_ERROR:
            return
        CLIENT_LOGS.log(log, logging.INFO, self.address, "error sent on connection %s, stream %s: %s: %s",
                        self.protocol.session_id, error.stream_id, error.code.wire_name, error.message,
                        extra={"session_id": self.protocol.session_id, "stream_id": error.stream_id,
                               "error_code": error.code.wire_name, "client": self.info.client})

    def _end_handshake(self, close_code: int | None = None) -> None:
        span, self._handshake_span = self._handshake_span, None
        proto = self.protocol
        tracing.end_handshake(span, session_id=proto.session_id, resumed=proto.resumed, compression=proto.compression,
                              close_code=proto.close_code if proto.close_code is not None else close_code,
                              client=self.info.client)
