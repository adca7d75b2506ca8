"""lowlat-mw as a plain ASGI application or middleware (ASGI is a specification, not a framework).

:class:`LowLatASGI` serves the protocol on WebSocket scopes through the asyncio driver: the
Starlette/FastAPI middleware is this class, ``lowlat-mw serve`` mounts it over a home page, and any
ASGI server or router can mount it directly. Given an inner `app`, it is a middleware: it takes the
WebSocket scopes at the ``path`` setting, HTTP requests for ``metrics_path`` (a Prometheus scrape)
and under ``client_path`` (the browser client and demo page), and passes everything else on. With
``dialects`` it also serves other wire protocols (protocol/dialect.py), each at its own path (or at ``path``
beside lowlat.v1, told apart by the subprotocol the client offers), on the same engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from .. import static_files as static
from ..asyncapi import asyncapi_json
from ..endpoint import Endpoint, Refuse
from ..errors import CloseCode, SettingsError
from ..model import ModelSpec
from ..protocol.dialect import LOWLAT_V1, Dialect, pick
from ..settings import Settings
from .connection import ConnectionDriver
from .direct import EXTENSION
from .drain import drain_all
from .shared import open_endpoint

__all__ = ["LowLatASGI", "accept", "cut_streams"]

log = logging.getLogger("lowlat_mw")
_JSON_NO_STORE = (("content-type", "application/json"), ("cache-control", "no-store"))

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class LowLatASGI:
    """ASGI app serving lowlat-mw on WebSocket scopes; with `app`, a middleware in front of it."""

    defer_build_errors = False
    """True for a middleware that frameworks build lazily (Starlette's add_middleware): a mistake found while the
    server runs then fails the lifespan start-up instead of raising (see __init__). Routes and endpoints raise."""

    def __init__(self, model: ModelSpec, *, app: ASGIApp | None = None, settings: Settings | None = None,
                 registry: Any = None, dialects: Mapping[str, Dialect | Sequence[Dialect]] | None = None,
                 **options: Any) -> None:
        """Settings as keyword arguments (or ``settings=``, with keyword arguments on top); `registry`: the
        prometheus_client CollectorRegistry for the metrics (default: the global one); `dialects`: path -> the
        dialect (or dialects, picked by subprotocol) served there besides lowlat.v1 at ``path``."""
        self.app = app
        self.dialects: dict[str, tuple[Dialect, ...]] = {
            at: (served,) if isinstance(served, Dialect) else tuple(served) for at, served in (dialects or {}).items()}
        self._metrics_app: Any = None
        self.failed: Exception | None = None
        """Why this app could not be built, when that was found while the server runs (see below)."""
        self._reported = False  # `failed` is in the log or the lifespan start-up's failure
        try:
            settings = settings.replace(**options) if settings is not None else Settings.load(options)
            self.endpoint = open_endpoint(model, settings, registry=registry)
        except Exception as exc:
            if not (self.defer_build_errors and _serving()):
                raise
            # Built inside the server's first ASGI call (Starlette and FastAPI build their middleware stack
            # lazily, in the lifespan call): raising now would only make uvicorn log "lifespan unsupported" at
            # INFO and answer 500 to every request. Fail the lifespan start-up instead, which stops the server.
            self.failed = exc
            if not isinstance(exc, SettingsError | ImportError):  # a traceback to show (the others are one line,
                log.error("lowlat-mw cannot start: %s", exc, exc_info=True)  # which _refuse reports once)
                self._reported = True

    async def drain(self, grace: float | None = None, reconnect_after_ms: int = 0) -> None:
        """Graceful shutdown of this endpoint (see :meth:`lowlat_mw.endpoint.Endpoint.drain`)."""
        if self.failed is None:
            await self.endpoint.drain(grace, reconnect_after_ms)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.failed is not None:
            await self._refuse(scope, receive, send)
            return
        kind = scope["type"]
        app = self.app
        settings = self.endpoint.settings
        if kind == "websocket":
            path = scope["path"]
            ours = path in (settings.path, scope.get("root_path", "") + settings.path)
            if self.dialects:
                at = self._dialects_at(path, scope.get("root_path", ""))
                if at:
                    await self.serve(scope, receive, send, (*at, LOWLAT_V1) if ours else at)
                    return
            if app is None or ours:
                await self.serve(scope, receive, send)
                return
        elif kind == "http":
            if settings.metrics_path and scope["path"] == settings.metrics_path:
                await self.serve_metrics(scope, receive, send)
                return
            if settings.asyncapi_path and scope["path"] == settings.asyncapi_path:
                await self.serve_asyncapi(scope, send)
                return
            if settings.health_path and scope["path"] == settings.health_path:
                status, report = self.endpoint.health()
                await static.send_asgi(static.StaticResponse(status, _JSON_NO_STORE, json.dumps(report).encode()),
                                       send)
                return
            if settings.client_path and (response := static.asgi_respond(scope, settings)) is not None:
                await static.send_asgi(response, send)
                return
            if app is None:
                await send({"type": "http.response.start", "status": 426,
                            "headers": [(b"content-type", b"text/plain"), (b"upgrade", b"websocket")]})
                await send({"type": "http.response.body", "body": b"WebSocket endpoint (lowlat-mw)\n"})
                return
        elif kind == "lifespan" and app is not None and settings.shares_sessions:
            # Shared sessions: a server whose connections were all gone by the time it shut down (uvicorn drains on
            # each connection's shutdown) still lets the models of clients that left run on within drain_grace, for
            # the process that relays them to their client now, and writes their last output.
            async def receive_then_drain() -> Message:
                message = await receive()
                if message["type"] == "lifespan.shutdown":
                    await drain_all()
                return message

            await app(scope, receive_then_drain, send)
            return
        if app is not None:
            await app(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Not built (:attr:`failed`): the lifespan start-up fails with the reason (uvicorn and hypercorn then
        exit); where the server runs no lifespan, WebSocket handshakes are refused (HTTP 403) and the rest is
        served."""
        kind = scope["type"]
        if kind == "lifespan":
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._reported = True  # (the server reports it, and stops)
                await send({"type": "lifespan.startup.failed", "message": f"lowlat-mw cannot start: {self.failed}"})
            return
        if kind == "websocket" or not self._reported:  # a server without lifespan: in its log (for HTTP, once)
            self._reported = True
            log.error("lowlat-mw cannot start: %s", self.failed)
        if kind != "websocket" and self.app is not None:
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await receive()  # websocket.connect
            # (closed before accepting: the server answers the handshake with HTTP 403)
            await send({"type": "websocket.close", "code": CloseCode.INTERNAL_ERROR})
            return
        await static.send_asgi(static.StaticResponse(500, (("content-type", "text/plain"),),
                                                     b"lowlat-mw cannot start: see the server's log\n"), send)

    async def serve_asyncapi(self, scope: Scope, send: Send) -> None:
        """Answer an HTTP request with the endpoint's AsyncAPI document (JSON), its server the request's host."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or ()}
        scheme = "wss" if scope.get("scheme") == "https" else "ws"
        host = headers.get("host")
        body = asyncapi_json(self.endpoint.settings, f"{scheme}://{host}" if host else None)
        await static.send_asgi(static.StaticResponse(
            200, (("content-type", "application/json"), ("access-control-allow-origin", "*")), body), send)

    def _dialects_at(self, path: str, root_path: str) -> tuple[Dialect, ...]:
        """The dialects served at `path` (with or without the scope's `root_path`), in the order given."""
        found = self.dialects.get(path)
        if found is None and root_path and path.startswith(root_path):
            found = self.dialects.get(path[len(root_path):])
        return found or ()

    async def serve(self, scope: Scope, receive: Receive, send: Send, dialects: Sequence[Dialect] = ()) -> None:
        """Serve one WebSocket scope: admission, then the connection until the socket is gone (`dialects`: those
        served at its path, picked by the subprotocol offered; none: lowlat.v1)."""
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        driver = await accept(self.endpoint, scope, send, dialects)
        if driver is None:
            return
        code: int | None = None
        task = driver.receiving = asyncio.current_task()
        try:
            while True:
                message = await receive()
                kind = message["type"]
                if kind == "websocket.receive":
                    data = message.get("bytes")
                    rest = driver.feed(data if data is not None else message.get("text") or "")
                    if rest is not None:
                        await rest
                    # Servers queue every frame of a TCP read, and neither receive() nor send() yields
                    # while frames are queued: without this, a flooding client would hold the event
                    # loop for thousands of frames at a time and stall every other connection.
                    await asyncio.sleep(0)
                elif kind == "websocket.disconnect":
                    code = message.get("code")
                    break
        except asyncio.CancelledError:
            # The driver let the connection go (a server that never reported its socket gone) and cancelled this
            # wait for it (clearing `receiving`): the connection is over. Any other cancel goes on.
            if driver.receiving is not None or task is None or task.uncancel():
                if self.endpoint.draining:  # the server stops it in its shutdown: forced (a second Ctrl-C, a timeout)
                    await cut_streams(driver)
                raise
        finally:
            driver.receiving = None
            await driver.disconnected(code)

    async def serve_metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a Prometheus scrape of this endpoint's registry (404 with metrics off)."""
        metrics = self.endpoint.metrics
        if metrics is None:
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"metrics are off (setting metrics=False)\n"})
            return
        if self._metrics_app is None:
            from prometheus_client import make_asgi_app

            self._metrics_app = make_asgi_app(metrics.registry)
        await self._metrics_app(scope, receive, send)


