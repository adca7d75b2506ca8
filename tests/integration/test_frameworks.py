"""The middleware in FastAPI (with HTTP pass-through) and the route form in Starlette."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest
from fastapi import FastAPI, WebSocket
from support.raw import JSON, PROTO, raw_connect

from lowlat_mw.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def words(req):
    for w in req.prompt.split():
        yield w + " "


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _fastapi_app(**settings):
    from lowlat_mw.adapters.starlette import LowLatMiddleware

    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict:
        return {"item_id": item_id}

    @app.websocket("/other-ws")
    async def other_ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("plain fastapi websocket")
        await websocket.close()

    app.add_middleware(LowLatMiddleware, model=words, **settings)
    return app


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_fastapi_middleware_streams_and_passes_other_scopes_through(uvicorn_server, mode):
    srv = uvicorn_server(_fastapi_app())
    async with asyncio.timeout(10):
        async with connect(srv.url, mode=mode) as client:
            stream = client.stream("served by fastapi")
            assert [c async for c in stream] == ["served ", "by ", "fastapi "]
            assert stream.end.usage["deltas"] == 3
        # normal HTTP routes of the app still work
        status, body = await asyncio.to_thread(_get, f"{srv.http_url}/items/42")
        assert (status, body) == (200, '{"item_id":42}')
        # an HTTP request to the middleware's path is the app's business too (FastAPI: 404)
        status, _ = await asyncio.to_thread(_get, f"{srv.http_url}/ws")
        assert status == 404
        # and the app's own WebSocket routes are untouched
        async with raw_connect(srv.url.replace("/ws", "/other-ws"), None) as conn:
            assert await conn.recv() == "plain fastapi websocket"


async def test_fastapi_middleware_custom_path(uvicorn_server):
    srv = uvicorn_server(_fastapi_app(path="/api/llm"), path="/api/llm")
    async with asyncio.timeout(10):
        async with connect(srv.url) as client:
            assert await client.complete("custom path") == "custom path "
        status, _ = await asyncio.to_thread(_get, f"{srv.http_url}/items/1")
        assert status == 200


async def test_starlette_middleware_http_pass_through(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(words))
    status, body = await asyncio.to_thread(_get, f"{srv.http_url}/health")
    assert (status, body) == (200, "ok")


@pytest.mark.parametrize("subprotocol", [PROTO, JSON])
async def test_route_form_in_starlette(uvicorn_server, subprotocol):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from lowlat_mw.adapters.starlette import lowlat_route

    async def home(request):
        return PlainTextResponse("home")

    app = Starlette(routes=[Route("/", home), lowlat_route("/ws", words, max_streams=3)])
    srv = uvicorn_server(app)
    async with asyncio.timeout(10):
        async with connect(srv.url, mode="proto" if subprotocol == PROTO else "json") as client:
            assert await client.complete("route form works") == "route form works "
            assert client.welcome.max_streams == 3
        status, body = await asyncio.to_thread(_get, f"{srv.http_url}/")
        assert (status, body) == (200, "home")


async def test_flask_extension_on_a_blueprint_serves_under_its_prefix():
    """Issue 38: `LowLat(blueprint)` raised an AttributeError. As flask-sock's route(bp=...): the routes go under
    the blueprint's url_prefix when it is registered, with the app's config; the demo page and the AsyncAPI
    document name the WebSocket where it is served."""
    import json

    from flask import Blueprint, Flask
    from prometheus_client import CollectorRegistry

    from lowlat_mw.adapters.flask import LowLat
    from lowlat_mw.testing.pytest_plugin import RunningServer

    blueprint = Blueprint("ai", __name__, url_prefix="/api")
    LowLat(blueprint, model=lambda req: "bp:" + req.prompt, registry=CollectorRegistry())
    app = Flask(__name__)
    app.config["LOWLAT_MW"] = {"client_path": "/lowlat", "asyncapi_path": "/asyncapi.json"}
    app.register_blueprint(blueprint)
    server = await asyncio.to_thread(RunningServer(app, "/api/ws").start)
    try:
        async with asyncio.timeout(20), connect(server.url) as client:
            assert await client.complete("hi") == "bp:hi"
        status, page = await asyncio.to_thread(_get, f"{server.http_url}/api/lowlat/")
        assert status == 200 and '"/api/ws"' in page, page[:2000]
        status, body = await asyncio.to_thread(_get, f"{server.http_url}/api/asyncapi.json")
        assert status == 200 and json.loads(body)["channels"]["lowlat"]["address"] == "/api/ws", body[:500]
    finally:
        await asyncio.to_thread(server.stop)
    with pytest.raises(TypeError, match="LowLat takes a Flask app or Blueprint, got str"):
        LowLat("app", model=words)  # type: ignore[arg-type]
