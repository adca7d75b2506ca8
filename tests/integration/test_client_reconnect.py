"""Python client: reconnect with backoff to a restarted server, final close codes, giving up."""

from __future__ import annotations

import asyncio
import time

import pytest
from support import seconds, wait_until
from support.raw import JSON

from lowlat_mw.client import connect, connect_sync
from lowlat_mw.client.backoff import Backoff
from lowlat_mw.errors import CloseCode, ConnectionClosed, ErrorCode, NotDelivered, ReconnectFailed, ResumeFailed
from lowlat_mw.testing import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

FAST = Backoff(base=0.05, cap=0.2, retries=20, jitter=False)


async def words(req):
    for w in req.prompt.split():
        yield w + " "


async def test_reconnects_to_a_server_restarted_on_the_same_port(uvicorn_server, starlette_app):
    first = uvicorn_server(starlette_app(words))
    async with asyncio.timeout(20), connect(first.url, backoff=FAST) as client:
        assert await client.complete("before restart") == "before restart "
        await asyncio.to_thread(first.stop)
        await wait_until(lambda: not client.connected, timeout=seconds(5))
        assert client.last_close.code == 1012  # uvicorn's "service restart" on shutdown: reconnect
        second = await asyncio.to_thread(uvicorn_server, starlette_app(words), port=first.port)
        assert second.url == first.url
        assert await client.complete("after restart") == "after restart "
        assert client.connections == 2


async def test_reconnect_waits_with_backoff_until_the_server_is_back(uvicorn_server, starlette_app):
    first = uvicorn_server(starlette_app(words))
    down_for = 0.4
    async with asyncio.timeout(20), connect(first.url, backoff=FAST) as client:
        assert await client.complete("one") == "one "
        await asyncio.to_thread(first.stop)
        await wait_until(lambda: not client.connected, timeout=seconds(5))

        async def restart_later():
            await asyncio.sleep(down_for)
            return await asyncio.to_thread(uvicorn_server, starlette_app(words), port=first.port)

        start = time.monotonic()
        restarter = asyncio.create_task(restart_later())
        # This request finds no server: the client retries with backoff until the restart.
        assert await client.complete("two") == "two "
        assert time.monotonic() - start >= down_for
        await restarter
        assert client.connections == 2


async def test_final_close_code_is_not_retried(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(words, max_frame_size=4096))
    async with asyncio.timeout(10), connect(srv.url, compression=[], backoff=FAST) as client:
        assert await client.complete("ok") == "ok "
        with pytest.raises(ConnectionClosed) as info:
            await client.complete("x" * 5000)  # over max_frame_size: Error + close 1009 (final)
        assert info.value.code == CloseCode.MESSAGE_TOO_BIG
        assert client.last_error is not None and client.last_error.code is ErrorCode.MESSAGE_TOO_BIG
        for _ in range(2):  # every later call fails the same way, without reconnecting
            with pytest.raises(ConnectionClosed) as again:
                await client.complete("ok")
            assert again.value.code == CloseCode.MESSAGE_TOO_BIG
        assert client.connections == 1


def test_final_close_code_sync_client(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(words, max_frame_size=4096))
    with connect_sync(srv.url, mode="json", backoff=FAST) as client:
        assert client.complete("ok") == "ok "
        with pytest.raises(ConnectionClosed) as info:
            client.complete("y" * 5000)
        assert info.value.code == CloseCode.MESSAGE_TOO_BIG
        with pytest.raises(ConnectionClosed):
            client.complete("ok")
        assert client.client.connections == 1


async def test_refused_handshake_is_final(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(words, subprotocols=[JSON]))
    client = connect(srv.url, mode="proto", backoff=FAST)
    async with asyncio.timeout(10):
        start = time.monotonic()
        with pytest.raises(ConnectionClosed) as info:
            await client.open()
        assert "403" in str(info.value)
        assert time.monotonic() - start < 1.0  # no backoff retries for a refusal
        assert client.connections == 0
        async with connect(srv.url, mode="json") as ok:
            assert await ok.complete("json works") == "json works "


async def test_nothing_listening_raises_reconnect_failed_at_once(unused_port):
    client = connect(f"ws://127.0.0.1:{unused_port}/ws", backoff=Backoff(retries=2, base=0.01))
    async with asyncio.timeout(10):
        with pytest.raises(ReconnectFailed) as info:
            async with client:
                pass
    # A first connection is not retried when nothing listens (a reconnect is: test_client_errors.py)
    assert "connection refused (nothing listens there" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert client.connections == 0


async def test_stream_on_unreachable_server_raises_reconnect_failed(unused_port):
    client = connect(f"ws://127.0.0.1:{unused_port}/ws", backoff=Backoff(retries=2, base=0.01))
    async with asyncio.timeout(10):
        with pytest.raises(ReconnectFailed):
            await client.complete("anyone?")


async def test_a_request_the_connection_drops_each_time_fails_as_not_delivered(uvicorn_server, starlette_app):
    # Issue 38, item 15: a request over a server's or proxy's message limit, where the limit drops the connection
    # (Django's runserver did): the client resumed, resent it, lost it again, and raised ResumeFailed "stream 2 is
    # unknown to this session", which did not say the request never arrived.
    srv = uvicorn_server(starlette_app(words))
    with FaultProxy(("127.0.0.1", srv.port), handshake=False) as proxy:
        proxy.cut_uploads_over(256 * 1024)
        backoff = Backoff(base=0.05, cap=0.2, retries=2, jitter=False)
        async with asyncio.timeout(30), connect(f"{proxy.url_base}/ws", mode="json", backoff=backoff) as client:
            assert await client.complete("small") == "small "
            with pytest.raises(NotDelivered) as info:
                await client.complete("x" * 600_000)
            error = info.value
            assert isinstance(error, ResumeFailed) and error.code is ErrorCode.RESUME_FAILED and error.retryable
            assert "was not delivered: the server never received it, though it was sent 3 times" in error.message
            assert "its message is 600" in error.message  # (its size: the reader can tell what dropped it)
            assert proxy.cuts == 3
            assert await client.complete("after") == "after "  # the connection, resumed, goes on
