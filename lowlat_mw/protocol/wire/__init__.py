"""Wire codecs: events <-> WebSocket messages, in Protobuf binary frames or JSON text frames.

- ``schema.py``: the one table of message kinds and their fields, which drives both codecs;
- ``protobuf.py``: the binary codec (``lowlat.v1.proto``) on the protobuf library's messages;
- ``json.py``: the text codec (``lowlat.v1.json``);
- ``fast.py``: hand-written Protobuf for the Delta, Request, Ack, Ping and Pong, each the library's bytes.

docs/protocol.md is the normative description of both formats.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from ...settings import SUBPROTOCOL_PROTO
from .. import events as ev
from ..selector import CompressionSelector
from .fast import FRAME_VERSION, ParamsMemo, encode_delta_fast, encode_delta_frame, encode_varint, params_size
from .json import JSON_CODEC, JsonCodec, from_json_dict, to_json_dict
from .protobuf import PROTO_CODEC, ProtoCodec, from_protobuf, to_protobuf

__all__ = ["FRAME_VERSION", "JSON_CODEC", "PROTO_CODEC", "JsonCodec", "ParamsMemo", "ProtoCodec", "WireCodec",
           "codec_for", "encode_delta_fast", "encode_delta_frame", "encode_varint", "from_json_dict",
           "from_protobuf", "params_size", "to_json_dict", "to_protobuf"]


class WireCodec(Protocol):
    """Turns events into WebSocket message payloads and back."""

    binary: bool

    def encode(self, event: ev.Event, compressor: CompressionSelector | None = None) -> bytes | str:
        """Serialize `event`, compressing with `compressor` where it pays off."""
        ...

    def decode(self, frame: bytes | str, *, limit: int, allowed: Iterable[str] | None = (),
               params: ParamsMemo | None = None) -> ev.Event:
        """Parse one WebSocket message; raise RemoteProtocolError on bad input. `params`: the connection's
        memo of the Request params it read lately (None: none)."""
        ...

    def encode_frame(self, event: ev.Event, compressor: CompressionSelector | None = None
                     ) -> tuple[bytes | str, int, int]:
        """(frame, size before compression, compression codec id)."""
        ...

    def encode_delta(self, stream_id: int, seq: int, chunk: str | bytes, compressor: CompressionSelector | None = None
                     ) -> tuple[bytes | str, int, int]:
        """The Delta (`stream_id`, `seq`, `chunk`) as :meth:`encode_frame` would, without building the event."""
        ...


def codec_for(subprotocol: str | None) -> WireCodec:
    """The codec serving `subprotocol` (None, no subprotocol, means JSON)."""
    return PROTO_CODEC if subprotocol == SUBPROTOCOL_PROTO else JSON_CODEC