async def cut_streams(driver: ConnectionDriver) -> None:
    """A server shutting down cancelled `driver`'s connection while its socket may still be open: stop the models of
    its running streams now, each stream ending with its retryable Error (docs/protocol.md 13.1), and wait (within
    ``close_timeout``) until those went out. Otherwise what the client got depended on the order the server's
    teardown cancelled tasks in: the model's first, the Error; the connection's first, the disconnect kept the
    streams for a resume that this process, going away, never serves, and the client saw only a dropped connection."""
    runner = driver.runner
    if runner is None or runner.driver is not driver:
        return
    running = [task for task in runner.tasks.values() if not task.done()]
    for task in running:
        task.cancel()  # (by the server, not the client: the stream ends with Error{internal, retryable})
    if running:
        await asyncio.wait(running, timeout=driver.settings.close_timeout)


async def accept(endpoint: Endpoint, scope: Scope, send: Send,
                 dialects: Sequence[Dialect] = ()) -> ConnectionDriver | None:
    """Admit the WebSocket of an ASGI scope whose ``websocket.connect`` arrived: accept it and return its
    driver, started; or refuse it (HTTP 403 before accepting, 4002 or 1013 after) and return None.
    The ASGI app and the Channels consumer both open their connections here. `dialects`: the wire protocols
    served at the scope's path (the first that takes the offered subprotocols runs it); none: lowlat.v1."""
    headers: dict[str, str] = {}
    for key, value in scope.get("headers") or ():
        headers[key.decode("latin-1").lower()] = value.decode("latin-1")
    client = scope.get("client")
    address = str(client[0]) if client else None
    offered = scope.get("subprotocols") or ()
    dialect = pick(dialects, offered, endpoint.settings) if dialects else None
    answer = endpoint.admit(offered, headers.get("origin"), headers.get("host"), address, dialect)
    if type(answer) is Refuse and answer.status is not None:
        await refuse_handshake(scope, send, answer.status, answer.message)
        return None
    await send({"type": "websocket.accept", "subprotocol": answer.subprotocol})
    if type(answer) is Refuse:
        # Not a 403 (clients treat that as final): 4002 and 1013 tell them to retry.
        await send({"type": "websocket.close", "code": int(answer.close_code), "reason": answer.message})
        return None
    extensions = scope.get("extensions")
    transport = extensions.get(EXTENSION) if extensions else None  # (our servers': it drops unanswered closes too)
    direct = transport if endpoint.settings.direct_writes else None
    try:
        driver = ConnectionDriver(
            endpoint, send=send, subprotocol=answer.subprotocol, address=address,
            client=tuple(client) if client else None, headers=headers, user=scope.get("user"),  # what models see
            extra={"path": scope.get("path", ""), "query_string": scope.get("query_string", b"").decode("latin-1")},
            direct=direct, closes=transport, dialect=dialect or LOWLAT_V1)
    except BaseException:
        endpoint.release(address)
        raise
    return driver


async def refuse_handshake(scope: Scope, send: Send, status: int, message: str) -> None:
    """Answer a WebSocket handshake with HTTP `status` and `message` as its text, so that a client can tell why, where
    the server offers the ASGI "websocket.http.response" extension (uvicorn does); elsewhere the server answers 403
    with no text (a close before accepting)."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "websocket.http.response.body", "body": f"{message}\n".encode()})
    else:
        await send({"type": "websocket.close", "code": 1008})


def _serving() -> bool:
    """True inside a running event loop: an app built now is built by the server, during a request."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
