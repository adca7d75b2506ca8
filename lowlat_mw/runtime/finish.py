"""How a stream ends: the ending of its pipeline, told apart (docs/protocol.md 13.1).

An ending is a tuple: ("stop",), ("cancelled",), ("warmup",), or (code, message[, retryable]) for an Error.
The client's Cancel ends a stream with End("cancelled"); the model's failure with Error model_error; the server
stopping the model for a reason of its own (a forced shutdown, a pool shut down) with INTERRUPTED, a retryable
Error, never a normal End. :func:`finish` then observes
the stream and sends (or keeps) its End or Error, whatever ended it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from ..errors import ErrorCode
from ..model import ModelInterrupted, model_name, reply_type_error
from ..observability import tracing
from ..protocol import events as ev
from ..protocol.session import ChunkTypeError, Session

if TYPE_CHECKING:
    from ..observability.timing import StreamTimer
    from .streams import ModelRunner

__all__ = ["CANCELLED", "INTERRUPTED", "STOP", "cancelled_by_client", "error_of", "failed", "finish", "send_end",
           "stopped"]

log = logging.getLogger("lowlat_mw")

# How a stream ends whose model the server stopped before it finished, for a reason of its own (a forced shutdown
# cancelled its task, its thread pool is shut down, its batch call was cancelled; not the client's Cancel, not the
# model's failure): a retryable Error, never a normal End, so a client never takes the cut output for the whole
# (docs/protocol.md 13.1).
INTERRUPTED = (ErrorCode.INTERNAL, "stream interrupted: the server stopped its model before it finished (shutting "
               "down?); the output is incomplete", True)
CANCELLED = ("cancelled",)
STOP = ("stop",)


def error_of(sid: int, ending: tuple[Any, ...]) -> ev.Error:
    """The Error of an `ending` (code, message[, retryable]) of stream `sid`."""
    return ev.Error(stream_id=sid, code=ending[0], message=ending[1], retryable=len(ending) > 2 and ending[2])


def cancelled_by_client(session: Session, sid: int) -> bool:
    """Whether stream `sid` stops because its client asked (a Cancel, or a resume that left it out): the machine
    marked it cancelling (or ended it already)."""
    st = session.streams.get(sid)
    return st is None or st.cancelling or st.terminal is not None


def stopped(session: Session, sid: int, fn: Any, exc: asyncio.CancelledError | None,
            expose: bool) -> tuple[Any, ...]:
    """How stream `sid` ends when its model stopped on a CancelledError (`exc`; None: the model caught its
    cancellation and returned). Its client's Cancel: End("cancelled"). Its task cancelled by anything else (a
    forced shutdown, the loop ending): INTERRUPTED, never a normal End. A CancelledError the model raised
    while its task was not cancelled (it awaited something cancelled): the model's failure (`expose`: see
    failed)."""
    if cancelled_by_client(session, sid):
        return CANCELLED
    if exc is not None and not asyncio.current_task().cancelling():  # type: ignore[union-attr]
        return failed(session, sid, fn, exc, expose)
    return INTERRUPTED


def failed(session: Session, sid: int, fn: Any, exc: BaseException, expose: bool) -> tuple[Any, ...]:
    """How stream `sid` ends when its model `fn` raised `exc`: Error model_error, logged once with the traceback
    (a chunk no Delta carries as the model's TypeError, as a reply of a wrong type), the exception's text in it if
    `expose` (expose_model_errors); INTERRUPTED when the server stopped it (ModelInterrupted)."""
    if isinstance(exc, ModelInterrupted):
        return INTERRUPTED
    if isinstance(exc, ChunkTypeError):
        exc = reply_type_error(fn, exc.chunk, yielded=True).with_traceback(exc.__traceback__)
    session_id = session.session_id
    log.error("model %s failed on stream %s of %s", model_name(fn), sid, session_id, exc_info=exc,
              extra={"session_id": session_id, "stream_id": sid})
    text = f"{type(exc).__name__}: {exc}" if expose else type(exc).__name__
    return (ErrorCode.MODEL_ERROR, f"model failed ({text})")


async def finish(runner: ModelRunner, req: ev.Request, fn: Any, label: str, ending: tuple[Any, ...],
                 timer: StreamTimer | None, span: Any, started: float) -> None:
    """Stream `req.stream_id` of `runner` ended (`ending`): its one finish. Its model's closing is timed (`fn`
    None: no model ran) and its inputs end. It is observed, then its End or Error recorded, its span ended, and
    only then is the End sent (kept in the session for the resume while no connection is attached): whoever reads
    it finds the metrics and the span already there. The timings are read first: that splits what the timer
    lumped together (StreamTimer.tick) before the metrics see the stages."""
    sid = req.stream_id
    if timer is not None and fn is not None:  # closing the model (its finally blocks; a thread hop)
        timer.lap("model")
    runner.tasks.pop(sid, None)
    inputs = runner.inputs.pop(sid, None)
    if inputs is not None:  # no more input comes (for a sync model still waiting in a thread, say)
        inputs.ended = True
        if inputs.waiters or inputs.cond is not None:
            inputs.put(None, True)
    timings = timer.timings_ms() if timer is not None else None
    if runner.metrics is not None:  # (a warm-up's hook time is no model stage of a request: not in them)
        # (from the Request's arrival where it was timed, as its first Delta is, on the timer's clock)
        seconds = runner.clock() - timer.start if timer is not None else runner.monotonic() - started
        runner.metrics.stream_ended(label, ending[0] if len(ending) == 1 else "error", seconds,
                                    timer if not req.warmup else None)
    if not runner.settings.stage_timings:
        timings = None
    sent = send_end(runner, sid, ending, timings, span, timer)
    if sent is not None:
        await sent
    if runner.shared is not None and not runner.destroyed:
        runner.shared.touch(runner.session)


def send_end(runner: ModelRunner, sid: int, ending: tuple[Any, ...], timings: dict[str, float] | None,
             span: Any, timer: StreamTimer | None) -> Awaitable[None] | None:
    """Stream `sid`'s End or Error (`ending`; or a relayed stream's own, alone) recorded, its span ended, and
    sent: through the attached connection (the send to await comes back), else kept in the session for the resume
    (None). Once the session is destroyed only the span ends."""
    if runner.destroyed:
        if span is not None:
            tracing.end_stream(span, None, timer)
        return None
    driver = runner.driver
    if driver is not None:
        return driver.end_stream(sid, ending, timings, span, timer)
    now = runner.monotonic()
    if len(ending) > 1:
        terminal = runner.session.finish(sid, now, error=error_of(sid, ending))
    elif type(ending[0]) is not str:  # a relayed stream's own End or Error
        terminal = runner.session.finish(sid, now, error=ending[0])
    else:
        terminal = runner.session.finish(sid, now, reason=ending[0], timings_ms=timings)
    if span is not None:
        tracing.end_stream(span, terminal, timer)
    return None
