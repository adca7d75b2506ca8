"""The JSON codec (subprotocol ``lowlat.v1.json``): one JSON object per text frame, never compressed.

The object's ``"type"`` is the kind's name and its members are the kind's fields, as the table in
``wire/schema.py`` says (docs/protocol.md, "JSON mapping", is the contract: these bytes do not change).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...errors import CloseCode, LocalProtocolError
from .. import events as ev
from ..selector import CompressionSelector
from .errors import bad_request, invalid, unsupported
from .fast import ParamsMemo
from .schema import BY_CLASS, BY_NAME, PRESENT, SET

__all__ = ["JSON_CODEC", "JsonCodec", "from_json_dict", "to_json_dict"]


def to_json_dict(event: ev.Event) -> dict[str, Any]:
    """The JSON object for `event` (docs/protocol.md, "JSON mapping"): its kind's fields in table order,
    each written when its rule says (:func:`~.schema.written`, written out here: it runs for every field)."""
    kind = BY_CLASS.get(type(event))
    if kind is None:
        raise LocalProtocolError(f"not a protocol event: {event!r}")
    d: dict[str, Any] = {"type": kind.name}
    for name, when, to_json in _WRITERS[kind.name]:
        value = getattr(event, name)
        if when is not None and not (value is not None if when is PRESENT else bool(value) if when is SET
                                     else when(event)):
            continue
        d[name] = value if to_json is None else to_json(value)
    return d


_WRITERS = {k.name: tuple((f.name, f.when, f.conv.to_json) for f in k.fields) for k in BY_NAME.values()}


class _Fields:
    """Typed access to a decoded JSON object; wrong types are the peer's fault (1007). `wrong`: the error
    to give instead of the field's own (an item of a list that has one message for all its faults)."""

    __slots__ = ("kind", "obj", "wrong")

    def __init__(self, obj: Mapping[str, Any], kind: str, wrong: str | None = None) -> None:
        self.obj, self.kind, self.wrong = obj, kind, wrong

    @staticmethod
    def invalid(msg: str) -> Exception:
        """The error for a value of the wrong type or range."""
        return invalid(msg)

    def sub(self, obj: Mapping[str, Any], kind: str, wrong: str | None = None) -> _Fields:
        """Typed access to a nested object, named `kind` in errors."""
        return _Fields(obj, kind, wrong)

    def get(self, name: str, types: type | tuple[type, ...], default: Any) -> Any:
        """Member `name` if it has one of `types` (a bool is no int), `default` if it is absent."""
        value = self.obj.get(name, default)
        if value is default:
            return value
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
            raise invalid(self.wrong or f"{self.kind}.{name} has the wrong type ({type(value).__name__})")
        return value

    def u32(self, name: str) -> int:
        v = self.get(name, int, 0)
        if not 0 <= v <= 0xFFFFFFFF:
            raise invalid(f"{self.kind}.{name} is out of range")
        return v  # type: ignore[no-any-return]

    def str(self, name: str, default: str | None = "") -> Any:
        return self.get(name, str, default)

    def bool(self, name: str) -> bool:
        return self.get(name, bool, False)  # type: ignore[no-any-return]

    def bytes(self, name: str) -> bytes | None:
        v = self.get(name, str, None)
        if v is None:
            return None
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"{self.kind}.{name} is not valid base64") from None

    def strs(self, name: str) -> tuple[str, ...]:
        v = self.get(name, list, [])
        if not all(isinstance(x, str) for x in v):
            raise invalid(f"{self.kind}.{name} must be a list of strings")
        return tuple(v)

    def mapping(self, name: str) -> dict[str, Any]:
        return dict(self.get(name, dict, {}))

    def seq_map(self, name: str) -> dict[int, int]:
        """A map of stream ids (decimal strings) to seq numbers, e.g. hello.last_seq."""
        out: dict[int, int] = {}
        for k, v in self.mapping(name).items():
            # isascii: int() refuses digits like "²"; the length check keeps int() cheap and in range
            if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 10
                    and int(k) <= 0xFFFFFFFF and isinstance(v, int) and 0 <= v <= 0xFFFFFFFF):
                raise invalid(f"{self.kind}.{name} must map stream ids to seq numbers")
            out[int(k)] = v
        return out


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


# Readers of a member by type, (object, its kind's name, member name) -> value: the common case checked first,
# anything else to _Fields, whose error names the member.
def _u32(obj: Mapping[str, Any], where: str, name: str) -> Any:
    v = obj.get(name, 0)
    return v if type(v) is int and 0 <= v <= 0xFFFFFFFF else _Fields(obj, where).u32(name)


def _str(obj: Mapping[str, Any], where: str, name: str) -> Any:
    v = obj.get(name, "")
    return v if type(v) is str else _Fields(obj, where).str(name)


def _opt_str(obj: Mapping[str, Any], where: str, name: str) -> Any:
    v = obj.get(name)
    return v if v is None or type(v) is str else _Fields(obj, where).str(name, None)


