"""Wire codecs: Protobuf binary frames and JSON text frames, round trips and every way to fail."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlat_mw.errors import CloseCode, ErrorCode, LocalProtocolError, RemoteProtocolError
from lowlat_mw.proto import lowlat_v1_pb2 as pb
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.compression import CODEC_IDS, available_codecs
from lowlat_mw.protocol.selector import CompressionSelector
from lowlat_mw.protocol.wire import (
    FRAME_VERSION,
    JsonCodec,
    ProtoCodec,
    codec_for,
    from_json_dict,
    to_json_dict,
    to_protobuf,
)

LIMIT = 8 * 1024 * 1024
ALL = tuple(available_codecs())
PROTO = ProtoCodec()
JSON = JsonCodec()
CODECS = [PROTO, JSON]
# Hypothesis builds its Unicode tables on first use: that one-off cost is not a slow test.
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frame(envelope: pb.Envelope, header: int = FRAME_VERSION << 4) -> bytes:
    return bytes((header,)) + envelope.SerializeToString()


# ================================================================================ strategies
u32 = st.integers(0, 2**32 - 1)
pos_u32 = st.integers(1, 2**32 - 1)
# Struct carries numbers as doubles: keep ints exact (|n| < 2**53) and floats finite.
json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**53 - 1), 2**53 - 1), st.text(max_size=20),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
params = st.dictionaries(st.text(max_size=10), json_value, max_size=4)
chat = st.builds(ev.ChatMessage, role=st.text(max_size=10), content=st.text())
finite = st.floats(allow_nan=False, allow_infinity=False)

requests = st.one_of(
    st.builds(ev.Request, stream_id=pos_u32, model=st.text(max_size=20), params=params, warmup=st.booleans()),
    st.builds(ev.Request, stream_id=pos_u32, model=st.text(max_size=20), text=st.text(), params=params,
              warmup=st.booleans()),
    st.builds(ev.Request, stream_id=pos_u32, model=st.text(max_size=20), data=st.binary(), params=params,
              warmup=st.booleans()),
    st.builds(ev.Request, stream_id=pos_u32, model=st.text(max_size=20),
              messages=st.lists(chat, max_size=4).map(tuple), params=params, warmup=st.booleans()),
)
deltas = st.one_of(
    st.builds(ev.Delta, stream_id=u32, seq=u32, text=st.text()),
    st.builds(ev.Delta, stream_id=u32, seq=u32, data=st.binary()),
)
events = st.one_of(
    st.builds(ev.Hello, client=st.text(max_size=20), compression=st.lists(st.text(max_size=8), max_size=4).map(tuple),
              resume_token=st.text(max_size=20), last_seq=st.dictionaries(u32, u32, max_size=4)),
    st.builds(ev.Welcome, session_id=st.text(max_size=20), resume_token=st.text(max_size=20),
              compression=st.lists(st.text(max_size=8), max_size=4).map(tuple), max_frame_size=u32,
              max_decompressed_size=u32, max_streams=u32, heartbeat_interval_ms=u32, idle_timeout_ms=u32,
              server=st.text(max_size=20), resumed=st.booleans()),
    requests,
    deltas,
    st.builds(ev.End, stream_id=u32, last_seq=u32, finish_reason=st.text(max_size=12),
              timings_ms=st.dictionaries(st.text(max_size=10), finite, max_size=4),
              usage=st.dictionaries(st.text(max_size=10), st.integers(-(2**63), 2**63 - 1), max_size=4)),
    st.builds(ev.Error, stream_id=u32, code=st.sampled_from(ErrorCode), message=st.text(), retryable=st.booleans()),
    st.builds(ev.Cancel, stream_id=u32),
    st.builds(ev.Ping, id=u32),
    st.builds(ev.Pong, id=u32),
    st.builds(ev.GoAway, reason=st.text(max_size=20), reconnect_after_ms=u32),
)


# ================================================================================ round trips
@FUZZ
@given(events)
def test_proto_round_trip(event: ev.Event) -> None:
    data = PROTO.encode(event)
    assert isinstance(data, bytes)
    assert data[0] == FRAME_VERSION << 4  # no compressor: codec nibble 0
    assert PROTO.decode(data, limit=LIMIT) == event


@FUZZ
@given(events)
def test_json_round_trip(event: ev.Event) -> None:
    data = JSON.encode(event)
    assert isinstance(data, str)
    assert JSON.decode(data, limit=LIMIT) == event


@FUZZ
@given(events, st.sampled_from(ALL))
def test_proto_round_trip_compressed(event: ev.Event, codec: str) -> None:
    # A very slow link makes the selector compress whatever it can shrink.
    selector = CompressionSelector([codec], min_size=0, link_mbps=0.001)
    data = PROTO.encode(event, selector)
    assert data[0] & 0x0F in (0, CODEC_IDS[codec])
    assert PROTO.decode(data, limit=LIMIT, allowed=[codec]) == event


@pytest.mark.parametrize("codec", ALL)
def test_compressed_frame_round_trips_when_allowed(codec: str) -> None:
    event = ev.Request(stream_id=7, model="m", text="all work and no play " * 500, params={"k": "v" * 100})
    selector = CompressionSelector([codec], min_size=0)
    data = PROTO.encode(event, selector)
    assert data[0] == (FRAME_VERSION << 4) | CODEC_IDS[codec]
    assert len(data) < len(PROTO.encode(event))
    assert PROTO.decode(data, limit=LIMIT, allowed=[codec]) == event
    assert PROTO.decode(data, limit=LIMIT, allowed=None) == event  # None: any installed codec


@pytest.mark.parametrize("codec", ALL)
@pytest.mark.parametrize("allowed", [(), ("nothing",)])
def test_compressed_frame_with_codec_not_allowed_is_refused(codec: str, allowed: tuple[str, ...]) -> None:
    event = ev.Delta(stream_id=1, seq=1, text="abc" * 2000)
    data = PROTO.encode(event, CompressionSelector([codec], min_size=0))
    assert data[0] & 0x0F == CODEC_IDS[codec]
    others = tuple(c for c in ALL if c != codec)
    for refused in (allowed, others):
        with pytest.raises(RemoteProtocolError) as info:
            PROTO.decode(data, limit=LIMIT, allowed=refused)
        assert info.value.error_code is ErrorCode.UNSUPPORTED_COMPRESSION


def test_empty_inputs_round_trip() -> None:
    for event in [
        ev.Request(stream_id=1, text=""),
        ev.Request(stream_id=1, data=b""),
        ev.Request(stream_id=1, messages=()),
        ev.Request(stream_id=1),
        ev.Delta(stream_id=0, seq=0, text=""),
        ev.Delta(stream_id=0, seq=0, data=b""),
        ev.Hello(),
        ev.End(stream_id=1),
    ]:
        for codec in CODECS:
            assert codec.decode(codec.encode(event), limit=LIMIT) == event, (codec, event)


def test_params_numbers_survive_protobuf_struct() -> None:
    event = ev.Request(stream_id=1, text="x", params={"n": 2**53 - 1, "neg": -3, "f": 0.5, "b": True,
                                                        "nested": {"l": [1, "a", None, False]}})
    got = PROTO.decode(PROTO.encode(event), limit=LIMIT)
    assert got == event
    assert type(got.params["n"]) is int and type(got.params["b"]) is bool  # type: ignore[union-attr]


def _library_struct_to_dict(struct: Any) -> Any:
    """What the codec gave before it read Structs itself: json_format.MessageToDict, whole numbers as ints."""
    from google.protobuf import json_format

    def fix(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
            return int(v)
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return fix(json_format.MessageToDict(struct))


any_number = st.one_of(st.integers(-(2**60), 2**60), st.floats())  # big ints, NaN and infinities too
struct_value = st.recursive(
    st.one_of(st.none(), st.booleans(), any_number, st.text(max_size=20)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(max_size=10), struct_value, max_size=4))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_params_read_as_the_protobuf_library_reads_them(value: dict[str, Any]) -> None:
    from google.protobuf import struct_pb2

    from lowlat_mw.protocol.wire.schema import struct_to_dict as _struct_to_dict

    struct = struct_pb2.Struct()
    struct.update(value)
    struct.fields["unset"].SetInParent()  # a Value with no kind: null, as the library reads it
    try:
        expected = _library_struct_to_dict(struct)
    except ValueError:  # NaN or an infinity: both refuse it
        with pytest.raises(ValueError):
            _struct_to_dict(struct)
        return
    got = _struct_to_dict(struct)
    assert got == expected and json.dumps(got) == json.dumps(expected)  # same types too (1 vs 1.0 vs True)


def test_decoding_params_leaves_no_garbage_for_the_collector() -> None:
    """Reading a Request's params makes no reference cycle (a recursive closure did, on every Request)."""
    import gc

    frame_ = PROTO.encode(ev.Request(stream_id=1, text="x", params={"n": 1, "l": [1, {"a": None}], "s": "v"}))
    gc.collect()
    gc.disable()
    try:
        for _ in range(100):
            PROTO.decode(frame_, limit=LIMIT)
        assert gc.collect() == 0
    finally:
        gc.enable()


