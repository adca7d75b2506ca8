"""Helpers for the delivery-guarantee tests: counting models, an endpoint we keep a handle on,
and running coroutines on the uvicorn server's own event loop (drain)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.routing import WebSocketRoute

from lowlat_mw.endpoint import Endpoint
from lowlat_mw.model import ModelRequest
from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.testing import FaultProxy


def tokens(n: int) -> list[str]:
    """What the counting models produce for `n`: "0,", "1,", ..."""
    return [f"{i}," for i in range(n)]


def split_tokens(text: str) -> list[str]:
    """The numbers of a counting model's reply, in the order received ("0,1,2," -> ["0,", "1,", "2,"])."""
    return [t + "," for t in text.split(",")[:-1]]


@dataclass
class Probe:
    """What the models did: chunks produced per stream, how many started and how many ran `finally`.

    Sync generators run in worker threads, so every counter is updated under a lock.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    produced: dict[tuple[str, int], int] = field(default_factory=dict)
    started: int = 0
    finalized: int = 0
    cancel_marks: dict[tuple[str, int], int] = field(default_factory=dict)

    def begin(self, req: ModelRequest) -> tuple[str, int]:
        key = (req.session.session_id, req.stream_id)
        with self.lock:
            self.started += 1
            self.produced[key] = 0
        return key

    def count(self, key: tuple[str, int]) -> None:
        with self.lock:
            self.produced[key] += 1

    def end(self) -> None:
        with self.lock:
            self.finalized += 1

    @property
    def running(self) -> int:
        """Models whose generator has not run its `finally` yet."""
        with self.lock:
            return self.started - self.finalized

    def total(self) -> int:
        with self.lock:
            return sum(self.produced.values())

    def only_stream(self) -> int:
        """Chunks produced by the one stream this probe saw."""
        with self.lock:
            assert len(self.produced) == 1, self.produced
            return next(iter(self.produced.values()))


def counting_models(probe: Probe) -> dict[str, Callable[[ModelRequest], Any]]:
    """Models yielding "0,", "1,", ... ``params["n"]`` tokens (optional ``params["size"]`` pads each).

    * ``count``      async generator, ``await asyncio.sleep(0)`` every 8 tokens; sleeps
                     ``params["pause"]`` seconds before token ``params["pause_at"]``
    * ``count_sync`` sync generator (runs in the model thread pool)
    * ``slow``       async generator sleeping ``params["delay"]`` seconds per token
    """

    def pad(i: int, size: int) -> str:
        tok = f"{i},"
        return tok if size <= len(tok) else tok + "." * (size - len(tok))

    async def count(req: ModelRequest):  # type: ignore[no-untyped-def]
        key = probe.begin(req)
        n, size = int(req.params.get("n", 500)), int(req.params.get("size", 0))
        pause_at, pause = int(req.params.get("pause_at", -1)), float(req.params.get("pause", 0))
        try:
            for i in range(n):
                if i == pause_at:
                    await asyncio.sleep(pause)
                probe.count(key)
                yield pad(i, size)
                if i % 8 == 7:
                    await asyncio.sleep(0)
        finally:
            probe.end()

    def count_sync(req: ModelRequest):  # type: ignore[no-untyped-def]
        key = probe.begin(req)
        n, size = int(req.params.get("n", 500)), int(req.params.get("size", 0))
        delay = float(req.params.get("delay", 0))
        try:
            for i in range(n):
                probe.count(key)
                yield pad(i, size)
                if delay:
                    time.sleep(delay)
        finally:
            probe.end()

    async def slow(req: ModelRequest):  # type: ignore[no-untyped-def]
        key = probe.begin(req)
        n, delay = int(req.params.get("n", 500)), float(req.params.get("delay", 0.01))
        try:
            for i in range(n):
                probe.count(key)
                yield f"{i},"
                await asyncio.sleep(delay)
        finally:
            probe.end()

    return {"count": count, "count_sync": count_sync, "slow": slow}


class LoopRecorder:
    """ASGI wrapper that remembers the server's event loop (to run ``endpoint.drain`` on it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.loop = asyncio.get_running_loop()
        await self.app(scope, receive, send)


@dataclass
class Served:
    """A uvicorn server running a Starlette app whose ``/ws`` route is a LowLatASGI app serving `endpoint`."""

    srv: Any  # conftest.RunningServer
    endpoint: Endpoint
    app: LoopRecorder
    probe: Probe

    @property
    def port(self) -> int:
        return self.srv.port

    async def on_server_loop(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        """Run `coro` on the server's event loop and await its result from the test's loop."""
        assert self.app.loop is not None, "no connection reached the server yet"
        fut = asyncio.run_coroutine_threadsafe(coro, self.app.loop)
        async with asyncio.timeout(timeout):
            return await asyncio.wrap_future(fut)

    def live_sessions(self) -> int:
        return len(self.endpoint.store)  # type: ignore[arg-type]

    def detached(self) -> int:
        """Sessions stored with no connection attached (waiting for a resume)."""
        items = getattr(self.endpoint.store, "_items", {})
        return sum(1 for live in list(items.values()) if live.driver is None)

    def paused(self) -> int:
        """Models of every session still stored that wait for their window (or, detached, the replay buffer)."""
        items = getattr(self.endpoint.store, "_items", {})
        return sum(live.waiting for live in list(items.values()))

    def closing_with(self) -> list[int]:
        """The close codes the server chose for its connections still open (it closed them; the peer has not
        taken the close yet)."""
        return [c.protocol.close_code for c in list(self.endpoint.connections) if c.protocol.close_code is not None]

    def model_tasks(self) -> int:
        """Model tasks of every session still stored."""
        items = getattr(self.endpoint.store, "_items", {})
        return sum(len(live.tasks) for live in list(items.values()))


def serve(uvicorn_server: Callable[..., Any], probe: Probe | None = None, *, port: int = 0,
          ws: str = "websockets-sansio", **settings: Any) -> Served:
    """Start a server with the counting models and `settings`; keep a handle on its endpoint."""
    probe = probe or Probe()
    asgi = LowLatASGI(counting_models(probe), **settings)
    app = LoopRecorder(Starlette(routes=[WebSocketRoute("/ws", asgi)]))
    srv = uvicorn_server(app, port=port, ws=ws)
    return Served(srv=srv, endpoint=asgi.endpoint, app=app, probe=probe)


def cut_schedule(proxy: FaultProxy, sizes: list[int | None]) -> None:
    """Cut the next new connections after sizes[0], sizes[1], ... server bytes; later ones never.

    (FaultProxy's public rules apply one size or one random range to every new connection.)
    """
    it = iter(sizes)
    proxy._cut_rule = lambda: next(it, None)


def rss_kib() -> int:
    """This process's resident set size in KiB (Linux /proc)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")
