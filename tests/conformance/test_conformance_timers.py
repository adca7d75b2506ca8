"""Heartbeat timeout, idle reaping and handshake timeout on the short-timers servers.

Timers (conformance_support.SHORT_TIMERS): Pings every 0.3 s (up to 0.6 s while the peer sends
application traffic), 0.3 s to answer, idle timeout 1.0 s, handshake timeout 1.0 s.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from conformance_support import HANDSHAKE_TIMEOUT, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, IDLE_TIMEOUT, measure
from support.raw import JSON, PROTO, codec_of, hello, raw_connect, read_until_closed, recv_event
from support.time import MARGIN

from lowlat_mw.client import connect
from lowlat_mw.errors import CloseCode
from lowlat_mw.protocol import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]



async def test_peer_that_never_answers_pings_is_closed_with_4001(timer_server):
    async def silent_peer(sp: str) -> None:
        async with raw_connect(timer_server.url, [sp]) as ws:
            await hello(ws)
            out = await read_until_closed(ws, timeout=5)  # never answers
        assert out.close_code == CloseCode.HEARTBEAT_TIMEOUT, out
        assert out.events == [ev.Ping(id=1)], out.events  # one Ping, then the close; no Error
        ping_at, closed_at = out.times[0], out.elapsed
        # the first Ping is due one interval after the WebSocket opened (a few ms before Welcome)
        assert HEARTBEAT_INTERVAL - 0.1 <= ping_at <= HEARTBEAT_INTERVAL + 0.5 * MARGIN, ping_at
        assert HEARTBEAT_TIMEOUT - 0.05 <= closed_at - ping_at <= HEARTBEAT_TIMEOUT + 0.5 * MARGIN, (ping_at, closed_at)
        assert closed_at <= HEARTBEAT_INTERVAL + HEARTBEAT_TIMEOUT + 0.5 * MARGIN
        measure(f"heartbeat close {timer_server.framework}-{'proto' if sp == PROTO else 'json'}",
                f"4001 {closed_at:.3f} s after Welcome (Ping at {ping_at:.3f} s, close {closed_at - ping_at:.3f} s "
                f"after it; interval {HEARTBEAT_INTERVAL} s + timeout {HEARTBEAT_TIMEOUT} s)")

    await asyncio.gather(silent_peer(PROTO), silent_peer(JSON))


async def test_peers_answering_pings_stay_open_across_intervals(timer_server):
    """A 2 s stream spans several Ping intervals: a raw client answering every Ping and the Python
    client (proto and JSON) all see it complete on their first connection."""

    async def raw_peer() -> None:
        async with raw_connect(timer_server.url, [PROTO]) as ws:
            await hello(ws)
            codec = codec_of(ws)
            pings = 0

            async def next_non_ping() -> ev.Event:
                nonlocal pings
                while True:
                    event = codec.decode(await ws.recv(), limit=1 << 20, allowed=())
                    if not isinstance(event, ev.Ping):
                        return event
                    pings += 1
                    await ws.send(codec.encode(event.response()))

            await ws.send(codec.encode(ev.Request(stream_id=1, model="hold", params={"delay": 2.0})))
            assert await next_non_ping() == ev.Delta(stream_id=1, seq=1, text="started;")
            assert await next_non_ping() == ev.Delta(stream_id=1, seq=2, text="done;")
            end = await next_non_ping()
            assert isinstance(end, ev.End) and (end.finish_reason, end.last_seq) == ("stop", 2)
            # intervals of 0.3 s, doubled up to 0.6 s after application traffic: >= 3 Pings in 2 s
            assert pings >= 3, pings
            await ws.send(codec.encode(ev.Request(stream_id=2, model="sync", text="still open")))
            assert await next_non_ping() == ev.Delta(stream_id=2, seq=1, text="sync:still open")

    async def python_client(mode: str) -> None:
        async with connect(timer_server.url, mode=mode) as client:
            stream = client.stream("x", model="hold", params={"delay": 2.0})
            assert [c async for c in stream] == ["started;", "done;"]
            assert client.connected and client.connections == 1 and client.last_close is None

    async with asyncio.timeout(15):
        await asyncio.gather(raw_peer(), python_client("proto"), python_client("json"))


async def test_idle_connection_is_reaped_with_4000(timer_server):
    async def idle_peer(sp: str) -> None:
        async with raw_connect(timer_server.url, [sp]) as ws:
            await hello(ws)
            out = await read_until_closed(ws, timeout=5, answer_pings=True)
        assert out.close_code == CloseCode.IDLE_TIMEOUT, out
        assert all(isinstance(e, ev.Ping) for e in out.events), out.events  # Pings only, no Error
        assert IDLE_TIMEOUT - 0.1 <= out.elapsed <= IDLE_TIMEOUT + 0.5 * MARGIN, out.elapsed
        measure(f"idle close {timer_server.framework}-{'proto' if sp == PROTO else 'json'}",
                f"4000 {out.elapsed:.3f} s after Welcome (idle_timeout {IDLE_TIMEOUT} s)")

    await asyncio.gather(idle_peer(PROTO), idle_peer(JSON))


async def test_no_idle_reaping_while_a_stream_runs(timer_server):
    async with asyncio.timeout(15), connect(timer_server.url) as client:
        # "started;" at once, then 1.8 s of silence (longer than the idle timeout), then "done;"
        stream = client.stream("x", model="hold", params={"delay": 1.8})
        assert [c async for c in stream] == ["started;", "done;"]
        assert stream.end.finish_reason == "stop"
        assert client.connected and client.last_close is None
        ended = time.monotonic()
        # once no stream runs, the reaper counts again from the End
        while client.connected:
            assert time.monotonic() - ended < IDLE_TIMEOUT + 2, "not reaped after the stream ended"
            await asyncio.sleep(0.01)
        reaped_after = time.monotonic() - ended
        assert client.last_close.code == CloseCode.IDLE_TIMEOUT
        assert IDLE_TIMEOUT - 0.1 <= reaped_after <= IDLE_TIMEOUT + 0.5 * MARGIN, reaped_after
        # and the client reconnects lazily for the next request
        assert await client.complete("again", model="sync") == "sync:again"
        assert client.connections == 2


async def test_no_hello_is_closed_with_4004(timer_server):
    async def mute_peer(sp: str) -> None:
        start = time.monotonic()
        async with raw_connect(timer_server.url, [sp]) as ws:
            out = await read_until_closed(ws, timeout=5)  # sends nothing at all
        elapsed = time.monotonic() - start
        # no Error, and no Ping either: a client cannot answer a Ping before its Hello
        assert (out.close_code, out.events) == (CloseCode.HANDSHAKE_TIMEOUT, []), out
        assert HANDSHAKE_TIMEOUT - 0.1 <= elapsed <= HANDSHAKE_TIMEOUT + 0.5 * MARGIN, elapsed
        measure(f"handshake close {timer_server.framework}-{'proto' if sp == PROTO else 'json'}",
                f"4004 {elapsed:.3f} s after connecting (handshake_timeout {HANDSHAKE_TIMEOUT} s)")

    await asyncio.gather(mute_peer(PROTO), mute_peer(JSON))


async def test_late_hello_within_handshake_timeout_is_welcomed(timer_server):
    """Hello after more than a Ping interval (but within the handshake timeout) still opens the session."""
    async with raw_connect(timer_server.url, [PROTO]) as ws:
        await asyncio.sleep(HEARTBEAT_INTERVAL + HEARTBEAT_TIMEOUT + 0.1)
        welcome = await hello(ws)  # hello() fails if anything but Welcome comes first
        assert welcome.idle_timeout_ms == IDLE_TIMEOUT * 1000
        assert welcome.heartbeat_interval_ms == HEARTBEAT_INTERVAL * 1000
        codec = codec_of(ws)
        await ws.send(codec.encode(ev.Request(stream_id=1, model="sync", text="late")))
        event = await recv_event(ws)
        while isinstance(event, ev.Ping):  # the Ping that was due before Hello may come now
            await ws.send(codec.encode(event.response()))
            event = await recv_event(ws)
        assert event == ev.Delta(stream_id=1, seq=1, text="sync:late")
