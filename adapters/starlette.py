"""Starlette / FastAPI adapter: a pure ASGI middleware and a route.

    app.add_middleware(LowLatMiddleware, model=generate, path="/ws", metrics_path="/metrics")
    # or: Route form
    app = Starlette(routes=[lowlat_route("/ws", generate)])
    # or: your own WebSocket route (FastAPI resolves its dependencies first: Depends for auth)
    lowlat = LowLatEndpoint(model=generate)

    @app.websocket("/ws")
    async def ws(websocket: WebSocket, user: User = Depends(current_user)):
        await lowlat.serve_websocket(websocket, user=user)

Every scope that is not a WebSocket at `path` (or, with ``metrics_path`` set, an HTTP request for
it: a Prometheus scrape; with ``client_path`` set, an HTTP request for one of the browser client's
files under it, docs/browser.md) passes through to the wrapped app untouched. The work is the core's
:class:`~lowlat_mw.runtime.asgi.LowLatASGI`; this module gives it Starlette's names and types.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp
from starlette.websockets import WebSocket

from lowlat_mw.model import ModelSpec
from lowlat_mw.protocol.dialect import Dialect
from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.settings import Settings

__all__ = ["LowLatEndpoint", "LowLatMiddleware", "document_websocket", "lowlat_route", "metrics_route"]


class LowLatMiddleware(LowLatASGI):
    """Serve the lowlat-mw protocol at ``path``; settings as keyword arguments (or ``settings=``)."""

    defer_build_errors = True  # Starlette builds it in the lifespan call: a mistake fails the start-up

    def __init__(
        self, app: ASGIApp, *, model: ModelSpec, settings: Settings | None = None, registry: Any = None,
        **options: Any,
    ) -> None:
        """`registry`: prometheus_client CollectorRegistry for the metrics (default: the global one)."""
        super().__init__(model, app=app, settings=settings, registry=registry, **options)


class LowLatEndpoint(LowLatASGI):
    """The endpoint for a WebSocket route of your own (settings as keyword arguments, or ``settings=``), so that
    the framework does what it does for its routes first: FastAPI resolves the route's dependencies (``Depends``:
    authentication, a database session...) and refuses the handshake when one raises ``WebSocketException``."""

    def __init__(self, *, model: ModelSpec, settings: Settings | None = None, registry: Any = None,
                 **options: Any) -> None:
        super().__init__(model, settings=settings, registry=registry, **options)

    async def serve_websocket(self, websocket: WebSocket, *, user: Any = None, dialect: Dialect | None = None) -> None:
        """Serve `websocket` (not accepted yet) until it closes; `user` (e.g. what a dependency returned) is what
        models see as ``req.session.user`` and the ``authenticate`` hook as ``handshake.user`` (default: the
        scope's ``user``, set by Starlette's AuthenticationMiddleware); `dialect`: the wire protocol it speaks
        (default: lowlat.v1; docs/architecture.md, "Adding a dialect")."""
        if user is not None:
            websocket.scope["user"] = user
        await self.serve(websocket.scope, websocket.receive, websocket.send, (dialect,) if dialect else ())


def lowlat_route(
    path: str, model: ModelSpec, *, settings: Settings | None = None, registry: Any = None, **options: Any
) -> WebSocketRoute:
    """A ``WebSocketRoute`` serving the protocol at `path`, for apps that prefer routing."""
    return WebSocketRoute(path, LowLatASGI(model, settings=settings, path=path, registry=registry, **options))


def metrics_route(path: str = "/metrics", registry: Any = None) -> Route:
    """A route answering Prometheus scrapes of `registry` (default: the global one) at `path`."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    source = registry if registry is not None else REGISTRY

    async def scrape(request: Request) -> Response:
        return Response(generate_latest(source), media_type=CONTENT_TYPE_LATEST)

    return Route(path, scrape, methods=["GET"])


def document_websocket(app: Any, path: str = "/ws", asyncapi_path: str | None = "/asyncapi.json", *,
                       tags: tuple[str, ...] = ("lowlat-mw",)) -> None:
    """Show the lowlat-mw WebSocket in a FastAPI app's OpenAPI page (``/docs``), which lists HTTP routes only: a
    ``GET`` route at `path`, documented as the WebSocket upgrade with a link to the AsyncAPI document at
    `asyncapi_path` (the ``asyncapi_path`` setting serves it). A plain HTTP ``GET`` there answers 426."""
    link = f" Its messages: the AsyncAPI 3.0 document at [{asyncapi_path}]({asyncapi_path})." if asyncapi_path else ""

    async def websocket_upgrade() -> Response:
        return Response("WebSocket endpoint (lowlat-mw): connect with a WebSocket client\n", status_code=426,
                        headers={"Upgrade": "websocket"}, media_type="text/plain")

    app.add_api_route(
        path, websocket_upgrade, methods=["GET"], tags=list(tags), response_class=Response,
        summary="lowlat-mw WebSocket (upgrade)",
        description=("Open a WebSocket here (subprotocol `lowlat.v1.json` or `lowlat.v1.proto`): one handshake, "
                     "then many streamed requests on one connection." + link),
        responses={101: {"description": "Switching Protocols: the WebSocket is open"},
                   426: {"description": "Upgrade Required: this path speaks WebSocket only"}})
