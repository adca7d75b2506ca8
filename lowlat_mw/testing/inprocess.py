"""An in-process test client: lowlat-mw's :class:`~lowlat_mw.client.AsyncClient` talking to an ASGI app in the
test's own event loop, through ASGI messages instead of a socket (as Starlette's ``TestClient.websocket_connect``
and Channels' ``WebsocketCommunicator`` do).

    from lowlat_mw.testing import AppClient
    from myapp import app                       # FastAPI / Starlette with LowLatMiddleware, a Channels router...

    async def test_reply():
        async with AppClient(app) as client:    # runs the app's lifespan start-up first, its shutdown at the end
            assert await client.complete("hello") == "..."

Everything the client offers works (streams, cancel, ping, resume after :meth:`AppClient.drop`), through the ASGI
send path of the middleware (no direct writes: there is no transport). For a real server on a loopback port, see
the pytest fixtures of :mod:`lowlat_mw.testing.pytest_plugin`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK, InvalidStatus
from websockets.frames import Close
from websockets.http11 import Response

from ..client.aio import AsyncClient

__all__ = ["AppClient", "LifespanFailed"]

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]
WAIT = 30.0  # bound on every wait for the app (generous: a loaded machine)
_DONE = object()  # the app's coroutine returned


class LifespanFailed(RuntimeError):
    """The app refused to start (``lifespan.startup.failed``): its message, e.g. a wrong setting."""


class AppClient(AsyncClient):
    """An :class:`~lowlat_mw.client.AsyncClient` connected to the ASGI `app` in this event loop, at `path`
    (with a query string if any). `lifespan`: run the app's lifespan start-up on ``__aenter__`` and its shutdown
    on ``__aexit__`` (an app without lifespan support is fine); False when another client already did. Other
    keyword arguments are the client's (``mode``, ``headers``, ``auth``, ``backoff``...)."""

    def __init__(self, app: ASGIApp, path: str = "/ws", *, lifespan: bool = True, client: tuple[str, int] =
                 ("127.0.0.1", 50000), **options: Any) -> None:
        super().__init__(f"ws://testserver{path}", **options)
        self.app = app
        self.lifespan = lifespan
        self.peer = client
        self._lifespan: _Lifespan | None = None
        self.connection: _ASGIWebSocket | None = None
        """The current in-memory WebSocket (its ``app_error`` holds what the app raised, if it did)."""

    async def __aenter__(self) -> AppClient:
        if self.lifespan:
            self._lifespan = _Lifespan(self.app)
            await self._lifespan.startup()
        try:
            await self.open()
        except BaseException:
            await self._stop_lifespan()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        finally:
            await self._stop_lifespan()

    async def _stop_lifespan(self) -> None:
        if self._lifespan is not None:
            lifespan, self._lifespan = self._lifespan, None
            await lifespan.shutdown()

    async def drop(self) -> None:
        """Lose the connection abruptly (as a network failure: 1006), so the client reconnects and resumes."""
        if self.connection is not None:
            await self.connection.abort()

    async def _open_ws(self) -> Any:
        parts = urlsplit(self.url)
        headers = [(b"host", b"testserver"), (b"sec-websocket-protocol", self.subprotocol.encode())]
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        scope: dict[str, Any] = {
            "type": "websocket", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "scheme": "ws", "server": ("testserver", 80), "client": self.peer, "root_path": "",
            "path": parts.path or "/", "raw_path": (parts.path or "/").encode(), "query_string": parts.query.encode(),
            "headers": headers, "subprotocols": [self.subprotocol], "extensions": {}, "state": {},
        }
        if self._lifespan is not None:
            scope["state"] = dict(self._lifespan.state)  # (what the lifespan put there, as servers pass it on)
        ws = _ASGIWebSocket(self.app, scope)
        await ws.open(self.open_timeout)
        self.connection = ws
        return ws


