"""wire/fast.py against the protobuf library: every hand-written encoder gives the library's bytes, every
hand-written decoder the library path's event or None (then the library path answers), on hypothesis-made
events and on made and mutated bytes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlat_mw.errors import RemoteProtocolError
from lowlat_mw.proto import lowlat_v1_pb2 as pb
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import ProtoCodec, fast, from_protobuf, to_protobuf
from lowlat_mw.protocol.wire.fast import DECODERS, ParamsMemo, encode_delta_fast, encode_small_fast

LIMIT = 8 * 1024 * 1024
PROTO = ProtoCodec()
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
u32 = st.integers(0, 2**32 - 1)


def decode_fast(payload: bytes, params: ParamsMemo | None = None) -> ev.Event | None:
    """What ProtoCodec.decode gets from wire/fast.py for `payload` (an Envelope's bytes), None: nothing."""
    decoder = DECODERS.get(payload[0]) if payload else None
    return None if decoder is None else decoder(payload, params)


def library(payload: bytes) -> ev.Event | RemoteProtocolError | Exception:
    """What the library path (wire/protobuf.py) reads from `payload`: an event, or the error it raises."""
    try:
        return from_protobuf(pb.Envelope.FromString(payload))
    except Exception as exc:
        return exc


# ================================================================================ fast delta path
@FUZZ
@given(u32, u32, st.one_of(st.text(), st.binary()))
def test_encode_delta_fast_is_byte_identical_to_protobuf(stream_id: int, seq: int, chunk: str | bytes) -> None:
    event = ev.Delta(stream_id=stream_id, seq=seq, **({"text": chunk} if isinstance(chunk, str) else {"data": chunk}))
    assert encode_delta_fast(stream_id, seq, chunk) == to_protobuf(event).SerializeToString()


@pytest.mark.parametrize("stream_id", [0, 1, 127, 128, 16383, 16384, 2**21, 2**28, 2**32 - 1])
@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16384, 70000])
def test_encode_delta_fast_at_varint_boundaries(stream_id: int, size: int) -> None:
    for chunk in ("x" * size, b"\x01" * size):
        event = ev.Delta(stream_id=stream_id, seq=stream_id, **(
            {"text": chunk} if isinstance(chunk, str) else {"data": chunk}))
        assert encode_delta_fast(stream_id, stream_id, chunk) == to_protobuf(event).SerializeToString()




@FUZZ
@given(u32, u32, st.one_of(st.text(), st.binary()))
def test_decode_fast_delta_reads_what_protobuf_reads(stream_id: int, seq: int, chunk: str | bytes) -> None:
    payload = encode_delta_fast(stream_id, seq, chunk)
    event = ev.Delta.of(stream_id, seq, chunk)
    assert decode_fast(payload) == event
    assert PROTO.decode(b"\x10" + payload, limit=LIMIT) == event


@FUZZ
@given(st.binary(max_size=64))
def test_decode_fast_delta_on_any_bytes_agrees_with_protobuf_or_leaves_them_to_it(tail: bytes) -> None:
    """Whatever it accepts, the library parses to the same Delta; whatever else it leaves alone."""
    for payload in (tail, b"\x22" + tail, b"\x22" + bytes((len(tail),)) + tail):
        fast = decode_fast(payload)
        if fast is None:
            continue
        env = pb.Envelope.FromString(payload)
        assert env.WhichOneof("msg") == "delta"
        which = env.delta.WhichOneof("chunk")
        assert fast == ev.Delta(stream_id=env.delta.stream_id, seq=env.delta.seq, **{which: getattr(env.delta, which)})


@pytest.mark.parametrize("payload", [
    b"\x22\x04\x08\x01\x1a\x01",  # the text runs past the end
    b"\x22\x05\x08\x01\x1a\x01\xff",  # invalid UTF-8 in a string field
    b"\x22\x06\x10\x01\x08\x01\x1a\x00",  # fields out of order: the library's call
    b"\x22\x03\x08\x01\x1a\x00\x00",  # bytes after the Delta
    b"\x22\x0a\x08\xff\xff\xff\xff\x7f\x1a\x00",  # a stream id beyond uint32
    b"\x0a\x00",  # not a Delta
    b"",
])
def test_decode_fast_delta_leaves_every_other_layout_to_protobuf(payload: bytes) -> None:
    assert decode_fast(payload) is None


