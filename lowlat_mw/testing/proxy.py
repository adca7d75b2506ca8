"""A TCP proxy that can cut, stall, delay and throttle connections (for fault-injection tests).

It runs its own event loop in a daemon thread so sync and async tests can both use it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["FaultProxy"]


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

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
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

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool) -> None:
        proxy = self.proxy
        try:
            while not self.closed:
                data = await reader.read(65536)
                if not data:
                    break
                while not proxy._flowing.is_set():
                    await proxy._flowing_async.wait()
                if not up and self.cut_at is not None and self.down_bytes + len(data) >= self.cut_at:
                    keep = max(0, self.cut_at - self.down_bytes)
                    if keep:
                        writer.write(data[:keep])
                        await writer.drain()
                    proxy.cuts += 1
                    self.abort()
                    return
                if proxy.delay:
                    await asyncio.sleep(proxy.delay)
                if proxy.bandwidth:
                    await asyncio.sleep(len(data) / proxy.bandwidth)
                writer.write(data)
                await writer.drain()
                if up:
                    self.up_bytes += len(data)
                else:
                    self.down_bytes += len(data)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            if not self.closed:
                try:
                    writer.write_eof()
                except (OSError, RuntimeError):
                    pass


class FaultProxy:
    """Forwards 127.0.0.1:port to `target`, with knobs to break the link on purpose."""

    def __init__(self, target: tuple[str, int], *, seed: int | None = None) -> None:
        host = target[0]
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise ValueError("FaultProxy only forwards to loopback addresses")
        self.target = target
        self.delay = 0.0          # seconds added to each forwarded chunk, both directions
        self.bandwidth = 0.0      # bytes per second per direction (0 = unlimited)
        self.cuts = 0             # how many connections were cut by cut_after / cut_randomly
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
        self.port = self._call(self._start())

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
        self._links.add(link)
        await link.run()

    def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._loop.is_closed():
            return

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                link.abort()

        try:
            self._call(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
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
