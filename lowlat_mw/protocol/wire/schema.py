"""The one table of the wire: every event kind, its name on the wire, and its fields with how each converts.

Both codecs read it: ``wire/json.py`` (one JSON object per text frame, docs/protocol.md "JSON mapping") and
``wire/protobuf.py`` (an ``Envelope`` through the protobuf library's message API). A field's name is the
same in the event class, the Protobuf message and the JSON object. Adding a message kind: its message in
``proto/lowlat_v1.proto`` (regenerate), its event class in ``protocol/events.py``, one :class:`Kind` in
:data:`KINDS`. tests/test_proto_generated.py checks the table against the Protobuf descriptors.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ...errors import ErrorCode
from .. import events as ev

__all__ = ["BY_CLASS", "BY_NAME", "EXTEND", "KINDS", "MAP", "PRESENT", "SET", "Conv", "Field", "Kind", "WireError",
           "error_code", "struct_to_dict", "written"]


class WireError(ValueError):
    """A value the peer sent that an event cannot hold (Request.params with NaN): a bad_request."""


def error_code(value: int) -> ErrorCode:
    """An ErrorCode from the wire; an unknown number is UNSPECIFIED (protocol.md 2)."""
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNSPECIFIED


# ================================================================================ conversions
Reader = Any  # wire/json.py's typed view of a JSON object (u32, str, bool, bytes, strs, mapping, seq_map, get...)


@dataclass(frozen=True, slots=True)
class Conv:
    """How one field's value converts, each step a function (None: the value goes as it is).

    `read`: the JSON reader's method for its type (``"u32"``, ``"str"``...), or a function (reader, name) ->
    value; `to_json`: value -> JSON value; `to_pb`: how the value goes on a Protobuf message, through the
    library's message API: None (set the attribute), ``"map"`` (item by item), ``"extend"`` (a repeated
    field) or a function (message, name, value); `from_pb`: the message's attribute -> value (a builtin,
    mostly: tuple, dict)."""

    read: str | Callable[[Reader, str], Any]
    to_json: Callable[[Any], Any] | None = None
    to_pb: str | Callable[[Any, str, Any], None] | None = None
    from_pb: Callable[[Any], Any] | None = None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _read_code(r: Reader, name: str) -> ErrorCode:
    return ErrorCode.from_wire_name(r.str(name))


def _read_sha(r: Reader, name: str) -> bytes:
    return r.bytes(name) or b""  # type: ignore[no-any-return]


def _map_reader(check: Callable[[Any], bool], wrong: str) -> Callable[[Reader, str], dict[Any, Any]]:
    """A JSON map whose every value passes `check` (else the error `wrong`, formatted with kind and name)."""
    def read(r: Reader, name: str) -> dict[Any, Any]:
        out = r.mapping(name)
        if not all(check(v) for v in out.values()):
            raise r.invalid(wrong.format(kind=r.kind, name=name))
        return out  # type: ignore[no-any-return]
    return read


def _seq_map_to_json(value: Mapping[int, int]) -> dict[str, int]:
    return {str(k): v for k, v in value.items()}


def _params_to_pb(msg: Any, name: str, value: Mapping[str, Any]) -> None:
    if value:  # (no params: no Struct on the wire)
        getattr(msg, name).update(dict(value))


def _params_from_pb(struct: Any) -> dict[str, Any]:
    try:
        return struct_to_dict(struct)
    except ValueError as exc:  # NaN / Infinity numbers: JSON has none
        raise WireError(f"request.params: {exc}") from None


def _nested(cls: type, fields: tuple[Field, ...], *, wrong: str = "", repeated: bool = False,
            wrapper: str = "", optional: bool = True, blame: bool = False) -> Conv:
    """The Conv of a sub-message (a dataclass of scalar `fields`), or with `repeated` of a list of them
    (`wrong`: the error for an item that is not an object, and with `blame` for its fields' wrong types too;
    `wrapper`: the Protobuf message holding the list, as ChatMessages.items holds Request.messages;
    `optional`: absent from JSON is None, not empty)."""
    names = tuple(f.name for f in fields)

    def item_json(value: Any) -> dict[str, Any]:
        return {f.name: getattr(value, f.name) for f in fields if written(f, getattr(value, f.name), value)}

    def item_pb(value: Any) -> dict[str, Any]:
        return {name: getattr(value, name) for name in names}

    def set_pb(msg: Any, name: str, value: Any) -> None:
        target = getattr(msg, name)
        target.SetInParent()  # (present even when every field is empty)
        for field in names:
            setattr(target, field, getattr(value, field))

    def item_from_pb(msg: Any) -> Any:
        return cls(**{name: getattr(msg, name) for name in names})

    def item_from_json(r: Reader, obj: Any, kind: str) -> Any:
        sub = r.sub(obj, kind, wrong if blame else None)
        return cls(**{f.name: getattr(sub, f.conv.read)(f.name) for f in fields})  # type: ignore[arg-type]

    if not repeated:
        return Conv(lambda r, name: item_from_json(r, r.get(name, dict, {}), f"{r.kind}.{name}")
                    if name in r.obj else None, item_json, set_pb, item_from_pb)

    def read_list(r: Reader, name: str) -> tuple[Any, ...] | None:
        if optional and name not in r.obj:
            return None
        items = r.get(name, list, [])
        if not all(isinstance(item, dict) for item in items):
            raise r.invalid(wrong)
        return tuple(item_from_json(r, item, f"{r.kind}.{name}") for item in items)

    def list_pb(msg: Any, name: str, value: tuple[Any, ...]) -> None:
        holder = getattr(msg, name)
        if wrapper:
            holder.SetInParent()  # (an empty conversation is still a conversation)
            holder = getattr(holder, wrapper)
        for item in value:
            holder.add(**item_pb(item))

    def list_from_pb(msg: Any) -> tuple[Any, ...]:
        return tuple(item_from_pb(m) for m in (getattr(msg, wrapper) if wrapper else msg))

    return Conv(read_list, lambda value: [item_json(item) for item in value], list_pb, list_from_pb)


def struct_to_dict(struct: Any) -> dict[str, Any]:
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


# ================================================================================ the table
@dataclass(frozen=True, slots=True)
class Field:
    """One field of a message: its name (event attribute = Protobuf field = JSON member), how it converts,
    and `when` its JSON member is written: None (always), ``"present"`` (not None: a oneof member), ``"set"``
    (truthy) or a test of the event."""

    name: str
    conv: Conv
    when: str | Callable[[Any], bool] | None = None


@dataclass(frozen=True, slots=True)
class Kind:
    """One message kind: its event class, its name (the Envelope's oneof member, the JSON ``"type"``), its
    fields in JSON order, and `empty`: the error when none of its oneof is set (None: that is allowed)."""

    cls: type
    name: str
    fields: tuple[Field, ...]
    empty: str | None = None


PRESENT, SET = "present", "set"  # a Field's `when`
MAP, EXTEND = "map", "extend"  # a Conv's `to_pb`
U32, STR, BOOL = Conv("u32"), Conv("str"), Conv("bool")
TEXT = Conv("opt_str")  # (a oneof member: None when unset)
DATA = Conv("bytes", _b64)  # (bytes in a oneof: base64 text in JSON, None when unset)
BYTES = Conv(_read_sha, _b64)
STRS = Conv("strs", list, EXTEND, tuple)
SEQ_MAP = Conv("seq_map", _seq_map_to_json, MAP, dict)
CODE = Conv(_read_code, attrgetter("wire_name"), None, error_code)  # (JSON: its wire name; unknown ones: UNSPECIFIED)
PARAMS = Conv("mapping", dict, _params_to_pb, _params_from_pb)


def _map(check: Callable[[Any], bool], wrong: str) -> Conv:
    return Conv(_map_reader(check, wrong), dict, MAP, dict)


def _f(name: str, conv: Conv, when: str | Callable[[Any], bool] | None = None) -> Field:
    return Field(name, conv, {"present": PRESENT, "set": SET}.get(when, when))  # type: ignore[call-overload]


def written(field: Field, value: Any, event: Any) -> bool:
    """Whether `field` (of value `value` in `event`) goes into the JSON object (see :attr:`Field.when`)."""
    when = field.when
    if when is None:
        return True
    if when is PRESENT:
        return value is not None
    if when is SET:
        return bool(value)
    return when(event)  # type: ignore[operator, no-any-return]


def _refused(e: Any) -> bool:
    return e.code is not ErrorCode.UNSPECIFIED


def _number(v: Any) -> bool:
    return isinstance(v, int | float)


def _int(v: Any) -> bool:
    return isinstance(v, int)


def _version(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 0xFFFFFFFF


TOOL_CALL = _nested(ev.ToolCall, (_f("id", STR), _f("name", STR), _f("arguments", STR)))
TOOL_RESULT = _nested(ev.ToolResult, (_f("id", STR), _f("content", STR), _f("is_error", BOOL, "set")))
MESSAGES = _nested(ev.ChatMessage, (_f("role", STR), _f("content", STR)), repeated=True, wrapper="items",
                   wrong="request.messages must be a list of {role, content} strings", blame=True)
PATCHES = _nested(ev.ContextPatch, (_f("offset", U32), _f("length", U32), _f("text", STR)), repeated=True,
                  optional=False, wrong="context.patches must be a list of {offset, length, text}")
_NUMBERS = "end.timings_ms / end.usage must map names to numbers"
_CHUNK = (_f("text", TEXT, "present"), _f("data", DATA, "present"), _f("tool_call", TOOL_CALL, "present"))

KINDS: tuple[Kind, ...] = (
    Kind(ev.Delta, "delta", (_f("stream_id", U32), _f("seq", U32), *_CHUNK), empty="Delta without text or data"),
    Kind(ev.Ack, "ack", (_f("stream_id", U32), _f("seq", U32), _f("done", BOOL))),
    Kind(ev.Request, "request", (
        _f("stream_id", U32), _f("model", STR), _f("text", TEXT, "present"), _f("data", DATA, "present"),
        _f("messages", MESSAGES, "present"), _f("params", PARAMS, "set"), _f("warmup", BOOL, "set"),
        _f("contexts", STRS, "set"), _f("continues", U32, "set"))),
    Kind(ev.End, "end", (
        _f("stream_id", U32), _f("last_seq", U32), _f("finish_reason", STR),
        _f("timings_ms", _map(_number, _NUMBERS)), _f("usage", _map(_int, _NUMBERS)))),
    Kind(ev.Error, "error", (_f("stream_id", U32), _f("code", CODE), _f("message", STR), _f("retryable", BOOL))),
    Kind(ev.Ping, "ping", (_f("id", U32),)),
    Kind(ev.Pong, "pong", (_f("id", U32),)),
    Kind(ev.Cancel, "cancel", (_f("stream_id", U32),)),
    Kind(ev.Hello, "hello", (
        _f("client", STR), _f("compression", STRS), _f("resume_token", STR), _f("last_seq", SEQ_MAP),
        _f("flow_window", U32), _f("auth", STR, "set"), _f("revision", U32, "set"), _f("history", BOOL, "set"))),
    Kind(ev.Welcome, "welcome", (
        _f("session_id", STR), _f("resume_token", STR), _f("compression", STRS), _f("max_frame_size", U32),
        _f("max_decompressed_size", U32), _f("max_streams", U32), _f("heartbeat_interval_ms", U32),
        _f("idle_timeout_ms", U32), _f("server", STR), _f("resumed", BOOL), _f("resume_window_ms", U32),
        _f("flow_window", U32), _f("revision", U32, "set"), _f("input_seq", SEQ_MAP),
        _f("contexts", _map(_version, "{kind}.{name} must map names to versions")))),
    Kind(ev.Input, "input", (
        _f("stream_id", U32), _f("seq", U32), _f("text", TEXT, "present"), _f("data", DATA, "present"),
        _f("tool_result", TOOL_RESULT, "present"), _f("end", BOOL, "set"))),
    Kind(ev.GoAway, "goaway", (_f("reason", STR), _f("reconnect_after_ms", U32))),
    Kind(ev.Push, "push", (_f("topic", STR), _f("text", TEXT, "present"), _f("data", DATA, "present")),
         empty="Push without text or data"),
    Kind(ev.Subscribe, "subscribe", (_f("id", U32), _f("group", STR), _f("leave", BOOL))),
    Kind(ev.Subscribed, "subscribed", (
        _f("id", U32), _f("group", STR), _f("leave", BOOL), _f("code", CODE, _refused),
        _f("message", STR, _refused))),
    Kind(ev.Context, "context", (
        _f("name", STR), _f("version", U32), _f("base_version", U32),
        _f("text", STR, lambda e: not e.base_version and not e.drop), _f("patches", PATCHES, "set"),
        _f("sha256", BYTES, "set"), _f("drop", BOOL, "set"))),
    Kind(ev.ContextAck, "context_ack", (
        _f("name", STR), _f("version", U32), _f("code", CODE, _refused), _f("message", STR, _refused))),
)
"""Every message kind of lowlat.v1, the ones a peer sends most first."""

BY_CLASS: dict[type, Kind] = {k.cls: k for k in KINDS}
BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
