"""ServerProtocol, the server's sans-IO machine, driven through a ConnectionPair and a fake clock.

`ConnectionPair` (lowlat_mw.testing) joins a ServerProtocol with the client end of the wire: the test
sends events as a client would put them on the wire (``send``, ``send_raw``), the server's frames are
decoded back into events, and time is a number the test moves forward. The client machine's own side
of these rules is tests/test_client_protocol.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlat_mw.endpoint import new_session_ids
from lowlat_mw.errors import CloseCode, ErrorCode, LocalProtocolError, SettingsError
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.base import Measured
from lowlat_mw.protocol.compression import CODEC_IDS
from lowlat_mw.protocol.selector import CompressionSelector
from lowlat_mw.protocol.server import (
    CancelStream,
    CloseConnection,
    ConnState,
    SendFrame,
    ServerProtocol,
    StartStream,
    negotiate_subprotocol,
)
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings
from lowlat_mw.testing import ConnectionPair
from lowlat_mw.testing.pair import T0

PROTO, JSON = SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON
BOTH = [PROTO, JSON]
DEFAULT = Settings()
Pair = ConnectionPair


def close_of(items: Iterable[Any]) -> CloseConnection | None:
    found = [i for i in items if isinstance(i, CloseConnection)]
    assert len(found) <= 1
    return found[0] if found else None


def only(items: Sequence[Any], cls: type) -> Any:
    assert len(items) == 1 and isinstance(items[0], cls), items
    return items[0]


# ================================================================================ handshake
@pytest.mark.parametrize(
    ("server", "client", "expected"),
    [
        (("zstd", "lz4", "snappy"), ("snappy", "zstd"), ("zstd", "snappy")),  # server order wins
        (("zstd", "lz4", "snappy"), ("lz4",), ("lz4",)),
        (("snappy", "lz4"), ("zstd", "lz4", "snappy"), ("snappy", "lz4")),
        (("zstd", "lz4", "snappy"), (), ()),
        (("zstd", "lz4", "snappy"), ("gzip", "br"), ()),
        ((), ("zstd", "lz4"), ()),
    ],
)
def test_hello_negotiates_compression_in_server_order(server: tuple[str, ...], client: tuple[str, ...],
                                                      expected: tuple[str, ...]) -> None:
    pair = ConnectionPair(Settings(compression=server), PROTO)
    welcome = only(pair.send(ev.Hello(compression=client)), ev.Welcome)
    assert welcome.compression == expected
    assert pair.conn.compression == expected
    assert (pair.conn.compressor is None) == (not expected)


@pytest.mark.parametrize("subprotocol", [JSON, None])
def test_json_mode_negotiates_no_compression(subprotocol: str | None) -> None:
    pair = ConnectionPair(DEFAULT, subprotocol)
    welcome = only(pair.send(ev.Hello(compression=("zstd", "lz4", "snappy"))), ev.Welcome)
    assert welcome.compression == ()
    assert pair.conn.compressor is None


def test_welcome_carries_session_and_limits() -> None:
    s = Settings(max_frame_size=4096, max_decompressed_size=65536, max_streams=3, heartbeat_interval=15,
                 heartbeat_max_interval=60, idle_timeout=90.5, server_name="edge-7")
    pair = ConnectionPair(s)
    assert pair.conn.state is ConnState.AWAIT_HELLO
    welcome = only(pair.send(ev.Hello(client="py/1")), ev.Welcome)
    assert welcome.resume_token.startswith("sess-1.") and len(welcome.resume_token) > 30
    assert welcome == ev.Welcome(session_id="sess-1", resume_token=welcome.resume_token, compression=(),
                                 max_frame_size=4096, max_decompressed_size=65536, max_streams=3,
                                 heartbeat_interval_ms=15000, idle_timeout_ms=90500, server="edge-7",
                                 resume_window_ms=60000, flow_window=0, revision=3)
    assert pair.conn.state is ConnState.OPEN


def test_welcome_itself_is_never_compressed() -> None:
    pair = ConnectionPair(Settings(compression_min_size=0, link_mbps=0.001, server_name="x" * 5000))
    frames = pair.conn.receive_data(pair.codec.encode(ev.Hello(compression=("zstd",))), T0)
    data = only(frames, SendFrame).data
    assert data[0] & 0x0F == 0  # the client learns the codecs from this very frame


def test_session_ids_are_random() -> None:
    # Drawn by the driver (lowlat_mw.endpoint.new_session_ids) and given to the machine, which draws nothing.
    (a, secret_a), (b, secret_b) = new_session_ids(), new_session_ids()
    assert a != b and len(a) >= 16 and secret_a != secret_b and len(secret_a) >= 32
    machine = ServerProtocol(DEFAULT, subprotocol=PROTO, now=T0, session_id=a, secret=secret_a)
    assert machine.session_id == a


@pytest.mark.parametrize("subprotocol", BOTH)
@pytest.mark.parametrize("first", [
    ev.Request(stream_id=1, text="hi"), ev.Ping(id=1), ev.Pong(id=1), ev.Cancel(stream_id=1),
    ev.Error(message="x"), ev.Delta(stream_id=1, seq=1, text="x"),
], ids=lambda e: type(e).__name__)
def test_frames_before_hello_are_a_protocol_error(subprotocol: str, first: ev.Event) -> None:
    pair = ConnectionPair(DEFAULT, subprotocol)
    out = pair.send(first)
    assert len(out) == 2
    error, close = out
    assert isinstance(error, ev.Error) and error.code is ErrorCode.PROTOCOL_ERROR and error.stream_id == 0
    assert close == CloseConnection(CloseCode.PROTOCOL_ERROR, "expected hello")
    assert pair.conn.closed and pair.conn.close_code == 1002


def test_second_hello_is_an_error_but_keeps_the_connection() -> None:
    pair = Pair.ready()
    error = only(pair.send(ev.Hello()), ev.Error)
    assert error.code is ErrorCode.PROTOCOL_ERROR
    assert not pair.conn.closed


def test_handshake_timeout_closes_with_4004_exactly_at_the_deadline() -> None:
    pair = ConnectionPair(Settings(handshake_timeout=7))
    assert pair.conn.next_deadline() == T0 + 7
    assert pair.tick(math.nextafter(T0 + 7, 0)) == []
    assert pair.tick(T0 + 7) == [CloseConnection(CloseCode.HANDSHAKE_TIMEOUT, "no hello within handshake_timeout")]
    assert pair.conn.close_code == 4004
    assert pair.conn.next_deadline() == math.inf


def test_hello_in_time_cancels_the_handshake_timeout() -> None:
    pair = ConnectionPair(Settings(handshake_timeout=7))
    pair.send(ev.Hello(), at=T0 + 6.9)
    assert pair.tick(T0 + 7) == []
    assert pair.conn.next_deadline() > T0 + 7


# ================================================================================ streams
@pytest.mark.parametrize("subprotocol", BOTH)
def test_request_starts_a_stream(subprotocol: str) -> None:
    pair = Pair.ready(subprotocol=subprotocol)
    req = ev.Request(stream_id=1, model="echo", text="hello", params={"temperature": 0})
    start = only(pair.send(req), StartStream)
    assert start.request == req
    assert set(pair.conn.streams) == {1}


@pytest.mark.parametrize("subprotocol", BOTH)
def test_stream_lifecycle_deltas_then_end_with_timings(subprotocol: str) -> None:
    pair = Pair.ready(subprotocol=subprotocol)
    pair.send(ev.Request(stream_id=5, text="go"), at=T0 + 1)
    chunks = ["Hel", "lo", ", ", "world", b"\x00\x01"]
    deltas = []
    for i, c in enumerate(chunks):
        deltas += pair.chunk(5, c, at=T0 + 1.25 + i * 0.1)
    assert [d.seq for d in deltas] == [1, 2, 3, 4, 5]
    assert all(isinstance(d, ev.Delta) and d.stream_id == 5 for d in deltas)
    assert [d.chunk for d in deltas] == chunks
    end = only(pair.finish(5, at=T0 + 2, timings_ms={"model": 3.5}), ev.End)
    assert end.stream_id == 5 and end.last_seq == 5 and end.finish_reason == "stop"
    assert end.usage == {"deltas": 5, "output_bytes": sum(len(c) for c in chunks)}
    assert end.timings_ms["total"] == pytest.approx(1000.0)
    assert end.timings_ms["first_delta"] == pytest.approx(250.0)
    assert end.timings_ms["model"] == 3.5
    assert pair.conn.streams == {}
    assert pair.chunk(5, "late") == []  # the stream is gone
    assert pair.finish(5) == []


def test_stream_without_output_ends_with_last_seq_0() -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=1), at=T0 + 1)
    end = only(pair.finish(1, at=T0 + 1.5), ev.End)
    assert end.last_seq == 0 and end.usage == {"deltas": 0, "output_bytes": 0}
    assert "first_delta" not in end.timings_ms
    assert end.timings_ms["total"] == pytest.approx(500.0)


def test_streams_are_independent() -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=1, text="a"))
    pair.send(ev.Request(stream_id=2, text="b"))
    out = pair.chunk(1, "x") + pair.chunk(2, "y") + pair.chunk(1, "z")
    assert [(d.stream_id, d.seq) for d in out] == [(1, 1), (2, 1), (1, 2)]


@pytest.mark.parametrize("chunk", [bytearray(b"ab"), memoryview(b"ab")])
def test_bytes_like_chunks_become_data_deltas(chunk: bytearray | memoryview) -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=1))
    assert only(pair.chunk(1, chunk), ev.Delta).data == b"ab"  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk", [123, None, ["a"], {"a": 1}])
def test_non_text_chunk_is_a_local_error(chunk: Any) -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=1))
    with pytest.raises(LocalProtocolError, match="str or bytes"):
        pair.conn.send_chunk(1, chunk, T0)


def test_fail_stream_sends_error_on_that_stream() -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=3))
    pair.chunk(3, "partial")
    error = only(pair.decode(pair.conn.fail_stream(3, T0 + 1, ErrorCode.MODEL_ERROR, "model failed (KeyError)")),
                 ev.Error)
    assert error == ev.Error(stream_id=3, code=ErrorCode.MODEL_ERROR, message="model failed (KeyError)")
    assert pair.conn.streams == {}
    assert pair.conn.fail_stream(3, T0 + 1, ErrorCode.MODEL_ERROR, "again") == []
    assert not pair.conn.closed
    assert isinstance(only(pair.send(ev.Request(stream_id=3)), StartStream), StartStream)  # id free again


def test_duplicate_stream_id_is_refused_and_the_running_one_kept() -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=9, text="first"), at=T0 + 1)
    error = only(pair.send(ev.Request(stream_id=9, text="second"), at=T0 + 2), ev.Error)
    # On stream 0: an Error on stream 9 would tell the client that its running stream 9 ended.
    assert (error.stream_id, error.code, error.retryable) == (0, ErrorCode.STREAM_ID_IN_USE, False)
    assert "stream 9" in error.message
    assert pair.conn.streams[9].started_at == T0 + 1
    assert not pair.conn.closed
    deltas = pair.chunk(9, "still running")
    assert [(d.stream_id, d.seq) for d in deltas] == [(9, 1)]


def test_too_many_streams_is_retryable() -> None:
    pair = Pair.ready(Settings(max_streams=2))
    assert isinstance(only(pair.send(ev.Request(stream_id=1)), StartStream), StartStream)
    assert isinstance(only(pair.send(ev.Request(stream_id=2)), StartStream), StartStream)
    error = only(pair.send(ev.Request(stream_id=3)), ev.Error)
    assert (error.stream_id, error.code, error.retryable) == (3, ErrorCode.TOO_MANY_STREAMS, True)
    assert set(pair.conn.streams) == {1, 2}
    pair.finish(1)
    assert isinstance(only(pair.send(ev.Request(stream_id=3)), StartStream), StartStream)


def test_cancel_asks_once_then_stream_ends_cancelled() -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=4))
    pair.chunk(4, "a")
    assert pair.send(ev.Cancel(stream_id=4)) == [CancelStream(4)]
    assert pair.send(ev.Cancel(stream_id=4)) == []  # second Cancel ignored
    assert pair.send(ev.Cancel(stream_id=99)) == []  # unknown stream ignored
    end = only(pair.finish(4, reason="cancelled"), ev.End)
    assert (end.finish_reason, end.last_seq) == ("cancelled", 1)
    assert pair.send(ev.Cancel(stream_id=4)) == []  # already finished
    assert not pair.conn.closed


def test_client_error_and_server_only_messages() -> None:
    pair = Pair.ready()
    assert pair.send(ev.Error(code=ErrorCode.INTERNAL, message="client trouble")) == []
    for event in (ev.Delta(stream_id=1, seq=1, text="x"), ev.End(stream_id=1), ev.Welcome(session_id="x"),
                  ev.GoAway()):
        error = only(pair.send(event), ev.Error)
        assert error.code is ErrorCode.PROTOCOL_ERROR and "not sent by clients" in error.message
    assert not pair.conn.closed


@pytest.mark.parametrize("subprotocol", BOTH)
def test_client_ping_gets_pong(subprotocol: str) -> None:
    pair = Pair.ready(subprotocol=subprotocol)
    assert pair.send(ev.Ping(id=77)) == [ev.Pong(id=77)]


# ================================================================================ bad input
@pytest.mark.parametrize("subprotocol", BOTH)
def test_oversize_frame_is_message_too_big(subprotocol: str) -> None:
    pair = Pair.ready(Settings(max_frame_size=1024), subprotocol)
    ok = ev.Request(stream_id=1, text="x" * 900)
    assert len(pair.codec.encode(ok)) <= 1024
    assert isinstance(only(pair.send(ok), StartStream), StartStream)
    big = ev.Request(stream_id=2, text="x" * 1100)
    error, close = pair.send(big)
    assert error.code is ErrorCode.MESSAGE_TOO_BIG and error.stream_id == 0
    assert close == CloseConnection(CloseCode.MESSAGE_TOO_BIG, "frame too big")
    assert pair.conn.streams == {}


@pytest.mark.parametrize(("subprotocol", "frame", "code", "close"), [
    (PROTO, b"\x10\xff\xff\xff", ErrorCode.INVALID_PAYLOAD, 1007),
    (PROTO, b"", ErrorCode.INVALID_PAYLOAD, 1007),
    (PROTO, b"\x30\x00", ErrorCode.PROTOCOL_ERROR, 1002),
    (PROTO, '{"type":"ping"}', ErrorCode.INVALID_PAYLOAD, 1003),
    (PROTO, b"\x11" + b"\x28\xb5\x2f\xfd" + bytes(10), ErrorCode.UNSUPPORTED_COMPRESSION, 1007),
    (JSON, "{not json", ErrorCode.INVALID_PAYLOAD, 1007),
    (JSON, '{"type":"request","stream_id":"1"}', ErrorCode.INVALID_PAYLOAD, 1007),
    (JSON, b"\x10", ErrorCode.INVALID_PAYLOAD, 1003),
])
def test_garbage_is_an_error_then_close(subprotocol: str, frame: bytes | str, code: ErrorCode, close: int) -> None:
    pair = Pair.ready(subprotocol=subprotocol)
    pair.send(ev.Request(stream_id=1))
    error, closing = pair.send_raw(frame)
    assert (error.code, error.stream_id) == (code, 0)
    assert isinstance(closing, CloseConnection) and closing.code == close
    assert closing.reason == code.wire_name
    assert pair.conn.close_code == close and pair.conn.streams == {}


@pytest.mark.parametrize(("subprotocol", "frame", "code", "stream_id"), [
    (JSON, '{"type":"bogus"}', ErrorCode.UNSUPPORTED_MESSAGE, 0),
    (JSON, '{"type":"request","stream_id":0,"text":"x"}', ErrorCode.BAD_REQUEST, 0),
    (JSON, '{"type":"request","stream_id":7,"text":"x","data":"AA=="}', ErrorCode.BAD_REQUEST, 7),
    (JSON, '{"type":"delta","stream_id":7,"seq":1}', ErrorCode.BAD_REQUEST, 0),
    (PROTO, b"\x10", ErrorCode.UNSUPPORTED_MESSAGE, 0),
    (PROTO, b"\x10\x1a\x02\x12\x00", ErrorCode.BAD_REQUEST, 0),  # Request with stream_id 0
])
def test_unusable_but_well_formed_frames_keep_the_connection(subprotocol: str, frame: bytes | str,
                                                             code: ErrorCode, stream_id: int) -> None:
    pair = Pair.ready(subprotocol=subprotocol)
    error = only(pair.send_raw(frame), ev.Error)
    assert (error.code, error.stream_id) == (code, stream_id)
    assert not pair.conn.closed
    assert pair.conn.streams == {}


# ================================================================================ compression on the wire
def test_negotiated_compression_in_both_directions() -> None:
    pair = Pair.ready(Settings(compression=("zstd", "lz4")), compression=("lz4",))
    assert pair.conn.compression == ("lz4",)
    text = "the quick brown fox jumps over the lazy dog " * 400
    client_sel = CompressionSelector(["lz4"], min_size=0)
    req = ev.Request(stream_id=1, text=text)
    data = pair.codec.encode(req, client_sel)
    assert data[0] & 0x0F == CODEC_IDS["lz4"]
    assert only(pair.send_raw(data), StartStream).request == req
    frames = pair.conn.send_chunk(1, text, T0)
    raw = only(frames, bytes)
    assert raw[0] & 0x0F == CODEC_IDS["lz4"] and len(raw) < len(text) // 4
    assert only(pair.decode(frames), ev.Delta).text == text


def test_compressed_frame_with_a_codec_that_was_not_negotiated_closes() -> None:
    pair = Pair.ready(compression=("lz4",))
    data = pair.codec.encode(ev.Request(stream_id=1, text="z" * 5000), CompressionSelector(["zstd"], min_size=0))
    error, close = pair.send_raw(data)
    assert error.code is ErrorCode.UNSUPPORTED_COMPRESSION
    assert close.code == CloseCode.INVALID_PAYLOAD


def test_decompression_bomb_from_client_is_message_too_big() -> None:
    pair = Pair.ready(Settings(max_decompressed_size=64 * 1024), compression=("zstd",))
    data = pair.codec.encode(ev.Request(stream_id=1, text="a" * 200_000), CompressionSelector(["zstd"], min_size=0))
    assert len(data) < 1024
    error, close = pair.send_raw(data)
    assert error.code is ErrorCode.MESSAGE_TOO_BIG
    assert close.code == CloseCode.MESSAGE_TOO_BIG


# ================================================================================ splitting huge chunks
MULTIBYTE = "aé€😀"  # 1, 2, 3 and 4 UTF-8 bytes


def _frame_size(data: bytes | str) -> int:
    return len(data.encode() if isinstance(data, str) else data)


@pytest.mark.parametrize("subprotocol", BOTH)
@pytest.mark.parametrize("frame_limit", [256, 1000, 4096])
@pytest.mark.parametrize("chunk", [
    MULTIBYTE * 1500,
    "😀" * 3000,
    "x" * 9000,
    "line\n\"quoted\"\t\\ " * 600,  # characters JSON escapes
    "\x00\x1f" * 3000,  # worst case for JSON: 6 bytes each
    bytes(range(256)) * 40,
], ids=["mixed", "emoji", "ascii", "escapes", "controls", "bytes"])
def test_huge_chunk_is_split_into_deltas_that_fit_the_frame_limit(subprotocol: str, frame_limit: int,
                                                                  chunk: str | bytes) -> None:
    pair = Pair.ready(Settings(max_frame_size=frame_limit), subprotocol)
    pair.send(ev.Request(stream_id=1))
    frames = pair.conn.send_chunk(1, chunk, T0)
    assert len(frames) > 1
    sizes = [_frame_size(f) for f in frames]
    assert max(sizes) <= frame_limit, sizes
    deltas = pair.decode(frames)
    assert [d.seq for d in deltas] == list(range(1, len(deltas) + 1))
    assert type(chunk)().join(d.chunk for d in deltas) == chunk
    end = only(pair.finish(1), ev.End)
    assert end.last_seq == len(deltas)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("subprotocol", BOTH)
@pytest.mark.parametrize("frame_limit", [64, 72, 80, 96])
@pytest.mark.parametrize("chunk", ["😀a" * 3, "a😀" * 3, "é" * 40, "\x00😀" * 5, b"\xff" * 50])
def test_splitting_terminates_even_when_the_frame_limit_is_tiny(subprotocol: str, frame_limit: int,
                                                                chunk: str | bytes) -> None:
    # With the largest ids a Delta's JSON envelope alone is ~63 bytes: pieces get down to one character.
    pair = ConnectionPair(Settings(max_frame_size=frame_limit), subprotocol)
    pair.send_raw(b"\x10\x0a\x00" if subprotocol == PROTO else '{"type":"hello"}')
    sid = 2**32 - 1
    assert isinstance(only(pair.send_raw(pair.codec.encode(ev.Request(stream_id=sid))), StartStream), StartStream)
    pair.conn.streams[sid].seq = 2**32 - 1000  # a long-running stream
    frames = pair.conn.send_chunk(sid, chunk, T0)
    deltas = pair.decode(frames)
    assert type(chunk)().join(d.chunk for d in deltas) == chunk
    for frame, delta in zip(frames, deltas, strict=True):
        if len(delta.chunk) > 1:  # a single character that cannot fit is the only exception
            assert _frame_size(frame) <= frame_limit


@pytest.mark.parametrize("subprotocol", BOTH)
def test_chunk_that_fits_is_not_split(subprotocol: str) -> None:
    pair = Pair.ready(Settings(max_frame_size=4096), subprotocol)
    pair.send(ev.Request(stream_id=1))
    for chunk in (MULTIBYTE * 100, b"\xff" * 2000):
        assert len(pair.chunk(1, chunk)) == 1


def test_split_with_compression_still_fits() -> None:
    pair = Pair.ready(Settings(max_frame_size=2048, compression_min_size=0), compression=("zstd", "lz4", "snappy"))
    pair.send(ev.Request(stream_id=1))
    chunk = MULTIBYTE * 5000
    frames = pair.conn.send_chunk(1, chunk, T0)
    assert max(len(f) for f in frames) <= 2048
    assert "".join(d.text for d in pair.decode(frames)) == chunk


# ================================================================================ heartbeat
def test_silent_client_is_closed_with_4001_within_interval_plus_timeout() -> None:
    pair = Pair.ready()
    log = pair.run_until(T0 + 1000, answer_pings=False)
    pings = [(t, e) for t, e in log if isinstance(e, ev.Ping)]
    closes = [(t, e) for t, e in log if isinstance(e, CloseConnection)]
    assert pings == [(T0 + 30, ev.Ping(id=1))]
    assert closes == [(T0 + 40, CloseConnection(CloseCode.HEARTBEAT_TIMEOUT, "no pong within heartbeat_timeout"))]
    assert pair.conn.close_code == 4001


def test_not_closed_before_the_pong_timeout() -> None:
    pair = Pair.ready()
    assert only(pair.tick(T0 + 30), ev.Ping)
    assert pair.tick(math.nextafter(T0 + 40, 0)) == []
    assert pair.conn.next_deadline() == T0 + 40
    assert close_of(pair.tick(T0 + 40)) is not None


def test_answering_pongs_keeps_the_connection_open_and_measures_rtt() -> None:
    pair = Pair.ready()
    log = pair.run_until(T0 + 599, rtt=0.125)
    assert close_of(e for _, e in log) is None
    assert not pair.conn.closed
    assert sum(isinstance(e, ev.Ping) for _, e in log) >= 4
    assert pair.conn.heartbeat.rtt == pytest.approx(0.125)


def test_idle_connection_is_pinged_at_the_base_interval() -> None:
    # An idle client that only answers Pings is quiet: the 30 s interval must not stretch.
    pair = Pair.ready()
    log = pair.run_until(T0 + 590)
    ping_times = [t for t, e in log if isinstance(e, ev.Ping)]
    assert ping_times[0] == T0 + 30
    gaps = [b - a for a, b in itertools.pairwise(ping_times)]
    # (the Hello itself was traffic before the first Ping; after that only Pongs flow)
    assert gaps[1:] == pytest.approx([30] * (len(gaps) - 1))
    assert len(gaps) >= 15


def test_any_client_frame_counts_as_alive() -> None:
    pair = Pair.ready()
    assert only(pair.tick(T0 + 30), ev.Ping)
    pair.send(ev.Ping(id=5), at=T0 + 35)  # not a Pong, but proof of life
    assert close_of(pair.tick(T0 + 40)) is None
    assert not pair.conn.closed


def test_busy_client_stretches_the_ping_interval_up_to_the_max() -> None:
    pair = Pair.ready()
    ping_times = []
    while pair.now < T0 + 1000:
        due = pair.conn.next_deadline()
        # the client sends application traffic just before every ping is due
        pair.send(ev.Cancel(stream_id=1), at=due - 1)
        for e in pair.tick(due):
            if isinstance(e, ev.Ping):
                ping_times.append(due)
                pair.send(ev.Pong(id=e.id), at=due + 0.01)
    gaps = [b - a for a, b in zip([T0, *ping_times], ping_times, strict=False)]
    assert gaps[:5] == pytest.approx([30, 60, 120, 120, 120])
    assert max(gaps) == pytest.approx(120)


class _CountingCodec:
    """A codec that counts its decodes (to tell the awaited Pong's fast path from the general one)."""

    def __init__(self, codec: Any) -> None:
        self.codec, self.decoded = codec, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.codec, name)

    def decode(self, *args: Any, **kw: Any) -> Any:
        self.decoded += 1
        return self.codec.decode(*args, **kw)