# ================================================================================ wire format
def test_json_wire_format_is_compact_and_documented() -> None:
    assert JSON.encode(ev.Delta(stream_id=1, seq=2, text="hi")) == '{"type":"delta","stream_id":1,"seq":2,"text":"hi"}'
    assert JSON.encode(ev.Delta(stream_id=1, seq=2, data=b"\x00\xff")) == (
        '{"type":"delta","stream_id":1,"seq":2,"data":"AP8="}')
    assert json.loads(JSON.encode(ev.Error(stream_id=3, code=ErrorCode.MODEL_ERROR)))["code"] == "model_error"
    assert json.loads(JSON.encode(ev.Hello(last_seq={5: 9})))["last_seq"] == {"5": 9}
    assert JSON.encode(ev.Delta(stream_id=1, seq=1, text="é")) == '{"type":"delta","stream_id":1,"seq":1,"text":"é"}'


def test_proto_frame_header() -> None:
    data = PROTO.encode(ev.Ping(id=1))
    assert data[0] == 0x10
    assert pb.Envelope.FromString(data[1:]).ping.id == 1


@pytest.mark.parametrize(("subprotocol", "cls"), [
    ("lowlat.v1.proto", ProtoCodec), ("lowlat.v1.json", JsonCodec), (None, JsonCodec),
])
def test_codec_for(subprotocol: str | None, cls: type) -> None:
    codec = codec_for(subprotocol)
    assert isinstance(codec, cls)
    assert codec.binary is (cls is ProtoCodec)


