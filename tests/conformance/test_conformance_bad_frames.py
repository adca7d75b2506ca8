"""Bad frames from a raw client after a valid Hello (docs/protocol.md sections 5, 6, 10, 11).

Each case checks the Error the spec prescribes, the close code (or that the connection stays
open and still serves a Request), and that a well-behaved client on the same server still streams.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import re
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lz4.frame
import pytest
import zstandard
from conformance_servers import SERVERS, ServerProcess, base_env, http_get, server_argv, start_ready
from conformance_support import assert_streams, measure
from support.raw import JSON, PROTO, codec_of, hello, raw_connect, read_until_closed
from support.waits import wait_until
from test_conformance_transport import frame
from websockets.exceptions import ConnectionClosed

from lowlat_mw.client import connect
from lowlat_mw.errors import ErrorCode, canonical_close_code
from lowlat_mw.observability.logs import CLIENT_LOGS
from lowlat_mw.proto import lowlat_v1_pb2 as pb
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import JsonCodec, ProtoCodec

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
    return [line for text in _log_texts(srv, sizes) for line in text.splitlines()]


def _open_connections(srv: Any) -> float:
    """The server's open-connections gauge (its /metrics)."""
    status, body = http_get(srv.port, "/metrics")
    assert status == 200, (status, body[:300])
    found = re.search(rb"^lowlat_connections ([0-9.e+]+)$", body, re.M)
    assert found, body[:300]
    return float(found[1])


async def _logs_settled(srv: Any, sizes: tuple[int, int]) -> list[str]:
    """The server's log lines since `sizes`, once it has let every connection go (its gauge is back to 0) and then
    written a mark to both log files (the model log_mark): every line it wrote about them is in by then."""
    await wait_until(lambda: _open_connections(srv) == 0, what=f"{srv.name} to let every connection go")
    mark = uuid.uuid4().hex
    async with connect(srv.url) as client:
        assert await client.complete(mark, model="log_mark") == "marked"
    line = f"log mark {mark}"
    await wait_until(lambda: all(line in text for text in _log_texts(srv, sizes)),
                     what=f"the log mark in both of {srv.name}'s log files")
    return [got for got in _log_since(srv, sizes) if line not in got]


def _log_texts(srv: Any, sizes: tuple[int, int]) -> list[str]:
    """What the server wrote to each of its log files since `sizes`."""
    texts = []
    for path, start in zip((srv.stderr_path, srv.stdout_path), sizes, strict=True):
        with open(path, "rb") as f:
            f.seek(start)
            texts.append(f.read().decode(errors="replace"))
    return texts


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
    lines = await _logs_settled(server, sizes)
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


# ================================================================================ the log budget per address
BUDGET_CONNECTIONS = 100  # connections from 127.0.0.1, each sending one bad frame
BUDGETED = re.compile(r"error sent on connection \S+, stream 0: invalid_payload")
HELD_BACK = re.compile(r"\((\d+) more from (\S+) held back at DEBUG\)")