def _heartbeat_state(pair: Pair) -> tuple[Any, ...]:
    conn, hb = pair.conn, pair.conn.heartbeat
    return (hb.awaiting, hb.rtt, hb.alive_since_ping, hb.rx_since_ping, hb.next_ping_at, conn.deadline_moved,
            conn.next_deadline(), list(conn.stats.received), list(conn.stats.sent), conn.pong_frame)


@pytest.mark.parametrize("subprotocol", BOTH)
def test_the_awaited_pong_is_known_by_its_bytes_and_does_what_decoding_it_does(subprotocol: str) -> None:
    fast, slow = Pair.ready(subprotocol=subprotocol), Pair.ready(subprotocol=subprotocol)
    fast.conn.codec = counting = _CountingCodec(fast.conn.codec)  # type: ignore[assignment]
    for n, rtt in enumerate((0.125, 0.5, 2.0), 1):
        due = T0 + 30 * n
        assert fast.tick(due) == slow.tick(due) == [ev.Ping(id=n)]
        pong = fast.codec.encode(ev.Pong(id=n))
        assert fast.conn.pong_frame == pong
        slow.conn.pong_frame = None  # the general path: decoded, then Protocol._on_pong
        assert fast.conn.receive_data(pong, due + rtt) == slow.conn.receive_data(pong, due + rtt) == [
            Measured("heartbeat_rtt_seconds", rtt)]
        assert _heartbeat_state(fast) == _heartbeat_state(slow)
        assert fast.conn.pong_frame is None and fast.conn.deadline_moved
        fast.conn.deadline_moved = slow.conn.deadline_moved = False
    assert counting.decoded == 0
    # Anything else (the Pong of an earlier Ping, a Ping) is decoded as before.
    assert fast.tick(T0 + 120) == [ev.Ping(id=4)]
    assert fast.conn.receive_data(fast.codec.encode(ev.Pong(id=3)), T0 + 120.5) == []
    assert counting.decoded == 1 and fast.conn.heartbeat.awaiting == 4 and fast.conn.pong_frame is not None