@pytest.mark.parametrize("codec", CODECS)
def test_encoding_a_non_event_is_a_local_error(codec: Any) -> None:
    with pytest.raises(LocalProtocolError):
        codec.encode(object())


def test_to_helpers_reject_non_events() -> None:
    with pytest.raises(LocalProtocolError):
        to_protobuf("nope")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        to_json_dict(3)  # type: ignore[arg-type]


# ================================================================================ fuzz: only RemoteProtocolError
def _decode_or_protocol_error(codec: Any, data: bytes | str, allowed: Any = ALL) -> None:
    try:
        result = codec.decode(data, limit=4096, allowed=allowed)
    except RemoteProtocolError as exc:
        assert isinstance(exc.error_code, ErrorCode)
        assert exc.close_code is None or exc.close_code in tuple(CloseCode)
        return
    assert isinstance(result, ev.Event)  # (every message kind of the protocol, v1.1's included)


@FUZZ
@given(st.one_of(st.binary(), st.text()))
def test_proto_decode_arbitrary_input_only_raises_remote_protocol_error(data: bytes | str) -> None:
    _decode_or_protocol_error(PROTO, data)


@FUZZ
@given(st.sampled_from([0x10, 0x11, 0x12, 0x13, 0x14, 0x1F]), st.binary(max_size=200))
def test_proto_decode_arbitrary_payload_with_valid_header(header: int, payload: bytes) -> None:
    _decode_or_protocol_error(PROTO, bytes((header,)) + payload)
    _decode_or_protocol_error(PROTO, bytes((header,)) + payload, allowed=None)


@FUZZ
@given(events, st.data())
def test_proto_decode_mutated_valid_frames(event: ev.Event, data: st.DataObject) -> None:
    raw = bytearray(PROTO.encode(event))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(1, len(raw) - 1)) if len(raw) > 1 else 0
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(raw)))
    _decode_or_protocol_error(PROTO, bytes(raw))
    _decode_or_protocol_error(PROTO, bytes(raw[:cut]))


