"""Handshake: subprotocol negotiation and the Origin check, identical on every framework."""

from __future__ import annotations

import asyncio

import pytest
from support.raw import JSON, PROTO, codec_of, hello, raw_connect
from websockets.exceptions import InvalidStatus

from lowlat_mw.client import Backoff, connect
from lowlat_mw.errors import HandshakeRefused, refusal_hint
from lowlat_mw.protocol import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def _stream_raw(ws) -> list:
    """Run one 'sync' request on a raw connection; return the frames received for it."""
    codec = codec_of(ws)
    await ws.send(codec.encode(ev.Request(stream_id=1, model="sync", text="hi")))
    frames = []
    async with asyncio.timeout(10):
        while True:
            frame = await ws.recv()
            frames.append(frame)
            event = codec.decode(frame, limit=1 << 20, allowed=())
            if isinstance(event, ev.End | ev.Error):
                break
    return frames


@pytest.mark.parametrize(
    ("offered", "chosen", "frame_type"),
    [
        ([PROTO], PROTO, bytes),
        ([JSON], JSON, str),
        (None, None, str),  # nothing offered: JSON, and no Sec-WebSocket-Protocol in the response
        ([JSON, PROTO], JSON, str),  # the client's order decides
        ([PROTO, JSON], PROTO, bytes),
        (["lowlat.v9.future", PROTO], PROTO, bytes),  # unknown offers are skipped
    ],
    ids=["proto", "json", "none", "json-first", "proto-first", "unknown-then-proto"],
)
async def test_subprotocol_decides_frame_type(server, offered, chosen, frame_type):
    async with raw_connect(server.url, offered) as ws:
        assert ws.subprotocol == chosen
        assert ws.response.headers.get("Sec-WebSocket-Protocol") == chosen
        welcome = await hello(ws, compression=("zstd",))
        assert welcome.max_streams == 16  # the examples set it explicitly
        assert welcome.compression == (("zstd",) if frame_type is bytes else ())
        frames = await _stream_raw(ws)
        assert frames and all(isinstance(f, frame_type) for f in frames)
        if frame_type is bytes:
            assert all(f[0] >> 4 == 1 for f in frames)  # frame version nibble
        events = [codec_of(ws).decode(f, limit=1 << 20, allowed=()) for f in frames]
        assert events[0] == ev.Delta(stream_id=1, seq=1, text="sync:hi")
        assert isinstance(events[-1], ev.End) and events[-1].last_seq == 1


@pytest.mark.parametrize("offered", [["lowlat.v2.proto"], ["chat", "superchat"], ["LOWLAT.V1.PROTO"]],
                         ids=["future-version", "foreign", "wrong-case"])
async def test_unsupported_subprotocols_only_are_refused_with_403(server, offered):
    with pytest.raises(InvalidStatus) as info:
        async with raw_connect(server.url, offered):
            pass
    assert info.value.response.status_code == 403


@pytest.mark.parametrize("origin", ["http://evil.example", "https://127.0.0.1.evil.example",
                                    "http://localhost:{port}", "http://127.0.0.1:1", "null"],
                         ids=["foreign", "lookalike", "other-host-same-port", "same-host-other-port", "null"])
async def test_cross_origin_is_refused_with_403(server, origin):
    with pytest.raises(InvalidStatus) as info:
        async with raw_connect(server.url, [PROTO], additional_headers={"Origin": origin.format(port=server.port)}):
            pass
    assert info.value.response.status_code == 403


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_same_host_origin_is_accepted(server, mode):
    sp = PROTO if mode == "proto" else JSON
    async with raw_connect(server.url, [sp], additional_headers={"Origin": server.origin}) as ws:
        assert ws.subprotocol == sp
        await hello(ws)
        frames = await _stream_raw(ws)
        assert isinstance(codec_of(ws).decode(frames[-1], limit=1 << 20, allowed=()), ev.End)


# Servers that cannot send a text with their 403: daphne (no ASGI "websocket.http.response" extension). There the
# client's error has the hint for a bare 403 instead.
NO_REFUSAL_TEXT = frozenset({"django"})


async def test_the_client_says_which_check_refused_the_handshake(server):
    """A new user saw the same client error for a wrong Origin and a wrong path (issue 38, item 17): the server's 403
    now says it was the Origin check, and the client shows it (not retried)."""
    client = connect(server.url, backoff=Backoff(base=0.01, retries=3), headers={"Origin": "http://evil.example"})
    async with asyncio.timeout(30):
        with pytest.raises(HandshakeRefused) as info:
            await client.open()
    assert info.value.status == 403 and client.connections == 0
    if server.framework in NO_REFUSAL_TEXT:
        assert str(info.value) == f"handshake refused with HTTP 403: {refusal_hint(403, '/ws')}"
    else:
        assert str(info.value) == ("handshake refused with HTTP 403: lowlat-mw: cross-origin WebSocket refused: the "
                                   "page's Origin is not in the server's allowed_origins")
