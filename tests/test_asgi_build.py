"""The Starlette/FastAPI middleware built with a mistake: at import time it raises; built by the server during its
first ASGI call (Starlette's lazy middleware stack) it fails the lifespan start-up instead. Routes and endpoints
(LowLatASGI itself, lowlat_route, LowLatEndpoint) always raise."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lowlat_mw.adapters.starlette import LowLatEndpoint, LowLatMiddleware, lowlat_route
from lowlat_mw.errors import SettingsError
from lowlat_mw.runtime.asgi import LowLatASGI


async def _model(req: Any) -> str:
    return "x"


async def _inner(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"inner"})


async def _call(app: LowLatMiddleware, scope: dict[str, Any], incoming: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    queue = list(incoming)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 10)
    return sent


def test_built_outside_a_running_loop_a_mistake_raises() -> None:
    with pytest.raises(SettingsError, match="idle_timout"):
        LowLatMiddleware(_inner, model=_model, idle_timout=5)
    with pytest.raises(ImportError, match="nosuchmodule"):
        LowLatMiddleware(_inner, model="nosuchmodule:generate")


def test_routes_and_endpoints_raise_even_when_built_while_serving() -> None:
    async def main() -> None:
        for build in (lambda: LowLatASGI(_model, idle_timout=5), lambda: lowlat_route("/ws", _model, idle_timout=5),
                      lambda: LowLatEndpoint(model=_model, idle_timout=5)):
            with pytest.raises(SettingsError, match="idle_timout"):
                build()

    asyncio.run(main())


def test_built_during_a_call_a_mistake_fails_the_lifespan_startup(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        app = LowLatMiddleware(_inner, model=_model, idle_timout=5)  # as Starlette builds it: in the lifespan call
        assert isinstance(app.failed, SettingsError)
        sent = await _call(app, {"type": "lifespan"}, [{"type": "lifespan.startup"}])
        assert [m["type"] for m in sent] == ["lifespan.startup.failed"]
        assert "'idle_timout'" in sent[0]["message"] and "did you mean 'idle_timeout'" in sent[0]["message"]
        # A server without lifespan: the app's own routes still answer, our WebSocket is refused (1011).
        sent = await _call(app, {"type": "http", "path": "/health"}, [{"type": "http.request"}])
        assert sent[-1]["body"] == b"inner"
        sent = await _call(app, {"type": "websocket", "path": "/ws"}, [{"type": "websocket.connect"}])
        assert sent == [{"type": "websocket.close", "code": 1011}]
        await app.drain(0)  # nothing to drain, no error

    with caplog.at_level("ERROR", logger="lowlat_mw"):
        asyncio.run(main())
    assert any("lowlat-mw cannot start" in r.getMessage() and "idle_timout" in r.getMessage()
               for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)  # one line, no traceback
