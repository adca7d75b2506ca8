"""FastAPI app serving a streaming model over lowlat-mw at ws://127.0.0.1:8000/ws.

Run:  uvicorn examples.fastapi_app:app --port 8000 --ws lowlat_mw.servers.uvicorn:WebSocketProtocol
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

import os
import time

from fastapi import FastAPI

from lowlat_mw.adapters.starlette import LowLatMiddleware


def generate(req):
    """A plain (blocking) generator model: lowlat-mw runs each step in a worker thread."""
    for word in f"You said: {req.prompt}".split():
        time.sleep(0.01)  # stands in for blocking inference work
        yield word + " "


app = FastAPI()
app.add_middleware(
    LowLatMiddleware,
    model=os.environ.get("LOWLAT_MODEL") or generate,
    path="/ws",
    max_streams=16,
    metrics_path="/metrics",  # Prometheus scrape of the lowlat_* metrics (HTTP GET)
)


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}
