"""The model runner: one :class:`ModelRunner` per session runs its models, one task per stream.

Each stream is one pipeline: its source (sources.py: a reply the result cache kept, its batch's reply, the
model's chunks; or, relayed, another process's), its shape (plain, or merged Deltas), then the one emit
(:meth:`ModelRunner._emit`), which hands each chunk to the session's current driver in one call
(:meth:`ConnectionDriver.chunk <lowlat_mw.runtime.connection.ConnectionDriver.chunk>`) or, while no connection is
attached, keeps it in the session for a resume; then its one finish (finish.py). It waits for the flow-control
window and, once the connection dropped, for the resume window to end. A session outlives a connection, so the
runner does too.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any

from .._fast import maker
from ..cache import is_deterministic, request_key
from ..errors import CloseCode, ErrorCode
from ..model import WHOLE_REPLY, Inputs, ModelRequest, warm_up
from ..observability import tracing
from ..observability.timing import StreamTimer
from ..protocol import events as ev
from ..protocol.session import Session
from . import eager, push, stalls
from .finish import CANCELLED, INTERRUPTED, STOP, cancelled_by_client, failed, finish, send_end, stopped
from .shared import process_id, shared_sessions
from .sources import cached_reply, each, keep_chunk, keep_reply, merged_deltas, model_chunks, recorded, reply_chunks

if TYPE_CHECKING:
    from .connection import ConnectionDriver

__all__ = ["ModelRunner"]

log = logging.getLogger("lowlat_mw")

_make_model_request = maker(ModelRequest, "stream_id", "model", "text", "data", "messages", "params", "session")


async def _relayed(source: AsyncIterator[Any], ends: list[Any]) -> AsyncIterator[Any]:
    """The chunks of a stream another process runs, from `source`, up to its End or Error (put in `ends`)."""
    async for item in source:
        if isinstance(item, ev.End | ev.Error):
            ends.append(item)
            return
        yield item


# ================================================================================ the model runner
class ModelRunner:
    """A client session's models: one task per stream, their output handed to the attached connection.

    While the session has no connection it stays in the endpoint's session store for
    ``resume_window`` seconds, its models paused once the replay buffer is full, until a new
    connection resumes it.
    """

    def __init__(self, session: Session, driver: ConnectionDriver) -> None:
        endpoint = driver.endpoint
        self.session = session
        self.endpoint = endpoint
        self.settings = endpoint.settings
        self.metrics = endpoint.metrics
        self.driver: ConnectionDriver | None = driver
        self.info = driver.info
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.inputs: dict[int, Any] = {}  # running stream id -> its model's req.inputs (protocol v1.3)
        self.loop = asyncio.get_running_loop()
        # Set while models may run; made by the first model that must wait (an Event is a deque: ~600 B).
        self.window: asyncio.Event | None = None
        self.waiting = 0  # models paused for the flow-control window
        self.destroyed = False
        self._detached = False
        self.scheduler = driver.scheduler
        self.monotonic = driver.monotonic
        self.clock = driver.clock
        # An async model's step holding the loop is warned about (runtime/stalls.py): the loop's watch, its scheduler's.
        self.stalls = watch = self.scheduler.stalls if self.settings.slow_step_warning else None
        if watch is not None and watch.epoch != stalls.WATCHER.epoch:  # (the loop's first runner, in this process)
            stalls.WATCHER.watch(watch)
        endpoint.store.put(session.session_id, self)
        # With a shared session store (Redis): the session's output is written there too, behind the socket. (The
        # setting is tested first, without a call: most apps share nothing.)
        self.shared = shared = shared_sessions(endpoint) if self.settings.session_store else None
        if shared is not None:
            shared.share(session, session.principal)
            push.HUB.runner_started(session.session_id, self)  # (its models' input may come from elsewhere)

    # ------------------------------------------------------------------ lifecycle
    def attach(self, driver: ConnectionDriver) -> None:
        """`driver`'s connection now carries this session (a resume)."""
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
        log.info("session %s detached; resumable for %.0f s", self.session.session_id, self.session.window,
                 extra={"session_id": self.session.session_id})

    def on_timer(self, now: float) -> float:
        """Scheduler callback: give up a detached session whose resume window ended."""
        if self.destroyed or self.driver is not None:
            return math.inf
        if now >= self.session.expires_at():
            if self.shared is not None and self.models_running():
                # Its client may have resumed on another process, which follows these streams: ask the store.
                # (Relays of other processes' streams alone keep nothing: nobody reads them here any more.)
                self._expiry = asyncio.get_running_loop().create_task(self._expire_shared())  # (kept: a reference)
                return now + self.settings.resume_window
            log.info("session %s expired", self.session.session_id, extra={"session_id": self.session.session_id})
            self.destroy()
            return math.inf
        return self.session.expires_at()

    def models_running(self) -> bool:
        """Whether a model of this session runs here (relays of other processes' streams aside)."""
        followed = self.session.followed
        return any(sid not in followed for sid in self.tasks)

    async def _expire_shared(self) -> None:
        """A shared session's resume window ended here with models running: if its client resumed on another
        process that is alive (the store says who holds it now), they run on for it (checked again a window
        later); if nobody holds it, the session is given up; if the store cannot say, it is asked again later."""
        shared = self.shared
        assert shared is not None
        sid = self.session.session_id
        owner = await shared.owner(sid)
        if owner is not None and owner not in ("", process_id()):
            alive = await shared.alive(owner)
            owner = None if alive is None else owner if alive else ""
        if self.destroyed or self.driver is not None or owner is None:
            return
        if owner == "" or (owner == process_id() and self.endpoint.store.get(sid) is self):
            log.info("session %s expired", sid, extra={"session_id": sid})
            self.destroy()

    def destroy(self) -> None:
        """Stop every model and forget the session."""
        if self.destroyed:
            return
        self.destroyed = True
        self.driver = None
        if self._detached:
            self._set_detached(False)
            self.scheduler.cancel(self)
        shared = self.shared
        if shared is not None:  # streams followed elsewhere must end there too, not wait for Deltas that never come
            session = self.session
            now = self.monotonic()
            for sid, st in list(session.streams.items()):
                if st.terminal is None and sid not in session.followed:
                    session.fail(sid, now, ErrorCode.RESUME_FAILED, f"stream {sid} stopped: its session ended on the "
                                 "process running it", retryable=True)
            shared.touch(session)
            shared.release(session)
        store = self.endpoint.store
        if store.get(self.session.session_id) is self:
            store.remove(self.session.session_id)
        if shared is not None:
            push.HUB.runner_ended(self.session.session_id, self)
        for task in list(self.tasks.values()):
            task.cancel()
        if self.window is not None:
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
        if not self.session.blocked and self.window is not None:
            self.window.set()

    # ------------------------------------------------------------------ streams
    def start(self, request: ev.Request, arrived: float | None) -> None:
        """Run the model for `request` in its own task; `arrived`: when its frame arrived (None: not timed)."""
        fn, label, kind, name = self.endpoint.models.resolve(request.model)
        metrics = self.metrics
        hists = metrics.stream_started(label) if metrics is not None else (None, None)
        timer = None
        if arrived is not None:
            timer = StreamTimer(self.clock, arrived, *hists)
            timer.lap("decode")
            if self.settings.delta_timing or (kind != "asyncgen" and kind != "async") or self.settings.merge_deltas:
                timer.every = 1  # asked for, or lapped per chunk anyway (a thread hop, a merge): every Delta timed
        # Started eagerly: the model's first step (for a quick model, its first Delta) runs now, not a loop turn later.
        # Its task is named for the model: a step that holds the loop is told whose (stalls). It registers itself in
        # self.tasks (_run): that step may end the stream and then wait to write its End, past the point where it
        # takes itself out again.
        eager.start(self.loop, self._run(request, fn, label, kind, timer), stalls.TASK_PREFIX + name)
        if self.shared is not None:  # (its start, and what its first step produced)
            self.shared.touch(self.session)

    def follow(self, stream_id: int, source: AsyncIterator[Any]) -> None:
        """Relay a stream another process runs (a session resumed from the shared store): `source` yields its
        chunks, then its End or Error, which this session sends as if its own model had produced them."""
        self.tasks[stream_id] = self.loop.create_task(self._follow(stream_id, source))

    async def _follow(self, sid: int, source: AsyncIterator[Any]) -> None:
        """Relay stream `sid` from `source` (see follow): its chunks through the one emit (the client's flow window
        applies here), then its End or Error; a Cancel from the client stops the model on the other process too."""
        ends: list[ev.End | ev.Error] = []
        ending: tuple[Any, ...] = CANCELLED
        try:
            await self._emit_each(sid, _relayed(source, ends), None, False)
            if ends:
                ending = (ends[0],)
        except asyncio.CancelledError:  # a Cancel from the client: the other process stops its model too
            if self.destroyed:
                raise
            if not cancelled_by_client(self.session, sid):  # (the loop ending, say): the stream runs on elsewhere,
                return  # and its client, once this connection is gone, resumes it there; nothing is sent for it here
            if self.shared is not None:
                self.shared.cancel_elsewhere(self.session.session_id, sid)
        except Exception:  # a bug of ours: the stream ends with an Error, as a failing model's
            log.exception("relaying stream %s of %s failed", sid, self.session.session_id,
                          extra={"session_id": self.session.session_id, "stream_id": sid})
            ending = (ev.Error(stream_id=sid, code=ErrorCode.INTERNAL, message="internal error"),)
        finally:
            await source.aclose()  # type: ignore[attr-defined]
            self.tasks.pop(sid, None)
        sent = send_end(self, sid, ending, None, None, None)
        if sent is not None:
            await sent

    def deliver(self, inp: ev.Input) -> str | None:
        """(v1.3) Hand the client's Input to its stream's model; why not, if it cannot take it."""
        inputs = self.inputs.get(inp.stream_id)
        if inputs is None:
            if inp.stream_id in self.session.followed and self.shared is not None:  # its model runs on another
                self.shared.input_elsewhere(self.session.session_id, inp)  # process: there it goes, in order
                return None
            if inp.stream_id not in self.tasks:
                return None  # ending: its End is on its way
            inputs = self.inputs[inp.stream_id] = Inputs()  # its model has not started yet (the result cache is
            # asked first): kept for it
        if len(inputs) >= self.settings.max_unread_inputs:
            return (f"more than {self.settings.max_unread_inputs} inputs the model has not read "
                    "(max_unread_inputs)")
        inputs.put(inp.item, inp.end)
        return None

    def deliver_remote(self, inp: ev.Input) -> None:
        """(v1.3) An Input the client sent to another process, which relays this stream: delivered as if it had come
        here (once, in seq order: the other process's session, restored from the store, does not know which Inputs
        came before and forwards what the client sends again after its resume)."""
        st = self.session.streams.get(inp.stream_id)
        if self.destroyed or st is None or not st.accepts("input") or inp.seq != st.input_seq + 1:
            return
        st.input_delivered(inp)
        problem = self.deliver(inp)
        if problem is not None and self.session.refuse(inp.stream_id, self.monotonic(), ErrorCode.BAD_REQUEST,
                                                       problem) is not None:
            self.cancel(inp.stream_id)
            if self.shared is not None:  # (the Error goes out through the store, to the process relaying it)
                self.shared.touch(self.session)

    def cancel(self, stream_id: int) -> None:
        """Stop the model of `stream_id` for its client (it ends with End("cancelled")): a Cancel here or, for a
        shared session, on another process."""
        task = self.tasks.get(stream_id)
        if task is not None:
            st = self.session.streams.get(stream_id)
            if st is not None:
                st.move("cancel")
            task.cancel()

    async def _run(self, req: ev.Request, fn: Any, label: str, kind: str, timer: StreamTimer | None) -> None:
        """Stream `req.stream_id`, start to end: its pipeline (:meth:`_stream`), then its one finish
        (finish.finish), whatever happened in it. How it ended: ("stop",), ("cancelled",), ("warmup",) or (code,
        message[, retryable]); INTERRUPTED unless the pipeline or its failure says otherwise (a KeyboardInterrupt
        or SystemExit raised in the model, say).

        An async model's task is watched (runtime/stalls.py) from here to the top of the finally: nothing between
        them raises. (A sync model's steps run in worker threads: they cannot hold the loop.)"""
        started = self.monotonic()
        tracer = self.driver.tracer if self.driver is not None else None
        span = None
        ending: tuple[Any, ...] = INTERRUPTED
        watch = self.stalls if kind == "asyncgen" or kind == "async" else None
        task = self.tasks[req.stream_id] = asyncio.current_task(self.loop)  # (taken out by its finish)
        watched = task if watch is not None else None
        if watched is not None:
            running = watch.running  # type: ignore[union-attr]
            running[watched] = self.settings.slow_step_warning
            if len(running) == 1 and not watch.wake.is_set():  # type: ignore[union-attr]  # the loop's first
                watch.wake.set()  # type: ignore[union-attr]  # (the watching thread looks at it from now on)
        try:
            if tracer is not None:  # (in the try: a tracer that fails ends the stream with an Error, as any failure)
                span = tracing.start_stream(tracer, req, self.session.session_id, label, timer)
            ending = await self._stream(req, fn, label, kind, timer)
        except asyncio.CancelledError as exc:
            if self.destroyed:
                raise
            ending = stopped(self.session, req.stream_id, fn, exc, self.settings.expose_model_errors)
        except Exception as exc:
            ending = failed(self.session, req.stream_id, fn, exc, self.settings.expose_model_errors)
        finally:
            if watched is not None:
                del watch.running[watched]  # type: ignore[union-attr]
            await finish(self, req, fn, label, ending, timer, span, started)

    async def _stream(self, req: ev.Request, fn: Any, label: str, kind: str, timer: StreamTimer | None) -> tuple:
        """Stream `req.stream_id`'s pipeline; returns how it ended. Its source: the reply the result cache kept for
        this request (the model does not run), or the model's warm-up (no output), or the model's chunks
        (sources.model_chunks), recorded for the result cache if it keeps them; shaped: plain, or merged
        (merge_deltas); then the one emit (:meth:`_emit`). A model that caught its cancellation and returned
        ends as stopped; a deterministic model's reply that ended normally is kept for the result cache."""
        sid = req.stream_id
        if fn is None:
            served = ", ".join(self.endpoint.models.names())
            return (ErrorCode.UNKNOWN_MODEL, f"unknown model {req.model!r}; served: {served}")
        kept: list[Any] | None = None  # the reply's chunks, for the result cache (looked up first: a hit needs
        key = b""  # no ModelRequest)
        cache = self.endpoint.cache
        if cache is not None and not req.warmup and not req.contexts and not req.continues and is_deterministic(fn):
            key = request_key(req)
            cached = await cached_reply(cache, self.shared, self.metrics, key, label, self.monotonic)
            if cached is not None:  # the reply kept for this request, at once: the model does not run
                if timer is not None:
                    timer.model_running()
                await self._emit_each(sid, each(cached), timer, False)
                return STOP
            kept = []
        mreq = self._model_request(req)
        if req.warmup:  # (protocol v1.2) the model's warm-up hook, if it has one, and no output
            if timer is not None:
                timer.model_running()
            await warm_up(fn, mreq, self.endpoint.executor)
            return ("warmup",)
        source = model_chunks(fn, mreq, kind, timer, self.settings, self.endpoint.executor)
        if not hasattr(source, "__aiter__"):  # a call to await: the model's reply
            source = reply_chunks(await source, self.endpoint.executor, fn)
        if isinstance(source, WHOLE_REPLY):  # one chunk: the one emit, without an iterator (nothing to merge)
            if kept is not None:
                keep_chunk(source, kept, cache.max_entry)  # type: ignore[union-attr]
            wait = self._emit(sid, source, timer)
            if wait is not None:
                await wait
        else:
            chunks = source if kept is None else recorded(source, kept, cache.max_entry)  # type: ignore[union-attr]
            merge = self.settings.merge_deltas
            if merge:
                chunks = merged_deltas(chunks, timer, self.settings)
            await self._emit_each(sid, chunks, timer, not merge)  # (see _emit_each for `fair`)
        if asyncio.current_task(self.loop).cancelling():  # type: ignore[union-attr]
            return stopped(self.session, sid, fn, None, False)  # (the model caught its cancellation and returned)
        if kept is not None:
            keep_reply(cache, self.shared, self.session.streams.get(sid), key, kept,  # type: ignore[arg-type]
                       self.monotonic())
        return STOP

    def _model_request(self, req: ev.Request) -> ModelRequest:
        """The ModelRequest of `req`, with what the session kept for it (protocol v1.3: its context and history, as
        they were at its Request) and its inputs: what the client sends while the model runs, from what it sent
        while the result cache was asked on."""
        sid = req.stream_id
        if req.contexts or req.continues:
            given = self.session.context.given.pop(sid, None) if self.session.context is not None else None
            mreq = ModelRequest(stream_id=sid, model=req.model, text=req.text, data=req.data,
                                messages=req.messages, params=req.params, session=self.info,
                                context=given[0] if given else {}, history=given[1] if given else ())
        else:
            mreq = _make_model_request(sid, req.model, req.text, req.data, req.messages, req.params, self.info)
        inputs = mreq.inputs
        early = self.inputs.get(sid)
        if early is not None:
            inputs.extend(early)
            inputs.ended = early.ended
        self.inputs[sid] = inputs
        inputs.loop = self.loop
        return mreq

    def _emit(self, sid: int, chunk: Any, timer: StreamTimer | None) -> Awaitable[None] | None:
        """One chunk of stream `sid` out, the one way a chunk leaves the runner: through the attached connection
        (ConnectionDriver.chunk), else into the session for the resume; the shared store told. What comes back is
        what to await before the model's next step (None: nothing): the write the connection could not take at once,
        then the pause while the flow-control window (or, detached, the replay buffer) is full."""
        driver = self.driver
        if driver is not None:
            write = driver.chunk(sid, chunk, timer)
        else:
            write = self._keep(sid, chunk, timer)
        if self.shared is not None:
            self.shared.touch(self.session)
        session = self.session
        if session.buffered >= session.pause_at:  # (Session.blocked)
            return self._paused(timer) if write is None else self._written_then_paused(write, timer)
        return write

    async def _emit_each(self, sid: int, chunks: AsyncIterator[Any], timer: StreamTimer | None, fair: bool) -> None:
        """Every chunk of `chunks` through the one emit (:meth:`_emit`), each awaited as it says; it closes `chunks`,
        however it ends. (The loop is here, not in the caller: no call per token on the hottest path.)

        `fair` (a model iterated chunk by chunk; docs/architecture.md, "Fair scheduling"): once the first Delta is
        out, if the driver says another stream's went out in this loop turn too (a burst of Requests), the model's
        next step waits for the next turn, after the other Requests read in this one."""
        try:
            async for chunk in chunks:
                wait = self._emit(sid, chunk, timer)
                if wait is not None:
                    await wait
                if fair:
                    fair = False
                    driver = self.driver
                    if driver is not None and driver.writer.first_delta():
                        await asyncio.sleep(0)
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    def _keep(self, sid: int, chunk: Any, timer: StreamTimer | None) -> None:
        """A chunk while no connection is attached: into the session, for the resume."""
        produced = self.clock()
        self.session.keep(sid, chunk, self.monotonic())
        if timer is not None:
            now = self.clock()
            timer.tick(produced, now, now)

    async def _written_then_paused(self, write: Awaitable[None], timer: StreamTimer | None) -> None:
        await write
        await self._paused(timer)

    async def _paused(self, timer: StreamTimer | None) -> None:
        """The flow-control window (or, detached, the replay buffer) is full: wait until it opens."""
        self.waiting += 1
        if timer is not None:  # (what went before the pause is not flow time)
            timer.lap("model")
        try:
            await self._wait_window()
        finally:
            self.waiting -= 1
            if timer is not None:
                timer.lap("flow")

    async def _wait_window(self) -> None:
        """Pause the model until the client acknowledges output (or resumes); 4003 if stuck."""
        while self.session.blocked and not self.destroyed:
            window = self.window
            if window is None:
                window = self.window = asyncio.Event()
            window.clear()
            driver = self.driver
            if driver is None:
                await window.wait()
                continue
            try:
                async with asyncio.timeout(self.settings.slow_consumer_timeout):
                    await window.wait()
            except TimeoutError:
                if self.driver is driver and self.session.blocked:
                    await driver.close(CloseCode.SLOW_CONSUMER, "client did not acknowledge output")