@FUZZ
@given(u32, u32, st.booleans())
def test_encode_small_fast_acks_are_byte_identical_to_protobuf(stream_id: int, seq: int, done: bool) -> None:
    ack = ev.Ack(stream_id=stream_id, seq=seq, done=done)
    assert encode_small_fast(ack) == to_protobuf(ack).SerializeToString()


@FUZZ
@given(st.integers(1, 2**32 - 1), st.text(max_size=20), st.text())
def test_encode_small_fast_text_requests_are_byte_identical_to_protobuf(stream_id: int, model: str, text: str) -> None:
    try:
        text.encode()
        model.encode()
    except UnicodeEncodeError:  # lone surrogates: protobuf refuses them too
        return
    req = ev.Request(stream_id=stream_id, model=model, text=text)
    assert encode_small_fast(req) == to_protobuf(req).SerializeToString()
    assert PROTO.decode(PROTO.encode(req), limit=LIMIT) == req


def test_encode_small_fast_leaves_other_requests_to_protobuf() -> None:
    assert encode_small_fast(ev.Request(stream_id=1, text="x", params={"a": 1})) is None
    warm = ev.Request(stream_id=1, text="x", warmup=True)  # (revision 2: its field must not be dropped)
    assert encode_small_fast(warm) is None
    assert PROTO.decode(PROTO.encode(warm), limit=LIMIT) == warm
    assert encode_small_fast(ev.Request(stream_id=1, data=b"x")) is None
    assert encode_small_fast(ev.Request(stream_id=1)) is None
    assert encode_small_fast(ev.Cancel(stream_id=1)) is None


@FUZZ
@given(u32, st.booleans())
def test_pings_and_pongs_fast_both_ways_are_what_protobuf_makes_and_reads(ping_id: int, pong: bool) -> None:
    event = ev.Pong(id=ping_id) if pong else ev.Ping(id=ping_id)
    payload = encode_small_fast(event)
    assert payload == to_protobuf(event).SerializeToString()
    assert decode_fast(payload) == event == from_protobuf(pb.Envelope.FromString(payload))


@FUZZ
@given(u32, u32, st.booleans())
def test_decode_fast_small_reads_acks_as_protobuf_does(stream_id: int, seq: int, done: bool) -> None:
    ack = ev.Ack(stream_id=stream_id, seq=seq, done=done)
    payload = to_protobuf(ack).SerializeToString()
    assert decode_fast(payload) == ack == from_protobuf(pb.Envelope.FromString(payload))


@FUZZ
@given(st.integers(1, 2**32 - 1), st.text(max_size=20), st.text())
def test_decode_fast_small_reads_text_requests_as_protobuf_does(stream_id: int, model: str, text: str) -> None:
    try:
        req = ev.Request(stream_id=stream_id, model=model, text=text)
        payload = to_protobuf(req).SerializeToString()
    except (UnicodeEncodeError, ValueError):  # lone surrogates: not encodable
        return
    assert decode_fast(payload) == req == from_protobuf(pb.Envelope.FromString(payload))


@FUZZ
@given(st.sampled_from([b"\x5a", b"\x1a", b"\x4a", b"\x42"]), st.binary(max_size=48))
def test_decode_fast_small_on_any_bytes_agrees_with_protobuf_or_leaves_them_to_it(tag: bytes, tail: bytes) -> None:
    for payload in (tag + tail, tag + bytes((len(tail),)) + tail):
        fast = decode_fast(payload)
        if fast is None:
            continue
        assert fast == from_protobuf(pb.Envelope.FromString(payload))


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**60, 2**60).map(float),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))


@FUZZ
@given(st.integers(1, 2**32 - 1), st.text(max_size=10),
       st.dictionaries(st.text(max_size=8), st.one_of(_scalars, st.lists(_scalars, max_size=2),
                                                     st.dictionaries(st.text(max_size=3), _scalars, max_size=2)),
                       max_size=5))
def test_decode_fast_reads_requests_with_flat_params_as_the_library_does(stream_id: int, text: str,
                                                                          params: dict[str, Any]) -> None:
    """Params of strings, numbers, bools and nulls are read by hand exactly as the library path reads them
    (whole numbers as ints below 2**53); nested values, NaN and infinities are left to the library."""
    try:
        payload = pb.Envelope(request=pb.Request(stream_id=stream_id, text=text)).SerializeToString()
        env = pb.Envelope.FromString(payload)
        env.request.params.update(params)
        payload = env.SerializeToString()
    except (UnicodeEncodeError, ValueError):  # lone surrogates: not encodable
        return
    fast = decode_fast(payload)
    try:
        library = from_protobuf(pb.Envelope.FromString(payload))
    except (ValueError, RemoteProtocolError):  # NaN or an infinity: refused by the library path
        assert fast is None
        return
    flat = all(v is None or isinstance(v, bool | int | float | str) for v in params.values())
    if flat:
        assert fast == library
    else:
        assert fast is None or fast == library


