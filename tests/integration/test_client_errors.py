"""What the Python client says when it cannot connect (issue 38, item 17).

A new user saw the same error for a wrong Origin and a wrong path ("handshake refused with HTTP 403": Starlette refuses
an unknown WebSocket path with 403 too), and waited 12-23 s of retries for a first connection to a closed port.
Now the server says which check refused (the text of its 403, where the server can send one), the client shows the
status with that text or a hint naming the path, and a first connection that nothing listens to fails at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from support import seconds, wait_until

from lowlat_mw.client import AsyncClient, connect, connect_sync
from lowlat_mw.client.backoff import Backoff
from lowlat_mw.errors import HandshakeRefused, ReconnectFailed
from lowlat_mw.servers.cli import build_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Retries that the old behaviour would have made (6 attempts); counted, never timed.
RETRYING = Backoff(base=0.01, cap=0.05, retries=5, jitter=False)


async def words(req: Any):  # (an async generator)
    for word in req.prompt.split():
        yield word


class Counting(AsyncClient):
    """Counts its connection attempts."""

    attempts = 0

    async def _open_ws(self) -> Any:
        self.attempts += 1
        return await super()._open_ws()


async def refusal(url: str, **options: Any) -> tuple[HandshakeRefused, int]:
    client = Counting(url, backoff=RETRYING, **options)
    async with asyncio.timeout(20):
        with pytest.raises(HandshakeRefused) as info:
            await client.open()
    return info.value, client.attempts


@pytest.mark.parametrize("ws", ["websockets-sansio", "wsproto"])
async def test_a_wrong_origin_and_a_wrong_path_give_different_errors(
        uvicorn_server: Callable[..., Any], starlette_app: Callable[..., Any], ws: str) -> None:
    srv = uvicorn_server(starlette_app(words), ws=ws)
    origin, tries = await refusal(srv.url, headers={"Origin": "http://evil.example"})
    assert (origin.status, tries) == (403, 1)  # final: not retried
    assert "Origin is not in the server's allowed_origins" in str(origin)
    path, tries = await refusal(srv.url.replace("/ws", "/wss"))
    assert (path.status, tries) == (403, 1)  # Starlette's own refusal of a path it has no route for: no text
    assert "no WebSocket route at /wss" in str(path) and "allowed_origins" in str(path)  # (the hint lists it last)
    assert str(origin) != str(path)
    async with connect(srv.url) as client:  # the right URL works
        assert await client.complete("a b") == "ab"


async def test_no_subprotocol_served_says_so(uvicorn_server: Callable[..., Any],
                                             starlette_app: Callable[..., Any]) -> None:
    srv = uvicorn_server(starlette_app(words, subprotocols=["lowlat.v1.json"]))
    error, tries = await refusal(srv.url, mode="proto")
    assert (error.status, tries) == (403, 1)
    assert "no subprotocol offered that this endpoint serves (lowlat.v1.json)" in str(error)


async def test_the_serve_command_answers_a_wrong_path_with_404(uvicorn_server: Callable[..., Any]) -> None:
    srv = uvicorn_server(build_app(words, metrics=False))
    error, tries = await refusal(srv.url.replace("/ws", "/chat"))
    assert (error.status, tries) == (404, 1)
    assert str(error) == ("handshake refused with HTTP 404: lowlat-mw: no WebSocket endpoint at /chat: "
                          "this server's is /ws")


async def test_a_first_connection_that_nothing_listens_to_fails_at_once(unused_port: int) -> None:
    url = f"ws://127.0.0.1:{unused_port}/ws"
    client = Counting(url, backoff=RETRYING)
    async with asyncio.timeout(20):
        with pytest.raises(ReconnectFailed) as info:
            await client.complete("anyone?")
    assert client.attempts == 1  # (6 before: 12-23 s with the default backoff)
    assert f"could not connect to {url}: connection refused (nothing listens there" in str(info.value)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_the_sync_client_fails_at_once_too(unused_port: int) -> None:
    started = time.monotonic()
    with pytest.raises(ReconnectFailed, match="connection refused"):
        with connect_sync(f"ws://127.0.0.1:{unused_port}/ws", backoff=Backoff(base=5.0, jitter=False)):
            pass
    assert time.monotonic() - started < 5.0  # the old first retry alone waited 5 s


async def test_a_reconnect_after_a_drop_still_waits_with_backoff(uvicorn_server: Callable[..., Any],
                                                                 starlette_app: Callable[..., Any]) -> None:
    """Once connected, a closed port is a server restarting: reconnecting retries with the backoff (and fails after
    the retries) instead of failing at once."""
    srv = uvicorn_server(starlette_app(words))
    client = Counting(srv.url, backoff=RETRYING)
    async with asyncio.timeout(30):
        assert await client.complete("one") == "one"
        await asyncio.to_thread(srv.stop)
        await wait_until(lambda: not client.connected, seconds(30), interval=0.01, what="the client to see it go")
        with pytest.raises(ReconnectFailed, match="after 6 attempts"):
            await client.complete("two")
    assert client.attempts == 1 + 6
