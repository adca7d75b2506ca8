"""What docs/protocol.md states since its 2026-12-02 fixes, one test each, on every server (raw clients).

The other fixes of that list have their tests where their subject lives: a client Delta
(test_conformance_bad_frames.py, "client-delta"), `message_too_big` before 1009 past the hosting server's
own limit and on a stream for max_request_size (test_conformance_limits.py), streams cut by a close
resumed and repeated Deltas dropped by seq (test_conformance_delivery.py), the control budget
(test_conformance_bad_frames.py, test_conformance_limits.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from support.raw import JSON, PROTO, codec_of, hello, raw_connect, recv_event

from lowlat_mw.errors import ErrorCode
from lowlat_mw.protocol import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_json_welcome_writes_every_member(server) -> None:
    """7, 7.1: the server always writes every member of the Welcome, defaults included."""
    async with raw_connect(server.url, [JSON]) as ws:
        await ws.send(codec_of(ws).encode(ev.Hello(client="spec")))
        async with asyncio.timeout(10):
            welcome = json.loads(await ws.recv())
    members = {f.name for f in dataclasses.fields(ev.Welcome)}
    assert set(welcome) == members | {"type"}, set(welcome) ^ (members | {"type"})
    assert welcome["type"] == "welcome" and welcome["session_id"] and welcome["resume_token"]
    assert welcome["resume_window_ms"] > 0 and welcome["flow_window"] == 0  # (this Hello offered no window)
    assert welcome["compression"] == [] and welcome["resumed"] is False


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_an_empty_model_name_selects_the_default_model(server, mode: str) -> None:
    """8.1: an empty `model` selects the model named `default` (the conformance models serve one)."""
    async with raw_connect(server.url, [PROTO if mode == "proto" else JSON]) as ws:
        await hello(ws)
        codec = codec_of(ws)
        await ws.send(codec.encode(ev.Request(stream_id=1, params={"n": 2})))
        await ws.send(codec.encode(ev.Request(stream_id=2, model="default", params={"n": 2})))
        got: dict[int, list[str]] = {1: [], 2: []}
        ended: set[int] = set()
        while ended != {1, 2}:
            event = await recv_event(ws, timeout=10)
            if isinstance(event, ev.Delta):
                got[event.stream_id].append(event.text or "")
            else:
                assert isinstance(event, ev.End), event
                ended.add(event.stream_id)
    assert got[1] == got[2] == ["a0;", "a1;"]


@pytest.mark.parametrize("offered", [("snappy", "lz4", "zstd"), ("lz4", "brotli", "zstd"), ("gzip",)],
                         ids=["reversed", "unknown-between", "unknown-only"])
async def test_codecs_come_in_the_servers_order_whatever_the_clients(server, offered: tuple[str, ...]) -> None:
    """10.2: Welcome.compression is the server's codecs (zstd, lz4, snappy) that the client offered, in the
    server's order; unknown names are ignored."""
    async with raw_connect(server.url, [PROTO]) as ws:
        welcome = await hello(ws, compression=offered)
    assert welcome.compression == tuple(c for c in ("zstd", "lz4", "snappy") if c in offered)


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_a_resume_of_a_session_this_server_does_not_hold_fails_each_listed_stream(server, mode: str) -> None:
    """13, 14.2: what a replacement server answers a client whose session lived in a process that exited (or
    expired): a new session (`resumed` false, a new token), then `Error{resume_failed, retryable: false}` for
    every stream the Hello listed, and the connection serves new requests."""
    async with raw_connect(server.url, [PROTO if mode == "proto" else JSON]) as ws:
        codec = codec_of(ws)
        token = "Z2l2ZW4tYnktYS1zZXJ2ZXItdGhhdC1leGl0ZWQ"  # (a token of no session here)
        await ws.send(codec.encode(ev.Hello(client="spec", resume_token=token, last_seq={3: 5, 4: 0})))
        welcome = await recv_event(ws, timeout=10)
        assert isinstance(welcome, ev.Welcome) and not welcome.resumed
        assert welcome.resume_token and welcome.resume_token != token
        errors = [await recv_event(ws, timeout=10) for _ in range(2)]
        assert sorted((e.stream_id, e.code, e.retryable) for e in errors) == [  # type: ignore[union-attr]
            (3, ErrorCode.RESUME_FAILED, False), (4, ErrorCode.RESUME_FAILED, False)]
        await ws.send(codec.encode(ev.Request(stream_id=5, model="sync", text="again")))
        assert await recv_event(ws, timeout=10) == ev.Delta(stream_id=5, seq=1, text="sync:again")


async def test_the_delta_that_reaches_the_flow_window_is_sent_then_the_model_waits_for_an_ack(server) -> None:
    """14.5: each Delta costs its chunk's UTF-8 bytes + 64 against `Welcome.flow_window`; the Delta that makes
    the sum reach the window is sent (never held back or split), then the model waits until an Ack frees
    room; the stream then completes, every Delta once and in order."""
    size, window, n = 100, 1000, 20
    per_delta = size + 64
    reaching = -(-window // per_delta)  # the first Delta whose cost makes the sum reach the window: the 7th
    async with raw_connect(server.url, [PROTO]) as ws:
        codec = codec_of(ws)
        await ws.send(codec.encode(ev.Hello(client="spec", flow_window=window)))
        welcome = await recv_event(ws, timeout=10)
        assert isinstance(welcome, ev.Welcome) and welcome.flow_window == window
        await ws.send(codec.encode(ev.Request(stream_id=1, model="count", params={"n": n, "size": size})))
        seqs = [(await recv_event(ws, timeout=10)).seq for _ in range(reaching)]  # type: ignore[union-attr]
        assert seqs == list(range(1, reaching + 1))
        # Paused: two round trips find nothing but their Pongs (a server that ran on would have written
        # the next Delta, which the model makes at once, before at least one of them).
        for ping_id in (1, 2):
            await ws.send(codec.encode(ev.Ping(id=ping_id)))
            assert await recv_event(ws, timeout=10) == ev.Pong(id=ping_id)
        last = reaching
        while last < n:  # Ack what arrived: the next window's worth comes (6 x 164 B stay under it: no pause)
            await ws.send(codec.encode(ev.Ack(stream_id=1, seq=last)))
            for _ in range(min(reaching, n - last)):
                event = await recv_event(ws, timeout=10)
                assert isinstance(event, ev.Delta) and event.seq == last + 1, event
                assert event.text == f"{last}," + "." * (size - len(f"{last},"))
                last = event.seq
        end = await recv_event(ws, timeout=10)
    assert isinstance(end, ev.End) and end.last_seq == n
