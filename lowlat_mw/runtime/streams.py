"""The model runner: one :class:`ModelRunner` per session runs its models, one task per stream.

It hands each chunk to the session's current driver in one call (:meth:`ConnectionDriver.chunk
<lowlat_mw.runtime.connection.ConnectionDriver.chunk>`), or, while no connection is attached, keeps it in the
session for a resume. It waits for the flow-control window and, once the connection dropped, for the resume window
to end. A session outlives a connection, so the runner does too.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .._fast import maker
from ..cache import CHUNK_OVERHEAD, is_deterministic, merged, request_key
from ..errors import CloseCode, ErrorCode
from ..model import (
    DONE,
    WAIT,
    WHOLE_REPLY,
    Inputs,
    ModelInterrupted,
    ModelRequest,
    chunks_of,
    model_name,
    reply_type_error,
    step_now,
    stream_model,
    warm_up,
)
from ..observability import tracing
from ..observability.timing import StreamTimer
from ..protocol import events as ev
from ..protocol.session import ChunkTypeError, Session
from . import eager, push, stalls
from .batch import batcher_for
from .shared import process_id, shared_sessions

if TYPE_CHECKING:
    from .connection import ConnectionDriver

__all__ = ["INTERRUPTED", "ModelRunner", "error_of"]

log = logging.getLogger("lowlat_mw")

# How a stream ends whose model the server stopped before it finished, for a reason of its own (a forced shutdown
# cancelled its task, its thread pool is shut down, its batch call was cancelled; not the client's Cancel, not the
# model's failure): a retryable Error, never a normal End, so a client never takes the cut output for the whole
# (docs/protocol.md 13.1).
INTERRUPTED = (ErrorCode.INTERNAL, "stream interrupted: the server stopped its model before it finished (shutting "
               "down?); the output is incomplete", True)
_CANCELLED = ("cancelled",)
_TOO_BIG = object()  # (in a recorded reply: it grew past what the cache keeps, so it is not kept)
_NO_RESULT = object()  # (ModelRunner._run: the model was not awaited for a result)
_make_model_request = maker(ModelRequest, "stream_id", "model", "text", "data", "messages", "params", "session")


def error_of(sid: int, ending: tuple[Any, ...]) -> ev.Error:
    """The Error of an `ending` (code, message[, retryable]) of stream `sid` (see ModelRunner._run)."""
    return ev.Error(stream_id=sid, code=ending[0], message=ending[1], retryable=len(ending) > 2 and ending[2])


def _kept(chunk: Any) -> Any:
    """A chunk as the result cache keeps it: a mutable buffer copied, as it is when it comes."""
    return bytes(chunk) if isinstance(chunk, bytearray | memoryview) else chunk


async def _recorded(agen: Any, kept: list[Any], limit: int) -> AsyncIterator[Any]:
    """`agen`'s chunks, each also put in `kept` (copied if mutable): a reply for the result cache, recorded up to
    about `limit` bytes (past it, `kept` holds only _TOO_BIG). Closed, it closes `agen` at once."""
    size = 0
    try:
        async for chunk in agen:
            if size <= limit:
                sized = isinstance(chunk, str | bytes | bytearray | memoryview)
                size += len(chunk) + CHUNK_OVERHEAD if sized else limit + 1
                if size <= limit:
                    kept.append(_kept(chunk))
                else:
                    kept[:] = [_TOO_BIG]
            yield chunk
    finally:
        await agen.aclose()


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
        # Its task is named for the model: a step that holds the loop is told whose (stalls).
        task, finished = eager.start(self.loop, self._run(request, fn, label, kind, timer), stalls.TASK_PREFIX + name)
        if not finished:  # (a stream that ended in that step popped itself already)
            self.tasks[request.stream_id] = task
        if self.shared is not None:  # (its start, and what its first step produced)
            self.shared.touch(self.session)

    def follow(self, stream_id: int, source: AsyncIterator[Any]) -> None:
        """Relay a stream another process runs (a session resumed from the shared store): `source` yields its
        chunks, then its End or Error, which this session sends as if its own model had produced them."""
        self.tasks[stream_id] = self.loop.create_task(self._follow(stream_id, source))

    async def _follow(self, sid: int, source: AsyncIterator[Any]) -> None:
        terminal: ev.End | ev.Error | None = None
        try:
            async for item in source:
                if isinstance(item, ev.End | ev.Error):
                    terminal = item
                    break
                await self._emit(sid, item, None)  # (the client's flow window applies here)
        except asyncio.CancelledError:  # a Cancel from the client: the other process stops its model too
            if self.destroyed:
                raise
            if not self._cancelled_by_client(sid):  # (the loop ending, say): the stream runs on elsewhere, and its
                return  # client, once this connection is gone, resumes it there; nothing is sent for it here
            if self.shared is not None:
                self.shared.cancel_elsewhere(self.session.session_id, sid)
        except Exception:  # a bug of ours: the stream ends with an Error, as a failing model's
            log.exception("relaying stream %s of %s failed", sid, self.session.session_id,
                          extra={"session_id": self.session.session_id, "stream_id": sid})
            terminal = ev.Error(stream_id=sid, code=ErrorCode.INTERNAL, message="internal error")
        finally:
            await source.aclose()  # type: ignore[attr-defined]
            self.tasks.pop(sid, None)
        if self.destroyed:
            return
        ending: tuple[Any, ...] = (terminal,) if terminal is not None else _CANCELLED
        driver = self.driver
        if driver is not None:
            await driver.end_stream(sid, ending, None, None, None)
        elif terminal is not None:
            self.session.finish(sid, self.monotonic(), error=terminal)
        else:
            self.session.finish(sid, self.monotonic(), reason="cancelled")

    def _cancelled_by_client(self, sid: int) -> bool:
        """Whether stream `sid` stops because its client asked (a Cancel, or a resume that left it out): the machine
        marked it cancelling (or ended it already)."""
        st = self.session.streams.get(sid)
        return st is None or st.cancelling or st.terminal is not None

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
        sid = req.stream_id
        session = self.session
        started = self.monotonic()
        tracer = self.driver.tracer if self.driver is not None else None
        span = None
        # How the stream ends: ("stop",), ("cancelled",) or (code, message[, retryable]); INTERRUPTED unless a path
        # below says otherwise (a KeyboardInterrupt or SystemExit raised in the model, say)
        ending: tuple[Any, ...] = INTERRUPTED
        # An async model's task is watched (runtime/stalls.py) from here to the top of the finally below: nothing
        # between them raises. (A sync model's steps run in worker threads: they cannot hold the loop.)
        watch = self.stalls if kind == "asyncgen" or kind == "async" else None
        watched = asyncio.current_task(self.loop) if watch is not None else None
        if watched is not None:
            running = watch.running  # type: ignore[union-attr]
            running[watched] = self.settings.slow_step_warning
            if len(running) == 1 and not watch.wake.is_set():  # type: ignore[union-attr]  # the loop's first
                watch.wake.set()  # type: ignore[union-attr]  # (the watching thread looks at it from now on)
        try:
            if tracer is not None:  # (in the try: a tracer that fails ends the stream with an Error, as any failure)
                span = tracing.start_stream(tracer, req, session.session_id, label, timer)
            if fn is None:
                served = ", ".join(self.endpoint.models.names())
                ending = (ErrorCode.UNKNOWN_MODEL, f"unknown model {req.model!r}; served: {served}")
                return
            kept: list[Any] | None = None  # the reply's chunks, for the result cache (looked up first: a hit needs
            key = b""  # no ModelRequest)
            cache = self.endpoint.cache
            if cache is not None and not req.warmup and not req.contexts and not req.continues and is_deterministic(fn):
                key = request_key(req)
                cached = cache.get(key, self.monotonic())
                if cached is None and self.shared is not None:  # the shared tier: what another process kept
                    cached = await self.shared.cache_get(key)
                    if cached is not None:
                        cache.put(key, cached, self.monotonic())
                if self.metrics is not None:
                    self.metrics.inc("cache_lookups", label, "miss" if cached is None else "hit")
                if cached is not None:  # the reply kept for this request, at once: the model does not run
                    if timer is not None:
                        timer.model_started = timer.lap("queue")
                    for chunk in cached:
                        await self._emit(sid, chunk, timer)
                    ending = ("stop",)
                    return
                kept = []
            if req.contexts or req.continues:  # (protocol v1.3) what the session kept for it, as it was at its Request
                given = session.context.given.pop(sid, None) if session.context is not None else None
                mreq = ModelRequest(stream_id=sid, model=req.model, text=req.text, data=req.data,
                                    messages=req.messages, params=req.params, session=self.info,
                                    context=given[0] if given else {}, history=given[1] if given else ())
            else:
                mreq = _make_model_request(sid, req.model, req.text, req.data, req.messages, req.params, self.info)
            inputs = mreq.inputs  # (v1.3: what the client sends while it runs)
            early = self.inputs.get(sid)
            if early is not None:  # (sent while the result cache was asked: kept for it)
                inputs.extend(early)
                inputs.ended = early.ended
            self.inputs[sid] = inputs
            inputs.loop = self.loop
            if req.warmup:  # (protocol v1.2) the model's warm-up hook, if it has one, and no output
                if timer is not None:
                    timer.model_started = timer.lap("queue")
                await warm_up(fn, mreq, self.endpoint.executor)
                ending = ("warmup",)
                return
            result: Any = _NO_RESULT  # (what an awaited call returned: a whole reply, or something to iterate)
            if getattr(fn, "batch", False):  # (micro-batching, batch.is_batched) this request's reply, from its batch
                if timer is not None:
                    timer.model_started = timer.lap("queue")  # (the batch's wait counts as the model's time)
                s = self.settings
                result = await batcher_for(fn, self.endpoint.executor, s.max_batch_size, s.max_batch_wait).reply(mreq)
            elif kind == "asyncgen":  # iterated as it is: no wrapper generator per chunk (see stream_model)
                if timer is not None:
                    timer.model_started = timer.lap("queue")  # (StreamTimer.model_running)
                agen = fn(mreq)
            elif kind == "async" and not self.settings.merge_deltas:  # awaited here: no wrapper generators
                if timer is not None:
                    timer.model_started = timer.lap("queue")
                result = await fn(mreq)
            else:
                agen = stream_model(fn, mreq, self.endpoint.executor,
                                    timer.model_running if timer is not None else None, kind)
            if result is not _NO_RESULT:
                if isinstance(result, WHOLE_REPLY):  # one chunk (as chunks_of would yield it)
                    await self._emit(sid, result, timer)
                    agen = None
                    if kept is not None:
                        kept.append(_kept(result))
                else:
                    agen = chunks_of(result, self.endpoint.executor, None, fn)
            if agen is not None:
                if kept is not None:
                    agen = _recorded(agen, kept, self.endpoint.cache.max_entry)  # type: ignore[union-attr]
                try:
                    if self.settings.merge_deltas:
                        await self._pump_merged(sid, agen, timer)
                    else:  # (_emit, written out: once per token)
                        shared = self.shared
                        first = True
                        async for chunk in agen:
                            driver = self.driver
                            if driver is not None:
                                await driver.chunk(sid, chunk, timer)
                            else:
                                self._keep(sid, chunk, timer)
                            if shared is not None:
                                shared.touch(session)
                            if session.buffered >= session.pause_at:  # (Session.blocked)
                                await self._paused(timer)
                            if first:
                                # Fair scheduling (docs/architecture.md): the first Delta is out. If another stream's
                                # went out in this loop turn too (a burst of Requests), the model's next step waits
                                # for the next turn, after the other Requests read in this one. (Counted only in a
                                # turn that wrote: its end-of-turn callback resets the count.)
                                first = False
                                turns = driver._turns if driver is not None else None
                                if turns is not None and turns.scheduled:
                                    turns.started += 1
                                    if turns.started > 1:
                                        await asyncio.sleep(0)
                finally:
                    await agen.aclose()
            if asyncio.current_task(self.loop).cancelling():  # type: ignore[union-attr]
                ending = self._stopped(sid, fn, None)  # (the model caught its cancellation and returned)
            else:
                ending = ("stop",)
                if kept is not None:
                    self._cache_reply(key, kept, sid)
        except asyncio.CancelledError as exc:
            if self.destroyed:
                raise
            ending = self._stopped(sid, fn, exc)
        except Exception as exc:
            ending = self._failed(sid, fn, exc)
        finally:
            if watched is not None:
                del watch.running[watched]  # type: ignore[union-attr]
            if timer is not None and fn is not None:  # closing the model (its finally blocks; a thread hop)
                timer.lap("model")
            self.tasks.pop(sid, None)
            inputs = self.inputs.pop(sid, None)
            if inputs is not None:  # no more input comes (for a sync model still waiting in a thread, say)
                inputs.ended = True
                if inputs.waiters or inputs.cond is not None:
                    inputs.put(None, True)
            # The stream is observed, then its End or Error recorded, the span ended, and only then is the End
            # sent: whoever reads it finds the metrics and the span already there. The timings are read first:
            # that splits what the timer lumped together (StreamTimer.tick) before the metrics see the stages.
            timings = timer.timings_ms() if timer is not None else None
            if self.metrics is not None:  # (a warm-up's hook time is no model stage of a request: not in them)
                # (from the Request's arrival where it was timed, as its first Delta is, on the timer's clock)
                seconds = self.clock() - timer.start if timer is not None else self.monotonic() - started
                self.metrics.stream_ended(label, ending[0] if len(ending) == 1 else "error", seconds,
                                          timer if not req.warmup else None)
            if not self.settings.stage_timings:
                timings = None
            driver = self.driver
            if self.destroyed:
                if span is not None:
                    tracing.end_stream(span, None, timer)
            elif driver is not None:
                await driver.end_stream(sid, ending, timings, span, timer)
            else:  # no connection: kept in the session for the resume
                now = self.monotonic()
                terminal = (session.finish(sid, now, reason=ending[0], timings_ms=timings) if len(ending) == 1
                            else session.finish(sid, now, error=error_of(sid, ending)))
                if span is not None:
                    tracing.end_stream(span, terminal, timer)
            if self.shared is not None and not self.destroyed:
                self.shared.touch(session)

    def _stopped(self, sid: int, fn: Any, exc: asyncio.CancelledError | None) -> tuple[Any, ...]:
        """How stream `sid` ends when its model stopped on a CancelledError (`exc`; None: the model caught its
        cancellation and returned). Its client's Cancel: End("cancelled"). Its task cancelled by anything else (a
        forced shutdown, the loop ending): INTERRUPTED, never a normal End. A CancelledError the model raised
        while its task was not cancelled (it awaited something cancelled): the model's failure."""
        if self._cancelled_by_client(sid):
            return _CANCELLED
        if exc is not None and not asyncio.current_task(self.loop).cancelling():  # type: ignore[union-attr]
            return self._failed(sid, fn, exc)
        return INTERRUPTED

    def _failed(self, sid: int, fn: Any, exc: BaseException) -> tuple[Any, ...]:
        """How stream `sid` ends when its model `fn` raised `exc`: Error model_error, logged once with the traceback
        (a chunk no Delta carries as the model's TypeError, as a reply of a wrong type); INTERRUPTED when the server
        stopped it (ModelInterrupted)."""
        if isinstance(exc, ModelInterrupted):
            return INTERRUPTED
        if isinstance(exc, ChunkTypeError):
            exc = reply_type_error(fn, exc.chunk, yielded=True).with_traceback(exc.__traceback__)
        session_id = self.session.session_id
        log.error("model %s failed on stream %s of %s", model_name(fn), sid, session_id, exc_info=exc,
                  extra={"session_id": session_id, "stream_id": sid})
        text = f"{type(exc).__name__}: {exc}" if self.settings.expose_model_errors else type(exc).__name__
        return (ErrorCode.MODEL_ERROR, f"model failed ({text})")

    def _cache_reply(self, key: bytes, chunks: list[Any], sid: int) -> None:
        """A deterministic model's reply ended normally: keep it for the same request (the result cache), unless it
        grew too big to keep, or its stream was cancelled (the client's Cancel, even if the model went on)."""
        cache = self.endpoint.cache
        st = self.session.streams.get(sid)
        if cache is None or (chunks and chunks[0] is _TOO_BIG) or (st is not None and st.cancelling):
            return
        if cache.put(key, chunks, self.monotonic()) and self.shared is not None:
            self.shared.cache_put(key, merged(chunks))

    async def _emit(self, sid: int, chunk: Any, timer: StreamTimer | None) -> None:
        """One chunk out: through the attached connection, else into the session for the resume."""
        driver = self.driver
        if driver is not None:
            await driver.chunk(sid, chunk, timer)
        else:
            self._keep(sid, chunk, timer)
        session = self.session
        if self.shared is not None:
            self.shared.touch(session)
        if session.buffered >= session.pause_at:  # (Session.blocked)
            await self._paused(timer)

    def _keep(self, sid: int, chunk: Any, timer: StreamTimer | None) -> None:
        """A chunk while no connection is attached: into the session, for the resume."""
        produced = self.clock()
        self.session.keep(sid, chunk, self.monotonic())
        if timer is not None:
            now = self.clock()
            timer.tick(produced, now, now)

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
