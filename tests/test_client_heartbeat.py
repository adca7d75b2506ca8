"""The Python client notices a server that stops answering (its own heartbeat), on loopback."""

from __future__ import annotations

import asyncio
import time

import pytest
from support import wait_until
from websockets.asyncio.server import serve

from lowlat_mw.client import connect
from lowlat_mw.errors import CloseCode, ConnectionClosed
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import JsonCodec


async def _silent_server(ws) -> None:  # type: ignore[no-untyped-def]
    codec = JsonCodec()
    await ws.recv()  # Hello
    await ws.send(codec.encode(ev.Welcome(session_id="s", heartbeat_interval_ms=100)))
    try:
        async for _ in ws:  # swallow the client's Pings and Requests without answering
            pass
    except Exception:
        pass


@pytest.mark.timeout(20)
async def test_client_closes_dead_server_with_4001() -> None:
    async with serve(_silent_server, "127.0.0.1", 0, subprotocols=["lowlat.v1.json"]) as server:
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(10):
            client = connect(f"ws://127.0.0.1:{port}/ws", mode="json", heartbeat_timeout=0.2)
            await client.open()
            started = time.monotonic()
            stream = client.stream("hi")
            with pytest.raises(ConnectionClosed) as info:
                await stream.text()
            elapsed = time.monotonic() - started
            assert info.value.code == CloseCode.HEARTBEAT_TIMEOUT
            # first client Ping after 0.1 s, then 0.2 s without an answer (plus scheduling slack)
            assert elapsed < 0.1 + 0.2 + 1.0
            await client.close()


@pytest.mark.timeout(20)
async def test_client_measures_rtt_against_answering_server() -> None:
    async def answering(ws) -> None:  # type: ignore[no-untyped-def]
        codec = JsonCodec()
        await ws.recv()
        await ws.send(codec.encode(ev.Welcome(session_id="s", heartbeat_interval_ms=50)))
        async for frame in ws:
            event = codec.decode(frame, limit=1 << 20)
            if isinstance(event, ev.Ping):
                await ws.send(codec.encode(event.response()))

    async with serve(answering, "127.0.0.1", 0, subprotocols=["lowlat.v1.json"]) as server:
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(10), connect(f"ws://127.0.0.1:{port}/ws", mode="json",
                                                heartbeat_timeout=0.5) as client:
            await wait_until(lambda: client.rtt is not None, interval=0.02, what="a heartbeat RTT")
            assert 0 <= client.rtt < 0.5
            await asyncio.sleep(0.3)  # several intervals: still connected
            assert client.connected
