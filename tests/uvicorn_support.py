"""A real uvicorn, in the test's own event loop, serving lowlat-mw's middleware on a loopback socket.

For tests that look inside the server while a raw client talks to it over a real socket: the
``lowlat.transport`` extension each connection was offered, the middleware's metrics, Python's
allocations (tracemalloc sees server and client alike).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path
from typing import Any

from support.time import seconds
from support.waits import wait_until

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ (its raw client) is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.soak import Conn, client_frame  # noqa: E402
from lowlat_mw.protocol import events as ev  # noqa: E402
from lowlat_mw.runtime.direct import EXTENSION  # noqa: E402

__all__ = ["WAIT", "Conn", "InProcessServer", "client_frame"]

WAIT = seconds(30.0)  # generous: a loaded CI machine


async def echo(req: Any) -> Any:
    yield req.text


class InProcessServer:
    """uvicorn with lowlat-mw's HTTP and WebSocket protocols (``ws``: "websockets" or "wsproto") and the Starlette
    middleware at /ws (`settings`), serving `model`; with `record`, keeps the ``lowlat.transport`` extension
    each connection was offered (``offered``: which keeps the connection's objects alive). With `plain`, uvicorn's
    own protocols instead (``--ws websockets-sansio`` or ``wsproto``, no lowlat-mw shim): as a user running plain
    uvicorn, gunicorn's UvicornWorker or another ASGI server has it. ``returned`` counts the WebSocket scopes whose
    application call returned."""

    def __init__(self, model: Any = echo, ws: str = "websockets", record: bool = False, plain: bool = False,
                 **settings: Any) -> None:
        import uvicorn
        from prometheus_client import CollectorRegistry
        from starlette.applications import Starlette

        from lowlat_mw.adapters.starlette import LowLatMiddleware
        from lowlat_mw.servers.uvicorn import HttpToolsProtocol, WebSocketProtocol, WSProtoProtocol

        self.registry = CollectorRegistry()
        inner = LowLatMiddleware(Starlette(), model=model, path="/ws", registry=self.registry, **settings)
        self.middleware = inner
        self.offered: list[Any] = []
        self.returned = 0

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "websocket":
                await inner(scope, receive, send)
                return
            if record:
                self.offered.append((scope.get("extensions") or {}).get(EXTENSION))
            await inner(scope, receive, send)
            self.returned += 1

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        protocol: Any = WSProtoProtocol if ws == "wsproto" else WebSocketProtocol
        http: Any = HttpToolsProtocol
        if plain:
            protocol, http = ("wsproto" if ws == "wsproto" else "websockets-sansio"), "auto"
        config = uvicorn.Config(app, http=http, ws=protocol, lifespan="off", log_level="warning",
                                ws_ping_interval=None, ws_per_message_deflate=False)
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> InProcessServer:
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        await wait_until(lambda: self.server.started, WAIT, interval=0.01, what="uvicorn to start")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        assert self.task is not None
        await asyncio.wait_for(self.task, WAIT)
        self.sock.close()

    def samples(self, metric: str, suffix: str = "_count") -> float:
        """The sum of `metric`'s samples whose name ends with `suffix`."""
        return sum(s.value for m in self.registry.collect() if m.name == metric
                   for s in m.samples if s.name.endswith(suffix))

    async def connect(self, hello: ev.Hello | None = None) -> tuple[Conn, ev.Welcome]:
        """A WebSocket on /ws (proto subprotocol), Hello sent, Welcome read."""
        return await Conn.open(self.port, hello or ev.Hello())
