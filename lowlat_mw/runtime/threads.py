"""The thread bridge: thread-per-connection servers (Flask on werkzeug or gunicorn) on the asyncio driver.

Each connection's own thread only reads frames and blocks on them. Everything else (protocol,
models, timers) runs on ONE process-wide asyncio loop in a daemon thread, through the same
:class:`~lowlat_mw.runtime.connection.ConnectionDriver` the ASGI adapters use, so heartbeats and reaping
come from that loop's single scheduler, async models run natively and sync models run in the
shared worker pool. Blocking socket writes go to a small send pool, never onto the loop.

Given the connection's socket (and the ``direct_writes`` setting on), the driver writes its frames
through a :class:`SocketWriter`, a :class:`~lowlat_mw.runtime.direct.DirectTransport` over that
blocking socket: frames are built on the loop, a loop turn's frames are queued as one piece, and one
job of the send pool at a time writes whatever is queued. Without it every frame was a round trip
from the loop to a pool thread and back, and the loop waited for each one (a third of a millisecond
per Delta on a 2-core machine, seven times the asyncio servers' cost).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import deque
from collections.abc import Callable, Mapping, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..endpoint import Endpoint
from .connection import ConnectionDriver
from .drain import drain_all

__all__ = ["SharedSocket", "SocketWriter", "ThreadDriver", "background_loop", "drain_all_sync"]

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


class SharedSocket:
    """A connection's socket as the threads that serve it share it: its WebSocket library's reader, the send pool,
    the connection's own thread, the driver's loop.

    Writes go one at a time, whole, in the order their writers take :attr:`lock`; a WebSocket library that builds a
    frame under the same lock and writes it before letting go (:meth:`write_locked`) puts its frames on the wire in
    the order it built them, between the driver's. Nothing is written after the connection's close frame (`last`).
    :meth:`shutdown` and :meth:`close` take a lock of their own (a blocked write holds `lock`): a shutdown never
    reaches a descriptor closed meanwhile, whose number the process may have given to another socket, and a close
    shuts the socket down first, so that a write blocked in another thread ends. Reads go straight to the socket.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.recv = sock.recv
        self.lock = threading.Lock()
        self.ended = False  # the close frame went out: nothing more is written
        self._fd_lock = threading.Lock()
        self._closed = False

    def write_locked(self, data: bytes, last: bool = False) -> bool:
        """Write `data` whole, :attr:`lock` held (`last`: the close frame). False: not written, the close frame went
        out before it. OSError: the socket failed (or was shut down under the write)."""
        if self.ended:
            return False
        if last:
            self.ended = True
        if data:
            self.sock.sendall(data)
        return True

    def sendall(self, data: bytes) -> None:
        """Write `data` whole, in its turn; BrokenPipeError after the close frame (the writer stops)."""
        with self.lock:
            if not self.write_locked(data):
                raise BrokenPipeError("the connection's close frame went out")

    def send(self, data: bytes) -> int:
        """:meth:`sendall` as a socket's ``send`` (a library's writes, whole); no bytes: nothing, even after the close
        frame."""
        if data:
            self.sendall(data)
        return len(data)

    def shutdown(self, how: int = socket.SHUT_RDWR) -> None:
        """Shut the socket down, unless it is closed (never a stale descriptor); errors (not connected) ignored."""
        with self._fd_lock:
            if not self._closed:
                try:
                    self.sock.shutdown(how)
                except OSError:
                    pass

    def close(self) -> None:
        """Shut the socket down (a write blocked in another thread fails) and close it; once."""
        with self._fd_lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)  # (fileno, setsockopt, getpeername...)