def test_a_pong_that_comes_after_the_timeout_check_is_decoded_and_measures_nothing() -> None:
    pair = Pair.ready()
    assert pair.tick(T0 + 30) == [ev.Ping(id=1)]
    pair.send(ev.Cancel(stream_id=9), at=T0 + 31)  # proof of life: at the timeout the Ping counts as answered
    assert pair.tick(T0 + 40) == [] and pair.conn.heartbeat.awaiting is None and pair.conn.pong_frame is None
    assert pair.conn.receive_data(pair.codec.encode(ev.Pong(id=1)), T0 + 41) == []
    assert pair.conn.heartbeat.rtt is None and not pair.conn.closed


@pytest.mark.parametrize("subprotocol", BOTH)
def test_ping_frames_are_made_once_for_every_connection_and_counted_as_framed(subprotocol: str) -> None:
    a, b = Pair.ready(subprotocol=subprotocol), Pair.ready(subprotocol=subprotocol)
    b.conn.heartbeats = a.conn.heartbeats  # (as a loop's connections share their scheduler's: see the driver's test)
    sent_a, sent_b = a.conn.tick(T0 + 30), b.conn.tick(T0 + 30)
    assert sent_a[0] is sent_b[0]  # one SendFrame for Ping 1 on every connection
    assert sent_a[0].data == a.codec.encode(ev.Ping(id=1))
    framed = Pair.ready(subprotocol=subprotocol)
    framed.conn._frame(ev.Ping(id=1))  # what Protocol._frame counts for the same frame
    assert list(a.conn.stats.sent) == list(framed.conn.stats.sent)