def test_repeated_params_are_read_once_and_every_request_gets_a_dict_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's requests mostly carry the same params: their bytes are read once (a bounded table of the
    connection's), and each Request still gets a dict of its own that its model may change."""
    reads: list[bytes] = []
    flat_struct = fast._flat_struct
    monkeypatch.setattr(fast, "_flat_struct", lambda buf: reads.append(buf) or flat_struct(buf))
    memo = fast.ParamsMemo()
    params = {"temperature": 0.5, "max_tokens": 64, "stop": "\n", "stream": True}
    payload = to_protobuf(ev.Request(stream_id=1, text="x", params=params)).SerializeToString()
    first = decode_fast(payload, memo)
    assert isinstance(first, ev.Request) and first.params == params
    first.params["max_tokens"] = 1  # (the model changes its own)
    first.params.pop("stop")
    second = decode_fast(payload, memo)
    assert isinstance(second, ev.Request) and second.params == params and second.params is not first.params
    assert len(reads) == 1
    for n in range(memo.MAX + 10):  # params that differ per request: the table stays bounded
        other = to_protobuf(ev.Request(stream_id=1, text="x", params={"seed": n})).SerializeToString()
        assert decode_fast(other, memo).params == {"seed": n}  # type: ignore[union-attr]
    assert len(memo.seen) <= memo.MAX
    big = {"prompt_prefix": "y" * memo.SIZE}  # too big to keep: read every time
    payload = to_protobuf(ev.Request(stream_id=1, text="x", params=big)).SerializeToString()
    assert decode_fast(payload, memo).params == big  # type: ignore[union-attr]
    assert decode_fast(payload, memo).params == big  # type: ignore[union-attr]
    assert reads.count(reads[-1]) == 2


def test_decode_fast_small_leaves_requests_with_nested_params_or_data_and_bad_ids_to_protobuf() -> None:
    for req in (ev.Request(stream_id=1, text="x", params={"a": {"b": 1}}), ev.Request(stream_id=1, data=b"x"),
                ev.Request(stream_id=1)):
        assert decode_fast(to_protobuf(req).SerializeToString()) is None
    assert decode_fast(b"\x1a\x04\x08\x00\x1a\x00") is None  # stream id 0: the library's bad_request
    with pytest.raises(RemoteProtocolError):
        PROTO.decode(b"\x10\x1a\x04\x08\x00\x1a\x00", limit=LIMIT)




# ================================================================================ differential, every fast path
_text = st.text(max_size=40).filter(lambda s: s == s.encode("utf-8", "replace").decode())  # (no lone surrogates)
_flat = st.dictionaries(st.text(max_size=8).filter(lambda s: s.isprintable()), st.one_of(
    st.none(), st.booleans(), st.integers(-2**53 + 1, 2**53 - 1), st.floats(allow_nan=False, allow_infinity=False),
    _text), max_size=4)
FAST_EVENTS = st.one_of(
    st.builds(ev.Delta, stream_id=u32, seq=u32, text=_text),
    st.builds(ev.Delta, stream_id=u32, seq=u32, data=st.binary(max_size=40)),
    st.builds(ev.Ack, stream_id=u32, seq=u32, done=st.booleans()),
    st.builds(ev.Ping, id=u32),
    st.builds(ev.Pong, id=u32),
    st.builds(ev.Request, stream_id=st.integers(1, 2**32 - 1), model=_text, text=_text),
    st.builds(ev.Request, stream_id=st.integers(1, 2**32 - 1), model=_text, text=_text, params=_flat),
)
"""The events wire/fast.py reads and (but Requests with params) writes."""
OTHER_EVENTS = st.one_of(
    st.builds(ev.Delta, stream_id=u32, seq=u32, tool_call=st.builds(ev.ToolCall, _text, _text, id=_text)),
    st.builds(ev.Request, stream_id=st.integers(1, 2**32 - 1), data=st.binary(max_size=8), warmup=st.booleans()),
    st.builds(ev.Request, stream_id=st.integers(1, 2**32 - 1), text=_text,
              contexts=st.lists(_text, min_size=1, max_size=2).map(tuple), continues=u32),
    st.builds(ev.Cancel, stream_id=u32),
    st.builds(ev.End, stream_id=u32, last_seq=u32, finish_reason=_text),
    st.builds(ev.Input, stream_id=st.integers(1, 2**32 - 1), seq=st.integers(1, 2**32 - 1), text=_text),
)
"""Events of the same kinds or first bytes that wire/fast.py must leave to the library."""


