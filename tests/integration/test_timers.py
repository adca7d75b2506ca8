"""Heartbeat timeout, idle reaping and handshake timeout on a real server, with short settings."""

from __future__ import annotations

import asyncio
import time

import pytest
from support import seconds, wait_until
from support.raw import JSON, PROTO, hello, raw_connect, read_until_closed
from support.time import MARGIN

from lowlat_mw.client import connect
from lowlat_mw.errors import CloseCode
from lowlat_mw.protocol import events as ev

from ._support import record_frames

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

INTERVAL, MAX_INTERVAL, TIMEOUT = 0.2, 0.4, 0.2


async def words(req):
    for w in req.prompt.split():
        yield w + " "


@pytest.mark.parametrize("subprotocol", [PROTO, JSON])
async def test_peer_that_stops_answering_pings_is_closed_with_heartbeat_timeout(
    uvicorn_server, starlette_app, subprotocol
):
    srv = uvicorn_server(starlette_app(words, heartbeat_interval=INTERVAL, heartbeat_max_interval=MAX_INTERVAL,
                                       heartbeat_timeout=TIMEOUT))
    async with asyncio.timeout(15), connect(srv.url) as good:
        rec = record_frames(good)  # the client is connected already: swap the codec on the live client
        assert await good.complete("hello there") == "hello there "

        async def silent_peer():
            start = time.monotonic()
            async with raw_connect(srv.url, [subprotocol]) as conn:
                await hello(conn)
                out = await read_until_closed(conn, timeout=5)
            return out, time.monotonic() - start

        # The silent peer dies while the good client idles through several intervals.
        (out, elapsed), _ = await asyncio.gather(silent_peer(), asyncio.sleep(5 * MAX_INTERVAL))
        assert out.close_code == CloseCode.HEARTBEAT_TIMEOUT
        assert any(isinstance(e, ev.Ping) for e in out.events), "the server never pinged"
        assert TIMEOUT <= elapsed <= INTERVAL + TIMEOUT + 0.3 * MARGIN, elapsed

        # The client that answers pings was pinged several times and is still connected.
        pings = [e for _, e in rec.received_events() if isinstance(e, ev.Ping)]
        assert len(pings) >= 2, pings
        assert good.connected and good.connections == 1 and good.last_close is None
        assert await good.complete("still here") == "still here "
        assert good.connections == 1


async def test_idle_connection_is_reaped(uvicorn_server, starlette_app):
    idle = 0.3
    srv = uvicorn_server(starlette_app(words, idle_timeout=idle))
    async with asyncio.timeout(15), raw_connect(srv.url, [PROTO]) as conn:
        start = time.monotonic()
        await hello(conn)
        out = await read_until_closed(conn, timeout=5)
        elapsed = time.monotonic() - start
    assert out.close_code == CloseCode.IDLE_TIMEOUT
    assert out.events == []  # closed without any frame first
    assert idle <= elapsed + 0.02 and elapsed <= idle + 0.3 * MARGIN, elapsed


async def test_python_client_reconnects_lazily_after_idle_reap(uvicorn_server, starlette_app):
    idle = 0.3
    srv = uvicorn_server(starlette_app(words, idle_timeout=idle))
    async with asyncio.timeout(15), connect(srv.url) as client:
        assert await client.complete("one") == "one "
        start = time.monotonic()
        await wait_until(lambda: not client.connected, timeout=seconds(5))
        took = time.monotonic() - start
        assert took <= idle + 0.3 * MARGIN
        assert client.last_close.code == CloseCode.IDLE_TIMEOUT
        assert await client.complete("two") == "two "
        assert client.connections == 2


async def test_running_stream_is_not_reaped(uvicorn_server, starlette_app):
    idle = 0.3

    async def slow(req):
        yield "start "
        await asyncio.sleep(3 * idle)  # no traffic at all for longer than idle_timeout
        yield "end"

    srv = uvicorn_server(starlette_app(slow, idle_timeout=idle))
    async with asyncio.timeout(15), connect(srv.url) as client:
        start = time.monotonic()
        assert await client.complete("x") == "start end"
        assert time.monotonic() - start >= 3 * idle
        assert client.connections == 1 and client.last_close is None
        # once the stream is over, the reaper starts counting again
        await wait_until(lambda: not client.connected, timeout=seconds(5))
        assert client.last_close.code == CloseCode.IDLE_TIMEOUT


@pytest.mark.parametrize("subprotocol", [PROTO, JSON])
async def test_no_hello_within_handshake_timeout(uvicorn_server, starlette_app, subprotocol):
    limit = 0.3
    srv = uvicorn_server(starlette_app(words, handshake_timeout=limit))
    async with asyncio.timeout(15):
        start = time.monotonic()
        async with raw_connect(srv.url, [subprotocol]) as conn:
            out = await read_until_closed(conn, timeout=5)
        elapsed = time.monotonic() - start
        assert out.close_code == CloseCode.HANDSHAKE_TIMEOUT
        assert out.events == []
        assert limit - 0.02 <= elapsed <= limit + 0.3 * MARGIN, elapsed
        # a client that says hello in time is fine on the same server
        async with connect(srv.url) as client:
            await asyncio.sleep(2 * limit)
            assert await client.complete("hi") == "hi "
            assert client.connections == 1