def test_a_compressor_that_may_compress_a_ping_gets_it_framed_as_any_message() -> None:
    pair = ConnectionPair(Settings(compression_min_size=0), PROTO)
    pair.send(ev.Hello(compression=("zstd",)))
    assert pair.conn.compressor is not None
    pair.conn.compressor.min_size = 0  # (as a slow link's estimates may set it: every payload is offered)
    [ping] = pair.conn.tick(T0 + 30)
    assert pair.decode([ping]) == [ev.Ping(id=1)]
    assert pair.conn.pong_frame == pair.codec.encode(ev.Pong(id=1))
    assert pair.conn.receive_data(pair.conn.pong_frame, T0 + 30.5) == [Measured("heartbeat_rtt_seconds", 0.5)]


# ================================================================================ idle reaper
def test_idle_connection_is_reaped_with_4000() -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=1), at=T0 + 10)
    pair.finish(1, at=T0 + 20)  # last application traffic
    log = pair.run_until(T0 + 2000)
    close = [(t, e) for t, e in log if isinstance(e, CloseConnection)]
    assert close == [(T0 + 620, CloseConnection(CloseCode.IDLE_TIMEOUT, "idle"))]


def test_pings_and_pongs_are_not_application_traffic() -> None:
    pair = Pair.ready()
    log = pair.run_until(T0 + 2000)  # only heartbeats flow
    assert [(t, e.code) for t, e in log if isinstance(e, CloseConnection)] == [(T0 + 600, 4000)]


