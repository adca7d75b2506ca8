"""Starlette / FastAPI adapter: a pure ASGI middleware and a route.

    app.add_middleware(LowLatMiddleware, model=generate, path="/ws")
    # or: Route form
    app = Starlette(routes=[lowlat_route("/ws", generate)])

Every scope that is not a WebSocket at `path` passes through to the wrapped app untouched.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from lowlat_mw.asgi import LowLatASGI
from lowlat_mw.model import ModelSpec
from lowlat_mw.settings import Settings

__all__ = ["LowLatMiddleware", "lowlat_route"]


class LowLatMiddleware:
    """Serve the lowlat-mw protocol at ``path``; settings as keyword arguments (or ``settings=``)."""

    def __init__(
        self, app: ASGIApp, *, model: ModelSpec, settings: Settings | None = None, **options: Any
    ) -> None:
        self.app = app
        self.endpoint = LowLatASGI(model, settings=settings, **options)
        self.path = self.endpoint.settings.path

    async def drain(self, grace: float = 30.0) -> None:
        """Graceful shutdown of the WebSocket side (see ``LowLatASGI.drain``)."""
        await self.endpoint.drain(grace)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] in (
            self.path, scope.get("root_path", "") + self.path
        ):
            await self.endpoint(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def lowlat_route(
    path: str, model: ModelSpec, *, settings: Settings | None = None, **options: Any
) -> WebSocketRoute:
    """A ``WebSocketRoute`` serving the protocol at `path`, for apps that prefer routing."""
    return WebSocketRoute(path, LowLatASGI(model, settings=settings, path=path, **options))
