"""A raw ASGI application serving the lowlat-mw protocol on WebSocket scopes.

ASGI is a specification, not a framework: this module imports none. The Starlette/FastAPI
middleware mounts it at a path; any ASGI server or router can mount it directly.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, ClassVar

from ..errors import CloseCode
from ..model import ModelFn, Models, ModelSpec, SessionInfo, shared_executor
from ..observability.metrics import Metrics
from ..protocol.limits import ConnectionLimiter
from ..protocol.session import MemorySessionStore, SessionStore
from ..security import check_handshake
from ..settings import Settings
from .aio import AsyncServerSession, drain_each

__all__ = [
    "LowLatASGI",
    "asgi_session",
    "check_scope",
    "client_address",
    "drain_all",
    "refuse",
    "session_info_from_scope",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("lowlat_mw")


def session_info_from_scope(scope: Scope, session_id: str, subprotocol: str | None) -> SessionInfo:
    """Connection facts for the model from an ASGI websocket scope."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    client = scope.get("client")
    return SessionInfo(
        session_id=session_id,
        subprotocol=subprotocol,
        client=tuple(client) if client else None,  # type: ignore[arg-type]
        headers=headers,
        user=scope.get("user"),
        extra={"path": scope.get("path", ""), "query_string": scope.get("query_string", b"").decode("latin-1")},
    )


def client_address(scope: Scope) -> str | None:
    """The client's address from an ASGI scope (for per-client limits)."""
    client = scope.get("client")
    return str(client[0]) if client else None


def check_scope(scope: Scope, settings: Settings) -> tuple[bool, str | None]:
    """(accept?, subprotocol) for an ASGI websocket scope (see security.check_handshake)."""
    headers = dict(scope.get("headers") or ())
    origin = headers.get(b"origin")
    host = headers.get(b"host")
    return check_handshake(
        scope.get("subprotocols") or (),
        origin.decode("latin-1") if origin is not None else None,
        host.decode("latin-1") if host is not None else None,
        settings,
    )


def asgi_session(
    scope: Scope,
    send: Send,
    *,
    model: ModelFn | Models,
    settings: Settings,
    subprotocol: str | None,
    store: SessionStore | None = None,
    metrics: Metrics | None = None,
) -> AsyncServerSession:
    """An AsyncServerSession that writes through an ASGI `send` (after websocket.accept)."""

    async def send_frame(data: bytes | str) -> None:
        if isinstance(data, bytes):
            await send({"type": "websocket.send", "bytes": data})
        else:
            await send({"type": "websocket.send", "text": data})

    async def close(code: int, reason: str) -> None:
        # A plain int: servers may check type(code) is int (daphne/autobahn refuse an IntEnum).
        await send({"type": "websocket.close", "code": int(code), "reason": reason})

    session = AsyncServerSession(
        model=model, settings=settings, send=send_frame, close=close,
        subprotocol=subprotocol, executor=shared_executor(settings.model_threads), store=store, metrics=metrics,
    )
    session.info = session_info_from_scope(scope, session.conn.session_id, subprotocol)
    return session


async def refuse(send: Send) -> None:
    """Refuse a websocket handshake before accept: ASGI servers answer with HTTP 403."""
    await send({"type": "websocket.close", "code": int(CloseCode.POLICY_VIOLATION)})


class LowLatASGI:
    """ASGI app: accepts the WebSocket, negotiates the subprotocol and runs a session."""

    instances: ClassVar[weakref.WeakSet[LowLatASGI]] = weakref.WeakSet()  # for drain_all()

    def __init__(self, model: ModelSpec, *, settings: Settings | None = None, registry: Any = None,
                 **options: Any) -> None:
        """`registry`: the prometheus_client CollectorRegistry for metrics (default: the global one)."""
        self.model = Models(model)
        self.settings = settings.replace(**options) if settings is not None else Settings.load(options)
        self.metrics = Metrics.for_registry(registry) if self.settings.metrics else None
        self._metrics_app: Any = None
        self.store: SessionStore = MemorySessionStore()  # sessions waiting to be resumed
        self.connections: weakref.WeakSet[AsyncServerSession] = weakref.WeakSet()
        self.limiter = ConnectionLimiter(self.settings.max_connections, self.settings.max_connections_per_client)
        self.draining = False
        LowLatASGI.instances.add(self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await send({"type": "http.response.start", "status": 426,
                        "headers": [(b"content-type", b"text/plain"), (b"upgrade", b"websocket")]})
            await send({"type": "http.response.body", "body": b"WebSocket endpoint (lowlat-mw)\n"})
            return
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        ok, subprotocol = check_scope(scope, self.settings)
        if not ok:
            self._refused("forbidden")
            await refuse(send)
            return
        await send({"type": "websocket.accept", "subprotocol": subprotocol})
        if self.draining:
            self._refused("draining")
            # Not a 403 (clients treat that as final): 4002 tells them to retry, which reaches the
            # server that replaces this one.
            await send({"type": "websocket.close", "code": int(CloseCode.DRAINING), "reason": "server draining"})
            return
        client = client_address(scope)
        refused = self.limiter.acquire(client)
        if refused is not None:
            log.warning("refused connection from %s: %s", client, refused, extra={"client": client})
            self._refused("limit")
            await send({"type": "websocket.close", "code": int(CloseCode.TRY_AGAIN_LATER), "reason": refused[:120]})
            return
        try:
            await self._serve(scope, receive, send, subprotocol)
        finally:
            self.limiter.release(client)

    def _refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.inc("handshakes_refused", reason)

    async def serve_metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI app answering a Prometheus scrape of this endpoint's registry (404 with metrics off)."""
        if self.metrics is None:
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"metrics are off (setting metrics=False)\n"})
            return
        if self._metrics_app is None:
            from prometheus_client import make_asgi_app

            self._metrics_app = make_asgi_app(self.metrics.registry)
        await self._metrics_app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, subprotocol: str | None) -> None:
        session = asgi_session(scope, send, model=self.model, settings=self.settings, subprotocol=subprotocol,
                               store=self.store, metrics=self.metrics)
        self.connections.add(session)
        session.start()
        code: int | None = None
        try:
            while True:
                message = await receive()
                kind = message["type"]
                if kind == "websocket.receive":
                    data = message.get("bytes")
                    await session.receive(data if data is not None else message.get("text") or "")
                    # Servers queue every frame of a TCP read, and neither receive() nor send() yields
                    # while frames are queued: without this, a flooding client would hold the event
                    # loop for thousands of frames at a time and stall every other connection.
                    await asyncio.sleep(0)
                elif kind == "websocket.disconnect":
                    code = message.get("code")
                    break
        finally:
            await session.disconnected(code)

    async def drain(self, grace: float | None = None, reconnect_after_ms: int = 0) -> None:
        """Graceful shutdown: refuse new connections, GoAway to every open one, let running
        streams finish for up to `grace` seconds (default: the ``drain_grace`` setting), then close
        them with 4002 (clients reconnect)."""
        self.draining = True
        await drain_each(list(self.connections), grace, reconnect_after_ms)


async def drain_all(grace: float | None = None, reconnect_after_ms: int = 0) -> None:
    """Drain every lowlat-mw endpoint of this process (call on shutdown, before the server closes sockets)."""
    endpoints = list(LowLatASGI.instances)
    if endpoints:
        await asyncio.gather(*(e.drain(grace, reconnect_after_ms) for e in endpoints), return_exceptions=True)