def test_never_reaped_while_a_stream_runs() -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=1), at=T0 + 1)
    log = pair.run_until(T0 + 5000)
    assert close_of(e for _, e in log) is None
    assert pair.conn.reaper.deadline(len(pair.conn.streams)) == math.inf
    pair.finish(1, at=T0 + 5000)
    log = pair.run_until(T0 + 6000)
    assert [(t, e.code) for t, e in log if isinstance(e, CloseConnection)] == [(T0 + 5600, 4000)]


def test_chunks_count_as_activity() -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=1), at=T0)
    pair.chunk(1, "x", at=T0 + 100)
    pair.finish(1, at=T0 + 200)
    log = pair.run_until(T0 + 1000)
    assert [(t, e.code) for t, e in log if isinstance(e, CloseConnection)] == [(T0 + 800, 4000)]


# ================================================================================ next_deadline vs tick
script_steps = st.lists(
    st.one_of(
        st.tuples(st.just("wait"), st.floats(0.01, 400)),
        st.tuples(st.sampled_from(["request", "chunk", "finish", "cancel", "join", "leave"]), st.integers(1, 3)),
        st.tuples(st.just("ping"), st.just(0)),
        st.tuples(st.just("hello"), st.just(0)),
    ),
    max_size=30,
)


def _deadline_of_parts(conn: ServerProtocol) -> float:
    """ServerProtocol.next_deadline from its parts' own methods (the ones it calls)."""
    if conn.state is not ConnState.OPEN:
        return conn.handshake_deadline
    running = conn.session.active if conn.session is not None else 0
    groups = conn.session.groups if conn.session is not None else ()
    lifetime = conn.settings.max_session_lifetime
    return min(conn.heartbeat.deadline(), conn.reaper.deadline(running, groups),
               conn.opened_at + lifetime if lifetime and not running else math.inf)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(BOTH),
    st.floats(1, 60), st.integers(1, 4), st.floats(0.5, 30), st.floats(5, 400), st.floats(1, 50),
    st.sampled_from([0.0, 0.0, 20.0, 300.0]), st.booleans(), script_steps,
)
def test_next_deadline_is_exactly_when_tick_acts(subprotocol: str, interval: float, mult: int, timeout: float,
                                                idle: float, handshake: float, lifetime: float, answers: bool,
                                                script: list[tuple[str, float]]) -> None:
    s = Settings(heartbeat_interval=interval, heartbeat_max_interval=interval * mult, heartbeat_timeout=timeout,
                 idle_timeout=idle, handshake_timeout=handshake, max_session_lifetime=lifetime, max_streams=2)
    pair = ConnectionPair(s, subprotocol)
    conn = pair.conn
    for kind, arg in script:
        target = pair.now + (arg if kind == "wait" else 0.5)
        while not conn.closed and conn.next_deadline() <= target:
            due = conn.next_deadline()
            assert due == _deadline_of_parts(conn)
            before = math.nextafter(due, -math.inf)
            if before >= pair.now:
                assert pair.tick(before) == []  # nothing is due just before the deadline
                assert conn.next_deadline() == due  # and looking did not move it
            out = pair.tick(max(due, pair.now))
            assert out, f"tick at next_deadline() {due} did nothing"
            for item in out:
                if isinstance(item, ev.Ping) and answers:
                    pair.send(ev.Pong(id=item.id), at=pair.now)
        if conn.closed:
            assert conn.next_deadline() == math.inf
            assert pair.tick(pair.now + 1e6) == []
            return
        pair.now = max(pair.now, target)
        assert pair.tick(pair.now) == []
        sid = int(arg)
        if kind == "hello":
            pair.send(ev.Hello())
        elif kind == "request":
            pair.send(ev.Request(stream_id=sid))
        elif kind == "chunk":
            pair.chunk(sid, "x")
        elif kind == "finish":
            pair.finish(sid)
        elif kind == "cancel":
            pair.send(ev.Cancel(stream_id=sid))
        elif kind == "ping":
            pair.send(ev.Ping(id=1))
        elif kind in ("join", "leave"):  # a session in push groups is listening, not idle
            conn.join(f"g{sid}", kind == "join", pair.now)


