"""Starlette / FastAPI adapter: a pure ASGI middleware and a route.

    app.add_middleware(LowLatMiddleware, model=generate, path="/ws", metrics_path="/metrics")
    # or: Route form
    app = Starlette(routes=[lowlat_route("/ws", generate)])

Every scope that is not a WebSocket at `path` (or, with ``metrics_path`` set, an HTTP request for
it: a Prometheus scrape; with ``client_path`` set, an HTTP request for one of the browser client's
files under it, docs/browser.md) passes through to the wrapped app untouched.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from lowlat_mw import static_files as static
from lowlat_mw.drivers.asgi import LowLatASGI
from lowlat_mw.model import ModelSpec
from lowlat_mw.settings import Settings

__all__ = ["LowLatMiddleware", "lowlat_route", "metrics_route"]


class LowLatMiddleware:
    """Serve the lowlat-mw protocol at ``path``; settings as keyword arguments (or ``settings=``)."""

    def __init__(
        self, app: ASGIApp, *, model: ModelSpec, settings: Settings | None = None, registry: Any = None,
        **options: Any,
    ) -> None:
        """`registry`: prometheus_client CollectorRegistry for the metrics (default: the global one)."""
        self.app = app
        self.endpoint = LowLatASGI(model, settings=settings, registry=registry, **options)
        self.path = self.endpoint.settings.path
        self.metrics_path = self.endpoint.settings.metrics_path
        self.client_path = self.endpoint.settings.client_path

    async def drain(self, grace: float | None = None) -> None:
        """Graceful shutdown of the WebSocket side (see ``LowLatASGI.drain``)."""
        await self.endpoint.drain(grace)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] in (
            self.path, scope.get("root_path", "") + self.path
        ):
            await self.endpoint(scope, receive, send)
        elif scope["type"] == "http" and self.metrics_path and scope["path"] == self.metrics_path:
            await self.endpoint.serve_metrics(scope, receive, send)
        elif scope["type"] == "http" and self.client_path and (
                response := static.asgi_respond(scope, self.endpoint.settings)) is not None:
            await static.send_asgi(response, send)
        else:
            await self.app(scope, receive, send)


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
