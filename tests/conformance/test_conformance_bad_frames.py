"""Bad frames from a raw client after a valid Hello (docs/protocol.md sections 5, 6, 10, 11).

Each case checks the Error the spec prescribes, the close code (or that the connection stays
open and still serves a Request), and that a well-behaved client on the same server still streams.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lz4.frame
import pytest
import zstandard
from conformance_support import (
    JSON,
    PROTO,
    assert_streams,
    codec_of,
    hello,
    measure,
    raw_connect,
    read_until_closed,
)
from websockets.exceptions import ConnectionClosed

from lowlat_mw.errors import ErrorCode, canonical_close_code
from lowlat_mw.proto import lowlat_v1_pb2 as pb
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.codec import ProtoCodec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MiB = 1024 * 1024
MAX_FRAME = MiB  # the default max_frame_size (the examples do not change it)
MAX_DECOMPRESSED = 8 * MiB


def _request_frame() -> bytes:
    return ProtoCodec().encode(ev.Request(stream_id=1, model="sync", text="a request long enough to cut"))


def _envelope_with_unknown_field() -> bytes:
    # field 99, varint 1: a future message kind this server does not know
    return b"\x10" + bytes([0x98, 0x06, 0x01])


def _zstd_bomb_declared() -> bytes:
    return b"\x11" + zstandard.ZstdCompressor(level=3).compress(b"\0" * (MAX_DECOMPRESSED + 1))


def _zstd_bomb_undeclared() -> bytes:
    # streamed: the frame header carries no content size, so only decompressing finds the size out
    compressed = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(b"\0" * (MAX_DECOMPRESSED + 1))
    assert zstandard.get_frame_parameters(compressed).content_size == zstandard.CONTENTSIZE_UNKNOWN
    return b"\x11" + compressed


def _zstd_truncated() -> bytes:
    payload = ProtoCodec().encode(ev.Request(stream_id=1, model="sync", text="y" * 4000))[1:]
    compressed = zstandard.ZstdCompressor().compress(payload)
    return b"\x11" + compressed[: len(compressed) // 2]


def _lz4_not_negotiated() -> bytes:
    payload = ProtoCodec().encode(ev.Request(stream_id=1, model="sync", text="z" * 4000))[1:]
    return b"\x12" + lz4.frame.compress(payload, store_size=True)


def _oversize_binary() -> bytes:
    env = pb.Envelope()
    env.request.stream_id = 1
    env.request.model = "sync"
    env.request.text = "x" * (MAX_FRAME + 100 - 20)
    frame = b"\x10" + env.SerializeToString()
    assert MAX_FRAME + 90 <= len(frame) <= MAX_FRAME + 110
    return frame


def _oversize_text() -> str:
    frame = json.dumps({"type": "request", "stream_id": 1, "model": "sync", "text": ""})
    frame = frame[:-2] + "x" * (MAX_FRAME + 100 - len(frame)) + '"}'
    assert len(frame) == MAX_FRAME + 100
    return frame


@dataclass(frozen=True)
class Case:
    mode: str
    frame: Callable[[], bytes | str]
    error: ErrorCode | None  # the Error on stream 0 the server sends
    close: int | None  # close code; None: the connection stays open
    compression: tuple[str, ...] = ()


CASES = {
    # ---- lowlat.v1.proto
    "garbage": Case("proto", lambda: b"\x10" + b"\xff" * 16, ErrorCode.INVALID_PAYLOAD, 1007),
    "garbage-no-header": Case("proto", lambda: b"\x0f\x00garbage", ErrorCode.PROTOCOL_ERROR, 1002),
    "empty-binary": Case("proto", lambda: b"", ErrorCode.INVALID_PAYLOAD, 1007),
    "truncated": Case("proto", lambda: _request_frame()[: len(_request_frame()) // 2], ErrorCode.INVALID_PAYLOAD,
                      1007),
    "version-2": Case("proto", lambda: b"\x20" + _request_frame()[1:], ErrorCode.PROTOCOL_ERROR, 1002),
    "unknown-message": Case("proto", _envelope_with_unknown_field, ErrorCode.UNSUPPORTED_MESSAGE, None),
    "empty-envelope": Case("proto", lambda: b"\x10", ErrorCode.UNSUPPORTED_MESSAGE, None),
    "text-on-proto": Case("proto", lambda: '{"type":"ping","id":1}', ErrorCode.INVALID_PAYLOAD, 1003),
    "oversize": Case("proto", _oversize_binary, ErrorCode.MESSAGE_TOO_BIG, 1009),
    "zstd-bomb": Case("proto", _zstd_bomb_declared, ErrorCode.MESSAGE_TOO_BIG, 1009, ("zstd",)),
    "zstd-bomb-undeclared": Case("proto", _zstd_bomb_undeclared, ErrorCode.MESSAGE_TOO_BIG, 1009, ("zstd",)),
    "zstd-truncated": Case("proto", _zstd_truncated, ErrorCode.INVALID_PAYLOAD, 1007, ("zstd",)),
    "codec-not-negotiated": Case("proto", _lz4_not_negotiated, ErrorCode.UNSUPPORTED_COMPRESSION, 1007, ("zstd",)),
    "codec-4-reserved": Case("proto", lambda: b"\x14" + _request_frame()[1:], ErrorCode.UNSUPPORTED_COMPRESSION,
                             1007, ("zstd", "lz4", "snappy")),
    "client-delta": Case("proto", lambda: ProtoCodec().encode(ev.Delta(stream_id=1, seq=1, text="x")),
                         ErrorCode.PROTOCOL_ERROR, None),
    "server-only-message": Case("proto", lambda: ProtoCodec().encode(ev.End(stream_id=1)),
                                ErrorCode.PROTOCOL_ERROR, None),
    "second-hello": Case("proto", lambda: ProtoCodec().encode(ev.Hello()), ErrorCode.PROTOCOL_ERROR, None),
    # ---- lowlat.v1.json
    "json-invalid": Case("json", lambda: '{"type": "request", ', ErrorCode.INVALID_PAYLOAD, 1007),
    "json-not-object": Case("json", lambda: "[1, 2]", ErrorCode.INVALID_PAYLOAD, 1007),
    "json-float-id": Case("json", lambda: '{"type":"cancel","stream_id":1.0}', ErrorCode.INVALID_PAYLOAD, 1007),
    "json-bad-base64": Case("json", lambda: '{"type":"request","stream_id":1,"data":"@@@"}',
                            ErrorCode.INVALID_PAYLOAD, 1007),
    "json-unknown-type": Case("json", lambda: '{"type":"frobnicate","x":1}', ErrorCode.UNSUPPORTED_MESSAGE, None),
    # a client Delta (docs/protocol.md 8.5, 11.1): decoded first, so an invalid one is bad_request
    "json-client-delta": Case("json", lambda: '{"type":"delta","stream_id":1,"seq":1,"text":"x"}',
                              ErrorCode.PROTOCOL_ERROR, None),
    "json-client-delta-empty": Case("json", lambda: '{"type":"delta","stream_id":1,"seq":1}',
                                    ErrorCode.BAD_REQUEST, None),
    "binary-on-json": Case("json", lambda: b"\x10", ErrorCode.INVALID_PAYLOAD, 1003),
    "json-oversize": Case("json", _oversize_text, ErrorCode.MESSAGE_TOO_BIG, 1009),
}


async def _request_still_served(ws) -> None:
    codec = codec_of(ws)
    await ws.send(codec.encode(ev.Request(stream_id=7, model="sync", text="ok?")))
    seen = []
    async with asyncio.timeout(10):
        while True:
            event = codec.decode(await ws.recv(), limit=MAX_DECOMPRESSED, allowed=("zstd", "lz4", "snappy"))
            seen.append(event)
            if isinstance(event, ev.End):
                break
    assert ev.Delta(stream_id=7, seq=1, text="sync:ok?") in seen


# daphne (autobahn) accepts only 1000 and 3000-4999 from applications, so the Channels adapter sends
# 1xxx codes as 4100 + (code - 1000) (docs/protocol.md, "Close codes"); tests compare canonical codes.
# daphne runs as `python -m lowlat_mw.servers.daphne` with its size limits just above max_frame_size, so an
# oversized frame reaches our Error + 1009 (it used to be dropped by daphne itself without a close frame).


@pytest.mark.parametrize("case_id", list(CASES))
async def test_bad_frame(server, case_id):
    case = CASES[case_id]
    async with raw_connect(server.url, [PROTO if case.mode == "proto" else JSON]) as ws:
        await hello(ws, case.compression)
        frame = case.frame()
        try:
            await ws.send(frame)
        except ConnectionClosed:
            if case.close is None:
                raise
        if case.close is None:
            # the Error arrives and the connection stays usable
            async with asyncio.timeout(10):
                event = codec_of(ws).decode(await ws.recv(), limit=MAX_DECOMPRESSED, allowed=())
            assert event == ev.Error(stream_id=0, code=case.error, message=event.message, retryable=False)
            await _request_still_served(ws)
        else:
            out = await read_until_closed(ws, timeout=10)
            assert canonical_close_code(out.close_code) == case.close, (out.close_code, out.events)
            assert len(out.errors) == 1 and out.events == out.errors, out.events
            for error in out.errors:
                assert (error.stream_id, error.code, error.retryable) == (0, case.error, False)
    await assert_streams(server.url, "proto" if case.mode == "proto" else "json")


# ================================================================================ log storms
STORM = 1000  # connections, each sending one text frame with invalid UTF-8
STORM_LINE = re.compile(r"utf-?8|1007|traceback|error|warn|fail|invalid", re.I)
# lowlat-mw's own line per connection (at INFO), one whatever the client sends, as the servers' access lines: it says
# "closed by client: 1007" for each of these connections (under daphne it used to say 1006, and matched nothing)
CONNECTION_LINE = re.compile(r"connection \S+ (open: |closed by (client|server): )")


def _log_size(srv: Any) -> tuple[int, int]:
    return tuple(p.stat().st_size if p.exists() else 0 for p in (srv.stderr_path, srv.stdout_path))  # type: ignore[return-value]


def _log_since(srv: Any, sizes: tuple[int, int]) -> list[str]:
    lines: list[str] = []
    for path, start in zip((srv.stderr_path, srv.stdout_path), sizes, strict=True):
        with open(path, "rb") as f:
            f.seek(start)
            lines += f.read().decode(errors="replace").splitlines()
    return lines


async def _bad_utf8(url: str) -> int | None:
    """Open, Hello, send one JSON-subprotocol text frame that is not UTF-8: the close code seen."""
    async with raw_connect(url, [JSON]) as ws:
        await hello(ws)
        ws.protocol.send_text(b'{"type":"ping","id":1,"x":"\xff\xfe"}')  # (websockets sends the bytes as given)
        ws.send_data()
        out = await read_until_closed(ws, timeout=20)
    assert out.events == [], out.events
    return out.close_code


async def test_a_thousand_connections_of_invalid_utf8_write_no_traceback_and_a_few_lines(server):
    """A flood of bad input is not a flood of log lines (docs/security.md "Logs"): every connection is closed
    with 1007, no traceback is logged, and the lines about it (not the server's per-connection access lines)
    are a few dozen at most: a few per client address in a minute, the rest at DEBUG."""
    sizes = _log_size(server)
    gate = asyncio.Semaphore(50)

    async def one() -> int | None:
        async with gate:
            return await _bad_utf8(server.url)

    codes = await asyncio.gather(*(one() for _ in range(STORM)))
    assert {canonical_close_code(c) for c in codes} == {1007}, sorted(set(codes), key=str)
    await assert_streams(server.url, "json")
    await asyncio.sleep(0.5)  # (the server's last lines reach its log files)
    lines = _log_since(server, sizes)
    storm = [line for line in lines if STORM_LINE.search(line) and not CONNECTION_LINE.search(line)]
    tracebacks = [i for i, line in enumerate(lines) if "traceback" in line.lower()]
    assert not tracebacks, f"{len(tracebacks)} tracebacks; the first:\n" + "\n".join(lines[tracebacks[0]:][:40])
    assert len(storm) <= 40, "\n".join(storm[:60])
    measure(f"log storm {server.framework}", f"{STORM} connections of invalid UTF-8: {len(storm)} lines about them, "
            f"{len(lines)} lines in all (access and connection lines included)")


# ================================================================================ control floods
FLOOD = 10_000  # Pings (or Cancels) in one burst on one connection
CONTROL_BURST, CONTROL_RATE = 1000, 200.0  # the defaults of control_rate_burst / control_rate_limit


@pytest.mark.parametrize("kind", ["ping", "cancel"])
async def test_a_burst_of_ten_thousand_control_messages_is_cut_at_the_budget(server, kind):
    """10,000 Pings (or Cancels for unknown streams) at once on one connection: the server handles about
    control_rate_burst of them, then sends Error{0, rate_limited} and closes with 1008 (docs/protocol.md 11.1,
    12); everyone else is served as before."""
    async with raw_connect(server.url, [PROTO]) as ws:
        await hello(ws)
        codec = codec_of(ws)
        frames = [codec.encode(ev.Ping(id=i) if kind == "ping" else ev.Cancel(stream_id=i))
                  for i in range(1, FLOOD + 1)]
        started = asyncio.get_running_loop().time()
        try:
            for frame in frames:
                await ws.send(frame)
        except ConnectionClosed:
            pass
        out = await read_until_closed(ws, timeout=30)
        took = asyncio.get_running_loop().time() - started
    assert canonical_close_code(out.close_code) == 1008, (out.close_code, out.errors)
    assert [(e.stream_id, e.code) for e in out.errors] == [(0, ErrorCode.RATE_LIMITED)]
    answered = sum(isinstance(e, ev.Pong) for e in out.events)
    if kind == "ping":
        assert CONTROL_BURST <= answered <= CONTROL_BURST + CONTROL_RATE * took + 1, (answered, took)
    else:
        assert answered == 0
    measure(f"control flood {kind} {server.framework}",
            f"{FLOOD} {kind}s: {answered} answered, then Error rate_limited and close {out.close_code} ({took:.2f} s)")
    await assert_streams(server.url, "proto")