# ================================================================================ teardown
def _assert_inert(pair: Pair) -> None:
    conn = pair.conn
    assert conn.closed and conn.state is ConnState.CLOSED
    assert conn.next_deadline() == math.inf
    assert conn.receive_data(pair.codec.encode(ev.Request(stream_id=8)), T0) == []
    assert conn.receive_data(pair.codec.encode(ev.Ping(id=1)), T0) == []
    assert conn.receive_data(b"\xff garbage", T0) == []
    assert conn.tick(T0 + 1e9) == []
    assert conn.send_chunk(1, "x", T0) == []
    assert conn.finish_stream(1, T0) == []
    assert conn.fail_stream(1, T0, ErrorCode.MODEL_ERROR, "x") == []
    assert conn.close() == []
    assert conn.connection_lost() == []


@pytest.mark.parametrize("how", ["server close", "protocol error", "heartbeat", "idle", "handshake", "lost"])
def test_after_close_every_method_returns_nothing(how: str) -> None:
    pair = ConnectionPair() if how == "handshake" else Pair.ready()
    if how != "handshake":
        pair.send(ev.Request(stream_id=1))
    if how == "server close":
        assert pair.conn.close(CloseCode.GOING_AWAY, "shutdown") == [CloseConnection(1001, "shutdown")]
    elif how == "protocol error":
        pair.send_raw(b"\x10\xff")
    elif how == "heartbeat":
        pair.run_until(T0 + 100, answer_pings=False)
    elif how == "idle":
        pair.finish(1)
        pair.run_until(T0 + 1000)
    elif how == "handshake":
        pair.tick(T0 + 60)
    else:
        pair.conn.connection_lost()
    _assert_inert(pair)


