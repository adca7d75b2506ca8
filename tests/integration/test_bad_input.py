"""Bad input from a raw client gets the documented Error frame and close code, and the server
keeps serving another client connected to it at the same time."""

from __future__ import annotations

import asyncio
import io
import json

import lz4.frame
import pytest
import snappy
import zstandard
from support.raw import JSON, PROTO, hello, raw_connect, read_until_closed

from lowlat_mw.client import connect
from lowlat_mw.errors import CloseCode, ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import JsonCodec, ProtoCodec

from ._support import raw_request, read_stream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

MAX_FRAME = 4096
MAX_DECOMPRESSED = 64 * 1024
BOMB = bytes(512 * 1024)  # zeros: 8x max_decompressed_size, compresses to well under MAX_FRAME
SNAPPY_BOMB = bytes(MAX_DECOMPRESSED + 8 * 1024)  # snappy tops out near 21:1, so a smaller bomb


async def words(req):
    for w in req.prompt.split():
        yield w + " "


def _valid_request(mode: str) -> bytes | str:
    codec = ProtoCodec() if mode == "proto" else JsonCodec()
    return codec.encode(ev.Request(stream_id=5, text="a perfectly valid request"))


def _zstd_streamed(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zstandard.ZstdCompressor(write_content_size=False).stream_writer(buf, closefd=False) as w:
        w.write(data)
    out = buf.getvalue()
    assert zstandard.frame_content_size(out) == -1  # no declared size: the decoder must bound itself
    return out


# (id, mode, codecs offered in Hello, frame, error code, close code or None for "stays open")
CASES = [
    ("proto-garbage", "proto", (), b"\x10" + b"\xff" * 16, ErrorCode.INVALID_PAYLOAD, CloseCode.INVALID_PAYLOAD),
    ("proto-bad-header", "proto", (), b"\xde\xad\xbe\xef", ErrorCode.PROTOCOL_ERROR, CloseCode.PROTOCOL_ERROR),
    ("proto-truncated", "proto", (), _valid_request("proto")[:-3], ErrorCode.INVALID_PAYLOAD,
     CloseCode.INVALID_PAYLOAD),
    ("proto-unknown-type", "proto", (), b"\x10\x98\x06\x01", ErrorCode.UNSUPPORTED_MESSAGE, None),
    ("proto-too-big", "proto", (), b"\x10" + b"\x00" * (MAX_FRAME + 100), ErrorCode.MESSAGE_TOO_BIG,
     CloseCode.MESSAGE_TOO_BIG),
    ("proto-text-frame", "proto", (), '{"type":"hello"}', ErrorCode.INVALID_PAYLOAD, CloseCode.UNSUPPORTED_DATA),
    ("proto-codec-not-negotiated", "proto", (), b"\x11" + zstandard.ZstdCompressor().compress(b"x" * 100),
     ErrorCode.UNSUPPORTED_COMPRESSION, CloseCode.INVALID_PAYLOAD),
    ("zstd-bomb-declared-size", "proto", ("zstd",), b"\x11" + zstandard.ZstdCompressor().compress(BOMB),
     ErrorCode.MESSAGE_TOO_BIG, CloseCode.MESSAGE_TOO_BIG),
    ("zstd-bomb-streamed", "proto", ("zstd",), b"\x11" + _zstd_streamed(BOMB),
     ErrorCode.MESSAGE_TOO_BIG, CloseCode.MESSAGE_TOO_BIG),
    ("lz4-bomb", "proto", ("lz4",), b"\x12" + lz4.frame.compress(BOMB, store_size=False),
     ErrorCode.MESSAGE_TOO_BIG, CloseCode.MESSAGE_TOO_BIG),
    ("snappy-bomb", "proto", ("snappy",), b"\x13" + bytes(snappy.compress(SNAPPY_BOMB)),
     ErrorCode.MESSAGE_TOO_BIG, CloseCode.MESSAGE_TOO_BIG),
    ("json-garbage", "json", (), "\x00not json {", ErrorCode.INVALID_PAYLOAD, CloseCode.INVALID_PAYLOAD),
    ("json-truncated", "json", (), _valid_request("json")[:-3], ErrorCode.INVALID_PAYLOAD,
     CloseCode.INVALID_PAYLOAD),
    ("json-unknown-type", "json", (), '{"type":"nope","stream_id":1}', ErrorCode.UNSUPPORTED_MESSAGE, None),
    ("json-wrong-field-type", "json", (), '{"type":"request","stream_id":"one","text":"x"}',
     ErrorCode.INVALID_PAYLOAD, CloseCode.INVALID_PAYLOAD),
    ("json-too-big", "json", (), json.dumps({"type": "request", "stream_id": 1, "text": "x" * MAX_FRAME}),
     ErrorCode.MESSAGE_TOO_BIG, CloseCode.MESSAGE_TOO_BIG),
    ("json-binary-frame", "json", (), b'{"type":"hello"}', ErrorCode.INVALID_PAYLOAD, CloseCode.UNSUPPORTED_DATA),
]


def test_cases_fit_the_limits():
    for case_id, _, _, frame, code, _ in CASES:
        if "bomb" in case_id:
            assert len(frame) < MAX_FRAME, case_id  # the bomb passes the frame limit; only its expansion is big
        if code is ErrorCode.MESSAGE_TOO_BIG and "bomb" not in case_id:
            assert len(frame) > MAX_FRAME, case_id


@pytest.mark.parametrize(("mode", "offer", "frame", "code", "close"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
async def test_bad_input_gets_documented_error_and_server_keeps_serving(
    uvicorn_server, starlette_app, mode, offer, frame, code, close
):
    srv = uvicorn_server(starlette_app(words, max_frame_size=MAX_FRAME, max_decompressed_size=MAX_DECOMPRESSED))
    async with asyncio.timeout(15), connect(srv.url) as bystander:
        assert await bystander.complete("before the attack") == "before the attack "
        async with raw_connect(srv.url, [PROTO if mode == "proto" else JSON]) as conn:
            welcome = await hello(conn, compression=offer)
            assert welcome.compression == offer
            await conn.send(frame)
            if close is None:
                _, events = await read_stream(conn, 0, allowed=offer)
                errors = [e for e in events if isinstance(e, ev.Error)]
                assert [(e.stream_id, e.code) for e in errors] == [(0, code)]
                # the connection stays open and keeps working
                assert await raw_request(conn, "still open", 9) == "still open "
            else:
                out = await read_until_closed(conn, allowed=offer)
                assert [(e.stream_id, e.code) for e in out.errors] == [(0, code)], out.events
                assert out.close_code == close
                if code is ErrorCode.MESSAGE_TOO_BIG:  # which limit refused it
                    limit = "max_frame_size" if len(frame) > MAX_FRAME else "max_decompressed_size"
                    assert limit in out.errors[0].message
        # the other client was never disturbed
        assert await bystander.complete("after the attack") == "after the attack "
        assert bystander.connections == 1
        # and new connections are still accepted
        async with connect(srv.url, mode=mode) as newcomer:
            assert await newcomer.complete("new") == "new "


async def test_request_before_hello_is_a_protocol_error(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(words))
    async with asyncio.timeout(10), raw_connect(srv.url, [PROTO]) as conn:
        await conn.send(_valid_request("proto"))
        out = await read_until_closed(conn)
    assert [(e.stream_id, e.code) for e in out.errors] == [(0, ErrorCode.PROTOCOL_ERROR)]
    assert out.close_code == CloseCode.PROTOCOL_ERROR


async def test_duplicate_stream_id_is_refused_without_closing(uvicorn_server, starlette_app):
    async def slow(req):
        yield "x"
        await asyncio.sleep(0.3)
        yield "y"

    srv = uvicorn_server(starlette_app(slow))
    async with asyncio.timeout(10), raw_connect(srv.url, [JSON]) as conn:
        await hello(conn)
        req = JsonCodec().encode(ev.Request(stream_id=4, text="a"))
        await conn.send(req)
        await conn.send(req)
        _, events = await read_stream(conn, 4)
    errors = [e for e in events if isinstance(e, ev.Error)]
    # The refusal is a connection-level Error (stream 0): an Error on stream 4 would end stream 4,
    # which keeps running and ends normally.
    assert [(e.stream_id, e.code) for e in errors] == [(0, ErrorCode.STREAM_ID_IN_USE)]
    assert [e.text for e in events if isinstance(e, ev.Delta)] == ["x", "y"]
    assert isinstance(events[-1], ev.End) and events[-1].finish_reason == "stop"
