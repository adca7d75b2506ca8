"""How a user tests a FastAPI app with lowlat-mw: in process (no socket) and through a real server.

The fixtures (``lowlat_server``, ``lowlat_client``) come from lowlat-mw's pytest plugin; ``lowlat_app`` says which
app they serve.
"""

from __future__ import annotations

import pytest

from examples.fastapi_app import app
from lowlat_mw.testing import AppClient


@pytest.fixture
def lowlat_app():
    return app


async def test_a_reply_in_process():
    async with AppClient(app) as client:
        assert await client.complete("hello there") == "You said: hello there "


async def test_streams_share_one_connection_in_process():
    async with AppClient(app, mode="json") as client:
        first, second = client.stream("one"), client.stream("two")
        assert "".join([c async for c in first]) == "You said: one "
        assert "".join([c async for c in second]) == "You said: two "
        assert client.connections == 1


def test_a_reply_through_uvicorn(lowlat_client):
    assert lowlat_client.complete("hello there") == "You said: hello there "