@pytest.fixture(scope="module", params=SERVERS)
def logged_server(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    """A conformance server of every kind that shows lowlat-mw's INFO lines in its log."""
    fw = request.param
    env = base_env(conformance_dir, {"CONFORMANCE_LOG_LEVEL": "INFO"})
    srv = start_ready(f"logged-{fw}", fw, lambda p: server_argv(fw, p, env=env), env, conformance_dir / "logs")
    yield srv
    died = srv.proc.poll()
    srv.stop()
    if died is not None:
        pytest.fail(f"{srv.name} died during the tests (code {died})\n{srv.output()}")


async def _garbage(url: str) -> int | None:
    """Open, Hello, send one frame that is not a protobuf Envelope: the close code seen (1007)."""
    async with raw_connect(url, [PROTO]) as ws:
        await hello(ws)
        await ws.send(CASES["garbage"].frame())
        out = await read_until_closed(ws, timeout=20)
    assert [(e.stream_id, e.code) for e in out.errors] == [(0, ErrorCode.INVALID_PAYLOAD)], out.events
    return out.close_code


async def test_a_hundred_connections_from_one_address_write_at_most_the_budget(logged_server):
    """docs/security.md "Logs": the lines a client's bad input causes are budgeted per client address, not per
    connection. 100 connections from 127.0.0.1, one bad frame each: at most CLIENT_LOGS.burst lines reach the log in
    a window (the rest go to DEBUG), and the next line after the window says how many were held back."""
    srv = logged_server
    sizes = _log_size(srv)
    gate = asyncio.Semaphore(20)

    async def one() -> int | None:
        async with gate:
            return await _garbage(srv.url)

    started = time.monotonic()
    codes = await asyncio.gather(*(one() for _ in range(BUDGET_CONNECTIONS)))
    took = time.monotonic() - started
    assert {canonical_close_code(c) for c in codes} == {1007}, sorted(set(codes), key=str)
    # The budget's next window, without waiting for it: then one more bad frame, whose line says how many were held.
    async with connect(srv.url) as client:
        assert await client.complete("", model="next_log_window") == "moved"
    assert canonical_close_code(await _garbage(srv.url)) == 1007
    lines = await _logs_settled(srv, sizes)  # (every line about them: a count read earlier could miss late ones)
    budgeted = [line for line in lines if BUDGETED.search(line)]
    *storm, last = budgeted
    # One window holds the storm unless it took a minute or more (then each window lets its burst through).
    windows = 1 + int(took // CLIENT_LOGS.window)
    assert len(storm) <= CLIENT_LOGS.burst * windows, f"{len(storm)} lines, the first:\n" + "\n".join(storm[:20])
    summary = HELD_BACK.search(last)  # (it rides on the first line let through in the next window)
    assert summary and summary[2] == "127.0.0.1", "\n".join(budgeted)
    held = sum(int(m[1]) for m in map(HELD_BACK.search, budgeted) if m)
    assert len(storm) + held == BUDGET_CONNECTIONS, "\n".join(budgeted)  # every line let through or counted
    assert not [line for line in lines if "traceback" in line.lower()], "\n".join(lines)
    measure(f"log budget {srv.framework}", f"{BUDGET_CONNECTIONS} connections with a bad frame from one address: "
            f"{len(storm)} lines ({took:.1f} s), then '{summary[0]}'")


# ================================================================================ a raw client (asyncio)
def _upgrade(port: int, subprotocol: str, key: str) -> bytes:
    """A client's WebSocket upgrade request for /ws."""
    return (f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {subprotocol}\r\n"
            "\r\n").encode()


def _message(data: bytes | str) -> bytes:
    """One masked client frame holding `data` (text for a str)."""
    return frame(1, data.encode()) if isinstance(data, str) else frame(2, data)


async def _read_frame(reader: asyncio.StreamReader) -> int:
    """One server frame (unmasked): its opcode."""
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", await reader.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", await reader.readexactly(8))[0]
    await reader.readexactly(n)
    return b0 & 0x0F


# ================================================================================ two closes meeting
@pytest.mark.parametrize("then", ["close", "ping"])
async def test_invalid_utf8_and_a_control_frame_in_one_read_log_no_traceback(logged_server, then):
    """Text that is not UTF-8 and then, in the same write, the client's close or a Ping: the server parses them
    from one read. Under uvicorn (websockets-sansio) the peer's close was answered before the text was looked at,
    and the text's 1007 close then raised InvalidState; or the text's 1007 close and FIN went out first, and the
    Ping's Pong raised "Cannot call write() after write_eof()". Each was "Fatal error on transport" with a
    traceback, per connection. Now the connection ends on the first close, with nothing logged about the other."""
    srv = logged_server
    sizes = _log_size(srv)
    control = frame(8, struct.pack("!H", 1000)) if then == "close" else frame(9, b"fz")
    for _ in range(20):
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            async with asyncio.timeout(15):
                writer.write(_upgrade(srv.port, JSON, base64.b64encode(os.urandom(16)).decode()))
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
                writer.write(_message(JsonCodec().encode(ev.Hello(client="utf8-then-control"))))
                await _read_frame(reader)  # the Welcome
                writer.write(frame(1, b'{"type":"ping","id":1,"x":"\xff\xfe"}') + control)
                while await reader.read(65536):  # the server's close, then EOF
                    pass
        except ConnectionResetError:
            pass  # (a server that closes at once may reset: only its log matters here)
        finally:
            writer.close()
    await assert_streams(srv.url, "json")
    lines = await _logs_settled(srv, sizes)
    tracebacks = [i for i, line in enumerate(lines) if "traceback" in line.lower()]
    assert not tracebacks, "\n".join(lines[max(0, tracebacks[0] - 3):][:40])


# ================================================================================ fuzzed connections
# Many short connections from a raw client, each a seeded random script: a Hello (mostly), a few small frames (the
# bad frames above, random bytes, text that is not UTF-8, mutated valid messages, control frames, fragments, reserved
# opcodes), then an ending that races the server's own close: a close frame at once, a close as soon as a reply
# arrives, EOF, a FIN without a close frame, or a reset. Whatever the order, the server logs no traceback.
FUZZ_CONNECTIONS = {"flask": 10_000}  # the rest: FUZZ_DEFAULT, to keep the suite short (10,000 there found no more)
FUZZ_DEFAULT = 1_000
FUZZ_CLIENTS = 48  # connections at once from the test process
FUZZ_SEED = int(os.environ.get("FUZZ_SEED", "38"))  # (not LOWLAT_*: those are settings)
FUZZ_ONLY = [int(i) for i in os.environ.get("FUZZ_ONLY", "").split(",") if i.strip()]  # replay these indices alone
HANG = 60.0  # seconds a fuzzed connection may take before it counts as hung: each ends at a close the server sends
# at once or within close_timeout (5 s); measured: the longest 0.2-1.5 s, 48 at once on a loaded 2-core machine
SMALL_CASES = [name for name in CASES if "oversize" not in name and "bomb" not in name]
ENDINGS = ("close", "after-reply", "eof", "drop", "reset")


def _fuzz_frame(rng: random.Random, codec: ProtoCodec | JsonCodec, case_frames: dict[str, bytes | str]) -> bytes:
    """One small client frame (or two: a fragmented message), well-formed or not."""
    valid = codec.encode(rng.choice([ev.Request(stream_id=rng.randint(1, 9), model="sync", text="fuzz"),
                                     ev.Ping(id=rng.randint(1, 99)), ev.Cancel(stream_id=rng.randint(1, 9)),
                                     ev.Ack(stream_id=rng.randint(1, 9), seq=rng.randint(0, 9))]))
    raw = valid.encode() if isinstance(valid, str) else valid
    kind = rng.randrange(9)
    if kind == 0:
        return _message(case_frames[rng.choice(SMALL_CASES)])
    if kind == 1:
        return _message(valid)
    if kind == 2:  # a valid message with a byte changed, or cut short
        data = bytearray(raw)
        if data and rng.random() < 0.5:
            data[rng.randrange(len(data))] = rng.randrange(256)
        else:
            data = data[:rng.randrange(len(data) + 1)]
        return frame(1 if isinstance(valid, str) else 2, bytes(data))
    if kind == 3:
        return frame(2, rng.randbytes(rng.randrange(48)))
    if kind == 4:  # text, often not UTF-8
        return frame(1, rng.randbytes(rng.randrange(48)))
    if kind == 5:  # a control frame: Ping, Pong, or a close in the middle of the script
        opcode = rng.choice((9, 10, 8))
        return frame(opcode, struct.pack("!H", rng.choice((1000, 1002, 4000))) if opcode == 8 else b"fz")
    if kind == 6:  # fragmented
        cut = rng.randrange(len(raw) + 1)
        return frame(1 if isinstance(valid, str) else 2, raw[:cut], fin=False) + frame(0, raw[cut:])
    if kind == 7:  # a reserved opcode, or a continuation with nothing to continue
        return frame(rng.choice((0, 3, 11)), rng.randbytes(4))
    return frame(2, raw, rsv1=True)  # compressed, with no extension negotiated


async def _fuzzed_connection(port: int, rng: random.Random, case_frames: dict[str, bytes | str]) -> str:
    """One connection's script (chosen by `rng`): how it ended for the client ("ok", or what went wrong)."""
    subprotocol = rng.choice((PROTO, JSON))
    codec = ProtoCodec() if subprotocol == PROTO else JsonCodec()
    hello_first = rng.random() < 0.9
    frames = [_fuzz_frame(rng, codec, case_frames) for _ in range(rng.randrange(4))]
    ending = rng.choice(ENDINGS)
    if ending == "after-reply":  # something is always answered (a Pong, unless the server closes first)
        frames.append(_message(codec.encode(ev.Ping(id=100))))
    key = base64.b64encode(rng.randbytes(16)).decode()
    deadline = asyncio.timeout(HANG)  # (from before the connect)
    try:
        async with deadline:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except TimeoutError:
        return "hung"
    try:
        async with asyncio.timeout_at(deadline.when()):
            writer.write(_upgrade(port, subprotocol, key))
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                return "refused"
            if hello_first:
                writer.write(_message(codec.encode(ev.Hello(client="fuzz"))))
                await _read_frame(reader)  # the Welcome
            writer.write(b"".join(frames))
            if ending == "reset":
                writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                                     struct.pack("ii", 1, 0))
                writer.transport.abort()
                return "ok"
            if ending == "drop":
                writer.close()
                return "ok"
            if ending == "after-reply":
                await _read_frame(reader)  # whatever the frames caused (an Error, a Pong, a Delta, the close)
            if ending == "eof":
                writer.write_eof()
            else:
                writer.write(frame(8, struct.pack("!H", 1000)))
            while await reader.read(65536):  # until the server closes
                pass
            return "ok"
    except TimeoutError:
        return "hung"
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return "cut"  # the server closed first (often what the frames asked for)
    finally:
        writer.close()


