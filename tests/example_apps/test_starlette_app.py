"""How a user tests a Starlette app with lowlat-mw (see test_fastapi_app.py)."""

from __future__ import annotations

import asyncio

import pytest

from examples.starlette_app import app
from lowlat_mw import connect
from lowlat_mw.testing import AppClient


@pytest.fixture
def lowlat_app():
    return app


async def test_cancel_and_resume_in_process():
    async with AppClient(app) as client:
        stream = client.stream("a b c d e f")
        await anext(aiter(stream))
        await stream.cancel()
        await client.drop()  # the connection is lost: the next request reconnects
        assert (await client.complete("again")).startswith("You said: again")
        assert client.connections == 2


async def test_through_uvicorn(lowlat_server):
    async with asyncio.timeout(30), connect(lowlat_server.url) as client:
        assert (await client.complete("hi")).startswith("You said: hi")
