"""Thread driver: runs sessions for thread-per-connection servers (Flask/werkzeug, gunicorn).

Each connection's own thread only reads frames and blocks on them. Everything else (protocol
state, model streams, timers) runs on ONE process-wide asyncio loop in a daemon thread, through
the same :class:`~lowlat_mw.drivers.aio.AsyncServerSession` the ASGI adapters use, so heartbeats and
reaping come from that loop's single scheduler, async models run natively and sync models run
in the shared worker pool. Blocking socket writes go to a small send pool, never onto the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..model import ModelFn, Models, SessionInfo, shared_executor
from ..observability.metrics import Metrics
from ..protocol.session import SessionStore
from ..settings import Settings
from .aio import AsyncServerSession, drain_sessions

__all__ = ["ThreadedSession", "background_loop", "drain_all"]

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()
_send_pool: ThreadPoolExecutor | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide event loop thread for thread-based adapters (started on first use)."""
    global _loop, _send_pool
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=run, name="lowlat-mw-loop", daemon=True).start()
            started.wait()
            _loop = loop
            _send_pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="lowlat-send")
        return _loop


class ThreadedSession:
    """One connection driven from its own (blocking) thread: call receive() per frame."""

    def __init__(
        self,
        *,
        model: ModelFn | Models,
        settings: Settings,
        send: Callable[[bytes | str], Any],
        close: Callable[[int, str], Any],
        subprotocol: str | None,
        info: Callable[[str], SessionInfo] | None = None,
        store: SessionStore | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.loop = background_loop()
        pool = _send_pool
        loop = self.loop

        async def send_frame(data: bytes | str) -> None:
            # The session's send lock keeps frames in order; the write itself may block.
            await loop.run_in_executor(pool, send, data)

        async def close_ws(code: int, reason: str) -> None:
            await loop.run_in_executor(pool, close, code, reason)

        async def make() -> AsyncServerSession:
            session = AsyncServerSession(
                model=model, settings=settings, send=send_frame, close=close_ws,
                subprotocol=subprotocol, executor=shared_executor(settings.model_threads), store=store,
                metrics=metrics,
            )
            if info is not None:
                session.info = info(session.conn.session_id)
            session.start()
            return session

        self.session: AsyncServerSession = self._call(make())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    @property
    def closed(self) -> bool:
        """True once the protocol decided to close (the reading thread should stop)."""
        return self.session.conn.closed

    def receive(self, data: bytes | str) -> None:
        """Feed one message; returns when it has been handled (backpressure for the reader)."""
        self._call(self.session.receive(data))

    def disconnected(self, code: int | None = None) -> None:
        """The socket is gone (`code`: the peer's close code): keep the session for resume or end it."""
        self._call(self.session.disconnected(code))


def drain_all(grace: float | None = None, reconnect_after_ms: int = 0) -> None:
    """Drain every thread-driven connection of the process (a server shutting down; blocks until done).

    GoAway, running streams finish for up to `grace` seconds (default: each connection's
    ``drain_grace`` setting), close 4002; connections that open afterwards are closed with 4002.
    Call it from any thread but the driver's loop. gunicorn's ``lowlat_mw.servers.gunicorn.ThreadWorker``
    calls it on SIGTERM.
    """
    loop = _loop
    if loop is None or loop.is_closed():
        return
    asyncio.run_coroutine_threadsafe(drain_sessions(grace, reconnect_after_ms), loop).result()
