"""asyncio driver: owns the clock, the tasks and the send callable for one ServerConnection.

Used by every ASGI adapter (Starlette/FastAPI middleware, Django Channels consumer). The
framework gives it a ``send(data)`` and ``close(code, reason)`` coroutine and feeds it frames;
timers come from the loop's one :class:`~lowlat_mw.timers.AsyncScheduler`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

from .connection import CancelStream, CloseConnection, SendFrame, ServerConnection, StartStream
from .errors import CloseCode, ErrorCode
from .events import Request
from .model import ModelFn, ModelRequest, Models, SessionInfo, stream_model
from .settings import Settings
from .timers import AsyncScheduler

__all__ = ["AsyncServerSession"]

log = logging.getLogger("lowlat_mw")

SendFn = Callable[[bytes | str], Awaitable[None]]
CloseFn = Callable[[int, str], Awaitable[None]]


class AsyncServerSession:
    """Runs one connection: frames in, model streams out, timers from the shared scheduler."""

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
    ) -> None:
        self.conn = ServerConnection(settings, subprotocol=subprotocol, now=time.monotonic())
        self.models = model if isinstance(model, Models) else Models(model)
        self.settings = settings
        self._send = send
        self._close = close
        self.info = info or SessionInfo(session_id=self.conn.session_id, subprotocol=subprotocol)
        if self.info.session_id != self.conn.session_id:
            self.conn.session_id = self.info.session_id
        self.executor = executor
        self.scheduler = scheduler or AsyncScheduler.current()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._timer_tasks: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()
        self._scheduled = math.inf
        self._closing = False
        self._close_sent = False

    # ------------------------------------------------------------------ driver API
    def start(self) -> None:
        """Register the connection's timers."""
        self._reschedule()

    async def receive(self, data: bytes | str) -> None:
        """Feed one WebSocket message from the client."""
        await self._run(self.conn.receive(data, time.monotonic()))
        self._reschedule()

    async def disconnected(self) -> None:
        """The socket is gone: stop every model and forget the timers."""
        self._closing = True
        self.conn.connection_lost()
        self.scheduler.cancel(self)
        self._scheduled = math.inf
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def shutdown(self, code: int = CloseCode.GOING_AWAY, reason: str = "server shutdown") -> None:
        """Close from the server side."""
        await self._run(self.conn.close(code, reason))

    def on_timer(self, now: float) -> float:
        """Called by the scheduler when a deadline is due."""
        actions = self.conn.tick(now)
        if actions:
            task = asyncio.get_running_loop().create_task(self._run(actions))
            self._timer_tasks.add(task)
            task.add_done_callback(self._timer_tasks.discard)
        self._scheduled = self.conn.next_deadline()
        return self._scheduled

    # ------------------------------------------------------------------ internals
    def _reschedule(self) -> None:
        when = self.conn.next_deadline()
        if when < self._scheduled or (when == math.inf and self._scheduled != math.inf):
            self._scheduled = when
            self.scheduler.schedule(self, when)

    async def _run(self, actions: list) -> None:  # type: ignore[type-arg]
        for action in actions:
            if isinstance(action, SendFrame):
                await self._send_frame(action.data)
            elif isinstance(action, StartStream):
                sid = action.request.stream_id
                self.tasks[sid] = asyncio.get_running_loop().create_task(self._stream(action.request))
            elif isinstance(action, CancelStream):
                task = self.tasks.get(action.stream_id)
                if task is not None:
                    task.cancel()
            elif isinstance(action, CloseConnection):
                await self._close_with(action.code, action.reason)

    async def _send_frame(self, data: bytes | str) -> None:
        if self._closing:
            return
        try:
            async with self._send_lock:
                await self._send(data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the socket went away under us
            log.debug("send failed, treating as disconnect: %r", exc)
            self._closing = True

    async def _close_with(self, code: int, reason: str) -> None:
        self._closing = True
        self.scheduler.cancel(self)
        self._scheduled = math.inf
        current = asyncio.current_task()
        for task in list(self.tasks.values()):
            if task is not current:
                task.cancel()
        if not self._close_sent:
            self._close_sent = True
            log.info("closing connection %s: %s %s", self.conn.session_id, code, reason,
                     extra={"session_id": self.conn.session_id, "close_code": code})
            try:
                async with self._send_lock:
                    await self._close(code, reason)
            except Exception as exc:
                log.debug("close failed: %r", exc)

    async def _stream(self, req: Request) -> None:
        sid = req.stream_id
        conn = self.conn
        mreq = ModelRequest(stream_id=sid, model=req.model, text=req.text, data=req.data,
                            messages=req.messages, params=req.params, session=self.info)
        actions: list = []  # type: ignore[type-arg]
        fn = self.models.get(req.model)
        if fn is None:
            self.tasks.pop(sid, None)
            await self._run(conn.fail_stream(sid, time.monotonic(), ErrorCode.UNKNOWN_MODEL,
                                             f"unknown model {req.model!r}; served: {', '.join(self.models.names())}"))
            self._reschedule()
            return
        try:
            agen = stream_model(fn, mreq, self.executor)
            try:
                async for chunk in agen:
                    await self._run(conn.send_chunk(sid, chunk, time.monotonic()))
                    if self._closing:
                        return
            finally:
                await agen.aclose()
            actions = conn.finish_stream(sid, time.monotonic())
        except asyncio.CancelledError:
            if self._closing:
                return
            actions = conn.finish_stream(sid, time.monotonic(), reason="cancelled")
        except Exception as exc:
            log.exception("model failed on stream %s of %s", sid, conn.session_id,
                          extra={"session_id": conn.session_id, "stream_id": sid})
            text = f"{type(exc).__name__}: {exc}" if self.settings.expose_model_errors else type(exc).__name__
            actions = conn.fail_stream(sid, time.monotonic(), ErrorCode.MODEL_ERROR, f"model failed ({text})")
        finally:
            self.tasks.pop(sid, None)
        await self._run(actions)
        self._reschedule()