def test_server_close_defaults_to_normal() -> None:
    pair = Pair.ready()
    assert pair.conn.close() == [CloseConnection(CloseCode.NORMAL, "")]
    assert pair.conn.close_code == 1000


def test_connection_lost_cancels_every_running_stream() -> None:
    pair = Pair.ready()
    for sid in (1, 2, 3):
        pair.send(ev.Request(stream_id=sid))
    pair.finish(2)
    assert pair.conn.connection_lost() == [CancelStream(1), CancelStream(3)]
    assert pair.conn.streams == {}
    assert pair.conn.closed
    assert pair.conn.connection_lost() == []


def test_stats_count_frames_and_bytes() -> None:
    pair = Pair.ready()
    pair.send(ev.Request(stream_id=1))
    pair.chunk(1, "abc")
    pair.chunk(1, b"de")
    stats = pair.conn.stats
    assert stats.frames_in == 2 and stats.frames_out == 3  # Welcome + 2 Deltas
    assert stats.bytes_in > 0 and stats.bytes_out == stats.payload_bytes_out > 5  # uncompressed: equal
    assert stats.by_codec()[0][0] == 3 and sum(n for n, _, _ in stats.by_codec()[1:]) == 0


# ================================================================================ subprotocol choice
@pytest.mark.parametrize(("offered", "served", "expected"), [
    ([PROTO], (PROTO, JSON), (True, PROTO)),
    ([JSON], (PROTO, JSON), (True, JSON)),
    ([PROTO, JSON], (PROTO, JSON), (True, PROTO)),
    ([JSON, PROTO], (PROTO, JSON), (True, JSON)),  # the client's preference order
    ([JSON, PROTO], (PROTO,), (True, PROTO)),
    (["chat", PROTO], (PROTO, JSON), (True, PROTO)),  # unknown ones are skipped
    ([], (PROTO, JSON), (True, None)),  # none offered: JSON without a subprotocol header
    ((), (JSON,), (True, None)),
    (["chat", "lowlat.v2.proto"], (PROTO, JSON), (False, None)),  # only unknown: refused
    ([JSON], (PROTO,), (False, None)),
    ([], (PROTO,), (False, None)),  # serves only proto, none offered: refused
])
def test_negotiate_subprotocol(offered: list[str], served: tuple[str, ...], expected: tuple[bool, str | None]
                               ) -> None:
    assert negotiate_subprotocol(offered, Settings(subprotocols=served)) == expected


