"""A TCP proxy that can cut, stall, delay and throttle connections (for fault-injection tests).

It runs its own event loop in a daemon thread so sync and async tests can both use it.

``delay`` is one-way latency, added in each direction: every chunk read from one side is stamped
with the time it is due (its arrival + ``delay``) and a separate writer forwards the chunks in
order, each when it is due. So the link holds up to ``delay`` worth of data in flight as a long
link does, and the delay does not turn into a bandwidth limit (up to :data:`MAX_IN_FLIGHT` bytes
may be in flight per direction; beyond that the proxy stops reading, as a full TCP window would).
A userspace proxy accepts a TCP connection at once, while over a real link ``connect()`` returns
after one round trip: with ``handshake=True`` (the default) a new connection's first client bytes
are therefore held for one extra round trip (2 x ``delay``), so a new connection costs what it
would over the delayed link. ``bandwidth`` (bytes per second per direction) serializes the chunks
after their delay.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import random
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_IN_FLIGHT", "FaultProxy"]

MAX_IN_FLIGHT = 16 * 1024 * 1024
"""Bytes a direction may hold in flight (read, not yet forwarded) while a delay is set."""

_READ_SIZE = 65536


class _Pipe:
    """One direction's chunks in flight, in order: (due time, bytes); b"" marks the end of the stream."""

    def __init__(self) -> None:
        self.chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self.pending = 0                  # bytes read and not yet written + drained
        self.queued = asyncio.Event()     # set when a chunk is appended
        self.progress = asyncio.Event()   # set when pending went down or the writer stopped
        self.writer_done = False

    def push(self, due: float, data: bytes) -> None:
        self.chunks.append((due, data))
        self.pending += len(data)
        self.queued.set()

    def wake(self) -> None:
        self.queued.set()
        self.progress.set()


class _Link:
    """One proxied connection: client <-> upstream."""

    def __init__(self, proxy: FaultProxy, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.cr, self.cw = cr, cw
        self.uw: asyncio.StreamWriter | None = None
        self.down_bytes = 0  # server -> client bytes forwarded
        self.up_bytes = 0
        self.cut_at: int | None = proxy._next_cut()
        self.closed = False
        self.task: asyncio.Task[Any] | None = None
        self.pipes: list[_Pipe] = []
        # Client bytes are not due upstream before the emulated TCP handshake is over.
        self.ready_at = asyncio.get_running_loop().time() + (2 * proxy.delay if proxy.handshake else 0.0)

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        for pipe in self.pipes:
            pipe.wake()
        for w in (self.cw, self.uw):
            if w is not None:
                try:
                    w.transport.abort()
                except Exception:
                    pass

    async def run(self) -> None:
        try:
            ur, uw = await asyncio.open_connection(*self.proxy.target)
        except OSError:
            self.abort()
            return
        self.uw = uw
        try:
            await asyncio.gather(self._pump(self.cr, uw, up=True), self._pump(ur, self.cw, up=False))
        finally:
            self.abort()
            self.proxy._links.discard(self)

    def _due(self, up: bool) -> float:
        now = asyncio.get_running_loop().time()
        if up and now < self.ready_at:
            now = self.ready_at
        return now + self.proxy.delay

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool) -> None:
        """Forward one direction: a reader task stamps chunks, this task writes them when due."""
        pipe = _Pipe()
        self.pipes.append(pipe)
        reading = asyncio.ensure_future(self._read_side(reader, pipe, up=up))
        try:
            await self._write_side(writer, pipe, up=up)
        finally:
            reading.cancel()
            await asyncio.wait([reading])
            if not reading.cancelled():
                reading.exception()  # retrieved: the link is over either way

    async def _read_side(self, reader: asyncio.StreamReader, pipe: _Pipe, *, up: bool) -> None:
        proxy = self.proxy
        try:
            while not self.closed and not pipe.writer_done:
                data = await reader.read(_READ_SIZE)
                if not data or self.closed or pipe.writer_done:
                    break
                while not proxy._flowing.is_set():
                    await proxy._flowing_async.wait()
                pipe.push(self._due(up), data)
                # Without a delay, read the next chunk only once this one is forwarded (backpressure
                # as from a plain relay); with one, keep up to MAX_IN_FLIGHT bytes in the pipe.
                while pipe.pending > (MAX_IN_FLIGHT if proxy.delay > 0 else 0):
                    if self.closed or pipe.writer_done:
                        return
                    pipe.progress.clear()
                    await pipe.progress.wait()
        except (ConnectionError, OSError):
            pass
        pipe.push(self._due(up), b"")  # the end of the stream (FIN) crosses the link like data

    async def _write_side(self, writer: asyncio.StreamWriter, pipe: _Pipe, *, up: bool) -> None:
        proxy = self.proxy
        loop = asyncio.get_running_loop()
        try:
            while not self.closed:
                if not pipe.chunks:
                    pipe.queued.clear()
                    await pipe.queued.wait()
                    continue
                due, data = pipe.chunks[0]
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                while not proxy._flowing.is_set():
                    await proxy._flowing_async.wait()
                if self.closed:
                    break
                pipe.chunks.popleft()
                if not data:
                    break
                if up and proxy.upload_limit is not None and self.up_bytes + len(data) > proxy.upload_limit:
                    proxy.cuts += 1  # (as a server or proxy that refuses a message that big by dropping the link)
                    self.abort()
                    return
                if not up and self.cut_at is not None and self.down_bytes + len(data) >= self.cut_at:
                    keep = max(0, self.cut_at - self.down_bytes)
                    if keep:
                        writer.write(data[:keep])
                        await writer.drain()
                    proxy.cuts += 1
                    self.abort()
                    return
                if proxy.bandwidth:
                    await asyncio.sleep(len(data) / proxy.bandwidth)
                writer.write(data)
                await writer.drain()
                if up:
                    self.up_bytes += len(data)
                else:
                    self.down_bytes += len(data)
                pipe.pending -= len(data)
                pipe.progress.set()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            pipe.writer_done = True
            pipe.progress.set()
            if not self.closed:
                try:
                    writer.write_eof()
                except (OSError, RuntimeError):
                    pass


