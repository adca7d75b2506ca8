"""Typed client options (connect's signature is the client's) and typed stream events (Delta, then End)."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from prometheus_client import CollectorRegistry

from lowlat_mw import AsyncClient, Delta, End, StreamError, connect, connect_sync
from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.testing import AppClient
from lowlat_mw.testing.pytest_plugin import RunningServer

WAIT = 30.0


async def words(req):
    for word in req.prompt.split():
        yield word


async def failing(req):
    yield "one"
    raise RuntimeError("boom")


def test_connect_has_the_clients_keyword_options() -> None:
    for function in (connect, connect_sync):
        params = inspect.signature(function).parameters
        assert list(params) == list(inspect.signature(AsyncClient).parameters)
        assert params["mode"].kind is inspect.Parameter.KEYWORD_ONLY and params["mode"].default == "proto"
        assert "Literal['proto', 'json']" in str(params["mode"].annotation)
        assert "backoff" in params and "headers" in params and "auth" in params
    assert inspect.signature(connect).return_annotation in ("AsyncClient", AsyncClient)
    assert inspect.signature(connect_sync).return_annotation in ("SyncClient",)
    with pytest.raises(TypeError):
        connect("ws://x", moed="json")  # a misspelt option fails at once, as for the class
    with pytest.raises(ValueError, match="mode must be"):
        connect("ws://x", mode="xml")  # type: ignore[arg-type]


async def test_stream_events_are_deltas_then_the_end() -> None:
    app = LowLatASGI(words, registry=CollectorRegistry())
    async with asyncio.timeout(WAIT), AppClient(app, path="/") as client:
        events = [e async for e in client.stream("a b c").events()]
        assert [type(e) for e in events] == [Delta, Delta, Delta, End]
        assert [(e.seq, e.text) for e in events[:3]] == [(1, "a"), (2, "b"), (3, "c")]
        end = events[-1]
        assert end.finish_reason == "stop" and end.last_seq == 3 and end.usage["deltas"] == 3
        assert "total" in end.timings_ms


async def test_stream_events_raise_the_streams_error() -> None:
    app = LowLatASGI(failing, registry=CollectorRegistry())
    async with asyncio.timeout(WAIT), AppClient(app, path="/") as client:
        seen = []
        with pytest.raises(StreamError):
            async for event in client.stream("x").events():
                seen.append(event)
        assert [type(e) for e in seen] == [Delta]


def test_sync_client_events() -> None:
    server = RunningServer(LowLatASGI(words, registry=CollectorRegistry()), path="/").start()
    try:
        with connect_sync(server.url, mode="json") as client:
            events = list(client.events("x y"))
            assert [type(e) for e in events] == [Delta, Delta, End]
            assert client.last_stream is not None and client.last_stream.end == events[-1]
            first = next(iter(client.events("p q r")))  # stopping early cancels the stream
            assert first.text == "p"
            assert client.complete("still fine") == "stillfine"
    finally:
        server.stop()
