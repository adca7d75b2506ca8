"""asyncio driver: owns the clock, the tasks and the sockets' send callables.

Two objects, because a session outlives a connection:

* :class:`AsyncServerSession` runs one WebSocket (frames in, frames out, its timers).
* :class:`LiveSession` runs one client session: its model tasks, flow control and replay buffer.
  When the WebSocket drops it stays in the endpoint's session store for ``resume_window``
  seconds, models paused once the buffer is full, until a new connection resumes it.

Used by every adapter (Starlette/FastAPI, Django Channels, and through the thread driver, Flask).
Timers come from the loop's one :class:`~lowlat_mw.drivers.timers.AsyncScheduler`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from ..errors import CloseCode, ErrorCode, close_code_reconnects
from ..model import DONE, WAIT, ModelFn, ModelRequest, Models, SessionInfo, step_now, stream_model
from ..observability import tracing
from ..observability.metrics import Metrics, StreamTimer, close_code_name
from ..protocol import events as ev
from ..protocol.server import (
    Authenticate,
    CancelStream,
    CloseConnection,
    ConnState,
    ResumeSession,
    SendFrame,
    ServerConnection,
    StartStream,
    _split,
    normalize_chunk,
)
from ..protocol.session import MemorySessionStore, Session, SessionStore
from ..security import Handshake, load_authenticator, run_authenticator
from ..settings import Settings
from .timers import AsyncScheduler

__all__ = ["AsyncServerSession", "LiveSession", "drain_each", "drain_on_shutdown", "drain_sessions", "draining"]

log = logging.getLogger("lowlat_mw")

SendFn = Callable[[bytes | str], Awaitable[None]]
CloseFn = Callable[[int, str], Awaitable[None]]

_ERRORS_LOGGED_AT_INFO = 10  # per connection; later Error frames are logged at DEBUG

# Close codes after which the session is kept for resume (the client will reconnect).
_RESUMABLE = frozenset({None, 1001, 1005, 1006, 1011, 1012, 1013, 1014,
                        CloseCode.HEARTBEAT_TIMEOUT, CloseCode.DRAINING, CloseCode.SLOW_CONSUMER})


class LiveSession:
    """A client session's models and buffers; attached to at most one connection at a time."""

    def __init__(self, session: Session, *, models: Models, settings: Settings, executor: Executor | None,
                 store: SessionStore, scheduler: AsyncScheduler, metrics: Metrics | None = None,
                 tracer: Any = None) -> None:
        self.session = session
        self.metrics = metrics
        self.tracer = tracer
        self._detached = False
        self.models = models
        self.settings = settings
        self.executor = executor
        self.store = store
        self.scheduler = scheduler
        self.driver: AsyncServerSession | None = None
        self.info: SessionInfo = SessionInfo(session_id=session.session_id)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.window = asyncio.Event()
        self.window.set()
        self.destroyed = False
        store.put(session.session_id, self)

    # ------------------------------------------------------------------ lifecycle
    def attach(self, driver: AsyncServerSession) -> None:
        """`driver`'s connection now carries this session."""
        self.driver = driver
        self.info = driver.info
        self.scheduler.cancel(self)
        self._set_detached(False)
        self.window_changed()

    def detach(self, now: float) -> None:
        """The connection dropped: wait for a resume until the window ends."""
        self.driver = None
        self.session.detach(now)
        self._set_detached(True)
        self.scheduler.schedule(self, self.session.expires_at())
        log.info("session %s detached; resumable for %.0f s", self.session.session_id, self.settings.resume_window,
                 extra={"session_id": self.session.session_id})

    def on_timer(self, now: float) -> float:
        """Scheduler callback: give up a detached session whose resume window ended."""
        if self.destroyed or self.driver is not None:
            return math.inf
        if now >= self.session.expires_at():
            log.info("session %s expired", self.session.session_id, extra={"session_id": self.session.session_id})
            self.destroy()
            return math.inf
        return self.session.expires_at()

    def destroy(self) -> None:
        """Stop every model and forget the session."""
        if self.destroyed:
            return
        self.destroyed = True
        self.driver = None
        self._set_detached(False)
        self.scheduler.cancel(self)
        if self.store.get(self.session.session_id) is self:
            self.store.remove(self.session.session_id)
        for task in list(self.tasks.values()):
            task.cancel()
        self.window.set()  # wake paused streams so their cancellation runs

    def _set_detached(self, detached: bool) -> None:
        if detached != self._detached:
            self._detached = detached
            if self.metrics is not None:
                self.metrics.sessions_detached += 1 if detached else -1

    async def wait_closed(self) -> None:
        """Wait until every model task has finished (after destroy or cancel)."""
        tasks = list(self.tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def window_changed(self) -> None:
        """Acks or a resume may have opened the flow-control window: wake paused models."""
        if not self.session.blocked:
            self.window.set()

    # ------------------------------------------------------------------ streams
    def start_stream(self, request: ev.Request) -> None:
        """Run the model for `request` in its own task."""
        self.tasks[request.stream_id] = asyncio.get_running_loop().create_task(self._stream(request))

    def cancel(self, stream_id: int) -> None:
        """Stop the model of `stream_id` (it ends with End("cancelled"))."""
        task = self.tasks.get(stream_id)
        if task is not None:
            task.cancel()

    async def _stream(self, req: ev.Request) -> None:
        sid = req.stream_id
        session = self.session
        terminal: ev.End | ev.Error | None = None
        fn = self.models.get(req.model)
        state = session.streams.get(sid)
        timer = state.timer if state is not None else None
        started = state.started_at if state is not None else time.monotonic()
        label = self.models.label(req.model)
        metrics = self.metrics
        if metrics is not None:
            metrics.streams += 1
            if timer is not None:
                timer.ttfd = metrics.hist("time_to_first_delta_seconds", label)
                timer.bind_gaps(metrics.hist("inter_delta_seconds", label))
        span = tracing.start_stream(self.tracer, req, session.session_id, label, timer) if self.tracer else None
        try:
            if fn is None:
                served = ", ".join(self.models.names())
                terminal = session.fail(sid, time.monotonic(), ErrorCode.UNKNOWN_MODEL,
                                        f"unknown model {req.model!r}; served: {served}")
                return
            mreq = ModelRequest(stream_id=sid, model=req.model, text=req.text, data=req.data,
                                messages=req.messages, params=req.params, session=self.info)
            agen = stream_model(fn, mreq, self.executor, timer.model_running if timer is not None else None)
            try:
                if self.settings.merge_deltas:
                    await self._pump_merged(sid, agen, timer)
                else:
                    async for chunk in agen:
                        if timer is not None:
                            timer.chunk()
                        await self._emit(sid, chunk, timer)
                if timer is not None:
                    timer.chunk()  # the model's last stretch, up to its return
            finally:
                await agen.aclose()
            if timer is not None:  # closing the model (its finally blocks; a thread hop for a sync generator)
                timer.lap("model")
            terminal = session.finish(sid, time.monotonic(), timings_ms=self._timings(timer))
        except asyncio.CancelledError:
            if timer is not None:
                timer.lap("model")
            if self.destroyed:
                raise
            terminal = session.finish(sid, time.monotonic(), reason="cancelled", timings_ms=self._timings(timer))
        except Exception as exc:
            if timer is not None:
                timer.lap("model")
            log.exception("model failed on stream %s of %s", sid, session.session_id,
                          extra={"session_id": session.session_id, "stream_id": sid})
            text = f"{type(exc).__name__}: {exc}" if self.settings.expose_model_errors else type(exc).__name__
            terminal = session.fail(sid, time.monotonic(), ErrorCode.MODEL_ERROR, f"model failed ({text})")
        finally:
            self.tasks.pop(sid, None)
            if metrics is not None:
                self._observe(metrics, label, terminal, time.monotonic() - started, timer)
            if span is not None:
                tracing.end_stream(span, terminal, timer)
            if terminal is not None and not self.destroyed:
                await self._deliver([terminal])

    def _timings(self, timer: StreamTimer | None) -> dict[str, float] | None:
        return timer.timings_ms() if timer is not None and self.settings.stage_timings else None

    @staticmethod
    def _observe(metrics: Metrics, label: str, terminal: ev.End | ev.Error | None, seconds: float,
                 timer: StreamTimer | None) -> None:
        """A stream ended: its outcome, duration and stages into the metrics."""
        metrics.streams -= 1
        outcome = "error" if isinstance(terminal, ev.Error) else (
            terminal.finish_reason if terminal is not None else "cancelled")
        metrics.inc("streams_finished", label, outcome)
        metrics.observe("stream_duration_seconds", seconds, label, outcome)
        if timer is not None:
            timer.close_gaps()
            for stage, seconds in timer.stages.items():
                metrics.observe("stage_seconds", seconds, stage, label)

    async def _pump_merged(self, sid: int, agen: Any, timer: StreamTimer | None) -> None:
        """Emit `agen`'s chunks, merging text chunks it yields back to back into one Delta (merge_deltas).

        A chunk joins the batch only if the model produced it without waiting and its previous step
        was quick too; the batch goes out when the model waits, a chunk of another kind comes, it
        would pass a quarter of the frame limit, or its first chunk is merge_max_delay old. The
        stream's first chunk always goes out at once (time to first delta is not traded away).
        """
        clock = time.perf_counter
        max_delay = self.settings.merge_max_delay
        budget = min(16384, (self.settings.max_frame_size - 32) // 4)  # chars: never needs a split
        parts: list[str] = []
        size = 0
        since = 0.0
        quick = False  # the previous step produced its chunk without waiting, within max_delay

        async def flush() -> None:
            nonlocal parts, size
            if parts:
                text = "".join(parts)
                parts, size = [], 0
                await self._emit(sid, text, timer)

        while True:
            began = clock()
            try:
                kind, chunk = step_now(agen)
            except Exception:
                await flush()  # what the model yielded before it failed still goes out
                raise
            if kind == WAIT:
                await flush()
                try:
                    chunk = await chunk
                except StopAsyncIteration:
                    break
                quick = False
            elif kind == DONE:
                break
            else:
                now = clock()
                was_quick, quick = quick, now - began < max_delay
                if type(chunk) is str and was_quick and quick:
                    if timer is not None:
                        timer.chunk()
                    if size + len(chunk) > budget or now - since > max_delay:
                        await flush()
                    if not parts:
                        since = now
                    parts.append(chunk)
                    size += len(chunk)
                    continue
            if timer is not None:
                timer.chunk()
            await flush()
            await self._emit(sid, chunk, timer)
        await flush()

    async def _emit(self, sid: int, chunk: Any, timer: StreamTimer | None) -> None:
        driver = self.driver
        now = time.monotonic()
        try:
            if driver is not None and driver.conn.open:
                actions = driver.conn.send_chunk(sid, chunk, now)  # records and frames it: SendFrames only
                if actions:
                    await driver._send_frames([a.data for a in actions])
            else:  # no connection: buffer it for the resume (same checks as a live send)
                for piece in _split(normalize_chunk(chunk), self.settings.max_frame_size - 32):
                    self.session.record(sid, piece, now)
        finally:  # recorded, so it counts as sent even if a cancel lands while the socket write is finishing
            if timer is not None:
                timer.sent()
        if self.session.blocked:
            try:
                await self._wait_window()
            finally:
                if timer is not None:
                    timer.lap("flow")

    async def _deliver(self, events: list[ev.Event]) -> None:
        driver = self.driver
        if driver is not None and driver.conn.open:
            await driver.run(driver.conn.deliver(events, time.monotonic()))
            driver.reschedule()

    async def _wait_window(self) -> None:
        """Pause the model until the client acknowledges output (or resumes); 4003 if stuck."""
        while self.session.blocked and not self.destroyed:
            self.window.clear()
            driver = self.driver
            if driver is None:
                await self.window.wait()
                continue
            try:
                async with asyncio.timeout(self.settings.slow_consumer_timeout):
                    await self.window.wait()
            except TimeoutError:
                if self.driver is driver and self.session.blocked:
                    await driver.close_with(CloseCode.SLOW_CONSUMER, "client did not acknowledge output")


class AsyncServerSession:
    """Runs one WebSocket connection: frames in, frames out, its timers from the shared scheduler."""

    def __init__(
        self,
        *,
        model: ModelFn | Models,
        settings: Settings,
        send: SendFn,
        close: CloseFn,
        subprotocol: str | None,
        info: SessionInfo | None = None,
        executor: Executor | None = None,
        scheduler: AsyncScheduler | None = None,
        store: SessionStore | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.tracer = tracing.tracer() if settings.tracing else None
        timed = settings.stage_timings or metrics is not None or self.tracer is not None
        self.conn = ServerConnection(settings, subprotocol=subprotocol, now=time.monotonic(),
                                     clock=time.perf_counter if timed else None, metrics=metrics)
        if metrics is not None:
            metrics.connections += 1
            metrics.inc("connections_opened", self.conn.stats.label)
        self._handshake_span = tracing.start_handshake(self.tracer, subprotocol) if self.tracer else None
        self.models = model if isinstance(model, Models) else Models(model)
        self.settings = settings
        self._send = send
        self._close = close
        self.info = info or SessionInfo(session_id=self.conn.session_id, subprotocol=subprotocol)
        self.executor = executor
        self.scheduler = scheduler or AsyncScheduler.current()
        self.store: SessionStore = store if store is not None else MemorySessionStore()
        self.live: LiveSession | None = None
        self._timer_tasks: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()
        # The send in progress (the task holding the lock) and when it began: on_timer closes the
        # connection when one stays blocked for slow_consumer_timeout, without a loop timer per frame.
        self._sender: asyncio.Task[Any] | None = None
        self._send_since = math.inf
        self._stuck_task: asyncio.Task[Any] | None = None  # the sender on_timer cancelled
        self._scheduled = math.inf
        self._closing = False
        self._close_sent = False
        self._gone = False
        self._welcomed = False
        self._errors_logged = 0
        self._superseded = False  # a resume moved this connection's session to another connection

    @property
    def tasks(self) -> dict[int, asyncio.Task[None]]:
        """Model tasks of the session this connection carries."""
        return self.live.tasks if self.live is not None else {}

    # ------------------------------------------------------------------ driver API
    def start(self) -> None:
        """Register the connection's timers (and the connection, for :func:`drain_sessions`)."""
        self.reschedule()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # driven without a loop (unit tests): nothing to drain it from
            return
        _LIVE.setdefault(loop, weakref.WeakSet()).add(self)
        if loop in _DRAINS:  # the server is shutting down: this one goes at once, so clients retry elsewhere
            self._spawn(loop, self.close_with(CloseCode.DRAINING, "server draining"))

    async def receive(self, data: bytes | str) -> None:
        """Feed one WebSocket message from the client."""
        if self._superseded:
            return  # stale socket: its session lives on another connection (the resume listed what it needs)
        await self.run(self.conn.receive(data, time.monotonic()))
        if self.live is not None:
            self.live.window_changed()
        self.reschedule()

    async def disconnected(self, code: int | None = None) -> None:
        """The socket is gone (`code`: the peer's close code, if any): keep or end the session."""
        if self._gone:
            return
        self._gone = True
        self._closing = True
        self._count_close(code)
        self.conn.connection_lost()
        self.scheduler.cancel(self)
        self._scheduled = math.inf
        live = self.live
        if live is None or live.driver is not self:
            return
        if self.conn.close_code is not None:
            code = self.conn.close_code  # we closed: our reason decides
        if code in _RESUMABLE and close_code_reconnects(code) and live.session.worth_keeping():
            live.detach(time.monotonic())
        else:
            live.destroy()
            await live.wait_closed()

    def _log_error(self, error: ev.Error) -> None:
        """Log an Error sent to the client (model failures are logged where they happen, with the traceback).

        The first few per connection at INFO, the rest at DEBUG: a client cannot flood the log.
        """
        if error.code is ErrorCode.MODEL_ERROR:
            return
        self._errors_logged += 1
        level = logging.INFO if self._errors_logged <= _ERRORS_LOGGED_AT_INFO else logging.DEBUG
        log.log(level, "error sent on connection %s, stream %s: %s: %s", self.conn.session_id, error.stream_id,
                error.code.wire_name, error.message,
                extra={"session_id": self.conn.session_id, "stream_id": error.stream_id,
                       "error_code": error.code.wire_name, "client": self.info.client})

    def _count_close(self, peer_code: int | None) -> None:
        """Log and count the connection's end (who closed it, with which code)."""
        by = "server" if self.conn.close_code is not None else "client"
        code = self.conn.close_code if self.conn.close_code is not None else (peer_code or 1006)
        log.info("connection %s closed by %s: %s %s", self.conn.session_id, by, code, self.conn.close_reason,
                 extra={"session_id": self.conn.session_id, "close_code": code, "closed_by": by,
                        "client": self.info.client})
        if self._handshake_span is not None:  # never got past Hello: the handshake failed with this close
            self._end_handshake(code)
        if self.metrics is not None:
            self.metrics.detach(self.conn.stats)
            self.metrics.connections -= 1
            self.metrics.inc("connections_closed", str(code), close_code_name(code), by)

    def _end_handshake(self, close_code: int | None = None) -> None:
        span, self._handshake_span = self._handshake_span, None
        conn = self.conn
        tracing.end_handshake(span, session_id=conn.session_id, resumed=conn.resumed, compression=conn.compression,
                              close_code=conn.close_code if conn.close_code is not None else close_code,
                              client=self.info.client)

    async def shutdown(self, code: int = CloseCode.GOING_AWAY, reason: str = "server shutdown") -> None:
        """Close from the server side."""
        await self.run(self.conn.close(code, reason))

    def on_timer(self, now: float) -> float:
        """Called by the scheduler when a deadline is due."""
        sender = self._sender
        stuck_at = self._send_since + self.settings.slow_consumer_timeout
        if sender is not None and self._stuck_task is None and now >= stuck_at:
            self._stuck_task = sender
            sender.cancel()  # _send_frames turns this into the slow-consumer close
        actions = self.conn.tick(now)
        if actions:
            self._spawn(asyncio.get_running_loop(), self.run(actions))
        self._scheduled = self._next_deadline()
        return self._scheduled

    async def drain(self, grace: float | None = None, reconnect_after_ms: int = 0) -> None:
        """GoAway, let running streams finish for up to `grace` seconds (default: the ``drain_grace``
        setting), then close with 4002."""
        await self.run(self.conn.drain(reconnect_after_ms))
        deadline = time.monotonic() + (self.settings.drain_grace if grace is None else grace)
        # Wait on the model tasks, not the session's running count: a task ends only after its
        # End/Error went out, so the 4002 close never overtakes a stream's last message.
        while self.live is not None and self.live.tasks and time.monotonic() < deadline:
            if self.conn.closed:
                return
            await asyncio.sleep(0.05)
        await self.close_with(CloseCode.DRAINING, "server shutting down")

    async def close_with(self, code: int, reason: str) -> None:
        """Close the WebSocket with `code` (idempotent)."""
        await self.run(self.conn.close(code, reason))

    # ------------------------------------------------------------------ internals
    def _spawn(self, loop: asyncio.AbstractEventLoop, coro: Awaitable[None]) -> None:
        """Run `coro` as a task of this connection's own, kept referenced until it is done."""
        task = loop.create_task(coro)  # type: ignore[arg-type]
        self._timer_tasks.add(task)
        task.add_done_callback(self._timer_tasks.discard)

    def _next_deadline(self) -> float:
        when = self.conn.next_deadline()
        if self._sender is not None and self._stuck_task is None:
            when = min(when, self._send_since + self.settings.slow_consumer_timeout)
        return when

    def reschedule(self) -> None:
        """Move this connection's timer earlier if its deadline moved earlier."""
        when = self._next_deadline()
        if when < self._scheduled or (when == math.inf and self._scheduled != math.inf):
            self._scheduled = when
            self.scheduler.schedule(self, when)

    async def run(self, actions: list[Any]) -> None:
        """Carry out the state machine's actions (consecutive frames go out under one lock)."""
        frames: list[bytes | str] = []
        for action in actions:
            if isinstance(action, SendFrame):
                frames.append(action.data)
                if action.error is not None:
                    self._log_error(action.error)
                continue
            if frames:
                await self._send_frames(frames)
                frames = []
            if isinstance(action, StartStream):
                self._ensure_live()
                self.live.start_stream(action.request)  # type: ignore[union-attr]
            elif isinstance(action, CancelStream):
                if self.live is not None:
                    self.live.cancel(action.stream_id)
            elif isinstance(action, ResumeSession):
                await self._resume(action)
            elif isinstance(action, Authenticate):
                await self._authenticate(action)
            elif isinstance(action, CloseConnection):
                await self._close_with(action.code, action.reason)
        if frames:
            await self._send_frames(frames)
        if self.live is None and self.conn.session is not None:
            self._ensure_live()
        if not self._welcomed and self.conn.state is ConnState.OPEN:
            self._welcomed = True
            conn = self.conn
            log.info("connection %s open: %s, compression %s%s", conn.session_id, conn.subprotocol or "json",
                     ",".join(conn.compression) or "none", " (resumed)" if conn.resumed else "",
                     extra={"session_id": conn.session_id, "subprotocol": conn.subprotocol, "client": self.info.client,
                            "resumed": conn.resumed})
        if self._handshake_span is not None and self.conn.state is not ConnState.AWAIT_HELLO:
            self._end_handshake()

    def _ensure_live(self) -> None:
        if self.live is None and self.conn.session is not None and not self._superseded:
            self.live = LiveSession(self.conn.session, models=self.models, settings=self.settings,
                                    executor=self.executor, store=self.store, scheduler=self.scheduler,
                                    metrics=self.metrics, tracer=self.tracer)
            self._refresh_info()
            self.live.attach(self)

    def _refresh_info(self) -> None:
        sid = self.conn.session_id
        if self.info.session_id != sid:
            self.info = dataclasses.replace(self.info, session_id=sid)

    async def _authenticate(self, action: Authenticate) -> None:
        hook = load_authenticator(self.settings.authenticate)
        principal, reason = await run_authenticator(hook, Handshake.from_info(self.info, action.hello.auth),
                                                     self.executor)
        if principal is not None:
            self.info = dataclasses.replace(self.info, principal=principal)
        else:
            log.warning("refused client %s: %s", self.info.client, reason,
                        extra={"session_id": self.conn.session_id, "client": self.info.client})
        await self.run(self.conn.authenticated(principal, time.monotonic(), reason))

    async def _resume(self, action: ResumeSession) -> None:
        found = self.store.get(action.session_id)
        live = found if isinstance(found, LiveSession) and not found.destroyed else None
        actions = self.conn.resume(live.session if live is not None else None, time.monotonic())
        old: AsyncServerSession | None = None
        if live is not None and self.conn.session is live.session:
            old = live.driver
            self.live = live
            self._refresh_info()
            live.attach(self)  # from now on the model tasks send through this connection
            if old is not None and old is not self:
                old.live = None  # its socket is stale: it must not touch the session any more
                old._superseded = True  # nor start a second LiveSession for it (see _ensure_live)
            log.info("session %s resumed", live.session.session_id, extra={"session_id": live.session.session_id})
        # Welcome and the replay go out before any await lets a model task run: the live Deltas
        # it now sends through this connection must follow them (never a Delta before Welcome).
        await self.run(actions)
        if old is not None and old is not self:
            await old.close_with(CloseCode.GOING_AWAY, "session resumed on another connection")
        if self.live is not None:
            self.live.window_changed()

    async def _send_frames(self, frames: list[bytes | str]) -> None:
        if self._closing:
            return
        try:
            async with self._send_lock:
                if self._closing:  # closed while this waited for the lock
                    return
                # No loop timer per send (asyncio.timeout costs a TimerHandle each time): the
                # connection's own timer checks _send_since. Its next deadline is normally the
                # heartbeat's; if none is due before this send's, arm one, so a stuck send is
                # caught between 1x and 1.5x slow_consumer_timeout after it began.
                self._sender = asyncio.current_task()
                self._send_since = since = time.monotonic()
                timeout = self.settings.slow_consumer_timeout
                if self._scheduled > since + 1.5 * timeout:
                    self._scheduled = since + timeout
                    self.scheduler.schedule(self, self._scheduled)
                try:
                    for data in frames:
                        await self._send(data)
                finally:
                    self._sender = None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task is not self._stuck_task:
                raise
            self._stuck_task = None
            if task.uncancel() > 0:  # also cancelled for another reason
                raise
            log.warning("send blocked for %.0f s: closing slow consumer", self.settings.slow_consumer_timeout)
            self.conn.close(CloseCode.SLOW_CONSUMER, "send blocked")
            await self._close_with(CloseCode.SLOW_CONSUMER, "send blocked", locked=False)
            await self.disconnected()
        except Exception as exc:  # the socket went away under us
            log.debug("send failed, treating as disconnect: %r", exc)
            self._closing = True

    async def _close_with(self, code: int, reason: str, *, locked: bool = True) -> None:
        self._closing = True
        self.scheduler.cancel(self)
        self._scheduled = math.inf
        if self._close_sent:
            return
        self._close_sent = True
        log.debug("closing connection %s: %s %s", self.conn.session_id, code, reason,
                 extra={"session_id": self.conn.session_id, "close_code": code})
        try:
            async with asyncio.timeout(5.0):
                if locked:
                    async with self._send_lock:
                        await self._close(code, reason)
                else:
                    await self._close(code, reason)
        except Exception as exc:
            log.debug("close failed: %r", exc)
        live = self.live
        if live is not None and live.driver is self and not close_code_reconnects(code):
            # A final close (protocol error, idle...): nothing to resume, stop the models now.
            live.destroy()


# ---------------------------------------------------------------------- server shutdown
# Every started connection, by the loop that runs it, and the drain in progress on a loop. Servers
# call drain_sessions() (or drain_on_shutdown()) when they shut down: uvicorn through our protocol
# shims, daphne through our runner, gunicorn through our worker (lowlat_mw.drivers.threads.drain_all).
_LIVE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[AsyncServerSession]] = (
    weakref.WeakKeyDictionary())
_DRAINS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = weakref.WeakKeyDictionary()


def draining(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """True once :func:`drain_sessions` began on `loop` (default: the running loop)."""
    return (loop or asyncio.get_running_loop()) in _DRAINS


async def drain_sessions(grace: float | None = None, reconnect_after_ms: int = 0) -> None:
    """Drain every connection of the running loop at once, for a server shutting down.

    Each gets GoAway; its running streams finish for up to `grace` seconds (default: its own
    ``drain_grace`` setting); then it is closed with 4002, and clients resume elsewhere. From then on
    a connection that starts on this loop is closed with 4002 at once. A second call waits for the first.
    """
    await asyncio.shield(_drain_task(asyncio.get_running_loop(), grace, reconnect_after_ms))


def _open_sessions(loop: asyncio.AbstractEventLoop) -> list[AsyncServerSession]:
    return [s for s in _LIVE.get(loop, ()) if not s.conn.closed]


def _drain_task(loop: asyncio.AbstractEventLoop, grace: float | None, reconnect_after_ms: int) -> asyncio.Task[None]:
    task = _DRAINS.get(loop)
    if task is None:
        sessions = _open_sessions(loop)
        if sessions:
            log.info("draining %d connection(s) for shutdown", len(sessions))
        task = _DRAINS[loop] = loop.create_task(drain_each(sessions, grace, reconnect_after_ms))
    return task


async def drain_each(sessions: list[AsyncServerSession], grace: float | None = None,
                     reconnect_after_ms: int = 0) -> None:
    """Drain `sessions` side by side (:meth:`AsyncServerSession.drain`); one failing stops none of the others."""
    if sessions:
        await asyncio.gather(*(s.drain(grace, reconnect_after_ms) for s in sessions), return_exceptions=True)


def drain_on_shutdown(then: Callable[[], Any]) -> bool:
    """For a server's synchronous per-connection shutdown hook, on the loop: start (or join) the drain
    of this loop's connections and call `then` once it is over. False (and `then` not called) when
    there is nothing of ours to drain on this loop."""
    loop = asyncio.get_running_loop()
    if loop not in _DRAINS and not _open_sessions(loop):
        return False
    _drain_task(loop, None, 0).add_done_callback(lambda _task: then())
    return True
