"""FaultProxy's one-way delay: applied per direction, pipelined (not a bandwidth limit), order and bytes kept.

An asyncio echo server on loopback (in the test's loop) stamps when bytes reach it; the proxy runs in
its own thread. Bounds are generous: lower bounds are what the delay guarantees, upper bounds only
tell a pipelined delay from one slept chunk by chunk.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from support.waits import wait_until

from lowlat_mw.testing import FaultProxy
from lowlat_mw.testing.proxy import MAX_IN_FLIGHT

SLACK = 0.98  # timers may fire a hair early relative to another thread's clock reads


class Echo:
    """Echoes every chunk back at once; records (monotonic arrival time, bytes) per chunk."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, bytes]] = []
        self.sent_at: list[float] = []
        self.eof = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                self.arrivals.append((time.monotonic(), data))
                self.sent_at.append(time.monotonic())
                writer.write(data)
                await writer.drain()
            self.eof.set()
            writer.write_eof()
            await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def echo_through(**proxy_kwargs: object) -> AsyncIterator[tuple[Echo, FaultProxy]]:
    echo = Echo()
    server = await asyncio.start_server(echo.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with FaultProxy(("127.0.0.1", port), **proxy_kwargs) as proxy:  # type: ignore[arg-type]
            yield echo, proxy
    finally:
        server.close()


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    async with asyncio.timeout(10):
        return await reader.readexactly(n)


def test_constructor_keywords_match_attributes() -> None:
    with FaultProxy(("127.0.0.1", 9), delay=0.025, bandwidth=1e6, handshake=False) as proxy:
        assert (proxy.delay, proxy.bandwidth, proxy.handshake) == (0.025, 1e6, False)
    with FaultProxy(("127.0.0.1", 9)) as proxy:
        assert (proxy.delay, proxy.bandwidth, proxy.handshake) == (0.0, 0.0, True)
    with pytest.raises(ValueError):
        FaultProxy(("127.0.0.1", 9), delay=-1)
    with pytest.raises(ValueError):
        FaultProxy(("10.0.0.1", 9))


async def test_delay_applies_once_in_each_direction() -> None:
    delay = 0.05
    async with echo_through(delay=delay, handshake=False) as (echo, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            for i in range(3):
                t0 = time.monotonic()
                writer.write(b"ping%d" % i)
                await writer.drain()
                assert await read_exactly(reader, 5) == b"ping%d" % i
                t3 = time.monotonic()
                arrived, data = echo.arrivals[-1]
                assert data == b"ping%d" % i
                assert arrived - t0 >= delay * SLACK, "client -> server not delayed"
                assert t3 - echo.sent_at[-1] >= delay * SLACK, "server -> client not delayed"
                assert 2 * delay * SLACK <= t3 - t0 < 2 * delay + 2.0
        finally:
            writer.close()


async def test_handshake_costs_one_round_trip_before_the_first_bytes() -> None:
    delay = 0.04
    async with echo_through(delay=delay) as (echo, proxy):
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            writer.write(b"hello")
            await writer.drain()
            assert await read_exactly(reader, 5) == b"hello"
            first = echo.arrivals[0][0]
            assert first - t0 >= 3 * delay * SLACK  # SYN, SYN-ACK, then the data: three one-way trips
            # Later bytes on the same connection pay the one-way delay only.
            t1 = time.monotonic()
            writer.write(b"again")
            await writer.drain()
            assert await read_exactly(reader, 5) == b"again"
            assert 2 * delay * SLACK <= time.monotonic() - t1 < 2 * delay + 2.0
        finally:
            writer.close()


async def test_delay_is_pipelined_not_a_bandwidth_limit() -> None:
    """20 messages 5 ms apart through 100 ms each way: the last is back after ~0.3 s, not after 20 delays."""
    delay, n = 0.1, 20
    async with echo_through(delay=delay, handshake=False) as (_, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            start = time.monotonic()
            for i in range(n):
                writer.write(b"%04d" % i)
                await writer.drain()
                await asyncio.sleep(0.005)
            assert await read_exactly(reader, 4 * n) == b"".join(b"%04d" % i for i in range(n))
            elapsed = time.monotonic() - start
            assert 2 * delay * SLACK <= elapsed < n * delay  # chunk-by-chunk sleeping would take >= 2 s
        finally:
            writer.close()


async def test_bytes_and_order_survive_delay_changes_and_end_of_stream() -> None:
    rng = random.Random(7)
    payload = os.urandom(3 * 1024 * 1024)
    async with echo_through(delay=0.01) as (echo, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:

            async def send() -> None:
                pos = 0
                while pos < len(payload):
                    size = rng.randint(1, 200_000)
                    writer.write(payload[pos:pos + size])
                    await writer.drain()
                    pos += size
                    if rng.random() < 0.3:
                        proxy.delay = rng.choice((0.0, 0.002, 0.02))  # later chunks may be due earlier
                writer.write_eof()

            sender = asyncio.ensure_future(send())
            async with asyncio.timeout(30):
                back = await reader.read(-1)  # everything, up to the echoed end of stream
            await sender
            assert back == payload
            assert b"".join(d for _, d in echo.arrivals) == payload
            assert echo.eof.is_set()
        finally:
            writer.close()


async def test_in_flight_is_bounded_when_the_reader_stops() -> None:
    """A client that stops reading: the proxy holds at most MAX_IN_FLIGHT (+ one read) per direction."""
    async with echo_through(delay=0.001, handshake=False) as (_, proxy):
        _reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            chunk = b"x" * 65536
            total = MAX_IN_FLIGHT * 8  # more than both pipes and every kernel buffer on the way hold
            sent = 0

            async def send() -> None:
                nonlocal sent
                while sent < total:
                    writer.write(chunk)
                    await writer.drain()
                    sent += len(chunk)

            sender = asyncio.ensure_future(send())
            [link] = await wait_until(lambda: list(proxy._links), what="the proxy's link")
            peak = [0]

            def capped() -> bool:
                """Nothing is read on the client: everything backs up until a pipe holds MAX_IN_FLIGHT and the proxy
                stops reading into it (the most it holds meanwhile is kept in `peak`)."""
                pending = max(p.pending for p in link.pipes)
                peak[0] = max(peak[0], pending)
                return sender.done() or pending > MAX_IN_FLIGHT

            await wait_until(capped, what="a pipe to fill up to MAX_IN_FLIGHT")
            assert not sender.done()
            assert peak[0] <= MAX_IN_FLIGHT + 65536, peak
            assert all(p.pending <= MAX_IN_FLIGHT + 65536 for p in link.pipes)
            assert max(p.pending for p in link.pipes) > MAX_IN_FLIGHT // 2  # the delayed pipe did fill up
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        finally:
            writer.close()