def _bool(obj: Mapping[str, Any], where: str, name: str) -> Any:
    v = obj.get(name, False)
    return v if v is True or v is False else _Fields(obj, where).bool(name)


def _reader(read: Any) -> Callable[[Mapping[str, Any], str, str], Any]:
    """The reader of a Conv's `read`: one of those above, or a _Fields method or the Conv's own function,
    which a member that is absent skips (it reads as from an empty object; a dict, fresh each time)."""
    if read in _READERS:
        return _READERS[read]  # type: ignore[no-any-return]
    if isinstance(read, str):
        def full(obj: Mapping[str, Any], where: str, name: str) -> Any:
            return getattr(_Fields(obj, where), read)(name)
    else:
        def full(obj: Mapping[str, Any], where: str, name: str) -> Any:
            return read(_Fields(obj, where), name)
    absent = full({}, "", "absent")
    if isinstance(absent, dict):
        return lambda obj, where, name: full(obj, where, name) if name in obj else {}
    return lambda obj, where, name: full(obj, where, name) if name in obj else absent


_READERS: dict[str, Callable[[Mapping[str, Any], str, str], Any]] = {
    "u32": _u32, "str": _str, "opt_str": _opt_str, "bool": _bool}
_PLANS = {k.name: (k.cls, tuple((f.name, _reader(f.conv.read)) for f in k.fields)) for k in BY_NAME.values()}


def from_json_dict(obj: Any) -> ev.Event:
    """Turn a decoded JSON value into an event (RemoteProtocolError on bad input): wrong types are the
    frame's fault (1007), values the event refuses are a bad_request naming a Request's stream."""
    if not isinstance(obj, dict):
        raise invalid("a JSON frame must be an object")
    name = obj.get("type")
    if not isinstance(name, str):
        raise invalid('a JSON frame needs a string "type" member')
    plan = _PLANS.get(name)
    if plan is None:
        raise unsupported(name)
    cls, fields = plan
    try:
        kw = {}
        for field, read in fields:
            kw[field] = read(obj, name, field)
        return cls(**kw)  # type: ignore[no-any-return]
    except LocalProtocolError as exc:
        raise bad_request(str(exc), obj.get("stream_id", 0) if name == "request" else 0) from None


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class JsonCodec:
    """One JSON object per text frame; never compressed (use it for browsers and debugging)."""

    binary = False

    def encode(self, event: ev.Event, compressor: CompressionSelector | None = None) -> str:
        """Serialize `event` as compact JSON text."""
        return json.dumps(to_json_dict(event), separators=(",", ":"), ensure_ascii=False)

    def encode_frame(self, event: ev.Event, compressor: CompressionSelector | None = None) -> tuple[str, int, int]:
        """(frame, its UTF-8 size, 0): text frames are never compressed."""
        text = json.dumps(to_json_dict(event), separators=(",", ":"), ensure_ascii=False)
        return text, _utf8_size(text), 0

    def encode_delta(self, stream_id: int, seq: int, chunk: str | bytes, compressor: CompressionSelector | None = None
                     ) -> tuple[str, int, int]:
        """The Delta (`stream_id`, `seq`, `chunk`) as :meth:`encode_frame` would, without building the event
        (every token of a JSON stream; tests/test_codec.py compares the two)."""
        if type(chunk) is str:
            d = {"type": "delta", "stream_id": stream_id, "seq": seq, "text": chunk}
        else:
            d = {"type": "delta", "stream_id": stream_id, "seq": seq,
                 "data": base64.b64encode(chunk).decode("ascii")}  # type: ignore[arg-type]
        text = json.dumps(d, separators=(",", ":"), ensure_ascii=False)
        return text, _utf8_size(text), 0

    def decode(self, frame: bytes | str, *, limit: int, allowed: Iterable[str] | None = (),
               params: ParamsMemo | None = None) -> ev.Event:
        """Parse a text frame (RemoteProtocolError with the close code to use on bad input)."""
        if not isinstance(frame, str):
            raise invalid("binary frame on the text subprotocol lowlat.v1.json", CloseCode.UNSUPPORTED_DATA)
        try:
            obj = json.loads(frame)
        except (ValueError, RecursionError) as exc:
            raise invalid(f"not valid JSON: {exc}") from None
        # Strings must be Unicode text, as in Protobuf: an unpaired surrogate (escaped as \ud800, or a
        # raw one from a caller that did not validate UTF-8) could never be sent back in a text frame.
        if (not frame.isascii() or _SURROGATE_ESCAPE.search(frame)) and _has_lone_surrogate(obj):
            raise invalid("a JSON string holds an unpaired surrogate (not valid Unicode)")
        return from_json_dict(obj)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _has_lone_surrogate(obj: Any) -> bool:
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


JSON_CODEC = JsonCodec()  # stateless: one serves every connection
