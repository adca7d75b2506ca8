"""Authentication from the framework a user already has, reaching the model (``req.session.user``) and the
``authenticate`` hook (``handshake.user``): Starlette's AuthenticationMiddleware (``request.user``), FastAPI
dependencies (``Depends``), Flask-Login's ``current_user`` and the Flask session. The apps are the guides' code."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from fastapi import WebSocket
from prometheus_client import CollectorRegistry

from lowlat_mw import ConnectionClosed, StreamError, connect_sync
from lowlat_mw.client import Backoff
from lowlat_mw.testing import AppClient

WAIT = 30.0


def whoami(req):
    user = req.session.user
    name = getattr(user, "display_name", None) or getattr(user, "id", None) or "anonymous"
    return f"{name}|{req.session.extra.get('flask_session', {}).get('theme', '-')}"


def only_signed_in(handshake):
    """An authenticate hook on the framework's user: anonymous clients are refused."""
    if not getattr(handshake.user, "is_authenticated", False):
        raise PermissionError("sign in first")
    return handshake.user


# ----------------------------------------------------------------------------- Starlette
def starlette_app():
    from starlette.applications import Starlette
    from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
    from starlette.middleware import Middleware
    from starlette.middleware.authentication import AuthenticationMiddleware

    from lowlat_mw.adapters.starlette import LowLatMiddleware

    class TokenBackend(AuthenticationBackend):
        async def authenticate(self, conn):
            token = conn.headers.get("authorization", "").removeprefix("Bearer ")
            return (AuthCredentials(["authenticated"]), SimpleUser(token)) if token else None

    # AuthenticationMiddleware first in the list: it runs before (outside) LowLatMiddleware, which then sees
    # scope["user"].
    return Starlette(middleware=[
        Middleware(AuthenticationMiddleware, backend=TokenBackend()),
        Middleware(LowLatMiddleware, model=whoami, path="/ws", authenticate=only_signed_in,
                   registry=CollectorRegistry()),
    ])


async def test_starlette_request_user_reaches_the_model_and_the_hook():
    app = starlette_app()
    async with asyncio.timeout(WAIT), AppClient(app, headers={"Authorization": "Bearer alice"}) as client:
        assert await client.complete("x") == "alice|-"
    client = AppClient(app, lifespan=False, backoff=Backoff(retries=0))
    with pytest.raises(StreamError, match="unauthorized: sign in first"):  # anonymous: refused by the hook
        await asyncio.wait_for(client.open(), WAIT)
    await client.close()


# ----------------------------------------------------------------------------- FastAPI
class User:
    def __init__(self, name: str) -> None:
        self.display_name = name
        self.is_authenticated = True


def fastapi_app():
    # (FastAPI reads the route's annotations: with `from __future__ import annotations` the names they use must
    # be module globals, so WebSocket and User are imported / defined at the top level here.)
    from fastapi import Depends, FastAPI, WebSocketException, status

    from lowlat_mw.adapters.starlette import LowLatEndpoint

    async def current_user(websocket: WebSocket) -> User:
        token = websocket.headers.get("authorization", "").removeprefix("Bearer ")
        if not token:
            raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION)
        return User(token)

    app = FastAPI()
    lowlat = LowLatEndpoint(model=whoami, registry=CollectorRegistry())

    @app.websocket("/ws")
    async def ws(websocket: WebSocket, user: User = Depends(current_user)) -> None:  # noqa: B008 (FastAPI idiom)
        await lowlat.serve_websocket(websocket, user=user)

    return app


async def test_fastapi_depends_resolves_the_user_first():
    app = fastapi_app()
    async with asyncio.timeout(WAIT), AppClient(app, headers={"Authorization": "Bearer bob"}) as client:
        assert await client.complete("x") == "bob|-"
        assert await client.complete("y") == "bob|-"  # one connection, many requests
    client = AppClient(app, lifespan=False, backoff=Backoff(retries=0))
    with pytest.raises(ConnectionClosed, match="403"):  # the dependency refused the handshake
        await asyncio.wait_for(client.open(), WAIT)
    await client.close()


# ----------------------------------------------------------------------------- Flask
def flask_app():
    from flask import Flask, session
    from flask_login import LoginManager, UserMixin

    from lowlat_mw.adapters.flask import LowLat

    class User(UserMixin):
        def __init__(self, user_id: str) -> None:
            self.id = user_id

    app = Flask(__name__)
    app.secret_key = "test-only"
    app.config["LOWLAT_MW"] = {"path": "/ws", "authenticate": only_signed_in}
    login = LoginManager(app)

    @login.request_loader
    def from_header(request):
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        return User(token) if token else None

    @app.get("/theme/<name>")
    def set_theme(name: str) -> str:
        session["theme"] = name
        return "ok"

    LowLat(app, model=whoami)
    return app


@pytest.fixture
def lowlat_app():
    return flask_app()


def test_flask_login_user_and_session_reach_the_model(lowlat_server):
    with urllib.request.urlopen(f"{lowlat_server.http_url}/theme/dark", timeout=10) as resp:
        cookie = resp.headers["Set-Cookie"].split(";", 1)[0]
    headers = {"Authorization": "Bearer carol", "Cookie": cookie}
    with connect_sync(lowlat_server.url, headers=headers) as client:
        assert client.complete("x") == "carol|dark"
    with pytest.raises(StreamError, match="unauthorized: sign in first"):  # anonymous: refused by the hook
        with connect_sync(lowlat_server.url, backoff=Backoff(retries=0)) as client:
            client.complete("x")
