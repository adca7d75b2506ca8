"""Flask app serving a streaming model over lowlat-mw at ws://127.0.0.1:8000/ws.

Run:  gunicorn -k lowlat_mw.servers.gunicorn.ThreadWorker --threads 256 -b 127.0.0.1:8000 examples.flask_app:app
      (gthread plus a handshake deadline; docs/security.md "Transport")
Then: lowlat-mw chat ws://127.0.0.1:8000/ws "hello"
Metrics: curl http://127.0.0.1:8000/metrics  (Prometheus text: lowlat_* series)
The scrape is unauthenticated: in production serve it where only Prometheus reaches (docs/observability.md).

Each WebSocket holds one gunicorn thread for its lifetime: size --threads for your connections.
Set LOWLAT_MODEL=package.module:callable to serve another model without editing this file.
"""

from __future__ import annotations

import os
import time

from flask import Flask

from lowlat_mw.adapters.flask import LowLat


def generate(req):
    """A plain generator model: each step runs in a worker thread, each word is its own delta."""
    for word in f"You said: {req.prompt}".split():
        time.sleep(0.01)
        yield word + " "


app = Flask(__name__)
app.config["LOWLAT_MW"] = {"path": "/ws", "max_streams": 16}  # or app.config["LOWLAT_MAX_STREAMS"] = 16
app.config["LOWLAT_METRICS_PATH"] = "/metrics"  # Prometheus scrape of the lowlat_* metrics (HTTP GET)


@app.get("/health")
def health() -> str:
    return "ok"


lowlat = LowLat(app, model=os.environ.get("LOWLAT_MODEL") or generate)
