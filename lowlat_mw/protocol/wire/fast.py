"""Hand-written Protobuf for the messages of every token and every stream, kept for speed.

Each function here is a shortcut beside the protobuf library, and holds one invariant: an encoder produces
exactly the bytes the library produces for the same event; a decoder returns exactly the event the library
path (``wire/protobuf.py``) returns for the same bytes, or None for anything it does not handle, so that
the library path answers (and names the fault). tests/test_wire_fast.py checks every function
against the library, on hypothesis-generated events and on generated and mutated bytes.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..._fast import maker
from .. import events as ev

__all__ = ["DECODERS", "FRAME_VERSION", "HEADER_NONE", "ParamsMemo", "encode_delta_fast", "encode_delta_frame",
           "encode_small_fast", "encode_varint", "params_size"]

FRAME_VERSION = 1  # a binary frame's header byte: the version in its high nibble, the compression codec in its low
HEADER_NONE = bytes((FRAME_VERSION << 4,))  # an uncompressed frame
_HEADER_DELTA = HEADER_NONE + b"\x22"  # then Envelope field 4 (delta), length-delimited
_SMALL_VARINTS = tuple(bytes((i,)) for i in range(0x80))


# ================================================================================ encoders
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

    Invariant: after the header byte, exactly the bytes the protobuf library produces for
    ``Envelope(delta=Delta(stream_id, seq, text | data))``."""
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