class FaultProxy:
    """Forwards 127.0.0.1:port to `target`, with knobs to break the link on purpose.

    `delay`: seconds of one-way latency added in each direction (a round trip gains 2 x delay);
    `bandwidth`: bytes per second per direction (0: unlimited); `handshake`: make a new
    connection's first client bytes wait one extra round trip, as a TCP handshake over the
    delayed link would. `delay` and `bandwidth` may be changed at any time.
    """

    def __init__(self, target: tuple[str, int], *, seed: int | None = None, delay: float = 0.0,
                 bandwidth: float = 0.0, handshake: bool = True) -> None:
        host = target[0]
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise ValueError("FaultProxy only forwards to loopback addresses")
        if delay < 0 or bandwidth < 0:
            raise ValueError("delay and bandwidth must be >= 0")
        self.target = target
        self.delay = float(delay)          # seconds added to each forwarded chunk, in each direction
        self.bandwidth = float(bandwidth)  # bytes per second per direction (0 = unlimited)
        self.handshake = handshake         # new connections pay one round trip before their first bytes
        self.cuts = 0             # how many connections were cut by cut_after / cut_randomly / cut_uploads_over
        self.upload_limit: int | None = None  # client bytes a connection may send before it is cut
        self.connections = 0
        self.rng = random.Random(seed)
        self._cut_rule: Callable[[], int | None] = lambda: None
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._flowing = threading.Event()
        self._flowing.set()
        self._flowing_async: asyncio.Event
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="lowlat-fault-proxy", daemon=True)
        self._thread.start()
        try:
            self.port = self._call(self._start())
        except BaseException:
            self._stop_loop()
            raise

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> FaultProxy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _start(self) -> int:
        self._flowing_async = asyncio.Event()
        self._flowing_async.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.connections += 1
        link = _Link(self, cr, cw)
        link.task = asyncio.current_task()
        self._links.add(link)
        try:
            await link.run()
        except asyncio.CancelledError:  # close(): end quietly (asyncio logs a cancelled handler task as an error)
            pass

    def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._loop.is_closed():
            return

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = []
            for link in list(self._links):
                link.abort()
                if link.task is not None and not link.task.done():
                    link.task.cancel()
                    tasks.append(link.task)
            if tasks:
                await asyncio.wait(tasks, timeout=2.0)

        try:
            self._call(stop())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.close()

    @property
    def url_base(self) -> str:
        """``ws://127.0.0.1:<port>``."""
        return f"ws://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ faults
    def _next_cut(self) -> int | None:
        return self._cut_rule()

    def cut_after(self, nbytes: int | None) -> None:
        """Cut each NEW connection after `nbytes` bytes from the server (None: never)."""
        self._cut_rule = lambda: nbytes

    def cut_randomly(self, low: int, high: int) -> None:
        """Cut each new connection after a random number of server bytes in [low, high]."""
        self._cut_rule = lambda: self.rng.randint(low, high)

    def cut_uploads_over(self, nbytes: int | None) -> None:
        """Cut each connection whose client sends more than `nbytes` bytes in all (None: never), before they are
        forwarded, as a server or proxy with a message size limit that drops the connection does."""
        self.upload_limit = nbytes

    def cut_all(self) -> None:
        """Drop every open connection at once (as a crashed network would)."""

        async def cut() -> None:
            for link in list(self._links):
                link.abort()

        self._call(cut())

    def stall(self) -> None:
        """Stop forwarding in both directions (bytes queue up in the kernel buffers)."""
        self._flowing.clear()
        self._loop.call_soon_threadsafe(self._flowing_async.clear)

    def resume(self) -> None:
        """Forward again after :meth:`stall`."""
        self._flowing.set()
        self._loop.call_soon_threadsafe(self._flowing_async.set)

    def open_links(self) -> int:
        """How many connections are open through the proxy."""
        return len(self._links)

    def wait_for_links(self, n: int, timeout: float = 5.0) -> bool:
        """Wait until at least `n` connections are open."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self._links) >= n:
                return True
            time.sleep(0.01)
        return False