@FUZZ
@given(st.one_of(st.text(), st.binary()))
def test_json_decode_arbitrary_input_only_raises_remote_protocol_error(data: bytes | str) -> None:
    _decode_or_protocol_error(JSON, data)


FIELDS = ["stream_id", "seq", "id", "model", "text", "data", "messages", "params", "code", "message", "retryable",
          "compression", "last_seq", "timings_ms", "usage", "client", "resume_token", "session_id",
          "max_frame_size", "resumed", "reason", "reconnect_after_ms", "finish_reason", "last_seq"]
any_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@FUZZ
@given(st.sampled_from(["hello", "welcome", "request", "delta", "end", "error", "cancel", "ping", "pong",
                        "goaway", "bogus"]),
       st.dictionaries(st.sampled_from(FIELDS), any_json, max_size=5))
def test_json_decode_known_types_with_random_fields(kind: str, fields: dict[str, Any]) -> None:
    _decode_or_protocol_error(JSON, json.dumps({"type": kind, **fields}))


@FUZZ
@given(events, st.data())
def test_json_decode_mutated_valid_frames(event: ev.Event, data: st.DataObject) -> None:
    obj = to_json_dict(event)
    key = data.draw(st.sampled_from(sorted(obj)))
    obj[key] = data.draw(any_json)
    _decode_or_protocol_error(JSON, json.dumps(obj))


# ================================================================================ specific failures
def _envelope(**kw: Any) -> pb.Envelope:
    env = pb.Envelope()
    for path, value in kw.items():
        msg_name, field_name = path.split("__")
        setattr(getattr(env, msg_name), field_name, value)
    return env


def _inf_params() -> pb.Envelope:
    env = pb.Envelope()
    env.request.stream_id = 1
    env.request.params["x"] = float("inf")
    return env


def _nan_params() -> pb.Envelope:
    env = pb.Envelope()
    env.request.stream_id = 1
    env.request.params["x"] = float("nan")
    return env


def _delta_without_chunk() -> pb.Envelope:
    env = pb.Envelope()
    env.delta.stream_id = 1
    return env


PROTO_FAILURES = [
    # (id, frame, limit, error code, close code)
    ("empty frame", b"", LIMIT, ErrorCode.INVALID_PAYLOAD, 1007),
    ("text frame", "{}", LIMIT, ErrorCode.INVALID_PAYLOAD, 1003),
    ("version 0", b"\x00" + PROTO.encode(ev.Ping())[1:], LIMIT, ErrorCode.PROTOCOL_ERROR, 1002),
    ("version 2", b"\x20" + PROTO.encode(ev.Ping())[1:], LIMIT, ErrorCode.PROTOCOL_ERROR, 1002),
    ("version 15", b"\xf0", LIMIT, ErrorCode.PROTOCOL_ERROR, 1002),
    ("not protobuf", b"\x10\xff\xff\xff", LIMIT, ErrorCode.INVALID_PAYLOAD, 1007),
    ("truncated", PROTO.encode(ev.Delta(stream_id=1, seq=1, text="hello"))[:-2], LIMIT,
     ErrorCode.INVALID_PAYLOAD, 1007),
    ("bad utf-8 in string", b"\x10\x22\x03\x1a\x01\xff", LIMIT, ErrorCode.INVALID_PAYLOAD, 1007),
    ("unknown codec id", b"\x14abc", LIMIT, ErrorCode.UNSUPPORTED_COMPRESSION, 1007),
    ("empty envelope", b"\x10", LIMIT, ErrorCode.UNSUPPORTED_MESSAGE, None),
    ("unknown message (field 15)", b"\x10\x78\x01", LIMIT, ErrorCode.UNSUPPORTED_MESSAGE, None),
    ("request stream 0", frame(_envelope(request__model="m")), LIMIT, ErrorCode.BAD_REQUEST, None),
    ("delta without chunk", frame(_delta_without_chunk()), LIMIT, ErrorCode.BAD_REQUEST, None),
    ("params inf", frame(_inf_params()), LIMIT, ErrorCode.BAD_REQUEST, None),
    ("params nan", frame(_nan_params()), LIMIT, ErrorCode.BAD_REQUEST, None),
    ("over limit", PROTO.encode(ev.Delta(stream_id=1, seq=1, text="x" * 100)), 50, ErrorCode.MESSAGE_TOO_BIG, 1009),
]


