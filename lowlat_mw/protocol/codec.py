"""Wire codecs: events <-> WebSocket messages, in Protobuf binary frames or JSON text frames.

Binary frame (subprotocol ``lowlat.v1.proto``)::

    +--------+---------------------------------------------+
    | header | Envelope (Protobuf), compressed per header  |
    +--------+---------------------------------------------+
    header = 0x10 | codec   (high nibble: frame version 1; low nibble: 0 none, 1 zstd, 2 lz4, 3 snappy)

Text frame (subprotocol ``lowlat.v1.json``): one JSON object with a ``"type"`` member, never
compressed. docs/protocol.md is the normative description of both.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from .._fast import maker
from ..errors import CloseCode, ErrorCode, LocalProtocolError, RemoteProtocolError
from ..proto import lowlat_v1_pb2 as pb
from ..settings import SUBPROTOCOL_PROTO
from . import events as ev
from .compression import decompress
from .selector import BINARY, TEXT, CompressionSelector

__all__ = ["FRAME_VERSION", "JsonCodec", "ProtoCodec", "WireCodec", "codec_for", "encode_varint"]

FRAME_VERSION = 1
_HEADER_BASE = FRAME_VERSION << 4
_HEADER_NONE = bytes((_HEADER_BASE,))
_HEADER_DELTA = _HEADER_NONE + b"\x22"  # uncompressed frame, Envelope field 4 (delta), length-delimited


class WireCodec(Protocol):
    """Turns events into WebSocket message payloads and back."""

    binary: bool

    def encode(self, event: ev.Event, compressor: CompressionSelector | None = None) -> bytes | str:
        """Serialize `event`, compressing with `compressor` where it pays off."""
        ...

    def decode(self, frame: bytes | str, *, limit: int, allowed: Iterable[str] | None = ()) -> ev.Event:
        """Parse one WebSocket message; raise RemoteProtocolError on bad input."""
        ...

    def encode_frame(self, event: ev.Event, compressor: CompressionSelector | None = None
                     ) -> tuple[bytes | str, int, int]:
        """(frame, size before compression, compression codec id)."""
        ...

    def encode_delta(self, stream_id: int, seq: int, chunk: str | bytes, compressor: CompressionSelector | None = None
                     ) -> tuple[bytes | str, int, int]:
        """The Delta (`stream_id`, `seq`, `chunk`) as :meth:`encode_frame` would, without building the event."""
        ...


def _invalid(msg: str, code: int = CloseCode.INVALID_PAYLOAD) -> RemoteProtocolError:
    return RemoteProtocolError(msg, error_code=ErrorCode.INVALID_PAYLOAD, close_code=code)


def _bad_request(msg: str, stream_id: int = 0) -> RemoteProtocolError:
    # The frame parsed but its content is not acceptable: answer with an Error, keep the connection.
    # The Error names the Request's stream when it has a usable id, so the client knows which failed.
    sid = stream_id if isinstance(stream_id, int) and 0 < stream_id <= 0xFFFFFFFF else 0
    return RemoteProtocolError(msg, error_code=ErrorCode.BAD_REQUEST, close_code=None, stream_id=sid)


def _unsupported(kind: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"unsupported message type {kind!r}", error_code=ErrorCode.UNSUPPORTED_MESSAGE, close_code=None
    )


# ================================================================================ Protobuf
_SMALL_VARINTS = tuple(bytes((i,)) for i in range(0x80))


def encode_varint(value: int) -> bytes:
    """A non-negative int as a Protobuf base-128 varint (also snappy's length header)."""
    if value < 0x80:
        return _SMALL_VARINTS[value]
    if value < 0x4000:  # two bytes: a stream's Delta numbers past 127
        return (value & 0x7F | 0x80 | value >> 7 << 8).to_bytes(2, "little")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_delta_frame(stream_id: int, seq: int, chunk: str | bytes) -> bytes:
    """A whole uncompressed binary frame (header byte + ``Envelope(delta=Delta(...))``) without building
    messages: the hot path of every token.

    Byte-for-byte what the protobuf library produces; tests/test_codec.py checks that.
    """
    small = _SMALL_VARINTS
    if type(chunk) is str:
        body, tag = chunk.encode(), b"\x1a"
    else:
        body, tag = bytes(chunk), b"\x22"
    n = len(body)
    inner = (
        (b"\x08" + (small[stream_id] if stream_id < 0x80 else encode_varint(stream_id)) if stream_id else b"")
        + (b"\x10" + (small[seq] if seq < 0x80 else encode_varint(seq)) if seq else b"")
        + tag + (small[n] if n < 0x80 else encode_varint(n)) + body
    )
    m = len(inner)
    return _HEADER_DELTA + (small[m] if m < 0x80 else encode_varint(m)) + inner


def _field(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: `tag`, the varint length of `body`, `body`."""
    n = len(body)
    return tag + (_SMALL_VARINTS[n] if n < 0x80 else encode_varint(n)) + body


def _uint(tag: bytes, value: int) -> bytes:
    """A varint field (proto3: nothing for 0)."""
    if not value:
        return b""
    return tag + (_SMALL_VARINTS[value] if value < 0x80 else encode_varint(value))


def encode_small_fast(event: ev.Event) -> bytes | None:
    """Protobuf bytes of ``Envelope(ack=...)``, of a Request with text only (what a client sends per
    stream) and of a Ping or Pong (heartbeats), without building messages; None for anything else.
    Byte-for-byte what the protobuf library produces; tests/test_codec.py checks that."""
    kind = type(event)
    if kind is ev.Ack:
        return _field(b"\x5a", _uint(b"\x08", event.stream_id) + _uint(b"\x10", event.seq)  # type: ignore[union-attr]
                      + (b"\x18\x01" if event.done else b""))  # type: ignore[union-attr]
    if kind is ev.Ping:  # (a heartbeat each way)
        return _field(b"\x42", _uint(b"\x08", event.id))  # type: ignore[union-attr]
    if kind is ev.Pong:
        return _field(b"\x4a", _uint(b"\x08", event.id))  # type: ignore[union-attr]
    if kind is ev.Request and event.text is not None and not event.params \
            and not event.warmup and not event.contexts and not event.continues:  # type: ignore[union-attr]
        model = event.model  # type: ignore[union-attr]
        return _field(b"\x1a", _uint(b"\x08", event.stream_id)  # type: ignore[union-attr]
                      + (_field(b"\x12", model.encode()) if model else b"")
                      + _field(b"\x1a", event.text.encode()))  # type: ignore[union-attr]
    return None


def encode_delta_fast(stream_id: int, seq: int, chunk: str | bytes) -> bytes:
    """Protobuf bytes of ``Envelope(delta=Delta(...))`` (the frame of :func:`encode_delta_frame` without its header)."""
    return encode_delta_frame(stream_id, seq, chunk)[1:]


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """(value, index after it) of the uint32 varint at `buf[i]`; IndexError past the end, ValueError if too big."""
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value > 0xFFFFFFFF:
                raise ValueError(value)
            return value, i
        shift += 7
        if shift > 28:
            raise ValueError(value)


_make_request = maker(ev.Request, "stream_id", "model", "text", "params")


def decode_fast(payload: bytes) -> ev.Event | None:
    """The message in `payload` (an Envelope's bytes) read without the protobuf library, for the three a
    peer sends per stream: a Delta laid out exactly as :func:`encode_delta_frame` writes it (every token a
    client receives), an Ack, and a Request with a model, text and flat params (what a server reads per
    stream; :func:`_flat_struct`), and for the heartbeat's Ping and Pong, their fields each at most once and
    in order. None for anything
    else (other messages, other layouts, bad UTF-8, invalid ids): the library decides those.
    tests/test_codec.py checks it against the library.
    (One function, written out: it runs for every message.)"""
    global _last_params
    try:
        tag = payload[0]
        m = payload[1]
        i = 2
        if m >= 0x80:
            m, i = _varint(payload, 1)
        end = len(payload)
        if i + m != end:
            return None
        if tag == 0x22:  # Delta: [stream_id] [seq] text | data
            sid = seq = 0
            b = payload[i]
            if b == 0x08:
                sid = payload[i + 1]
                i += 2
                if sid >= 0x80:
                    sid, i = _varint(payload, i - 1)
                b = payload[i]
            if b == 0x10:
                seq = payload[i + 1]
                i += 2
                if seq >= 0x80:
                    seq, i = _varint(payload, i - 1)
                b = payload[i]
            n = payload[i + 1]
            i += 2
            if n >= 0x80:
                n, i = _varint(payload, i - 1)
            if i + n != end:
                return None
            if b == 0x1a:
                return ev.Delta(stream_id=sid, seq=seq, text=payload[i:].decode())
            if b == 0x22:
                return ev.Delta(stream_id=sid, seq=seq, data=payload[i:])
            return None
        if tag == 0x5a:
            allowed = _ACK_FIELDS
        elif tag == 0x1a:
            allowed = _REQUEST_FIELDS
        elif tag == 0x4a or tag == 0x42:  # a Pong, a Ping: [id]
            allowed = _PING_FIELDS
        else:
            return None
        f: dict[int, Any] = {}
        last = 0
        while i < end:
            key = payload[i]
            num, wire = key >> 3, key & 7
            if key >= 0x80 or num <= last or allowed.get(num) != wire:
                return None
            last = num
            value = payload[i + 1]
            i += 2
            if value >= 0x80:
                value, i = _varint(payload, i - 1)
            if wire == 2:
                if i + value > end:
                    return None
                value, i = payload[i:i + value], i + value
            f[num] = value
        if tag == 0x4a:
            return ev.Pong(id=f.get(1, 0))
        if tag == 0x42:
            return ev.Ping(id=f.get(1, 0))
        if tag == 0x5a:
            done = f.get(3, 0)
            if done > 1:
                return None
            return ev.Ack(stream_id=f.get(1, 0), seq=f.get(2, 0), done=done == 1)
        if 3 not in f:
            return None
        if 6 in f:
            raw = f[6]
            seen = _PARAMS_SEEN.get(raw)  # (a client sends the same params with request after request)
            if seen is None:
                params = _flat_struct(raw)
                if params is None:
                    return None
                if len(raw) <= _PARAMS_SEEN_SIZE:
                    if len(_PARAMS_SEEN) >= _PARAMS_SEEN_MAX:
                        _PARAMS_SEEN.clear()
                    seen = _PARAMS_SEEN[raw] = (params, len(_PARAMS_JSON(params)))
            if seen is not None:  # kept: the model gets a dict of its own (it may change it), and its size goes
                params = seen[0].copy()  # to the max_request_size check that comes next
                _last_params = (params, seen[1])
        else:
            params = {}
        sid = f.get(1, 0)
        if sid == 0:  # an invalid id (_varint refuses more than 32 bits): the library's path names it in a
            return None  # bad_request
        # (built without Request.__init__: the id is checked above, and text is its one input)
        return _make_request(sid, f[2].decode() if 2 in f else "", f[3].decode(), params)
    except (IndexError, ValueError, LocalProtocolError):  # bad UTF-8 is a ValueError; an Ack's or Ping's invalid
        return None  # ids: the library's path names them in a bad_request


def _params_json() -> Callable[[Any], str]:
    """json.dumps(params, default=str), its C encoder made once: params come from a decoder, a tree, so
    the circular-reference check (a dict per call, made by JSONEncoder.iterencode) is left out."""
    from json.encoder import c_make_encoder, encode_basestring_ascii

    if c_make_encoder is None:  # pragma: no cover - an interpreter without the _json accelerator
        return json.JSONEncoder(default=str).encode
    encode = c_make_encoder(None, str, encode_basestring_ascii, None, ": ", ", ", False, False, True)
    join = "".join
    return lambda params: join(encode(params, 0))


_PARAMS_JSON = _params_json()

_NO_PARAMS: tuple[Any, int] = (None, 0)
_last_params = _NO_PARAMS  # the params dict decode_fast made last from a kept encoding, and its size


def params_size(params: Mapping[str, Any]) -> int:
    """Bytes of `params` as JSON (``json.dumps(params, default=str)``), what max_request_size counts them as.
    For the dict :func:`decode_fast` just made from a kept encoding (the next thing a server asks) the size
    kept with it, once: no JSON per request. (The memo holds that dict, so no other object can have its
    identity; it is forgotten when used, so a dict changed later is measured anew.)"""
    global _last_params
    last = _last_params
    if params is last[0]:
        _last_params = _NO_PARAMS
        return last[1]  # type: ignore[no-any-return]
    return len(_PARAMS_JSON(params))


# Flat params read lately, by their bytes: a client's requests mostly repeat them (temperature, max_tokens...), and
# reading them byte by byte was 18% of a Request's Python up to its first Delta. Flat values are immutable, and
# every Request gets a copy. Bounded: emptied when full (params that differ per request just pass through).
_PARAMS_SEEN: dict[bytes, tuple[dict[str, Any], int]] = {}  # bytes -> (params, JSON size)
_PARAMS_SEEN_MAX = 256
_PARAMS_SEEN_SIZE = 512  # bytes of params worth keeping (256 x 512 B at most)

_ACK_FIELDS = {1: 0, 2: 0, 3: 0}  # field number -> wire type (0 varint, 2 length-delimited)
_REQUEST_FIELDS = {1: 0, 2: 2, 3: 2, 6: 2}
_PING_FIELDS = {1: 0}
_DOUBLE = struct.Struct("<d").unpack_from


def _flat_struct(buf: bytes) -> dict[str, Any] | None:
    """The params of a Request (a google.protobuf.Struct's bytes) as :func:`_struct_to_dict` reads them, when
    every value is a string, number, bool or null (most params: temperature, max_tokens...); None for
    anything else (a nested struct or list, NaN or an infinity, another layout): the library decides.
    Map entries in either field order; a later key wins, as in the library. (Lengths under 128, the
    common case, read inline.)"""
    out: dict[str, Any] = {}
    i, end = 0, len(buf)
    while i < end:
        if buf[i] != 0x0A:  # Struct.fields (1, length-delimited): nothing else is expected
            return None
        n = buf[i + 1]
        i += 2
        if n >= 0x80:
            n, i = _varint(buf, i - 1)
        stop = i + n
        if stop > end:
            return None
        key, value = "", None
        while i < stop:  # one map entry: key = 1, value = 2 (a Value)
            tag = buf[i]
            n = buf[i + 1]
            i += 2
            if n >= 0x80:
                n, i = _varint(buf, i - 1)
            if i + n > stop:
                return None
            if tag == 0x0A:
                key = buf[i:i + n].decode()
            elif tag == 0x12:
                value = _flat_value(buf, i, i + n)
                if value is _NOT_FLAT:
                    return None
            else:
                return None
            i += n
        out[key] = value
    return out


_NOT_FLAT = object()


def _flat_value(buf: bytes, i: int, end: int) -> Any:
    """One google.protobuf.Value in ``buf[i:end]`` as :func:`_value` reads it, or _NOT_FLAT (see _flat_struct)."""
    if i == end:
        return None  # no kind set
    tag = buf[i]
    if tag == 0x11 and end - i == 9:  # number_value (2, 64-bit)
        x = _DOUBLE(buf, i + 1)[0]
        if x.is_integer():
            return int(x) if -2**53 < x < 2**53 else x
        if math.isinf(x) or math.isnan(x):
            return _NOT_FLAT
        return x
    if tag == 0x1A:  # string_value (3)
        n, j = buf[i + 1], i + 2
        if n >= 0x80:
            n, j = _varint(buf, i + 1)
        return buf[j:end].decode() if j + n == end else _NOT_FLAT
    if tag == 0x20 or tag == 0x08:  # bool_value (4), null_value (1): one varint
        n, j = buf[i + 1], i + 2
        if n >= 0x80 or j != end:
            return _NOT_FLAT
        if tag == 0x08:
            return None if n == 0 else _NOT_FLAT
        return n != 0 if n <= 1 else _NOT_FLAT
    return _NOT_FLAT


def _struct_to_dict(struct: Any) -> dict[str, Any]:
    """A google.protobuf.Struct as the dict JSON would give, whole numbers as ints (what MessageToDict gives,
    then ints for whole numbers below 2**53). Module-level functions, not a nested recursive one: a closure
    that refers to itself is a reference cycle per call, left for the garbage collector, on every Request
    with params. A ValueError for NaN or an infinity (JSON has no such number)."""
    return {key: _value(v) for key, v in struct.fields.items()}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        x = v.number_value
        if x.is_integer():
            return int(x) if -2**53 < x < 2**53 else x
        if math.isinf(x) or math.isnan(x):
            raise ValueError(f"{x} is not a JSON number")
        return x
    if kind == "bool_value":
        return v.bool_value
    if kind == "struct_value":
        return {key: _value(x) for key, x in v.struct_value.fields.items()}
    if kind == "list_value":
        return [_value(x) for x in v.list_value.values]
    return None  # null_value, or no kind set (as MessageToDict reads it)


def to_protobuf(event: ev.Event) -> pb.Envelope:
    """Build the Envelope message for `event`."""
    env = pb.Envelope()
    if isinstance(event, ev.Delta):
        d = env.delta
        d.stream_id, d.seq = event.stream_id, event.seq
        if event.text is not None:
            d.text = event.text
        elif event.tool_call is not None:
            call = event.tool_call
            d.tool_call.id, d.tool_call.name, d.tool_call.arguments = call.id, call.name, call.arguments
        else:
            d.data = event.data  # type: ignore[assignment]
    elif isinstance(event, ev.End):
        e = env.end
        e.stream_id, e.last_seq, e.finish_reason = event.stream_id, event.last_seq, event.finish_reason
        if event.timings_ms:  # (item by item: a protobuf map's update() is the slow generic Mapping one)
            timings = e.timings_ms
            for name, ms in event.timings_ms.items():
                timings[name] = ms
        if event.usage:
            usage = e.usage
            for name, count in event.usage.items():
                usage[name] = count
    elif isinstance(event, ev.Request):
        r = env.request
        r.stream_id, r.model = event.stream_id, event.model
        if event.text is not None:
            r.text = event.text
        elif event.data is not None:
            r.data = event.data
        elif event.messages is not None:
            r.messages.SetInParent()
            for m in event.messages:
                r.messages.items.add(role=m.role, content=m.content)
        if event.params:
            r.params.update(dict(event.params))
        if event.warmup:
            r.warmup = True
        if event.contexts:
            r.contexts.extend(event.contexts)
        if event.continues:
            r.continues = event.continues
    elif isinstance(event, ev.Error):
        env.error.stream_id, env.error.code = event.stream_id, int(event.code)
        env.error.message, env.error.retryable = event.message, event.retryable
    elif isinstance(event, ev.Ping):
        env.ping.id = event.id
    elif isinstance(event, ev.Pong):
        env.pong.id = event.id
    elif isinstance(event, ev.Cancel):
        env.cancel.stream_id = event.stream_id
    elif isinstance(event, ev.Hello):
        h = env.hello
        h.client, h.resume_token = event.client, event.resume_token
        h.compression.extend(event.compression)
        h.last_seq.update(event.last_seq)
        h.flow_window, h.auth, h.revision, h.history = event.flow_window, event.auth, event.revision, event.history
    elif isinstance(event, ev.Welcome):
        w = env.welcome
        w.session_id, w.resume_token, w.server, w.resumed = (
            event.session_id, event.resume_token, event.server, event.resumed)
        w.compression.extend(event.compression)
        w.max_frame_size, w.max_decompressed_size = event.max_frame_size, event.max_decompressed_size
        w.max_streams, w.heartbeat_interval_ms = event.max_streams, event.heartbeat_interval_ms
        w.idle_timeout_ms = event.idle_timeout_ms
        w.resume_window_ms, w.flow_window, w.revision = event.resume_window_ms, event.flow_window, event.revision
        if event.input_seq:
            w.input_seq.update(event.input_seq)
        if event.contexts:
            w.contexts.update(event.contexts)
    elif isinstance(event, ev.Input):
        i = env.input
        i.stream_id, i.seq, i.end = event.stream_id, event.seq, event.end
        if event.text is not None:
            i.text = event.text
        elif event.data is not None:
            i.data = event.data
        elif event.tool_result is not None:
            r = event.tool_result
            i.tool_result.id, i.tool_result.content, i.tool_result.is_error = r.id, r.content, r.is_error
    elif isinstance(event, ev.Ack):
        env.ack.stream_id, env.ack.seq, env.ack.done = event.stream_id, event.seq, event.done
    elif isinstance(event, ev.GoAway):
        env.goaway.reason, env.goaway.reconnect_after_ms = event.reason, event.reconnect_after_ms
    elif isinstance(event, ev.Push):
        env.push.topic = event.topic
        if event.text is not None:
            env.push.text = event.text
        else:
            env.push.data = event.data  # type: ignore[assignment]
    elif isinstance(event, ev.Subscribe):
        env.subscribe.id, env.subscribe.group, env.subscribe.leave = event.id, event.group, event.leave
    elif isinstance(event, ev.Subscribed):
        s = env.subscribed
        s.id, s.group, s.leave, s.code, s.message = event.id, event.group, event.leave, int(event.code), event.message
    elif isinstance(event, ev.Context):
        c = env.context
        c.name, c.version, c.base_version, c.text = event.name, event.version, event.base_version, event.text
        for patch in event.patches:
            c.patches.add(offset=patch.offset, length=patch.length, text=patch.text)
        c.sha256, c.drop = event.sha256, event.drop
    elif isinstance(event, ev.ContextAck):
        a = env.context_ack
        a.name, a.version, a.code, a.message = event.name, event.version, int(event.code), event.message
    else:
        raise LocalProtocolError(f"not a protocol event: {event!r}")
    return env


def from_protobuf(env: pb.Envelope) -> ev.Event:
    """Turn a parsed Envelope into an event (RemoteProtocolError for unset / unknown kinds)."""
    kind = env.WhichOneof("msg")
    try:
        if kind == "ack":  # (what a server reads most, with Requests)
            return ev.Ack(stream_id=env.ack.stream_id, seq=env.ack.seq, done=env.ack.done)
        if kind == "delta":
            d = env.delta
            which = d.WhichOneof("chunk")
            if which is None:
                raise _bad_request("Delta without text or data")
            if which == "tool_call":
                call = d.tool_call
                return ev.Delta(stream_id=d.stream_id, seq=d.seq,
                                tool_call=ev.ToolCall(call.name, call.arguments, id=call.id))
            return ev.Delta(stream_id=d.stream_id, seq=d.seq, **{which: getattr(d, which)})
        if kind == "request":
            r = env.request
            which = r.WhichOneof("input")
            kw: dict[str, Any] = {}
            if which == "messages":
                kw["messages"] = tuple(ev.ChatMessage(role=m.role, content=m.content) for m in r.messages.items)
            elif which is not None:
                kw[which] = getattr(r, which)
            try:
                params = _struct_to_dict(r.params) if r.HasField("params") else {}
            except ValueError as exc:  # NaN / Infinity numbers: JSON has none
                raise _bad_request(f"request.params: {exc}", r.stream_id) from None
            return ev.Request(stream_id=r.stream_id, model=r.model, params=params, warmup=r.warmup,
                              contexts=tuple(r.contexts), continues=r.continues, **kw)
        if kind == "end":
            e = env.end
            return ev.End(stream_id=e.stream_id, last_seq=e.last_seq, finish_reason=e.finish_reason,
                          timings_ms=dict(e.timings_ms), usage=dict(e.usage))
        if kind == "error":
            e = env.error
            return ev.Error(stream_id=e.stream_id, code=_error_code(e.code), message=e.message, retryable=e.retryable)
        if kind == "ping":
            return ev.Ping(id=env.ping.id)
        if kind == "pong":
            return ev.Pong(id=env.pong.id)
        if kind == "cancel":
            return ev.Cancel(stream_id=env.cancel.stream_id)
        if kind == "hello":
            h = env.hello
            return ev.Hello(client=h.client, compression=tuple(h.compression),
                            resume_token=h.resume_token, last_seq=dict(h.last_seq), flow_window=h.flow_window,
                            auth=h.auth, revision=h.revision, history=h.history)
        if kind == "welcome":
            w = env.welcome
            return ev.Welcome(
                session_id=w.session_id, resume_token=w.resume_token, compression=tuple(w.compression),
                max_frame_size=w.max_frame_size, max_decompressed_size=w.max_decompressed_size,
                max_streams=w.max_streams, heartbeat_interval_ms=w.heartbeat_interval_ms,
                idle_timeout_ms=w.idle_timeout_ms, server=w.server, resumed=w.resumed,
                resume_window_ms=w.resume_window_ms, flow_window=w.flow_window, revision=w.revision,
                input_seq=dict(w.input_seq), contexts=dict(w.contexts))
        if kind == "input":
            i = env.input
            which = i.WhichOneof("item")
            item: dict[str, Any] = {}
            if which == "tool_result":
                r = i.tool_result
                item["tool_result"] = ev.ToolResult(id=r.id, content=r.content, is_error=r.is_error)
            elif which is not None:
                item[which] = getattr(i, which)
            return ev.Input(stream_id=i.stream_id, seq=i.seq, end=i.end, **item)
        if kind == "goaway":
            return ev.GoAway(reason=env.goaway.reason, reconnect_after_ms=env.goaway.reconnect_after_ms)
        if kind == "push":
            p = env.push
            which = p.WhichOneof("body")
            if which is None:
                raise _bad_request("Push without text or data")
            return ev.Push(topic=p.topic, **{which: getattr(p, which)})
        if kind == "subscribe":
            return ev.Subscribe(id=env.subscribe.id, group=env.subscribe.group, leave=env.subscribe.leave)
        if kind == "subscribed":
            s = env.subscribed
            return ev.Subscribed(id=s.id, group=s.group, leave=s.leave, code=_error_code(s.code), message=s.message)
        if kind == "context":
            c = env.context
            return ev.Context(name=c.name, version=c.version, base_version=c.base_version, text=c.text,
                              patches=tuple(ev.ContextPatch(offset=p.offset, length=p.length, text=p.text)
                                            for p in c.patches), sha256=c.sha256, drop=c.drop)
        if kind == "context_ack":
            a = env.context_ack
            return ev.ContextAck(name=a.name, version=a.version, code=_error_code(a.code), message=a.message)
    except LocalProtocolError as exc:  # event validation failed: the peer's fault
        sid = env.request.stream_id if kind == "request" else 0
        raise _bad_request(str(exc), sid) from None
    raise _unsupported(kind or "empty envelope")


def _error_code(value: int) -> ErrorCode:
    """An ErrorCode from the wire; an unknown number is UNSPECIFIED (protocol.md 2)."""
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNSPECIFIED


class ProtoCodec:
    """Protobuf Envelope in binary frames with a one-byte header (version, compression)."""

    binary = True

    def encode(self, event: ev.Event, compressor: CompressionSelector | None = None) -> bytes:
        """Serialize `event` as a binary frame, compressed when `compressor` says it pays."""
        return self.encode_frame(event, compressor)[0]

    def encode_frame(self, event: ev.Event, compressor: CompressionSelector | None = None) -> tuple[bytes, int, int]:
        """(frame, its size before compression, compression codec id)."""
        if isinstance(event, ev.Delta) and event.tool_call is None:
            return self.encode_delta(event.stream_id, event.seq, event.chunk, compressor)
        kind = type(event)
        payload = (encode_small_fast(event) if kind is ev.Ack or kind is ev.Request or kind is ev.Ping
                   or kind is ev.Pong else None)
        if payload is None:
            payload = to_protobuf(event).SerializeToString()
        if compressor is None or len(payload) < compressor.min_size:
            frame = _HEADER_NONE + payload
            return frame, len(frame), 0
        return self._compressed(payload, BINARY if isinstance(event, ev.Request) and event.data is not None else TEXT,
                                compressor)

    def encode_delta(self, stream_id: int, seq: int, chunk: str | bytes, compressor: CompressionSelector | None = None
                     ) -> tuple[bytes, int, int]:
        """The Delta (`stream_id`, `seq`, `chunk`) as :meth:`encode_frame` would, without building the event."""
        frame = encode_delta_frame(stream_id, seq, chunk)
        if compressor is None or len(frame) <= compressor.min_size:  # payload too small to try (the common case)
            return frame, len(frame), 0
        return self._compressed(frame[1:], TEXT if type(chunk) is str else BINARY, compressor)

    @staticmethod
    def _compressed(payload: bytes, kind: str, compressor: CompressionSelector) -> tuple[bytes, int, int]:
        codec_id, out = compressor.compress(payload, kind)
        return bytes((_HEADER_BASE | codec_id,)) + out, len(payload) + 1, codec_id

    def decode(self, frame: bytes | str, *, limit: int, allowed: Iterable[str] | None = ()) -> ev.Event:
        """Parse a binary frame (RemoteProtocolError with the close code to use on bad input)."""
        if isinstance(frame, str):
            raise _invalid("text frame on the binary subprotocol lowlat.v1.proto", CloseCode.UNSUPPORTED_DATA)
        if not frame:
            raise _invalid("empty frame")
        header = frame[0]
        if header >> 4 != FRAME_VERSION:
            raise RemoteProtocolError(
                f"unsupported frame version {header >> 4}",
                error_code=ErrorCode.PROTOCOL_ERROR, close_code=CloseCode.PROTOCOL_ERROR)
        codec_id = header & 0x0F
        payload = bytes(frame[1:]) if not codec_id else decompress(codec_id, bytes(frame[1:]), limit, allowed)
        if len(payload) > limit:
            raise RemoteProtocolError(
                f"payload exceeds max_decompressed_size ({limit} bytes)",
                error_code=ErrorCode.MESSAGE_TOO_BIG, close_code=CloseCode.MESSAGE_TOO_BIG)
        first = payload[:1]
        if (first == b"\x22" or first == b"\x5a" or first == b"\x1a"  # a Delta, an Ack, a Request,
                or first == b"\x4a" or first == b"\x42"):  # a Pong, a Ping
            event = decode_fast(payload)
            if event is not None:
                return event
        try:
            env = pb.Envelope.FromString(payload)
        except DecodeError as exc:
            raise _invalid(f"not a valid Envelope: {exc}") from None
        return from_protobuf(env)


# ================================================================================ JSON
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def to_json_dict(event: ev.Event) -> dict[str, Any]:
    """The JSON object for `event` (docs/protocol.md, "JSON mapping")."""
    if isinstance(event, ev.Delta):
        d: dict[str, Any] = {"type": "delta", "stream_id": event.stream_id, "seq": event.seq}
        if event.text is not None:
            d["text"] = event.text
        elif event.tool_call is not None:
            call = event.tool_call
            d["tool_call"] = {"id": call.id, "name": call.name, "arguments": call.arguments}
        else:
            d["data"] = _b64(event.data)  # type: ignore[arg-type]
        return d
    if isinstance(event, ev.End):
        return {"type": "end", "stream_id": event.stream_id, "last_seq": event.last_seq,
                "finish_reason": event.finish_reason, "timings_ms": dict(event.timings_ms),
                "usage": dict(event.usage)}
    if isinstance(event, ev.Request):
        d = {"type": "request", "stream_id": event.stream_id, "model": event.model}
        if event.text is not None:
            d["text"] = event.text
        elif event.data is not None:
            d["data"] = _b64(event.data)
        elif event.messages is not None:
            d["messages"] = [{"role": m.role, "content": m.content} for m in event.messages]
        if event.params:
            d["params"] = dict(event.params)
        if event.warmup:
            d["warmup"] = True
        if event.contexts:
            d["contexts"] = list(event.contexts)
        if event.continues:
            d["continues"] = event.continues
        return d
    if isinstance(event, ev.Error):
        return {"type": "error", "stream_id": event.stream_id, "code": event.code.wire_name,
                "message": event.message, "retryable": event.retryable}
    if isinstance(event, ev.Ping):
        return {"type": "ping", "id": event.id}
    if isinstance(event, ev.Pong):
        return {"type": "pong", "id": event.id}
    if isinstance(event, ev.Cancel):
        return {"type": "cancel", "stream_id": event.stream_id}
    if isinstance(event, ev.Hello):
        return {"type": "hello", "client": event.client, "compression": list(event.compression),
                "resume_token": event.resume_token,
                "last_seq": {str(k): v for k, v in event.last_seq.items()}, "flow_window": event.flow_window,
                **({"auth": event.auth} if event.auth else {}),
                **({"revision": event.revision} if event.revision else {}),
                **({"history": True} if event.history else {})}
    if isinstance(event, ev.Welcome):
        return {"type": "welcome", "session_id": event.session_id, "resume_token": event.resume_token,
                "compression": list(event.compression), "max_frame_size": event.max_frame_size,
                "max_decompressed_size": event.max_decompressed_size, "max_streams": event.max_streams,
                "heartbeat_interval_ms": event.heartbeat_interval_ms,
                "idle_timeout_ms": event.idle_timeout_ms, "server": event.server, "resumed": event.resumed,
                "resume_window_ms": event.resume_window_ms, "flow_window": event.flow_window,
                **({"revision": event.revision} if event.revision else {}),
                "input_seq": {str(k): v for k, v in event.input_seq.items()}, "contexts": dict(event.contexts)}
    if isinstance(event, ev.Input):
        d = {"type": "input", "stream_id": event.stream_id, "seq": event.seq}
        if event.text is not None:
            d["text"] = event.text
        elif event.data is not None:
            d["data"] = _b64(event.data)
        elif event.tool_result is not None:
            r = event.tool_result
            d["tool_result"] = {"id": r.id, "content": r.content, **({"is_error": True} if r.is_error else {})}
        if event.end:
            d["end"] = True
        return d
    if isinstance(event, ev.Ack):
        return {"type": "ack", "stream_id": event.stream_id, "seq": event.seq, "done": event.done}
    if isinstance(event, ev.GoAway):
        return {"type": "goaway", "reason": event.reason, "reconnect_after_ms": event.reconnect_after_ms}
    if isinstance(event, ev.Push):
        if event.text is not None:
            return {"type": "push", "topic": event.topic, "text": event.text}
        return {"type": "push", "topic": event.topic, "data": _b64(event.data)}  # type: ignore[arg-type]
    if isinstance(event, ev.Subscribe):
        return {"type": "subscribe", "id": event.id, "group": event.group, "leave": event.leave}
    if isinstance(event, ev.Subscribed):
        d = {"type": "subscribed", "id": event.id, "group": event.group, "leave": event.leave}
        if event.code is not ErrorCode.UNSPECIFIED:
            d["code"], d["message"] = event.code.wire_name, event.message
        return d
    if isinstance(event, ev.Context):
        d = {"type": "context", "name": event.name, "version": event.version, "base_version": event.base_version}
        if not event.base_version and not event.drop:
            d["text"] = event.text
        if event.patches:
            d["patches"] = [{"offset": p.offset, "length": p.length, "text": p.text} for p in event.patches]
        if event.sha256:
            d["sha256"] = _b64(event.sha256)
        if event.drop:
            d["drop"] = True
        return d
    if isinstance(event, ev.ContextAck):
        d = {"type": "context_ack", "name": event.name, "version": event.version}
        if event.code is not ErrorCode.UNSPECIFIED:
            d["code"], d["message"] = event.code.wire_name, event.message
        return d
    raise LocalProtocolError(f"not a protocol event: {event!r}")


class _Fields:
    """Typed access to a decoded JSON object; wrong types are the peer's fault (1007)."""

    __slots__ = ("kind", "obj")

    def __init__(self, obj: Mapping[str, Any], kind: str) -> None:
        self.obj, self.kind = obj, kind

    def _get(self, name: str, types: type | tuple[type, ...], default: Any) -> Any:
        value = self.obj.get(name, default)
        if value is default:
            return value
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
            raise _invalid(f"{self.kind}.{name} has the wrong type ({type(value).__name__})")
        return value

    def u32(self, name: str) -> int:
        v = self._get(name, int, 0)
        if not 0 <= v <= 0xFFFFFFFF:
            raise _invalid(f"{self.kind}.{name} is out of range")
        return v

    def int(self, name: str) -> int:
        return self._get(name, int, 0)

    def str(self, name: str, default: str | None = "") -> Any:
        return self._get(name, str, default)

    def bool(self, name: str) -> bool:
        return self._get(name, bool, False)

    def bytes(self, name: str) -> bytes | None:
        v = self._get(name, str, None)
        if v is None:
            return None
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise _invalid(f"{self.kind}.{name} is not valid base64") from None

    def strs(self, name: str) -> tuple[str, ...]:
        v = self._get(name, list, [])
        if not all(isinstance(x, str) for x in v):
            raise _invalid(f"{self.kind}.{name} must be a list of strings")
        return tuple(v)

    def mapping(self, name: str) -> dict[str, Any]:
        return dict(self._get(name, dict, {}))

    def seq_map(self, name: str) -> dict[int, int]:
        """A map of stream ids (decimal strings) to seq numbers, e.g. hello.last_seq."""
        out: dict[int, int] = {}
        for k, v in self.mapping(name).items():
            # isascii: int() refuses digits like "²"; the length check keeps int() cheap and in range
            if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 10
                    and int(k) <= 0xFFFFFFFF and isinstance(v, int) and 0 <= v <= 0xFFFFFFFF):
                raise _invalid(f"{self.kind}.{name} must map stream ids to seq numbers")
            out[int(k)] = v
        return out


def _versions(obj: Mapping[str, Any]) -> dict[str, int]:
    """Welcome.contexts from JSON: names to 32-bit versions."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 0xFFFFFFFF for v in obj.values()):
        raise _invalid("welcome.contexts must map names to versions")
    return dict(obj)


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def from_json_dict(obj: Any) -> ev.Event:
    """Turn a decoded JSON value into an event (RemoteProtocolError on bad input)."""
    if not isinstance(obj, dict):
        raise _invalid("a JSON frame must be an object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise _invalid('a JSON frame needs a string "type" member')
    f = _Fields(obj, kind)
    try:
        if kind == "request":
            messages = None
            if "messages" in obj:
                raw = f._get("messages", list, [])
                if not all(isinstance(m, dict) and isinstance(m.get("role", ""), str)
                           and isinstance(m.get("content", ""), str) for m in raw):
                    raise _invalid("request.messages must be a list of {role, content} strings")
                messages = tuple(ev.ChatMessage(role=m.get("role", ""), content=m.get("content", ""))
                                 for m in raw)
            return ev.Request(stream_id=f.u32("stream_id"), model=f.str("model"),
                              text=f.str("text", None), data=f.bytes("data"), messages=messages,
                              params=f.mapping("params"), warmup=f.bool("warmup"),
                              contexts=f.strs("contexts") if "contexts" in obj else (),
                              continues=f.u32("continues") if "continues" in obj else 0)
        if kind == "delta":
            call = None
            if "tool_call" in obj:
                c = _Fields(f._get("tool_call", dict, {}), "delta.tool_call")
                call = ev.ToolCall(c.str("name"), c.str("arguments"), id=c.str("id"))
            return ev.Delta(stream_id=f.u32("stream_id"), seq=f.u32("seq"),
                            text=f.str("text", None), data=f.bytes("data"), tool_call=call)
        if kind == "input":
            result = None
            if "tool_result" in obj:
                r = _Fields(f._get("tool_result", dict, {}), "input.tool_result")
                result = ev.ToolResult(id=r.str("id"), content=r.str("content"), is_error=r.bool("is_error"))
            return ev.Input(stream_id=f.u32("stream_id"), seq=f.u32("seq"), text=f.str("text", None),
                            data=f.bytes("data"), tool_result=result, end=f.bool("end"))
        if kind == "end":
            timings = f.mapping("timings_ms")
            usage = f.mapping("usage")
            if not all(isinstance(v, int | float) for v in timings.values()) or not all(
                    isinstance(v, int) for v in usage.values()):
                raise _invalid("end.timings_ms / end.usage must map names to numbers")
            return ev.End(stream_id=f.u32("stream_id"), last_seq=f.u32("last_seq"),
                          finish_reason=f.str("finish_reason"), timings_ms=timings, usage=usage)
        if kind == "error":
            return ev.Error(stream_id=f.u32("stream_id"), code=ErrorCode.from_wire_name(f.str("code")),
                            message=f.str("message"), retryable=f.bool("retryable"))
        if kind == "ping":
            return ev.Ping(id=f.u32("id"))
        if kind == "pong":
            return ev.Pong(id=f.u32("id"))
        if kind == "cancel":
            return ev.Cancel(stream_id=f.u32("stream_id"))
        if kind == "hello":
            last_seq = f.seq_map("last_seq")
            return ev.Hello(client=f.str("client"), compression=f.strs("compression"),
                            resume_token=f.str("resume_token"), last_seq=last_seq, flow_window=f.u32("flow_window"),
                            auth=f.str("auth"), revision=f.u32("revision"), history=f.bool("history"))
        if kind == "welcome":
            return ev.Welcome(
                session_id=f.str("session_id"), resume_token=f.str("resume_token"),
                compression=f.strs("compression"), max_frame_size=f.u32("max_frame_size"),
                max_decompressed_size=f.u32("max_decompressed_size"), max_streams=f.u32("max_streams"),
                heartbeat_interval_ms=f.u32("heartbeat_interval_ms"),
                idle_timeout_ms=f.u32("idle_timeout_ms"), server=f.str("server"), resumed=f.bool("resumed"),
                resume_window_ms=f.u32("resume_window_ms"), flow_window=f.u32("flow_window"),
                revision=f.u32("revision"), input_seq=f.seq_map("input_seq"),
                contexts=_versions(f.mapping("contexts")))
        if kind == "ack":
            return ev.Ack(stream_id=f.u32("stream_id"), seq=f.u32("seq"), done=f.bool("done"))
        if kind == "goaway":
            return ev.GoAway(reason=f.str("reason"), reconnect_after_ms=f.u32("reconnect_after_ms"))
        if kind == "push":
            return ev.Push(topic=f.str("topic"), text=f.str("text", None), data=f.bytes("data"))
        if kind == "subscribe":
            return ev.Subscribe(id=f.u32("id"), group=f.str("group"), leave=f.bool("leave"))
        if kind == "subscribed":
            return ev.Subscribed(id=f.u32("id"), group=f.str("group"), leave=f.bool("leave"),
                                 code=ErrorCode.from_wire_name(f.str("code")), message=f.str("message"))
        if kind == "context":
            raw = f._get("patches", list, [])
            patches = []
            for p in raw:
                if not isinstance(p, dict):
                    raise _invalid("context.patches must be a list of {offset, length, text}")
                pf = _Fields(p, "context.patches")
                patches.append(ev.ContextPatch(offset=pf.u32("offset"), length=pf.u32("length"), text=pf.str("text")))
            return ev.Context(name=f.str("name"), version=f.u32("version"), base_version=f.u32("base_version"),
                              text=f.str("text"), patches=tuple(patches), sha256=f.bytes("sha256") or b"",
                              drop=f.bool("drop"))
        if kind == "context_ack":
            return ev.ContextAck(name=f.str("name"), version=f.u32("version"),
                                 code=ErrorCode.from_wire_name(f.str("code")), message=f.str("message"))
    except LocalProtocolError as exc:
        raise _bad_request(str(exc), obj.get("stream_id", 0) if kind == "request" else 0) from None
    raise _unsupported(kind)


class JsonCodec:
    """One JSON object per text frame; never compressed (use it for browsers and debugging)."""

    binary = False

    def encode(self, event: ev.Event, compressor: CompressionSelector | None = None) -> str:
        """Serialize `event` as compact JSON text."""
        return json.dumps(to_json_dict(event), separators=(",", ":"), ensure_ascii=False)

    def encode_frame(self, event: ev.Event, compressor: CompressionSelector | None = None) -> tuple[str, int, int]:
        """(frame, its UTF-8 size, 0): text frames are never compressed."""
        text = json.dumps(to_json_dict(event), separators=(",", ":"), ensure_ascii=False)
        return text, len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass")), 0

    def encode_delta(self, stream_id: int, seq: int, chunk: str | bytes, compressor: CompressionSelector | None = None
                     ) -> tuple[str, int, int]:
        """The Delta (`stream_id`, `seq`, `chunk`) as :meth:`encode_frame` would, without building the event."""
        if type(chunk) is str:
            d = {"type": "delta", "stream_id": stream_id, "seq": seq, "text": chunk}
        else:
            d = {"type": "delta", "stream_id": stream_id, "seq": seq, "data": _b64(chunk)}  # type: ignore[arg-type]
        text = json.dumps(d, separators=(",", ":"), ensure_ascii=False)
        return text, len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass")), 0

    def decode(self, frame: bytes | str, *, limit: int, allowed: Iterable[str] | None = ()) -> ev.Event:
        """Parse a text frame (RemoteProtocolError with the close code to use on bad input)."""
        if not isinstance(frame, str):
            raise _invalid("binary frame on the text subprotocol lowlat.v1.json", CloseCode.UNSUPPORTED_DATA)
        try:
            obj = json.loads(frame)
        except (ValueError, RecursionError) as exc:
            raise _invalid(f"not valid JSON: {exc}") from None
        # Strings must be Unicode text, as in Protobuf: an unpaired surrogate (escaped as \ud800, or a
        # raw one from a caller that did not validate UTF-8) could never be sent back in a text frame.
        if (not frame.isascii() or _SURROGATE_ESCAPE.search(frame)) and _has_lone_surrogate(obj):
            raise _invalid("a JSON string holds an unpaired surrogate (not valid Unicode)")
        return from_json_dict(obj)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _has_lone_surrogate(obj: Any) -> bool:
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


PROTO_CODEC, JSON_CODEC = ProtoCodec(), JsonCodec()  # stateless: one of each serves every connection


def codec_for(subprotocol: str | None) -> WireCodec:
    """The codec serving `subprotocol` (None, no subprotocol, means JSON)."""
    return PROTO_CODEC if subprotocol == SUBPROTOCOL_PROTO else JSON_CODEC
