"""lowlat_mw.testing.AppClient: the client over ASGI messages to an app in the same loop, no socket."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware

from lowlat_mw import ConnectionClosed, StreamError
from lowlat_mw.adapters.starlette import LowLatMiddleware
from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.testing import AppClient, LifespanFailed

WAIT = 30.0


async def words(req):
    for i in range(int(req.params.get("n", 3))):
        yield f"w{i} "


def starlette_app(**settings) -> Starlette:
    return Starlette(middleware=[Middleware(LowLatMiddleware, model=words, path="/ws",
                                            registry=CollectorRegistry(), **settings)])


async def test_streams_ping_and_close_in_both_modes() -> None:
    for mode in ("proto", "json"):
        async with asyncio.timeout(WAIT), AppClient(starlette_app(), mode=mode) as client:
            assert await client.complete("x", params={"n": 4}) == "w0 w1 w2 w3 "
            assert 0 <= await client.ping() < WAIT
            assert client.welcome is not None and client.connection.subprotocol == f"lowlat.v1.{mode}"


async def test_a_wrong_setting_fails_the_lifespan_start_up_with_its_message() -> None:
    with pytest.raises(LifespanFailed, match="idle_timout"):
        async with asyncio.timeout(WAIT), AppClient(starlette_app(idle_timout=5)):
            pass


async def test_a_refused_handshake_is_a_final_connection_closed() -> None:
    app = LowLatASGI(words, registry=CollectorRegistry(), allowed_origins=[])
    client = AppClient(app, path="/", headers={"Origin": "http://evil.example"}, lifespan=False)
    with pytest.raises(ConnectionClosed, match="403"):
        await asyncio.wait_for(client.open(), WAIT)
    await client.close()


async def test_a_dropped_connection_resumes_the_running_stream() -> None:
    gate = asyncio.Event()

    async def held(req):
        yield "before "
        await gate.wait()
        yield "after"

    app = LowLatASGI(held, registry=CollectorRegistry())
    async with asyncio.timeout(WAIT), AppClient(app, path="/") as client:
        stream = client.stream("x")
        assert await anext(aiter(stream)) == "before "
        await client.drop()  # 1006: the client reconnects and resumes the stream
        gate.set()
        assert [c async for c in stream] == ["after"]
        assert client.resumes == 1 and client.connections == 2


async def test_a_model_error_is_a_stream_error() -> None:
    async def broken(req):
        raise ValueError("nope")
        yield  # pragma: no cover

    async with asyncio.timeout(WAIT), AppClient(LowLatASGI(broken, registry=CollectorRegistry()), path="/") as c:
        with pytest.raises(StreamError):
            await c.complete("x")


async def test_the_lifespan_state_reaches_each_connection() -> None:
    import contextlib

    seen = []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield {"db": "connected"}

    async def model(req):
        return "x"

    class Spy:  # an ASGI middleware that notes the state each WebSocket scope carries
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope["type"] == "websocket":
                seen.append(dict(scope.get("state", {})))
            await self.app(scope, receive, send)

    app = Starlette(lifespan=lifespan, middleware=[
        Middleware(Spy), Middleware(LowLatMiddleware, model=model, path="/ws", registry=CollectorRegistry())])
    async with asyncio.timeout(WAIT), AppClient(app) as client:
        assert await client.complete("x") == "x"
    assert seen == [{"db": "connected"}]


def test_a_server_that_fails_to_start_says_why_and_cleans_up() -> None:
    from lowlat_mw.testing.pytest_plugin import RunningServer

    server = RunningServer(starlette_app(idle_timout=5))
    with pytest.raises(RuntimeError, match="did not start serving") as info:
        server.start()
    assert isinstance(info.value.__cause__, SystemExit)  # uvicorn exits on a failed lifespan start-up
    assert not server._thread.is_alive() and server._sock.fileno() == -1


def test_a_failed_start_up_leaves_no_unretrieved_task_exception(caplog: pytest.LogCaptureFixture) -> None:
    """uvicorn's SystemExit is raised by the server thread's main coroutine, not left on a task of its own: else
    the collector finds that task later and asyncio logs "Task exception was never retrieved", at a random
    moment of whichever test then runs (or at interpreter exit)."""
    import gc

    from lowlat_mw.testing.pytest_plugin import RunningServer

    with pytest.raises(RuntimeError, match="did not start serving"):
        RunningServer(starlette_app(idle_timout=5)).start()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
