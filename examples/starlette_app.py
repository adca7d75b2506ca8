"""Starlette app serving a streaming model over lowlat-mw at ws://127.0.0.1:8000/ws.

Run:  uvicorn examples.starlette_app:app --port 8000 --ws lowlat_mw.servers.uvicorn:WebSocketProtocol
        --http lowlat_mw.servers.uvicorn:Http --ws-max-size 1049600 --ws-ping-interval 0
        --ws-per-message-deflate false
      (websockets-sansio with fragment floods bounded, a bounded handshake, our size limit, no
      protocol pings or deflate: docs/security.md "Transport"; `lowlat-mw serve` sets the same)
Then: lowlat-mw chat ws://127.0.0.1:8000/ws "hello"
Metrics: curl http://127.0.0.1:8000/metrics  (Prometheus text: lowlat_* series)
The scrape is unauthenticated: in production serve it where only Prometheus reaches (docs/observability.md).

Set LOWLAT_MODEL=package.module:callable to serve another model without editing this file.
"""

from __future__ import annotations

import asyncio
import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from lowlat_mw.adapters.starlette import LowLatMiddleware


async def generate(req):
    """An async generator model: streams the prompt back word by word."""
    for word in f"You said: {req.prompt}".split():
        yield word + " "
        await asyncio.sleep(0.01)


async def health(request):
    return PlainTextResponse("ok")


app = Starlette(
    routes=[Route("/health", health)],
    middleware=[
        Middleware(
            LowLatMiddleware,
            model=os.environ.get("LOWLAT_MODEL") or generate,
            path="/ws",
            max_streams=16,  # settings are keyword arguments (LOWLAT_* environment variables also work)
            metrics_path="/metrics",  # Prometheus scrape of the lowlat_* metrics (HTTP GET)
        )
    ],
)
