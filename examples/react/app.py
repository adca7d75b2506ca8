"""A page using the useAISocket React hook, served next to the lowlat-mw endpoint.

Setup: npm install --prefix examples/react    (React 18's UMD builds into examples/react/node_modules)
Run:   uvicorn examples.react.app:app --port 8000
Open:  http://127.0.0.1:8000/react/

The middleware serves the protocol at /ws and the browser client under /lowlat (client_path);
the page (index.html, app.js, useAISocket.js) imports it as "lowlat-mw" through an import map.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from lowlat_mw.adapters.starlette import LowLatMiddleware
from lowlat_mw.demo import demo_model

HERE = Path(__file__).resolve().parent

app = Starlette(routes=[Mount("/react", StaticFiles(directory=HERE, html=True))])
app.add_middleware(LowLatMiddleware, model=demo_model, path="/ws", client_path="/lowlat")
