"""Errors sent to clients are logged with their ids, and a client cannot flood the log with them."""

from __future__ import annotations

import asyncio
import logging

import pytest

from lowlat_mw.observability.logs import CLIENT_LOGS

from ._support import JSON, hello, raw_connect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def echo(req):
    yield req.text or ""


async def test_error_frames_are_logged_with_ids_then_demoted_to_debug(uvicorn_server, starlette_app, caplog) -> None:
    CLIENT_LOGS.reset()  # (the per-address budget is process-wide: other tests' lines from 127.0.0.1 count)
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
