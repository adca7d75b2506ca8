"""The connection driver: one :class:`ConnectionDriver` per WebSocket (its session's models: :mod:`.streams`).

The driver owns what the protocol machine may not: the socket's ASGI ``send``, the clocks, the
tasks and the timers. Two objects, because a session outlives a connection:

* :class:`ConnectionDriver` runs one WebSocket: it feeds the frames it receives (one way in: its ``feed``) and
  the time to its :class:`~lowlat_mw.protocol.server.ServerProtocol` and carries out the actions that come back
  through one action table (write these frames, start or cancel a model, close), and it is the one way out for model
  output. It writes through its :class:`~lowlat_mw.runtime.writer.Writer` (ASGI ``send``, or the corked direct
  transport); its other jobs live beside it: timers (:mod:`.deadlines`), the close (:mod:`.closing`), pushes
  (:mod:`.membership`), resume (:mod:`.resume`), the authenticate hook (:mod:`.auth`).
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
from collections.abc import Awaitable, Callable, Coroutine, Mapping, MutableMapping, Sequence
from types import MappingProxyType
from typing import Any

from ..endpoint import Endpoint, new_session_ids
from ..errors import CloseCode, ErrorCode
from ..model import SessionInfo
from ..observability import tracing
from ..observability.logs import CLIENT_LOGS
from ..observability.metrics import Metrics
from ..observability.timing import StreamTimer
from ..protocol import events as ev
from ..protocol.base import CloseConnection, Measured, SendFrame
from ..protocol.dialect import LOWLAT_V1, Dialect, ServerMachine
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
from . import push
from .auth import authenticate
from .closing import CLOSE_SLACK, Closing
from .deadlines import Deadlines
from .direct import BURST, DirectTransport, DropsCloses
from .finish import error_of
from .membership import PUSH_BACKLOG, PUSH_LISTEN_WAIT, PushTarget
from .resume import resume
from .shared import shared_sessions
from .streams import ModelRunner
from .timers import AsyncScheduler, cpu_clock
from .writer import CorkedWriter, Writer

__all__ = ["CLOSE_SLACK", "PUSH_BACKLOG", "PUSH_LISTEN_WAIT", "ConnectionDriver"]

log = logging.getLogger("lowlat_mw")

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


# ================================================================================ the connection driver
class ConnectionDriver(Deadlines, Closing, PushTarget):
    """Runs one WebSocket: frames in (:meth:`feed`), frames out through its :class:`~lowlat_mw.runtime.writer.Writer`,
    its timers from the loop's scheduler (:class:`~lowlat_mw.runtime.deadlines.Deadlines`).

    `send` takes ASGI messages (``websocket.send`` and ``websocket.close``): the ASGI server's own,
    or an adapter's that speaks to its socket the same way. With `direct` (a server's
    :class:`~lowlat_mw.runtime.direct.DirectTransport`) frames go out through a corked writer
    (:class:`~lowlat_mw.runtime.writer.CorkedWriter`): built here, the frames of one loop turn in one write; the
    close still goes through `send`. The endpoint admitted the connection.

    `closes`: the server's :class:`~lowlat_mw.runtime.direct.DropsCloses`, where it drops a connection whose close is
    not over within the endpoint's ``close_timeout`` (told here) and then reports it gone (:meth:`disconnected`). A
    server without it may never report a connection whose peer does not take the close (plain uvicorn waits for a
    paused transport before it writes the close frame): the driver then lets the connection go itself, CLOSE_SLACK
    seconds after that bound (:class:`~lowlat_mw.runtime.closing.Closing`).
    """

    # Slots: a connection's attributes in a fixed array, not a dict of ~1.5 KB per connection. (__dict__ only
    # for what a test may set, e.g. a fake `monotonic`; none is made otherwise.)
    __slots__ = ("__dict__", "__weakref__", "_answered", "_arrived", "_close_sent", "_drops", "_gone",
                 "_handshake_span", "_inbox", "_push_backlog", "_scheduled", "_superseded", "_timer_tasks", "_turns",
                 "_unreported_at", "_welcomed", "address", "direct", "endpoint", "info", "loop", "member", "metrics",
                 "opened_at", "protocol", "receiving", "runner", "scheduler", "settings", "timed", "tracer", "writer")

    monotonic: Callable[[], float] = staticmethod(time.monotonic)  # the machine's `now` (a test may fake it)
    clock: Callable[[], float] = staticmethod(time.perf_counter)  # stage timings

    def __init__(self, endpoint: Endpoint, *, send: Send, subprotocol: str | None, address: str | None = None,
                 client: tuple[str, int] | None = None, headers: Mapping[str, str] | None = None, user: Any = None,
                 extra: Mapping[str, Any] | None = None, direct: DirectTransport | None = None,
                 closes: DropsCloses | None = None, dialect: Dialect = LOWLAT_V1) -> None:
        """`address`: what the endpoint admitted the connection as (released when it ends); `client`,
        `headers`, `user` and `extra`: what models and the authenticate hook see of it (SessionInfo); `dialect`: the
        wire protocol, whose machine this driver runs (protocol/dialect.py)."""
        settings = self.settings = endpoint.settings
        self.endpoint = endpoint
        self.metrics: Metrics | None = endpoint.metrics
        self.tracer = tracing.tracer() if settings.tracing else None
        self.timed = settings.stage_timings or self.metrics is not None or self.tracer is not None
        session_id, secret = new_session_ids()
        self.opened_at = now = self.monotonic()
        self.direct = direct
        self._inbox: deque[bytes | str] | None = None  # direct reads waiting for an earlier message to be handled
        self.address = address
        self.info = SessionInfo(session_id=session_id, subprotocol=subprotocol, client=client, headers=headers or {},
                                user=user, extra=extra or {})
        self.loop = loop = asyncio.get_running_loop()
        scheduler = AsyncScheduler.by_loop.get(loop)
        self.scheduler = scheduler = scheduler if scheduler is not None else AsyncScheduler.current()
        self.protocol: ServerMachine = dialect.machine(settings, subprotocol=subprotocol, now=now,
                                                       session_id=session_id, secret=secret, meter=cpu_clock,
                                                       heartbeats=scheduler.heartbeats)
        self.runner: ModelRunner | None = None
        self._arrived = 0.0  # when the frame being handled arrived (perf_counter), for a Request's stage timer
        self._timer_tasks: set[asyncio.Task[None]] = set()
        self._close_sent = False
        self._gone = False
        close_within = getattr(closes, "close_within", None)
        if close_within is not None:
            close_within(settings.close_timeout)  # (this endpoint's, not another app's of the process)
        self._drops = close_within is not None
        self._unreported_at: asyncio.TimerHandle | None = None
        self.receiving: asyncio.Task[Any] | None = None
        """The task reading this connection's ASGI ``receive`` (LowLatASGI.serve), if it says so: ended when the
        driver lets the connection go itself (Closing._unreported)."""
        self._welcomed = False
        self._superseded = False  # a resume moved this connection's session to another connection
        self.member = False  # in push's index of users and groups (push.HUB.add): it leaves it when it closes
        self._push_backlog = 0  # bytes of pushes waiting for the connection's output (PUSH_BACKLOG bounds them)
        self._handshake_span = tracing.start_handshake(self.tracer, subprotocol) if self.tracer else None
        # Where offered, messages skip the ASGI queue too (ASGI receive still brings the disconnect).
        reads = direct is not None and self.read_directly()
        self.writer = writer = Writer(self, send, loop) if direct is None else \
            CorkedWriter(self, send, direct, loop, expects=reads and hasattr(direct, "expect"))
        self._turns = writer.turns  # (ModelRunner's fair pacing reads it)
        if self.metrics is not None:
            self.metrics.connection_opened(self.protocol.stats, direct is not None, reads)
        endpoint.connection_started(self)  # drains reach it from now on
        self._scheduled = self.protocol.next_deadline()  # (lowlat.v1: the handshake timeout)
        self._answered = math.nan  # where on_timer put the timer for a Ping's Pong to come (nan: equal to nothing)
        self.scheduler.schedule(self, self._scheduled)
        if self.protocol.state is ConnState.OPEN:  # a dialect without a handshake: open from the start
            self._opened()

    @property
    def tasks(self) -> dict[int, asyncio.Task[None]]:
        """Model tasks of the session this connection carries."""
        return self.runner.tasks if self.runner is not None else {}

    # ------------------------------------------------------------------ from the socket
    def feed(self, data: bytes | str, burst: int = 0) -> Awaitable[None] | None:
        """The one way in: one WebSocket message from the client, handled here and now as far as nothing has to wait
        (:meth:`_carry_out`). What has to wait (a busy writer, a close, the authenticate hook, a resume) comes back.

        `burst` 0: a reader that awaits each message (ASGI ``receive``: :meth:`receive`) awaits what comes back.
        `burst` n: a direct read (:class:`~lowlat_mw.runtime.direct.DirectReads`, the n-th message of one socket
        read, called from the server's ``data_received``): what has to wait goes on in a task while the messages
        after it wait in order, reading paused; past BURST messages of one read the rest go one per loop turn, as
        through ASGI (a flood does not hold the loop). None comes back."""
        if burst:
            inbox = self._inbox
            if inbox is not None:
                inbox.append(data)
                return None
            if burst > BURST:
                self._inbox = deque((data,))
                self._pause_reading()
                self._spawn(self._read_inbox())
                return None
        if self._superseded:
            return None  # stale socket: its session lives on another connection (the resume listed what it needs)
        try:
            proto = self.protocol
            if data is proto.pong_frame and proto.state is ConnState.OPEN:  # the Pong on_timer's transport awaited
                self._pong(proto)
                return None
            if self.timed:
                self._arrived = self.clock()
            actions = proto.receive_data(data, self.monotonic())
            rest = self._carry_out(actions) if actions else None
            if rest is None:
                self._settle()
                return None
        except Exception:
            if not burst:
                raise  # (the ASGI server's: logged, closed with 1011)
            self._spawn(self._failed())
            return None
        if not burst:
            return self._settle_after(rest)
        self._inbox = deque()
        self._pause_reading()
        self._spawn(self._fed(self._settle_after(rest)))
        return None

    async def receive(self, data: bytes | str) -> None:
        """:meth:`feed` `data` and await what it leaves (for a reader that awaits each message)."""
        rest = self.feed(data)
        if rest is not None:
            await rest

    def _settle(self) -> None:
        """After a message: models waiting for the flow-control window look again; the timer follows the deadline."""
        runner = self.runner
        if runner is not None and runner.waiting:
            runner.window_changed()
        if self.protocol.deadline_moved:
            self.reschedule()

    async def _settle_after(self, rest: Awaitable[None]) -> None:
        await rest
        self._settle()

    def read_directly(self) -> bool:
        """Have the server hand messages straight to :meth:`feed` (the transport's optional
        :class:`~lowlat_mw.runtime.direct.DirectReads`); False: they keep coming through ASGI ``receive``."""
        set_receiver = getattr(self.direct, "set_receiver", None)
        return set_receiver is not None and bool(set_receiver(self.feed))

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

    async def _fed(self, rest: Awaitable[None]) -> None:
        """Finish what a direct read left (:meth:`feed`), then the messages that came meanwhile."""
        try:
            await rest
        except Exception:
            self._inbox = None
            await self._failed()
            return
        await self._read_inbox()

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

    async def _failed(self) -> None:
        """A message could not be handled (a bug of ours): as an ASGI app's failure, logged and closed with 1011."""
        log.exception("failed handling a message of %s", self.protocol.session_id,
                      extra={"session_id": self.protocol.session_id})
        await self.close(CloseCode.INTERNAL_ERROR, "internal error")

    # ------------------------------------------------------------------ actions
    def _carry_out(self, actions: Sequence[Any]) -> Coroutine[Any, Any, None] | None:
        """Carry out the machine's `actions` in order, here and now as far as none has to wait (frames the writer takes
        at once, streams to start or cancel, measurements: _NOW); from the first that has to wait (_LATER), the rest
        comes back as one coroutine, to await or run in a task. Consecutive frames go out in one write."""
        frames: list[bytes | str] | None = None
        for i, action in enumerate(actions):
            kind = type(action)
            if kind is SendFrame:
                if frames is None:
                    frames = [action.data]
                else:
                    frames.append(action.data)
                if action.error is not None:
                    self._sent_error(action.error)
                continue
            if frames is not None:
                rest = self.writer.take(frames)
                if rest is not None:
                    return self._carry_on(rest, actions, i)
                frames = None
            now = _NOW.get(kind)
            if now is None or not now(self, action):
                return self._carry_on(None, actions, i)
        if frames is not None:
            rest = self.writer.take(frames)
            if rest is not None:
                return self._carry_on(rest, actions, len(actions))
        if not self._welcomed and self.protocol.state is ConnState.OPEN:
            self._opened()
        return None

    async def _carry_on(self, write: Awaitable[None] | None, actions: Sequence[Any], i: int) -> None:
        """:meth:`_carry_out` from where it had to wait: the `write` before awaited, ``actions[i]`` awaited, the rest
        as there."""
        if write is not None:
            await write
        if i < len(actions):
            action = actions[i]
            await _LATER[type(action)](self, action)
            i += 1
        rest = self._carry_out(actions[i:])
        if rest is not None:
            await rest

    async def _act(self, actions: Sequence[Any]) -> None:
        """Carry out `actions` (:meth:`_carry_out`) and wait for what has to wait."""
        rest = self._carry_out(actions)
        if rest is not None:
            await rest

    def _start(self, action: StartStream) -> bool:
        runner = self.runner
        if runner is None:
            if self._superseded or self.protocol.session is None:
                return True
            runner = self.runner = ModelRunner(self.protocol.session, self)
        runner.start(action.request, self._arrived if self.timed else None)
        return True

    def _cancel(self, action: CancelStream) -> bool:
        if self.runner is not None:
            self.runner.cancel(action.stream_id)
        return True

    def _measured(self, action: Measured) -> bool:
        if self.metrics is not None:
            self.metrics.observe(action.name, action.value)
        return True

    def _deliver(self, action: DeliverInput) -> bool:
        """(v1.3) An Input for a running stream: to its model, or the stream fails (the model is not reading)."""
        inp = action.input
        problem = self.runner.deliver(inp) if self.runner is not None else None
        if problem is not None:
            rest = self._carry_out(self.protocol.refuse_input(inp.stream_id, self.monotonic(), ErrorCode.BAD_REQUEST,
                                                              problem))
            if rest is not None:  # (the socket is busy: in order, after what is being written)
                self._spawn(rest)
        return True

    def _opened(self) -> None:
        """The Welcome went out: log the open connection, time the handshake, make it reachable by pushes."""
        self._welcomed = True
        proto = self.protocol
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
        log.info("connection %s open: %s, compression %s%s", proto.session_id, proto.subprotocol or proto.stats.label,
                 ",".join(proto.compression) or "none", " (resumed)" if proto.resumed else "",
                 extra={"session_id": proto.session_id, "subprotocol": proto.subprotocol,
                        "client": self.info.client, "resumed": proto.resumed})
        if self.metrics is not None:
            self.metrics.handshake_done(self.monotonic() - self.opened_at)
        if self._handshake_span is not None:
            self._end_handshake()

    # ------------------------------------------------------------------ from the models
    def chunk(self, sid: int, chunk: Any, timer: StreamTimer | None) -> Awaitable[None] | None:
        """The model of stream `sid` produced `chunk`: frame it, record it for resume, hand it to the writer; the
        write to await if the writer could not take it at once (else None: no coroutine per Delta).

        Timed (`timer`): a sampled Delta (a stream's first two, then two in `timer.every`) reads the clock
        where the chunk arrived, where its frames were built and where they were handed over
        (StreamTimer.tick); the others only count down to the next sample."""
        proto = self.protocol
        if timer is not None:
            left = timer.left - 1
            if left:
                timer.left = left
            else:  # sampled
                return self._sampled(proto, sid, chunk, timer)
        frames = proto.send_chunk(sid, chunk, self.monotonic())
        return self.writer.take(frames) if frames else None

    def _sampled(self, proto: ServerProtocol, sid: int, chunk: Any, timer: StreamTimer) -> Awaitable[None] | None:
        """:meth:`chunk` of a sampled Delta: timed where it arrived, where its frames were built, where they left."""
        clock = self.clock
        produced = clock()
        compressor = proto.compressor
        spent = compressor.spent if compressor is not None else 0.0
        frames = proto.send_chunk(sid, chunk, self.monotonic())
        encoded = clock()
        write = self.writer.take(frames) if frames else None
        if write is None:
            timer.tick(produced, encoded, clock(), compressor.spent - spent if compressor is not None else 0.0)
            return None
        return self._timed_write(write, timer, produced, encoded, compressor, spent)

    async def _timed_write(self, write: Awaitable[None], timer: StreamTimer, produced: float, encoded: float,
                           compressor: Any, spent: float) -> None:
        try:
            await write
        finally:  # recorded, so it counts as sent even if a cancel lands while the socket write is finishing
            timer.tick(produced, encoded, self.clock(), compressor.spent - spent if compressor is not None else 0.0)

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
            rest = self._carry_out(actions)
            if rest is not None:
                await rest
        if proto.deadline_moved:
            self.reschedule()

    def _spawn(self, coro: Awaitable[None]) -> None:
        """Run `coro` as a task of this connection's own, kept referenced until it is done."""
        task = self.loop.create_task(coro)  # type: ignore[arg-type]
        self._timer_tasks.add(task)
        task.add_done_callback(self._timer_tasks.discard)

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


# The action table: what the machine's actions do. _NOW: carried out at once (True), or not yet (False: they have to
# wait); _LATER: awaited, in order, after what was written before them.
_NOW: Mapping[type, Callable[[ConnectionDriver, Any], bool]] = MappingProxyType({
    StartStream: ConnectionDriver._start,
    CancelStream: ConnectionDriver._cancel,
    DeliverInput: ConnectionDriver._deliver,
    Measured: ConnectionDriver._measured,
    Membership: ConnectionDriver._join_now,
})
_LATER: Mapping[type, Callable[[ConnectionDriver, Any], Awaitable[None]]] = MappingProxyType({
    CloseConnection: lambda driver, action: driver.close_socket(action.code, action.reason),
    ResumeSession: resume,
    Authenticate: authenticate,
    Membership: ConnectionDriver._join_later,
})
