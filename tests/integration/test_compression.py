"""Compression chosen and not chosen, checked on the bytes that actually crossed the wire."""

from __future__ import annotations

import asyncio

import pytest
from support.raw import JSON, PROTO, hello, raw_connect

from lowlat_mw.client import connect
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.compression import CODEC_IDS, available_codecs
from lowlat_mw.protocol.wire import to_protobuf

from ._support import read_stream, record_frames

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

CHUNK = 20 * 1024
N_BIG = 5


def _big_chunk(i: int) -> str:
    line = f"chunk {i}: the quick brown fox jumps over the lazy dog. "
    return (line * (CHUNK // len(line) + 1))[:CHUNK]


async def big_model(req):
    for i in range(N_BIG):
        await asyncio.sleep(0)
        yield _big_chunk(i)


async def tiny_model(req):
    for i in range(20):
        yield f" t{i}"


def _codec_nibble(frame: bytes) -> int:
    assert frame[0] >> 4 == 1, f"frame version must be 1, header {frame[0]:#x}"
    return frame[0] & 0x0F


def _delta_frames(pairs):
    return [(f, e) for f, e in pairs if isinstance(e, ev.Delta)]


async def test_raw_client_gets_compressed_frames_for_large_repetitive_chunks(uvicorn_server, starlette_app):
    # A 10 Mbit/s link: compressing 20 KB of repetitive text pays by a wide margin, whatever the selector
    # measures of its own speed on a loaded machine.
    srv = uvicorn_server(starlette_app(big_model, link_mbps=10))
    async with asyncio.timeout(10), raw_connect(srv.url, [PROTO]) as conn:
        welcome = await hello(conn, compression=available_codecs())
        assert welcome.compression, "server agreed to no codec"
        await conn.send(b"\x10" + to_protobuf(ev.Request(stream_id=1, text="go")).SerializeToString())
        frames, events = await read_stream(conn, 1, allowed=welcome.compression)
    deltas = [(f, e) for f, e in zip(frames, events, strict=True) if isinstance(e, ev.Delta)]
    assert [e.text for _, e in deltas] == [_big_chunk(i) for i in range(N_BIG)]
    negotiated_ids = {CODEC_IDS[c] for c in welcome.compression}
    for frame, _ in deltas:
        assert _codec_nibble(frame) in negotiated_ids, f"a {CHUNK}-byte delta went uncompressed"
        assert len(frame) < CHUNK // 4, f"compressed frame is {len(frame)} bytes for a {CHUNK}-byte chunk"
    end_frame = frames[-1]
    assert isinstance(events[-1], ev.End) and _codec_nibble(end_frame) == 0  # small: never compressed


async def test_python_client_receives_and_decompresses_compressed_frames(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(big_model))
    client = connect(srv.url)
    rec = record_frames(client)
    async with asyncio.timeout(10), client:
        chunks = [c async for c in client.stream("go")]
        assert client.welcome.compression
    assert chunks == [_big_chunk(i) for i in range(N_BIG)]
    deltas = _delta_frames(rec.received_events())
    assert len(deltas) == N_BIG
    assert all(_codec_nibble(f) != 0 and len(f) < CHUNK // 4 for f, _ in deltas)


async def test_tiny_deltas_are_not_compressed(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(tiny_model))
    client = connect(srv.url)
    rec = record_frames(client)
    async with asyncio.timeout(10), client:
        chunks = [c async for c in client.stream("go")]
        assert client.welcome.compression  # compression was negotiated, just not worth it
    assert chunks == [f" t{i}" for i in range(20)]
    assert rec.received and all(f[0] == 0x10 for f in rec.received)


async def test_client_offering_no_compression_gets_uncompressed_frames(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(big_model))
    client = connect(srv.url, compression=[])
    rec = record_frames(client)
    async with asyncio.timeout(10), client:
        chunks = [c async for c in client.stream("go")]
        assert client.welcome.compression == ()
    assert chunks == [_big_chunk(i) for i in range(N_BIG)]
    assert all(f[0] == 0x10 for f in rec.received)
    assert all(len(f) > CHUNK for f, _ in _delta_frames(rec.received_events()))


async def test_server_with_compression_disabled_sends_uncompressed(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(big_model, compression=[]))
    client = connect(srv.url)  # offers every codec
    rec = record_frames(client)
    async with asyncio.timeout(10), client:
        assert [c async for c in client.stream("go")] == [_big_chunk(i) for i in range(N_BIG)]
        assert client.welcome.compression == ()
    assert all(f[0] == 0x10 for f in rec.received)


async def test_json_mode_is_never_compressed(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(big_model))
    client = connect(srv.url, mode="json")
    rec = record_frames(client)
    async with asyncio.timeout(10), client:
        chunks = [c async for c in client.stream("go")]
        assert client.welcome.compression == ()
    assert chunks == [_big_chunk(i) for i in range(N_BIG)]
    assert all(isinstance(f, str) for f in rec.received)
    assert all(len(f) > CHUNK for f, _ in _delta_frames(rec.received_events()))


async def test_raw_json_client_offering_compression_gets_none(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(big_model))
    async with asyncio.timeout(10), raw_connect(srv.url, [JSON]) as conn:
        welcome = await hello(conn, compression=available_codecs())
        assert welcome.compression == ()