@pytest.mark.parametrize(("subprotocol", "binary"), [(PROTO, True), (JSON, False), (None, False)])
def test_codec_follows_the_subprotocol(subprotocol: str | None, binary: bool) -> None:
    conn = ServerProtocol(DEFAULT, subprotocol=subprotocol, now=T0, session_id="s", secret="x" * 32)
    assert conn.codec.binary is binary


# ================================================================================ gc.freeze at the first connection
_FREEZE_SNIPPET = """
import gc, sys
from lowlat_mw.endpoint import Endpoint
from lowlat_mw.settings import Settings

class Driver:
    address = None
    loop = None

endpoint = Endpoint(lambda req: "x", Settings(gc_freeze=sys.argv[1] == "on"))
before = gc.get_freeze_count()
endpoint.connection_started(Driver())
first = gc.get_freeze_count()
endpoint.connection_started(Driver())
print(before, first, gc.get_freeze_count())
"""


_THRESHOLD_SNIPPET = """
import gc, sys
from lowlat_mw.endpoint import Endpoint
from lowlat_mw.settings import Settings

class Driver:
    address = None
    loop = None

endpoint = Endpoint(lambda req: "x", Settings(gc_threshold=int(sys.argv[1])))
before = gc.get_threshold()
endpoint.connection_started(Driver())
first = gc.get_threshold()
gc.set_threshold(*before)  # (someone else changes it later: the next connection leaves it alone)
endpoint.connection_started(Driver())
print(*before, *first, *gc.get_threshold())
"""


@pytest.mark.parametrize("setting", [50_000, 0])
def test_the_first_connection_sets_the_gc_thresholds_once(setting: int) -> None:
    """gc_threshold (`lowlat-mw serve`: 50000): the first connection sets the collector's thresholds to
    (n, 50, 100), once per process; 0 (the library default) leaves the interpreter's."""
    import subprocess
    import sys

    out = [int(x) for x in subprocess.run([sys.executable, "-c", _THRESHOLD_SNIPPET, str(setting)],
                                          capture_output=True, text=True, timeout=120, check=True).stdout.split()]
    before, first, second = out[:3], out[3:6], out[6:]
    assert before == [700, 10, 10]
    assert first == ([setting, 50, 100] if setting else before)
    assert second == before


def test_a_negative_gc_threshold_is_refused() -> None:
    with pytest.raises(SettingsError, match="gc_threshold"):
        Settings(gc_threshold=-1)


@pytest.mark.parametrize("setting", ["on", "off"])
def test_the_first_connection_freezes_the_startup_heap_once(setting: str) -> None:
    """gc_freeze on (`lowlat-mw serve`'s default): the first connection moves the process's objects to the
    permanent generation, once; off (the library default), the collector is left alone. (A fresh process:
    the freeze is once per process.)"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FREEZE_SNIPPET, setting], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    before, first, second = (int(x) for x in out)
    assert before == 0
    if setting == "on":
        assert first > 10_000 and second == first  # the startup heap (imports) frozen; the second does nothing
    else:
        assert first == second == 0