@pytest.mark.parametrize(("frame_", "limit", "error_code", "close_code"),
                         [c[1:] for c in PROTO_FAILURES], ids=[c[0] for c in PROTO_FAILURES])
def test_proto_decode_failures(frame_: bytes | str, limit: int, error_code: ErrorCode, close_code: int | None) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        PROTO.decode(frame_, limit=limit, allowed=ALL)
    assert (info.value.error_code, info.value.close_code) == (error_code, close_code), str(info.value)


@pytest.mark.parametrize("codec", ALL)
def test_proto_compressed_frame_over_limit_is_too_big(codec: str) -> None:
    data = PROTO.encode(ev.Delta(stream_id=1, seq=1, text="z" * 100_000), CompressionSelector([codec], min_size=0))
    assert len(data) < 10_000
    with pytest.raises(RemoteProtocolError) as info:
        PROTO.decode(data, limit=50_000, allowed=[codec])
    assert (info.value.error_code, info.value.close_code) == (ErrorCode.MESSAGE_TOO_BIG, 1009)


@pytest.mark.parametrize("codec", ALL)
def test_proto_corrupt_compressed_payload_is_invalid(codec: str) -> None:
    data = bytes((0x10 | CODEC_IDS[codec],)) + b"\x00garbage-not-compressed\x00"
    with pytest.raises(RemoteProtocolError) as info:
        PROTO.decode(data, limit=LIMIT, allowed=[codec])
    assert (info.value.error_code, info.value.close_code) == (ErrorCode.INVALID_PAYLOAD, 1007)


def test_proto_unknown_error_code_is_unspecified() -> None:
    env = pb.Envelope()
    env.error.code = 999  # type: ignore[assignment]
    env.error.message = "from the future"
    assert PROTO.decode(frame(env), limit=LIMIT) == ev.Error(code=ErrorCode.UNSPECIFIED, message="from the future")