def encode_delta_fast(stream_id: int, seq: int, chunk: str | bytes) -> bytes:
    """Protobuf bytes of ``Envelope(delta=Delta(...))`` (the frame of :func:`encode_delta_frame` without its header)."""
    return encode_delta_frame(stream_id, seq, chunk)[1:]


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

    Invariant: exactly the bytes the protobuf library produces for the same event; None for any other."""
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


# ================================================================================ decoders
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


def _body(payload: bytes) -> int:
    """Where the one field of the Envelope in `payload` begins, after its tag and length, if it spans the rest
    of `payload`; -1 if not. IndexError or ValueError on a truncation."""
    m = payload[1]
    i = 2
    if m >= 0x80:
        m, i = _varint(payload, 1)
    return i if i + m == len(payload) else -1


def decode_delta(payload: bytes, params: ParamsMemo | None = None) -> ev.Delta | None:
    """The Delta in `payload` (an Envelope's bytes) laid out exactly as :func:`encode_delta_frame` writes it
    (every token a client receives).

    Invariant: the event the library path reads from `payload`, or None (another layout, a tool call, bad
    UTF-8, a truncation): the library path decides those."""
    try:
        m = payload[1]
        i = 2 if m < 0x80 and m + 2 == len(payload) else _body(payload)  # (a one-byte length, inline: most)
        if i < 0:
            return None
        end = len(payload)
        sid = seq = 0  # (the two varints, read written out: this runs for every token a client receives)
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
    except (IndexError, ValueError):  # bad UTF-8 is a ValueError
        return None


def _fields(payload: bytes, allowed: Mapping[int, int]) -> dict[int, Any] | None:
    """The fields of the one message in `payload` (an Envelope's bytes): number -> int (a varint) or bytes
    (length-delimited), when its fields are each at most once, in order, with the wire type `allowed` gives
    their number; None for anything else (another layout, an id past 32 bits, a truncation)."""
    try:
        m = payload[1]
        i = 2 if m < 0x80 and m + 2 == len(payload) else _body(payload)  # (a one-byte length, inline: most)
        if i < 0:
            return None
        end = len(payload)
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
        return f
    except (IndexError, ValueError):
        return None


_ACK_FIELDS = {1: 0, 2: 0, 3: 0}  # field number -> wire type (0 varint, 2 length-delimited)
_REQUEST_FIELDS = {1: 0, 2: 2, 3: 2, 6: 2}
_ID_FIELDS = {1: 0}


def decode_ack(payload: bytes, params: ParamsMemo | None = None) -> ev.Ack | None:
    """The Ack in `payload` (an Envelope's bytes), what a server reads for every few Deltas.

    Invariant: the event the library path reads from `payload`, or None: the library path decides."""
    f = _fields(payload, _ACK_FIELDS)
    if f is None:
        return None
    done = f.get(3, 0)
    if done > 1:
        return None
    return ev.Ack(stream_id=f.get(1, 0), seq=f.get(2, 0), done=done == 1)


def _id_decoder(cls: type[ev.Ping | ev.Pong]) -> Callable[[bytes, ParamsMemo | None], ev.Ping | ev.Pong | None]:
    def decode(payload: bytes, params: ParamsMemo | None = None) -> ev.Ping | ev.Pong | None:
        f = _fields(payload, _ID_FIELDS)
        return None if f is None else cls(id=f.get(1, 0))

    decode.__doc__ = (f"The {cls.__name__} in `payload` (an Envelope's bytes), a heartbeat.\n\n"
                      "Invariant: the event the library path reads from `payload`, or None: the library path decides.")
    decode.__qualname__ = decode.__name__ = f"decode_{cls.__name__.lower()}"
    return decode


decode_ping, decode_pong = _id_decoder(ev.Ping), _id_decoder(ev.Pong)
_make_request = maker(ev.Request, "stream_id", "model", "text", "params")


def decode_request(payload: bytes, params: ParamsMemo | None = None) -> ev.Request | None:
    """The Request in `payload` (an Envelope's bytes) with a model, text and flat params (:func:`_flat_struct`),
    what a server reads per stream. `params`: the connection's memo of params it read lately (None: none).

    Invariant: the event the library path reads from `payload`, or None (other inputs, nested params, an
    invalid id, bad UTF-8): the library path decides those, and names the fault in a bad_request."""
    f = _fields(payload, _REQUEST_FIELDS)
    if f is None or 3 not in f:
        return None
    sid = f.get(1, 0)
    if sid == 0:  # an invalid id (_varint refuses more than 32 bits): the library's path names it
        return None
    try:
        raw = f.get(6)
        kept = {} if raw is None else _flat_struct(raw) if params is None else params.read(raw)
        if kept is None:
            return None
        # (built without Request.__init__: the id is checked above, and text is its one input)
        return _make_request(sid, f[2].decode() if 2 in f else "", f[3].decode(), kept)  # type: ignore[no-any-return]
    except (IndexError, ValueError):  # bad UTF-8 is a ValueError
        return None


DECODERS: Mapping[int, Callable[[bytes, ParamsMemo | None], ev.Event | None]] = {
    0x22: decode_delta, 0x5a: decode_ack, 0x1a: decode_request, 0x42: decode_ping, 0x4a: decode_pong,
}
"""The fast decoder of each Envelope whose first byte (its oneof field's tag) it names."""


# ================================================================================ Request.params
_DOUBLE = struct.Struct("<d").unpack_from
_NOT_FLAT = object()


def _flat_struct(buf: bytes) -> dict[str, Any] | None:
    """The params of a Request (a google.protobuf.Struct's bytes) as ``schema.struct_to_dict`` reads them, when
    every value is a string, number, bool or null (most params: temperature, max_tokens...); None for
    anything else (a nested struct or list, NaN or an infinity, another layout): the library decides.
    Map entries in either field order; a later key wins, as in the library. (Lengths under 128, the
    common case, read inline.) IndexError or ValueError on a truncation or bad UTF-8."""
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


def _flat_value(buf: bytes, i: int, end: int) -> Any:
    """One google.protobuf.Value in ``buf[i:end]`` as ``schema._value`` reads it, or _NOT_FLAT (see _flat_struct)."""
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


def params_size(params: Mapping[str, Any]) -> int:
    """Bytes of `params` as JSON (``json.dumps(params, default=str)``), what max_request_size counts them as."""
    return len(_PARAMS_JSON(params))


@dataclass(slots=True, eq=False)
class ParamsMemo:
    """One connection's memo of the flat params its Requests brought lately, by their bytes, and the JSON size
    of the dict made last, for the max_request_size check that follows the decoding (:meth:`size`).

    A client's Requests mostly repeat their params (temperature, max_tokens...), and reading them byte by
    byte was 18% of a Request's Python up to its first Delta. Flat values are immutable, and every Request
    gets a dict of its own (its model may change it). Owned by the connection's machine, so no memo is
    shared between connections; bounded: emptied when full (params that differ per request just pass)."""

    MAX: ClassVar[int] = 8  # params kept per connection
    SIZE: ClassVar[int] = 512  # bytes of params worth keeping (8 x 512 B per connection at most)
    seen: dict[bytes, tuple[dict[str, Any], int]] = field(default_factory=dict)  # bytes -> (params, JSON size)
    last: dict[str, Any] | None = None
    last_size: int = 0

    def read(self, raw: bytes) -> dict[str, Any] | None:
        """The flat params encoded as `raw` (a Struct's bytes), None if not flat (see :func:`_flat_struct`)."""
        seen = self.seen.get(raw)
        if seen is None:
            params = _flat_struct(raw)
            if params is None or len(raw) > self.SIZE:
                return params
            if len(self.seen) >= self.MAX:
                self.seen.clear()
            seen = self.seen[raw] = (params, params_size(params))
        params = seen[0].copy()
        self.last, self.last_size = params, seen[1]
        return params

    def size(self, params: Mapping[str, Any]) -> int:
        """:func:`params_size` of `params`; for the dict :meth:`read` just made (the next thing a server asks)
        the size kept with it, once: no JSON per request. (The memo holds that dict, so no other object can
        have its identity; it is forgotten when used, so a dict changed later is measured anew.)"""
        if params is self.last:
            self.last = None
            return self.last_size
        return params_size(params)