@pytest.mark.timeout(900)
async def test_fuzzed_connections_log_no_traceback(logged_server):
    """Issue 38, item 5: under Flask two closes could meet (the driver's, the connection thread's, simple-websocket's
    answer to the peer's close), and the second raised wsproto's LocalProtocolError with a traceback in the log
    (about 1 in 3,800 fuzzed connections). 10,000 fuzzed connections on Flask (1,000 on the other servers): no
    traceback, the server still serves."""
    srv = logged_server
    indices = FUZZ_ONLY or range(FUZZ_CONNECTIONS.get(srv.framework, FUZZ_DEFAULT))
    total = len(indices)
    sizes = _log_size(srv)
    case_frames = {name: CASES[name].frame() for name in SMALL_CASES}
    gate = asyncio.Semaphore(FUZZ_CLIENTS)
    endings: dict[str, int] = {}
    hung: list[int] = []  # connections the server had not closed after HANG s (to replay: FUZZ_SEED and the index)
    longest = 0.0

    async def one(i: int) -> None:
        nonlocal longest
        async with gate:
            began = time.monotonic()
            how = await _fuzzed_connection(srv.port, random.Random(FUZZ_SEED * 1_000_003 + i), case_frames)
            longest = max(longest, time.monotonic() - began)
            endings[how] = endings.get(how, 0) + 1
            if how == "hung":
                hung.append(i)

    started = time.monotonic()
    async with asyncio.timeout(600):  # (measured: 51-52 s for Flask's 10,000 on a loaded 2-core machine)
        await asyncio.gather(*(one(i) for i in indices))
    took = time.monotonic() - started
    assert not hung, (f"{len(hung)} of {total} fuzzed connections on {srv.framework} not closed within {HANG:g} s; "
                      f"replay: FUZZ_SEED={FUZZ_SEED} FUZZ_ONLY={','.join(map(str, sorted(hung)[:20]))} pytest "
                      f"'{__file__}::test_fuzzed_connections_log_no_traceback[{srv.framework}]'")
    await assert_streams(srv.url, "proto")
    assert srv.alive()
    lines = _log_since(srv, sizes)
    tracebacks = [i for i, line in enumerate(lines) if "traceback" in line.lower()]
    assert not tracebacks, f"{len(tracebacks)} tracebacks in {total} connections; the first:\n" + "\n".join(
        lines[max(0, tracebacks[0] - 3):][:50])
    measure(f"fuzz {srv.framework}", f"{total} fuzzed connections in {took:.0f} s (the longest {longest:.2f} s), no "
            "traceback, none hung; client side: " + ", ".join(f"{k} {v}" for k, v in sorted(endings.items())))
