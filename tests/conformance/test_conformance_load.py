"""Load: 200 concurrent connections, each streaming a 50-delta reply, on every framework."""

from __future__ import annotations

import asyncio
import time

import pytest
from conformance_support import measure

from lowlat_mw import Backoff
from lowlat_mw.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
SERVER_LEVEL = True  # the `server` fixture's frameworks: conformance_servers.SERVERS (conftest)

CONNECTIONS = 200
DELTAS = 50
STREAM_BOUND = 60.0  # seconds for all 200 replies (a few seconds is typical here)


async def test_200_concurrent_connections_stream_every_delta_in_order(server):
    # no reconnect retries: a refused or dropped connection must fail the test, not hide in a retry
    clients = [connect(server.url, backoff=Backoff(retries=0)) for _ in range(CONNECTIONS)]
    opening = asyncio.Semaphore(50)  # stay within small accept backlogs while opening

    async def open_one(client) -> None:
        async with opening:
            await client.open()

    async def stream_one(client) -> tuple[list[str], list[int], object]:
        stream = client.stream("load", model="agen", params={"n": DELTAS, "delay": 0.001})
        chunks, seqs = [], []
        async for chunk in stream:
            chunks.append(chunk)
            seqs.append(stream.last_seq)
        return chunks, seqs, stream.end

    try:
        t0 = time.monotonic()
        async with asyncio.timeout(STREAM_BOUND):
            await asyncio.gather(*(open_one(c) for c in clients))
        opened = time.monotonic() - t0
        assert all(c.connected for c in clients)
        t1 = time.monotonic()
        async with asyncio.timeout(STREAM_BOUND):
            results = await asyncio.gather(*(stream_one(c) for c in clients))
        streamed = time.monotonic() - t1
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

    expected = [f"a{i};" for i in range(DELTAS)]
    for chunks, seqs, end in results:
        assert chunks == expected
        assert seqs == list(range(1, DELTAS + 1))
        assert end is not None and end.finish_reason == "stop" and end.last_seq == DELTAS
    assert all(c.connections == 1 for c in clients)
    measure(f"load {server.framework}",
            f"{CONNECTIONS} connections opened in {opened:.2f} s; {CONNECTIONS} x {DELTAS} deltas streamed "
            f"concurrently in {streamed:.2f} s ({CONNECTIONS * DELTAS / streamed:,.0f} deltas/s)")