class _ASGIWebSocket:
    """The part of websockets' ClientConnection the client uses, over ASGI messages to `app` (one connection)."""

    close_timeout = WAIT  # (its close waits for the app at most WAIT: the client's bound, twice that, never ends it)

    def __init__(self, app: ASGIApp, scope: dict[str, Any]) -> None:
        self.app, self.scope = app, scope
        self.subprotocol: str | None = None
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.protocol = SimpleNamespace(close_rcvd=None)  # (read by the client when close_code is None)
        self.app_error: BaseException | None = None
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._accepted = False

    async def open(self, timeout: float) -> None:
        self._to_app.put_nowait({"type": "websocket.connect"})
        self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            async with asyncio.timeout(timeout):
                first = await self._from_app.get()
        except BaseException:
            self._task.cancel()  # (an app that never accepts nor refuses)
            raise
        if isinstance(first, dict) and first.get("type") == "websocket.accept":
            self._accepted = True
            self.subprotocol = first.get("subprotocol")
            return
        # Refused before accepting: a real server answers the handshake with HTTP 403 (500 if the app failed).
        status = 500 if self.app_error is not None else 403
        if isinstance(first, dict) and first.get("type") == "websocket.http.response.start":
            status = int(first.get("status", 403))
        await self._finish()
        raise InvalidStatus(Response(status, "refused", Headers()))

    async def _run(self) -> None:
        try:
            await self.app(self.scope, self._receive, self._send_to_client)
        except Exception as exc:  # a server logs it and closes with 1011 (or answers 500 before accepting)
            self.app_error = exc
            if self._accepted and self.close_code is None:
                self._closed(1011, "")
        finally:
            self._from_app.put_nowait(_DONE)

    async def _receive(self) -> dict[str, Any]:
        return await self._to_app.get()

    async def _send_to_client(self, message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        if kind == "websocket.send":
            if self.close_code is not None:  # (servers raise too: uvicorn's ClientDisconnected is an OSError)
                raise OSError(f"websocket.send after the connection closed ({self.close_code})")
            data = message.get("bytes")
            self._from_app.put_nowait(data if data is not None else message.get("text", ""))
        elif kind == "websocket.close":
            if not self._accepted:
                self._from_app.put_nowait(dict(message))
            elif self.close_code is None:
                self._closed(int(message.get("code") or 1000), str(message.get("reason") or ""))
            self._to_app.put_nowait({"type": "websocket.disconnect", "code": message.get("code") or 1000})
        else:  # websocket.accept, websocket.http.response.*
            self._from_app.put_nowait(dict(message))

    def _closed(self, code: int, reason: str) -> None:
        self.close_code, self.close_reason = code, reason
        self._from_app.put_nowait(Close(code, reason))

    # ------------------------------------------------------------------ what the client calls
    async def send(self, frame: bytes | str) -> None:
        if self.close_code is not None:
            raise ConnectionClosedError(None, Close(self.close_code, self.close_reason or ""))
        self._to_app.put_nowait({"type": "websocket.receive", "bytes": frame} if isinstance(frame, bytes)
                                else {"type": "websocket.receive", "text": frame})

    async def recv(self) -> bytes | str:
        item = await self._from_app.get()
        if item is _DONE:
            if self.close_code is None:
                self._closed(1006, "")  # the app returned without closing: the server drops the socket
            item = await self._from_app.get()
        if isinstance(item, Close):
            self._from_app.put_nowait(item)  # (every later recv sees the close too)
            error = ConnectionClosedOK if item.code in (1000, 1001) else ConnectionClosedError
            raise error(item, None)
        if isinstance(item, dict):
            return await self.recv()  # (nothing else is expected after the accept)
        return item  # type: ignore[no-any-return]

    def __aiter__(self) -> AsyncIterator[bytes | str]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[bytes | str]:
        while True:
            try:
                yield await self.recv()
            except ConnectionClosedOK:
                return

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close from the client's side: the app gets websocket.disconnect, and is awaited (bounded)."""
        if self.close_code is None:
            self._closed(code, reason)
            self._to_app.put_nowait({"type": "websocket.disconnect", "code": code})
        await self._finish()

    async def abort(self) -> None:
        """The connection is lost (1006) without a close handshake."""
        await self.close(1006)

    async def _finish(self) -> None:
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), WAIT)
            if not task.done():  # pragma: no cover - an app that never returns after its disconnect
                task.cancel()


class _Lifespan:
    """The app's lifespan, as uvicorn's ``lifespan="auto"`` runs it: an app that fails on the lifespan scope
    (no lifespan support) is served anyway; ``lifespan.startup.failed`` raises :class:`LifespanFailed`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[Mapping[str, Any] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.state: dict[str, Any] = {}  # the lifespan scope's state: each connection's scope gets a copy

    async def _run(self) -> None:
        async def send(message: Any) -> None:
            self._from_app.put_nowait(message)

        try:
            await self.app({"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state},
                           self._to_app.get, send)
        except Exception:
            pass  # (no lifespan support: as uvicorn's "auto")
        finally:
            self._from_app.put_nowait(None)

    async def startup(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._to_app.put_nowait({"type": "lifespan.startup"})
        try:
            async with asyncio.timeout(WAIT):
                reply = await self._from_app.get()
        except BaseException:
            self._task.cancel()
            raise
        if reply is not None and reply["type"] == "lifespan.startup.failed":
            await self._wait()
            raise LifespanFailed(reply.get("message") or "the app's lifespan start-up failed")
        if reply is None:
            self._task = None  # no lifespan: nothing to shut down

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        self._to_app.put_nowait({"type": "lifespan.shutdown"})
        async with asyncio.timeout(WAIT):
            await self._from_app.get()
        await self._wait()

    async def _wait(self) -> None:
        if self._task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, WAIT)
