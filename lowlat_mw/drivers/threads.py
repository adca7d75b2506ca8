"""The thread bridge: thread-per-connection servers (Flask on werkzeug or gunicorn) on the asyncio driver.

Each connection's own thread only reads frames and blocks on them. Everything else (protocol,
models, timers) runs on ONE process-wide asyncio loop in a daemon thread, through the same
:class:`~lowlat_mw.drivers.aio.ConnectionDriver` the ASGI adapters use, so heartbeats and reaping
come from that loop's single scheduler, async models run natively and sync models run in the
shared worker pool. Blocking socket writes go to a small send pool, never onto the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..endpoint import Endpoint
from .aio import ConnectionDriver, drain_all

__all__ = ["ThreadDriver", "background_loop", "drain_all_sync"]

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


class ThreadDriver:
    """One connection served from its own (blocking) thread: call :meth:`receive` per frame.

    `send(data)` and `close(code, reason)` write to the socket (blocking); they run in the send pool,
    in order (the driver's send lock keeps one write at a time).
    """

    def __init__(self, endpoint: Endpoint, *, send: Callable[[bytes | str], Any], close: Callable[[int, str], Any],
                 subprotocol: str | None, address: str | None = None, **facts: Any) -> None:
        """`address` and `facts` (client, headers, user, extra): as for ConnectionDriver."""
        self.loop = loop = background_loop()
        pool = _send_pool

        async def asgi_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "websocket.send":
                data = message.get("bytes")
                await loop.run_in_executor(pool, send, data if data is not None else message["text"])
            else:
                await loop.run_in_executor(pool, close, message.get("code", 1000), message.get("reason", ""))

        async def make() -> ConnectionDriver:
            return ConnectionDriver(endpoint, send=asgi_send, subprotocol=subprotocol, address=address, **facts)

        self.driver: ConnectionDriver = self._call(make())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    @property
    def closed(self) -> bool:
        """True once the protocol decided to close (the reading thread should stop)."""
        return self.driver.protocol.closed

    def receive(self, data: bytes | str) -> None:
        """Feed one message; returns when it has been handled (backpressure for the reader)."""
        self._call(self.driver.receive(data))

    def disconnected(self, code: int | None = None) -> None:
        """The socket is gone (`code`: the peer's close code): keep the session for resume or end it."""
        self._call(self.driver.disconnected(code))


def drain_all_sync(grace: float | None = None, reconnect_after_ms: int = 0) -> None:
    """:func:`~lowlat_mw.drivers.aio.drain_all` for the thread-driven connections (a server shutting down;
    blocks until done, from any thread but the driver's loop). gunicorn's
    ``lowlat_mw.servers.gunicorn.ThreadWorker`` calls it on SIGTERM."""
    loop = _loop
    if loop is None or loop.is_closed():
        return
    asyncio.run_coroutine_threadsafe(drain_all(grace, reconnect_after_ms), loop).result()


def facts_from_environ(environ: Mapping[str, Any], path: str) -> dict[str, Any]:
    """What models see of a WSGI connection (client, headers, user, extra), from its environ."""
    headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
    return {"client": (environ.get("REMOTE_ADDR", ""), int(environ.get("REMOTE_PORT") or 0)), "headers": headers,
            "user": environ.get("REMOTE_USER"),
            "extra": {"path": path, "query_string": environ.get("QUERY_STRING", "")}}