def _mutations(payload: bytes, data: Any) -> bytes:
    """`payload` with one random change: a byte's low bits changed (a key's wire type, a small number), a byte
    replaced, inserted or deleted, or a cut."""
    how = data.draw(st.sampled_from(["retype", "replace", "insert", "delete", "cut"]))
    if not payload:
        return data.draw(st.binary(max_size=4))
    at = data.draw(st.integers(0, len(payload) - 1))
    byte = bytes((data.draw(st.integers(0, 255)),))
    if how == "retype":
        return payload[:at] + bytes((payload[at] ^ data.draw(st.integers(1, 7)),)) + payload[at + 1:]
    if how == "replace":
        return payload[:at] + byte + payload[at + 1:]
    if how == "insert":
        return payload[:at] + byte + payload[at:]
    if how == "delete":
        return payload[:at] + payload[at + 1:]
    return payload[:at]


def _agrees(payload: bytes, params: ParamsMemo | None = None) -> ev.Event | None:
    """Assert the fast decoder gives what the library path gives, or None; returns the fast result."""
    got = decode_fast(payload, params)
    if got is not None:
        assert got == library(payload), payload
    return got


@FUZZ
@given(st.one_of(FAST_EVENTS, OTHER_EVENTS))
def test_every_fast_encoder_writes_the_librarys_bytes_or_leaves_the_event_to_it(event: ev.Event) -> None:
    want = to_protobuf(event).SerializeToString()
    small = encode_small_fast(event)
    assert small is None or small == want
    if type(event) is ev.Delta and event.tool_call is None:
        assert encode_delta_fast(event.stream_id, event.seq, event.chunk) == want  # type: ignore[arg-type]
        frame = fast.encode_delta_frame(event.stream_id, event.seq, event.chunk)  # type: ignore[arg-type]
        assert frame == fast.HEADER_NONE + want
    plain_request = type(event) is ev.Request and event.text is not None and not (
        event.params or event.warmup or event.contexts or event.continues)
    if type(event) in (ev.Ack, ev.Ping, ev.Pong) or plain_request:
        assert small == want  # (the kinds it names: it must not leave them)


@FUZZ
@given(FAST_EVENTS)
def test_every_fast_decoder_reads_the_librarys_bytes_as_the_library_path_does(event: ev.Event) -> None:
    payload = to_protobuf(event).SerializeToString()
    memo = ParamsMemo()
    assert _agrees(payload) == event == library(payload)  # (never left to the library: these are its layouts)
    assert _agrees(payload, memo) == event and _agrees(payload, memo) == event  # (the second from the memo)
    assert PROTO.decode(fast.HEADER_NONE + payload, limit=LIMIT, params=memo) == event


@FUZZ
@given(OTHER_EVENTS)
def test_the_fast_decoders_leave_other_messages_of_their_kinds_to_the_library(event: ev.Event) -> None:
    payload = to_protobuf(event).SerializeToString()
    assert _agrees(payload) is None
    assert PROTO.decode(fast.HEADER_NONE + payload, limit=LIMIT) == event


@FUZZ
@given(st.one_of(FAST_EVENTS, OTHER_EVENTS), st.data())
def test_the_fast_decoders_on_mutated_bytes_agree_with_the_library_or_leave_them_to_it(event: ev.Event,
                                                                                        data: Any) -> None:
    payload = to_protobuf(event).SerializeToString()
    for _ in range(4):
        payload = _mutations(payload, data)
        _agrees(payload)
        _agrees(payload, ParamsMemo())


@FUZZ
@given(st.sampled_from(sorted(DECODERS)), st.binary(max_size=48))
def test_the_fast_decoders_on_any_bytes_agree_with_the_library_or_leave_them_to_it(tag: int, tail: bytes) -> None:
    for payload in (bytes((tag,)) + tail, bytes((tag, len(tail))) + tail):
        _agrees(payload)