class SocketWriter:
    """A :class:`~lowlat_mw.runtime.direct.DirectTransport` over a blocking socket, written from the send pool.

    :meth:`write` (on the loop, never blocking) queues bytes; one pool job at a time writes everything
    queued, in order, joined into one ``sendall``. :meth:`call` queues a function (simple-websocket's
    ``send`` or ``close``) in the same order, so a close goes out after the frames written before it.
    Past `high` bytes queued the writer is not writable until the queue drains (the driver waits, and its
    slow-consumer timer runs meanwhile). A failed write makes it `closing`: queued bytes are dropped,
    queued functions still run (they handle a closed socket themselves).
    """

    HIGH = 64 * 1024  # bytes queued before the driver is held back (asyncio's default high-water mark)

    def __init__(self, sock: socket.socket | SharedSocket, loop: asyncio.AbstractEventLoop, pool: ThreadPoolExecutor,
                 high: int = HIGH) -> None:
        self.closing = False
        self._sock = sock
        try:  # (gunicorn sets it on its listening socket; werkzeug's server does not)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a small frame waits for no ACK
        except OSError:  # not TCP (a Unix socket)
            pass
        self._loop = loop
        self._pool = pool
        self._high = high
        self._lock = threading.Lock()
        self._queue: deque[Any] = deque()  # bytes, or (function, args, concurrent Future)
        self._size = 0  # bytes queued or being written
        self._busy = False  # a pool job is writing
        self._writable = asyncio.Event()  # (the loop's: set and cleared on the loop only)
        self._writable.set()
        self.is_writable = self._writable.is_set

    def write(self, data: bytes) -> None:
        """Queue `data` (whole frames) for the socket; called on the loop, never blocks."""
        if not self.closing:
            self._enqueue(data, len(data))

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in the send pool after everything queued so far; awaitable on the loop."""
        done: Future[Any] = Future()
        self._enqueue((fn, args, done), 0)
        return asyncio.wrap_future(done, loop=self._loop)

    def _enqueue(self, item: Any, size: int) -> None:
        """Queue `item` (`size` bytes to write, 0 for a call) and start a pool job unless one is running."""
        with self._lock:
            self._queue.append(item)
            if size:
                self._size += size
                if self._size >= self._high:
                    self._writable.clear()
            start = not self._busy
            self._busy = True
        if start:
            self._pool.submit(self._run)

    def wait_writable(self) -> Any:
        return self._writable.wait()

    def is_closing(self) -> bool:
        return self.closing

    def lost(self) -> None:
        """The connection is gone (on the loop): nothing more is written, and a waiting writer wakes."""
        self.closing = True
        self._writable.set()

    def _wake(self) -> None:  # on the loop
        if self.closing or self._size < self._high:
            self._writable.set()

    def _run(self) -> None:
        """The pool job: write what is queued, in order, until the queue is empty."""
        queue = self._queue
        while True:
            with self._lock:
                if not queue:
                    self._busy = False
                    return
                item = queue.popleft()
                if type(item) is bytes:
                    chunks = [item]
                    while queue and type(queue[0]) is bytes:
                        chunks.append(queue.popleft())
            if type(item) is not bytes:
                fn, args, done = item
                try:
                    done.set_result(fn(*args))
                except BaseException as exc:
                    done.set_exception(exc)
                continue
            size = sum(map(len, chunks))
            if not self.closing:
                try:
                    self._sock.sendall(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                except OSError:
                    self.closing = True
            with self._lock:
                self._size -= size
                wake = not self._writable.is_set() and (self.closing or self._size < self._high)
            if wake:
                self._loop.call_soon_threadsafe(self._wake)


class ThreadDriver:
    """One connection served from its own (blocking) thread: call :meth:`receive` per frame.

    `send(data)` and `close(code, reason)` write to the socket (blocking); they run in the send pool,
    in order (the driver's send lock keeps one write at a time). With `sock` (the connection's socket,
    with no WebSocket extension in use) and the ``direct_writes`` setting on, the driver frames its output
    itself and a :class:`SocketWriter` writes it; `send` and `close` then run in the writer's order.

    Given `sock`, a connection still open ``close_timeout`` after the driver closed it is shut down: a peer that
    stopped reading otherwise holds a blocked write (the close frame waits behind it), the connection's thread,
    its reader thread and the socket for good. The shutdown fails the blocked write and ends both threads' reads.
    (So the driver waits for :meth:`disconnected`: a :class:`~lowlat_mw.runtime.direct.DropsCloses`.) Pass it as
    a :class:`SharedSocket` that the WebSocket library writes and closes through as well: its frames and the driver's
    then reach the wire in order, and the shutdown never meets a descriptor the library closed meanwhile.
    """

    def __init__(self, endpoint: Endpoint, *, send: Callable[[bytes | str], Any], close: Callable[[int, str], Any],
                 subprotocol: str | None, address: str | None = None,
                 sock: socket.socket | SharedSocket | None = None, **facts: Any) -> None:
        """`address` and `facts` (client, headers, user, extra): as for ConnectionDriver."""
        self.loop = loop = background_loop()
        pool = _send_pool
        assert pool is not None
        if sock is not None and not isinstance(sock, SharedSocket):
            sock = SharedSocket(sock)  # (the driver's own writes and shutdown, in order at least among themselves)
        writer = self.writer = (SocketWriter(sock, loop, pool) if sock is not None and endpoint.settings.direct_writes
                                else None)

        self._sock = sock
        self._close_timeout = endpoint.settings.close_timeout  # (close_within: the driver's own)
        self._drop_at: asyncio.TimerHandle | None = None

        async def asgi_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "websocket.send":
                data = message.get("bytes")
                fn, args = send, (data if data is not None else message["text"],)
            else:
                fn, args = close, (message.get("code", 1000), message.get("reason", ""))
                if sock is not None and self._drop_at is None:
                    self._drop_at = loop.call_later(self._close_timeout, self._drop)
            if writer is not None:
                await writer.call(fn, *args)
            else:
                await loop.run_in_executor(pool, fn, *args)

        async def make() -> ConnectionDriver:
            return ConnectionDriver(endpoint, send=asgi_send, subprotocol=subprotocol, address=address,
                                    direct=writer, closes=self if sock is not None else None, **facts)

        self.driver: ConnectionDriver = self._call(make())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close_within(self, seconds: float) -> None:
        """(DropsCloses, given a socket) Shut the socket down `seconds` after the driver's close."""
        self._close_timeout = seconds

    def _drop(self) -> None:
        """close_timeout after the close (on the loop): shut the socket down unless it is closed (the reader thread
        closes it when the connection ends; SharedSocket: never after that)."""
        self._drop_at = None
        if self._sock is not None:
            self._sock.shutdown(socket.SHUT_RDWR)

    @property
    def closed(self) -> bool:
        """True once the protocol decided to close (the reading thread should stop)."""
        return self.driver.protocol.closed

    def receive(self, data: bytes | str) -> None:
        """Feed one message; returns when it has been handled (backpressure for the reader)."""
        self._call(self.driver.receive(data))

    def disconnected(self, code: int | None = None) -> None:
        """The socket is gone (`code`: the peer's close code): keep the session for resume or end it."""
        self._call(self._disconnected(code))

    async def _disconnected(self, code: int | None) -> None:
        drop, self._drop_at = self._drop_at, None
        if drop is not None:  # (it held this connection's objects for close_timeout after every close)
            drop.cancel()
        if self.writer is not None:
            self.writer.lost()
        await self.driver.disconnected(code)


def drain_all_sync(grace: float | None = None, reconnect_after_ms: int = 0) -> None:
    """:func:`~lowlat_mw.runtime.drain.drain_all` for the thread-driven connections (a server shutting down;
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
