"""Errors sent to clients are logged with their ids, and a client cannot flood the log with them."""

from __future__ import annotations

import asyncio
import logging

import pytest
from support.raw import JSON, LIMIT, codec_of, hello, raw_connect
from support.time import seconds
from support.waits import wait_until
from websockets.exceptions import ConnectionClosed

from lowlat_mw.errors import CloseCode
from lowlat_mw.observability.logs import CLIENT_LOGS
from lowlat_mw.protocol import events as ev

from ._delivery_support import serve

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def echo(req):
    yield req.text or ""


async def test_error_frames_are_logged_with_ids_then_demoted_to_debug(uvicorn_server, starlette_app, caplog) -> None:
    srv = uvicorn_server(starlette_app(echo, metrics=False))
    caplog.set_level(logging.DEBUG, logger="lowlat_mw")
    async with raw_connect(srv.url, subprotocols=[JSON]) as ws:
        welcome = await hello(ws)
        for _ in range(15):
            await ws.send('{"type":"no_such_message"}')  # Error unsupported_message, connection kept
            async with asyncio.timeout(5):
                assert "unsupported_message" in await ws.recv()
    records = [r for r in caplog.records if getattr(r, "error_code", None) == "unsupported_message"]
    assert len(records) == 15
    assert [r.levelno for r in records] == [logging.INFO] * 10 + [logging.DEBUG] * 5
    assert all(r.session_id == welcome.session_id and r.stream_id == 0 for r in records)


async def test_the_connections_of_one_address_share_its_budget(uvicorn_server, starlette_app, caplog) -> None:
    """The budget is keyed by the client's address, not by the connection (its port): 15 connections from
    127.0.0.1 with one bad message each log 10 lines at INFO and the rest at DEBUG (docs/security.md "Logs")."""
    srv = uvicorn_server(starlette_app(echo, metrics=False))
    caplog.set_level(logging.DEBUG, logger="lowlat_mw")
    for _ in range(15):
        async with raw_connect(srv.url, subprotocols=[JSON]) as ws:
            await hello(ws)
            await ws.send('{"type":"no_such_message"}')
            async with asyncio.timeout(5):
                assert "unsupported_message" in await ws.recv()
    records = [r for r in caplog.records if getattr(r, "error_code", None) == "unsupported_message"]
    assert len({r.session_id for r in records}) == 15
    assert [r.levelno for r in records] == [logging.INFO] * CLIENT_LOGS.burst + [logging.DEBUG] * 5


async def test_a_slow_consumer_closed_is_logged_within_its_address_budget(uvicorn_server, caplog) -> None:
    """The "closing slow consumer" WARNING is a line a client causes (it stops reading): past its address's
    budget it goes to DEBUG like the others."""
    logger = logging.getLogger("test.error_logs")
    for _ in range(CLIENT_LOGS.burst):  # the budget of 127.0.0.1 spent
        CLIENT_LOGS.log(logger, logging.INFO, "127.0.0.1", "spent")
    served = serve(uvicorn_server, slow_consumer_timeout=0.5, resume_window=0.5)
    caplog.set_level(logging.DEBUG, logger="lowlat_mw")
    async with asyncio.timeout(20), raw_connect(f"ws://127.0.0.1:{served.port}/ws", max_queue=4) as ws:
        codec = codec_of(ws)
        await ws.send(codec.encode(ev.Hello(client="raw-no-acks", flow_window=0)))
        assert isinstance(codec.decode(await ws.recv(), limit=LIMIT, allowed=()), ev.Welcome)
        await ws.send(codec.encode(ev.Request(stream_id=1, model="count", text="x",
                                              params={"n": 100_000, "size": 4096})))
        await wait_until(lambda: [r for r in caplog.records if "slow consumer" in r.getMessage()], seconds(20),
                         interval=0.05, what="the slow-consumer log")
        with pytest.raises(ConnectionClosed):
            async for _ in ws:  # the queued Deltas, then the close
                pass
    assert ws.close_code == CloseCode.SLOW_CONSUMER
    [record] = [r for r in caplog.records if "slow consumer" in r.getMessage()]
    assert record.levelno == logging.DEBUG and record.client[0] == "127.0.0.1"
