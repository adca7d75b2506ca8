"""Run an ASGI app under uvicorn with lowlat-mw's recommended options and a graceful drain.

uvicorn closes every WebSocket with 1012 as soon as it starts shutting down. ``run`` first stops
accepting connections, then drains every lowlat-mw endpoint (GoAway, running streams finish for
up to `drain_grace` seconds, close 4002 so clients reconnect), and only then lets uvicorn shut down.
"""

from __future__ import annotations

from typing import Any

from .settings import Settings

__all__ = ["run", "uvicorn_options"]


def uvicorn_options(settings: Settings | None = None) -> dict[str, Any]:
    """uvicorn keyword arguments that match lowlat-mw's settings."""
    settings = settings or Settings.load()
    return {
        "ws": "websockets-sansio",
        # Our own limit answers first (Error frame + 1009); the server's is a backstop just above it.
        "ws_max_size": settings.max_frame_size + 1024,
        "ws_ping_interval": None,  # the protocol's application-level heartbeat replaces it
        "ws_per_message_deflate": False,
    }


def run(app: Any, *, drain_grace: float = 30.0, settings: Settings | None = None, **uvicorn_kwargs: Any) -> None:
    """``uvicorn.run`` with a graceful WebSocket drain on shutdown."""
    import uvicorn

    from .asgi import drain_all

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            for server in self.servers:
                server.close()  # stop accepting first
            await drain_all(drain_grace)
            await super().shutdown(sockets)

    options = {**uvicorn_options(settings), **uvicorn_kwargs}
    config = uvicorn.Config(app, **options)
    DrainingServer(config).run()
