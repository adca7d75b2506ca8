"""Fuzzing the decoders with hypothesis (many examples, bounded) and the atheris harness for a bounded time.

Properties (tests/fuzz/checks.py): arbitrary bytes / text / protobuf wire data / JSON objects reach
ProtoCodec, JsonCodec and a ServerProtocol after Hello, and only the library's own
RemoteProtocolError (with a documented Error code and close code) or valid events and protocol
actions come out; whatever is accepted round-trips and is valid Unicode. Crashes found by either
fuzzer are kept below as regression tests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fuzz.checks import (
    ALL_CODECS,
    JSON,
    PROTO,
    SUBPROTOCOLS,
    FuzzFailure,
    check_connection,
    check_frame,
    open_connection,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlat_mw.errors import CloseCode, ErrorCode, LocalProtocolError, RemoteProtocolError
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.compression import compress
from lowlat_mw.protocol.wire import encode_varint
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "fuzz" / "fuzz_decoder.py"
ATHERIS_SECONDS = int(os.environ.get("FUZZ_SECONDS", "8"))  # not LOWLAT_*: those are settings


def many(n: int) -> settings:
    """`n` examples, no per-example deadline (the whole file stays under ~20 s)."""
    return settings(max_examples=n, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# ================================================================================ strategies
# Text including unpaired surrogates (JSON can carry them as \ud800 escapes).
any_text = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=40).map("".join)
u32ish = st.one_of(st.integers(0, 2**32 - 1), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2**32, -1]))
json_scalar = st.one_of(st.none(), st.booleans(), u32ish, st.floats(), any_text)
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(any_text, inner, max_size=3), max_leaves=6)
KINDS = ["hello", "welcome", "request", "delta", "end", "error", "cancel", "ping", "pong", "goaway", "ack",
         "frobnicate", ""]
FIELDS = ["stream_id", "seq", "text", "data", "model", "messages", "params", "code", "message", "retryable", "id",
          "client", "compression", "resume_token", "last_seq", "flow_window", "auth", "session_id",
          "max_frame_size", "max_decompressed_size", "max_streams", "heartbeat_interval_ms", "idle_timeout_ms",
          "server", "resumed", "resume_window_ms", "reason", "reconnect_after_ms", "done", "finish_reason",
          "timings_ms", "usage"]
# well-typed values for every field (3 times in 4), so the decoder gets past the first wrong type and deeper in
_u32 = st.integers(0, 2**32)  # 2**32: one past the range
_str = any_text
_bool = st.booleans()
TYPED = {
    **dict.fromkeys(["stream_id", "seq", "id", "flow_window", "max_frame_size", "max_decompressed_size",
                     "max_streams", "heartbeat_interval_ms", "idle_timeout_ms", "resume_window_ms",
                     "reconnect_after_ms"], _u32),
    **dict.fromkeys(["text", "model", "message", "client", "resume_token", "auth", "session_id", "server",
                     "reason", "finish_reason"], _str),
    **dict.fromkeys(["retryable", "resumed", "done"], _bool),
    "code": st.one_of(st.sampled_from([c.wire_name for c in ErrorCode]), _str),
    "data": st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode()),
    "messages": st.lists(st.fixed_dictionaries({}, optional={"role": _str, "content": st.one_of(_str, json_scalar)}),
                         max_size=3),
    "params": st.dictionaries(_str, json_value, max_size=3),
    "last_seq": st.one_of(_u32, st.dictionaries(st.one_of(st.integers(0, 2**33).map(str), _str), u32ish,
                                                max_size=3)),
    "compression": st.lists(st.one_of(_str, json_scalar), max_size=3),
    "timings_ms": st.dictionaries(_str, json_scalar, max_size=3),
    "usage": st.dictionaries(_str, json_scalar, max_size=3),
}
member = st.sampled_from(FIELDS).flatmap(
    lambda f: st.tuples(st.just(f), st.one_of(TYPED[f], TYPED[f], TYPED[f], json_value)))
json_objects = st.builds(lambda kind, members: {"type": kind, **dict(members)},
                         st.sampled_from([*KINDS, None, 1, True, 1.5, ["request"], {"type": "ping"}]),
                         st.lists(member, max_size=6))


# Protobuf wire data: (field number, wire type, value) records, nested through length-delimited fields,
# so fields of the right number arrive with the wrong wire type, wrong lengths, deep nesting, ...
def _record(field: int, wire: int, value: Any) -> bytes:
    key = encode_varint((field << 3) | wire)
    if wire == 0:
        return key + encode_varint(value)
    if wire == 1:
        return key + value.to_bytes(8, "little")
    if wire == 5:
        return key + value.to_bytes(4, "little")
    if wire == 2:
        return key + encode_varint(len(value)) + value
    return key  # 3 / 4: group start / end (deprecated, mostly invalid), 6 / 7: invalid wire types


records = st.recursive(
    st.one_of(
        st.builds(_record, st.integers(1, 12), st.just(0), st.integers(0, 2**64 - 1)),
        st.builds(_record, st.integers(1, 12), st.just(1), st.integers(0, 2**64 - 1)),
        st.builds(_record, st.integers(1, 12), st.just(5), st.integers(0, 2**32 - 1)),
        st.builds(_record, st.integers(1, 12), st.just(2), st.binary(max_size=20)),
        st.builds(_record, st.integers(1, 12), st.sampled_from([3, 4, 6, 7]), st.none()),
    ),
    lambda inner: st.builds(_record, st.integers(1, 12), st.just(2),
                            st.lists(inner, max_size=4).map(b"".join)),
    max_leaves=6,
)
proto_payloads = st.lists(records, max_size=3).map(b"".join)


# ================================================================================ codecs
@many(1000)
@given(st.binary(max_size=300))
def test_proto_decode_arbitrary_bytes(frame: bytes) -> None:
    check_frame(PROTO, frame)


@many(400)
@given(st.sampled_from(range(0x10, 0x20)), proto_payloads)
def test_proto_decode_arbitrary_wire_data(header: int, payload: bytes) -> None:
    check_frame(PROTO, bytes([header]) + payload)


@many(300)
@given(st.sampled_from(ALL_CODECS), proto_payloads, st.data())
def test_proto_decode_compressed_and_damaged(codec: str, payload: bytes, data: st.DataObject) -> None:
    from lowlat_mw.protocol.compression import CODEC_IDS

    body = bytearray(compress(codec, payload))
    for _ in range(data.draw(st.integers(0, 3))):  # flip, cut or grow the compressed bytes
        op = data.draw(st.sampled_from(["flip", "cut", "grow"]))
        if op == "flip" and body:
            i = data.draw(st.integers(0, len(body) - 1))
            body[i] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del body[data.draw(st.integers(0, len(body))):]
        else:
            body += data.draw(st.binary(min_size=1, max_size=8))
    check_frame(PROTO, bytes([0x10 | CODEC_IDS[codec]]) + bytes(body))
    check_frame(PROTO, bytes([0x10 | CODEC_IDS[codec]]) + bytes(body), allowed=())  # not negotiated


@many(1000)
@given(st.one_of(any_text, st.text(max_size=200)))
def test_json_decode_arbitrary_text(frame: str) -> None:
    check_frame(JSON, frame)


@many(500)
@given(json_objects, st.booleans())
def test_json_decode_arbitrary_objects(obj: dict[str, Any], ascii_only: bool) -> None:
    try:
        frame = json.dumps(obj, ensure_ascii=ascii_only)
    except ValueError:  # circular or similar: not a frame a client can send
        return
    check_frame(JSON, frame)


@many(100)
@given(st.sampled_from(["text", "binary"]), st.one_of(any_text, st.binary(max_size=50)))
def test_wrong_frame_type_is_unsupported_data(expected: str, frame: str | bytes) -> None:
    codec = PROTO if expected == "binary" else JSON
    wrong = isinstance(frame, str) == codec.binary
    if wrong:
        with pytest.raises(RemoteProtocolError) as info:
            codec.decode(frame, limit=1 << 20, allowed=ALL_CODECS)
        assert (info.value.error_code, info.value.close_code) == (ErrorCode.INVALID_PAYLOAD, CloseCode.UNSUPPORTED_DATA)
    else:
        check_frame(codec, frame)


# ================================================================================ ServerProtocol
def _frame_for(subprotocol: str) -> st.SearchStrategy[bytes | str]:
    if subprotocol == SUBPROTOCOL_PROTO:
        valid = st.builds(lambda sid, text: PROTO.encode(ev.Request(stream_id=sid, model="m", text=text)),
                          st.integers(1, 6), any_text.filter(lambda t: not any(0xD800 <= ord(c) < 0xE000 for c in t)))
        control = st.builds(lambda kind, sid: PROTO.encode(kind(stream_id=sid) if kind is not ev.Ping
                                                            else ev.Ping(id=sid)),
                            st.sampled_from([ev.Cancel, ev.Ack, ev.Ping]), st.integers(0, 6))
        return st.one_of(valid, control, st.binary(max_size=60),
                         st.builds(lambda h, p: bytes([h]) + p, st.sampled_from(range(0x10, 0x14)), proto_payloads))
    valid = st.builds(lambda sid, text: JSON.encode(ev.Request(stream_id=sid, model="m", text=text)),
                      st.integers(1, 6), any_text)
    return st.one_of(valid, st.builds(json.dumps, json_objects), any_text)


def _steps(subprotocol: str) -> st.SearchStrategy[list[tuple[str, Any]]]:
    step = st.one_of(
        st.tuples(st.just("frame"), _frame_for(subprotocol)),
        st.tuples(st.just("frame"), _frame_for(subprotocol)),
        st.tuples(st.just("tick"), st.floats(0, 40)),
        st.tuples(st.just("chunk"), st.tuples(st.integers(0, 5), st.one_of(st.text(max_size=30),
                                                                          st.binary(max_size=30)))),
        st.tuples(st.sampled_from(["finish", "fail"]), st.integers(0, 5)),
    )
    return st.lists(step, max_size=14)


@pytest.mark.parametrize("subprotocol", SUBPROTOCOLS, ids=["proto", "json"])
def test_server_connection_survives_arbitrary_traffic(subprotocol: str) -> None:
    @many(150)
    @given(_steps(subprotocol))
    def run(steps: list[tuple[str, Any]]) -> None:
        check_connection(subprotocol, steps)

    run()


def test_the_checks_can_fail() -> None:
    """Guard: the property checks do catch a violation (a decoder that returns garbage)."""

    class Broken:
        binary = False

        def decode(self, frame: Any, **kw: Any) -> Any:
            return "not an event"

    with pytest.raises(FuzzFailure):
        check_frame(Broken(), "{}")  # type: ignore[arg-type]


# ================================================================================ regression tests
# Inputs the fuzzers found; each failed before its fix.
@pytest.mark.parametrize("frame", [
    # atheris, crash-883fbc66: an End whose finish_reason held lone surrogates was accepted; the same with
    # a \ud800 escape in a Request made the model's echo unsendable and the connection went mute
    '{"type":"end","stream_id":1,"last_seq":1,"finish_reason":"stop' + "\udada" * 4 + '"}',
    '{"type":"request","stream_id":1,"model":"sync","text":"a\\ud800b"}',
    '{"type":"request","stream_id":1,"text":"\\udfff"}',
    '{"type":"ping","id":1,"\\ud800":0}',
    '{"type":"request","stream_id":1,"params":{"k":["\\uDBFF"]}}',
], ids=["raw-surrogate", "escaped-high", "escaped-low", "in-a-key", "upper-case-hex-in-params"])
def test_json_unpaired_surrogate_is_invalid_payload(frame: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        JSON.decode(frame, limit=1 << 20)
    assert (info.value.error_code, info.value.close_code) == (ErrorCode.INVALID_PAYLOAD, CloseCode.INVALID_PAYLOAD)


@pytest.mark.parametrize("frame", [
    '{"type":"request","stream_id":1,"text":"\\ud83d\\ude00 caf\\u00e9"}',  # a valid pair and a BMP escape
    '{"type":"request","stream_id":1,"text":"\\\\ud800"}',  # an escaped backslash, then plain text
    '{"type":"request","stream_id":1,"text":"\U0001f600 café"}',
])
def test_json_valid_unicode_still_decodes(frame: str) -> None:
    event = JSON.decode(frame, limit=1 << 20)
    assert isinstance(event, ev.Request) and event.text in ("\U0001f600 café", "\\ud800")


def test_json_request_with_a_surrogate_closes_the_connection_instead_of_muting_it() -> None:
    conn = open_connection(SUBPROTOCOL_JSON)
    actions = conn.receive_data('{"type":"request","stream_id":1,"model":"sync","text":"a\\ud800b"}', 2000.0)
    assert [type(a).__name__ for a in actions] == ["SendFrame", "CloseConnection"]
    assert actions[1].code == CloseCode.INVALID_PAYLOAD


@pytest.mark.parametrize("subprotocol", SUBPROTOCOLS, ids=["proto", "json"])
def test_model_chunk_with_an_unpaired_surrogate_is_a_local_error(subprotocol: str) -> None:
    # atheris, crash-b05366e0: such a chunk raised UnicodeEncodeError on proto; on JSON it became a text frame
    # the WebSocket server could not send, and the connection went silent
    conn = open_connection(subprotocol)
    codec = PROTO if subprotocol == SUBPROTOCOL_PROTO else JSON
    assert type(conn.receive_data(codec.encode(ev.Request(stream_id=1, model="m")), 1000.0)[0]).__name__ == \
        "StartStream"
    with pytest.raises(LocalProtocolError):
        conn.send_chunk(1, "tok\udc80", 1000.0)
    assert len(conn.send_chunk(1, "tok é \U0001f600", 1000.0)) == 1  # valid text still goes out


async def test_model_yielding_an_unpaired_surrogate_fails_its_stream_with_model_error() -> None:
    from driver_support import Peer, endpoint_for

    async def model(req: Any) -> Any:
        yield "fine;"
        yield "bad\ud800"

    peer = Peer(endpoint_for(model), SUBPROTOCOL_JSON)
    try:
        await peer.receive(ev.Hello())
        await peer.receive(ev.Request(stream_id=1, text="x"))
        for _ in range(200):
            if any(isinstance(e, ev.Error) for e in peer.events):
                break
            await asyncio.sleep(0.01)
        events = peer.events
        assert events[1] == ev.Delta(stream_id=1, seq=1, text="fine;")
        assert events[2] == ev.Error(stream_id=1, code=ErrorCode.MODEL_ERROR,
                                     message="model failed (LocalProtocolError)")
        assert peer.closed is None  # the connection stays open and usable
    finally:
        await peer.gone()


# ================================================================================ atheris
def test_atheris_harness_bounded(tmp_path: Path) -> None:
    """Run tests/fuzz/fuzz_decoder.py under libFuzzer for ATHERIS_SECONDS (8 s; FUZZ_SECONDS overrides)."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        pytest.skip("atheris is not installed (pip install atheris): the hypothesis tests above still ran")
    corpus, artifacts = tmp_path / "corpus", tmp_path / "artifacts"
    artifacts.mkdir()
    subprocess.run([sys.executable, str(HARNESS), "--write-seeds", str(corpus)], check=True, timeout=60)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(HARNESS), f"-max_total_time={ATHERIS_SECONDS}", "-rss_limit_mb=1024", "-timeout=10",
         "-print_final_stats=1", f"-artifact_prefix={artifacts}/", str(corpus)],
        capture_output=True, text=True, timeout=ATHERIS_SECONDS + 90, cwd=tmp_path,
    )
    elapsed = time.monotonic() - start
    crashes = sorted(artifacts.iterdir())
    runs = [line for line in proc.stderr.splitlines() if line.startswith("stat::number_of_executed_units")]
    print(f"atheris: {runs[0].split(':')[-1].strip() if runs else '?'} inputs in {elapsed:.1f} s, "
          f"{len(crashes)} crashes")
    assert proc.returncode == 0 and not crashes, (
        f"the fuzzer found a crash (exit {proc.returncode}): {[c.name for c in crashes]}\n"
        f"{[c.read_bytes() for c in crashes]}\n{proc.stderr[-5000:]}")
    assert runs and int(runs[0].split(":")[-1]) > 1000, proc.stderr[-3000:]  # it really ran