JSON_FAILURES = [
    # (id, frame, error code, close code)
    ("binary frame", b'{"type":"ping"}', ErrorCode.INVALID_PAYLOAD, 1003),
    ("empty", "", ErrorCode.INVALID_PAYLOAD, 1007),
    ("invalid json", "{not json", ErrorCode.INVALID_PAYLOAD, 1007),
    ("deep nesting", "[" * 100_000, ErrorCode.INVALID_PAYLOAD, 1007),
    ("huge integer", '{"type":"ping","id":' + "9" * 5000 + "}", ErrorCode.INVALID_PAYLOAD, 1007),
    ("array", "[1, 2]", ErrorCode.INVALID_PAYLOAD, 1007),
    ("string", '"ping"', ErrorCode.INVALID_PAYLOAD, 1007),
    ("no type", "{}", ErrorCode.INVALID_PAYLOAD, 1007),
    ("no type, other fields", '{"stream_id": 1}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("type not a string", '{"type": 5}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("unknown type", '{"type": "bogus"}', ErrorCode.UNSUPPORTED_MESSAGE, None),
    ("request stream 0", '{"type":"request","stream_id":0,"text":"x"}', ErrorCode.BAD_REQUEST, None),
    ("request no stream id", '{"type":"request","text":"x"}', ErrorCode.BAD_REQUEST, None),
    ("request text and data", '{"type":"request","stream_id":1,"text":"x","data":"AA=="}',
     ErrorCode.BAD_REQUEST, None),
    ("stream id string", '{"type":"request","stream_id":"1"}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("stream id float", '{"type":"request","stream_id":1.0}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("stream id bool", '{"type":"request","stream_id":true}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("stream id negative", '{"type":"cancel","stream_id":-1}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("stream id > u32", '{"type":"cancel","stream_id":4294967296}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("text not a string", '{"type":"request","stream_id":1,"text":5}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("model null", '{"type":"request","stream_id":1,"model":null}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("bad base64", '{"type":"request","stream_id":1,"data":"!!!"}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("bad base64 padding", '{"type":"delta","stream_id":1,"seq":1,"data":"AAA"}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("data not a string", '{"type":"request","stream_id":1,"data":[1]}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("messages not a list", '{"type":"request","stream_id":1,"messages":"hi"}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("message role not a string", '{"type":"request","stream_id":1,"messages":[{"role":1,"content":"x"}]}',
     ErrorCode.INVALID_PAYLOAD, 1007),
    ("message not an object", '{"type":"request","stream_id":1,"messages":["x"]}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("params not an object", '{"type":"request","stream_id":1,"params":[1]}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("delta without chunk", '{"type":"delta","stream_id":1,"seq":1}', ErrorCode.BAD_REQUEST, None),
    ("end timings not numbers", '{"type":"end","stream_id":1,"timings_ms":{"a":"x"}}', ErrorCode.INVALID_PAYLOAD,
     1007),
    ("end usage float", '{"type":"end","stream_id":1,"usage":{"a":1.5}}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("error retryable string", '{"type":"error","retryable":"yes"}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("error code int", '{"type":"error","code":5}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("hello compression string", '{"type":"hello","compression":"zstd"}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("hello compression ints", '{"type":"hello","compression":[1]}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("hello last_seq key", '{"type":"hello","last_seq":{"x":1}}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("hello last_seq negative", '{"type":"hello","last_seq":{"1":-1}}', ErrorCode.INVALID_PAYLOAD, 1007),
    ("hello last_seq superscript digit", '{"type":"hello","last_seq":{"\\u00b2":1}}', ErrorCode.INVALID_PAYLOAD,
     1007),
    ("hello last_seq huge key", '{"type":"hello","last_seq":{"' + "9" * 5000 + '":1}}', ErrorCode.INVALID_PAYLOAD,
     1007),
    ("ping id float", '{"type":"ping","id":1.5}', ErrorCode.INVALID_PAYLOAD, 1007),
]


@pytest.mark.parametrize(("frame_", "error_code", "close_code"),
                         [c[1:] for c in JSON_FAILURES], ids=[c[0] for c in JSON_FAILURES])
def test_json_decode_failures(frame_: bytes | str, error_code: ErrorCode, close_code: int | None) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        JSON.decode(frame_, limit=LIMIT)
    assert (info.value.error_code, info.value.close_code) == (error_code, close_code), str(info.value)


@pytest.mark.parametrize(("codec", "frame_", "stream_id"), [
    (JSON, '{"type":"request","stream_id":7,"text":"x","data":"AA=="}', 7),
    (JSON, '{"type":"request","stream_id":0,"text":"x"}', 0),
    (JSON, '{"type":"delta","stream_id":7,"seq":1}', 0),  # only a Request's stream is named
    (PROTO, frame(_inf_params()), 1),
    (PROTO, frame(_envelope(request__model="m")), 0),
    (PROTO, frame(_delta_without_chunk()), 0),
], ids=["json text+data", "json stream 0", "json delta", "proto params inf", "proto stream 0", "proto delta"])
def test_bad_request_names_the_requests_stream(codec: Any, frame_: bytes | str, stream_id: int) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        codec.decode(frame_, limit=LIMIT)
    assert info.value.error_code is ErrorCode.BAD_REQUEST
    assert info.value.stream_id == stream_id


@pytest.mark.parametrize("last_seq", [
    '{"4294967295": 4294967295}', '{"0": 0}', '{"007": 1}',
])
def test_json_hello_last_seq_accepts_u32(last_seq: str) -> None:
    hello = JSON.decode('{"type":"hello","last_seq":' + last_seq + "}", limit=LIMIT)
    assert isinstance(hello, ev.Hello)
    assert {str(int(k)): v for k, v in json.loads(last_seq).items()} == {str(k): v for k, v in hello.last_seq.items()}


@pytest.mark.parametrize("last_seq", [
    '{"4294967296": 1}', '{"1": 4294967296}', '{"-1": 1}', '{"1.0": 1}', '{" 1": 1}', '{"\u0661": 1}', '{"": 1}',
])
def test_json_hello_last_seq_rejects_what_is_not_u32(last_seq: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        JSON.decode('{"type":"hello","last_seq":' + last_seq + "}", limit=LIMIT)
    assert (info.value.error_code, info.value.close_code) == (ErrorCode.INVALID_PAYLOAD, 1007)


def test_json_unknown_error_code_name_is_unspecified() -> None:
    got = JSON.decode('{"type":"error","code":"from_the_future","message":"m"}', limit=LIMIT)
    assert got == ev.Error(code=ErrorCode.UNSPECIFIED, message="m")


def test_json_missing_fields_take_defaults() -> None:
    assert JSON.decode('{"type":"ping"}', limit=LIMIT) == ev.Ping(id=0)
    assert JSON.decode('{"type":"hello"}', limit=LIMIT) == ev.Hello()
    assert JSON.decode('{"type":"request","stream_id":3,"text":null}', limit=LIMIT) == ev.Request(stream_id=3)


def test_from_json_dict_rejects_non_objects() -> None:
    for value in (None, 1, "x", [], ["type"]):
        with pytest.raises(RemoteProtocolError):
            from_json_dict(value)


def test_a_maker_builds_what_init_builds_field_for_field_with_fresh_defaults_and_stays_frozen() -> None:
    """_fast.maker (the hot paths' constructor of Request and ModelRequest) sets every field as __init__ does:
    the given ones, each other one its default or a new object of its default factory."""
    import dataclasses

    from lowlat_mw._fast import maker
    from lowlat_mw.model import ModelRequest, SessionInfo

    info = SessionInfo(session_id="s", client=("127.0.0.1", 1))
    cases = [(ev.Request, ("stream_id", "model", "text", "params"), (7, "m", "hi", {"a": 1})),
             (ModelRequest, ("stream_id", "model", "text", "data", "messages", "params", "session"),
              (3, "", None, b"x", None, {"b": 2}, info)),
             (ev.Ack, ("stream_id", "seq"), (4, 2))]  # (an arity the hot paths do not use: the generic loop)
    for cls, names, values in cases:
        make = maker(cls, *names)
        made, built = make(*values), cls(**dict(zip(names, values, strict=True)))
        assert type(made) is cls
        for f in dataclasses.fields(cls):
            assert getattr(made, f.name) == getattr(built, f.name), f.name
            if f.default_factory is not dataclasses.MISSING and f.name not in names:  # a new one per object
                assert getattr(make(*values), f.name) is not getattr(made, f.name), f.name
        assert made == built
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.stream_id = 9  # type: ignore[misc]
    with pytest.raises(TypeError, match="takes 2 positional arguments but 3"):
        maker(ev.Ack, "stream_id", "seq")(1, 2, 3)
    with pytest.raises(TypeError, match="no field"):
        maker(ev.Request, "stream_id", "prompt")
    with pytest.raises(TypeError, match="no default"):
        maker(ev.Request, "text")  # stream_id has none
    with pytest.raises(TypeError, match="not a slotted"):
        maker(dataclasses.make_dataclass("Loose", [("a", int)], frozen=True), "a")
    from lowlat_mw.protocol.wire.fast import decode_request as decode_fast

    fast = decode_fast(to_protobuf(ev.Request(stream_id=5, model="m", text="t", params={"k": 1})).SerializeToString())
    assert fast == ev.Request(stream_id=5, model="m", text="t", params={"k": 1})
    big = to_protobuf(ev.Request(stream_id=1, text="t")).SerializeToString()
    big = big.replace(b"\x08\x01", b"\x08\x80\x80\x80\x80\x10")  # stream id 2**32
    assert decode_fast(big[:1] + bytes([len(big) - 2]) + big[2:]) is None  # an id past 32 bits: the library's


@FUZZ
@given(u32, u32, st.one_of(st.text(), st.binary()))
def test_encode_delta_writes_what_encode_frame_writes_for_the_delta(stream_id: int, seq: int,
                                                                     chunk: str | bytes) -> None:
    """Each codec's encode_delta (every token, without an event) is its encode_frame of the Delta."""
    event = ev.Delta.of(stream_id, seq, chunk)
    for codec in CODECS:
        try:
            want = codec.encode_frame(event)
        except (UnicodeEncodeError, ValueError):  # a lone surrogate: neither writes it
            with pytest.raises((UnicodeEncodeError, ValueError)):
                codec.encode_delta(stream_id, seq, chunk)
            continue
        assert codec.encode_delta(stream_id, seq, chunk) == want, codec
