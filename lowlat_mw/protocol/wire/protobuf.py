"""The Protobuf codec (subprotocol ``lowlat.v1.proto``): an ``Envelope`` per binary frame, behind a header byte.

Binary frame::

    +--------+---------------------------------------------+
    | header | Envelope (Protobuf), compressed per header  |
    +--------+---------------------------------------------+
    header = 0x10 | codec   (high nibble: frame version 1; low nibble: 0 none, 1 zstd, 2 lz4, 3 snappy)

Events become messages through the protobuf library's message API, field by field as the table in
``wire/schema.py`` says; the messages of every token and every stream take the shortcuts of ``wire/fast.py``,
which produce and read exactly what the library does (docs/protocol.md is the normative description).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

from google.protobuf.message import DecodeError

from ...errors import CloseCode, ErrorCode, LocalProtocolError, RemoteProtocolError
from ...proto import lowlat_v1_pb2 as pb
from .. import events as ev
from ..compression import decompress
from ..selector import BINARY, TEXT, CompressionSelector
from .errors import bad_request, invalid, unsupported
from .fast import DECODERS, FRAME_VERSION, HEADER_NONE, ParamsMemo, encode_delta_frame, encode_small_fast
from .schema import BY_CLASS, BY_NAME, EXTEND, MAP, Kind, WireError

__all__ = ["PROTO_CODEC", "ProtoCodec", "from_protobuf", "to_protobuf"]

_HEADER_BASE = FRAME_VERSION << 4


class _Message:
    """A kind's Protobuf side, read from the descriptors: its oneof (None: none), its fields' conversions, and a
    getter of all its fields' values from an event at once (one call, not one getattr per field)."""

    __slots__ = ("fields", "oneof", "values")

    def __init__(self, kind: Kind) -> None:
        descriptor = pb.Envelope.DESCRIPTOR.fields_by_name[kind.name].message_type
        self.oneof = descriptor.oneofs[0].name if descriptor.oneofs else None
        members = {f.name for o in descriptor.oneofs for f in o.fields}
        # (name, to_pb, from_pb, is a oneof member) per field
        self.fields = tuple((f.name, f.conv.to_pb, f.conv.from_pb, f.name in members) for f in kind.fields)
        names = [f.name for f in kind.fields]
        get = attrgetter(*names) if names else None
        self.values: Callable[[ev.Event], tuple[Any, ...]] = (
            (lambda event: ()) if get is None else (lambda event: (get(event),)) if len(names) == 1 else get)


_MESSAGES = {name: _Message(kind) for name, kind in BY_NAME.items()}


def to_protobuf(event: ev.Event) -> pb.Envelope:
    """The Envelope message for `event`: its kind's fields set on the Envelope's member through the library's
    message API, as the table says (a None, an unset oneof member, is left unset)."""
    kind = BY_CLASS.get(type(event))
    if kind is None:
        raise LocalProtocolError(f"not a protocol event: {event!r}")
    env = pb.Envelope()
    msg = getattr(env, kind.name)
    plan = _MESSAGES[kind.name]
    empty = True
    for (name, to_pb, _, member), value in zip(plan.fields, plan.values(event), strict=True):
        if value is None:  # an unset oneof member
            continue
        if to_pb is None:
            if value or member:  # (a default is no field on the wire, but a oneof's member set to it is)
                setattr(msg, name, value)
                empty = False
        elif to_pb is MAP:  # (item by item: a protobuf map's update() is the slow generic Mapping one)
            if value:
                target = getattr(msg, name)
                for key, item in value.items():
                    target[key] = item
                empty = False
        elif to_pb is EXTEND:
            if value:
                getattr(msg, name).extend(value)
                empty = False
        else:  # (a conversion may set a default, which is no field on the wire: `empty` stays as it is)
            to_pb(msg, name, value)  # type: ignore[operator]
    if empty:  # nothing set on the wire: a message whose fields are all defaults is still this kind
        msg.SetInParent()
    return env


def from_protobuf(env: pb.Envelope) -> ev.Event:
    """Turn a parsed Envelope into an event (RemoteProtocolError for unset / unknown kinds, and a bad_request
    naming a Request's stream for values the event refuses). Of a oneof, only the member set is read."""
    name = env.WhichOneof("msg")
    kind = BY_NAME.get(name) if name else None
    if kind is None:
        raise unsupported(name or "empty envelope")
    msg = getattr(env, name)  # type: ignore[arg-type]
    plan = _MESSAGES[name]  # type: ignore[index]
    which = msg.WhichOneof(plan.oneof) if plan.oneof else None
    if which is None and kind.empty is not None:
        raise bad_request(kind.empty)
    kw = {}
    try:
        for field, _, from_pb, member in plan.fields:
            if not member or field == which:
                value = getattr(msg, field)
                kw[field] = value if from_pb is None else from_pb(value)
        return kind.cls(**kw)  # type: ignore[no-any-return]
    except (LocalProtocolError, WireError) as exc:  # event validation failed: the peer's fault
        raise bad_request(str(exc), msg.stream_id if name == "request" else 0) from None


class ProtoCodec:
    """Protobuf Envelope in binary frames with a one-byte header (version, compression)."""

    binary = True

    def encode(self, event: ev.Event, compressor: CompressionSelector | None = None) -> bytes:
        """Serialize `event` as a binary frame, compressed when `compressor` says it pays."""
        return self.encode_frame(event, compressor)[0]

    def encode_frame(self, event: ev.Event, compressor: CompressionSelector | None = None) -> tuple[bytes, int, int]:
        """(frame, its size before compression, compression codec id)."""
        if isinstance(event, ev.Delta) and event.tool_call is None:
            return self.encode_delta(event.stream_id, event.seq, event.chunk, compressor)  # type: ignore[arg-type]
        kind = type(event)
        payload = (encode_small_fast(event) if kind is ev.Ack or kind is ev.Request or kind is ev.Ping
                   or kind is ev.Pong else None)
        if payload is None:
            payload = to_protobuf(event).SerializeToString()
        if compressor is None or len(payload) < compressor.min_size:
            frame = HEADER_NONE + payload
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

    def decode(self, frame: bytes | str, *, limit: int, allowed: Iterable[str] | None = (),
               params: ParamsMemo | None = None) -> ev.Event:
        """Parse a binary frame (RemoteProtocolError with the close code to use on bad input). `params`: the
        connection's memo of Request params (:class:`~.fast.ParamsMemo`; None: none)."""
        if isinstance(frame, str):
            raise invalid("text frame on the binary subprotocol lowlat.v1.proto", CloseCode.UNSUPPORTED_DATA)
        if not frame:
            raise invalid("empty frame")
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
        fast = DECODERS.get(payload[0]) if payload else None  # a Delta, an Ack, a Request, a Ping, a Pong
        if fast is not None:
            event = fast(payload, params)
            if event is not None:
                return event
        try:
            env = pb.Envelope.FromString(payload)
        except DecodeError as exc:
            raise invalid(f"not a valid Envelope: {exc}") from None
        return from_protobuf(env)


PROTO_CODEC = ProtoCodec()  # stateless: one serves every connection
