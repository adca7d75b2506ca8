"""What must hold for ANY input to the frame decoders: shared by tests/test_fuzz.py (hypothesis) and the
atheris harness (tests/fuzz/fuzz_decoder.py).

A violated property raises ``FuzzFailure`` (or lets an unexpected exception escape): both are crashes.

* ``check_frame``: ``codec.decode`` returns an event or raises ``RemoteProtocolError`` whose Error
  code / close code pair is one the spec documents; a decoded payload never exceeds the limit; an
  accepted event re-encodes, as text that is valid Unicode, and decodes back to itself.
* ``check_connection``: a ``ServerProtocol`` fed frames after Hello only ever answers with protocol
  actions, every frame it sends is valid (UTF-8 text / a decodable binary frame), a close is final.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, get_args

from lowlat_mw.errors import CloseCode, ErrorCode, LocalProtocolError, RemoteProtocolError
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.compression import available_codecs
from lowlat_mw.protocol.server import (
    Authenticate,
    CancelStream,
    CloseConnection,
    ConnState,
    DeliverInput,
    Measured,
    Membership,
    ResumeSession,
    SendFrame,
    ServerProtocol,
    StartStream,
)
from lowlat_mw.protocol.wire import JsonCodec, ProtoCodec, to_json_dict
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings
from lowlat_mw.testing import ConnectionPair

LIMIT = 64 * 1024
ALL_CODECS = tuple(available_codecs())
EVENT_TYPES = get_args(ev.Event)  # every message kind, new revisions' included (v1.3: Input, Context...)
PROTO, JSON = ProtoCodec(), JsonCodec()

# (error code, close code) pairs docs/protocol.md documents for a frame the server cannot take.
DOCUMENTED = {
    (ErrorCode.INVALID_PAYLOAD, CloseCode.INVALID_PAYLOAD),
    (ErrorCode.INVALID_PAYLOAD, CloseCode.UNSUPPORTED_DATA),
    (ErrorCode.PROTOCOL_ERROR, CloseCode.PROTOCOL_ERROR),
    (ErrorCode.MESSAGE_TOO_BIG, CloseCode.MESSAGE_TOO_BIG),
    (ErrorCode.UNSUPPORTED_COMPRESSION, CloseCode.INVALID_PAYLOAD),
    (ErrorCode.UNSUPPORTED_MESSAGE, None),
    (ErrorCode.BAD_REQUEST, None),
}


class FuzzFailure(AssertionError):
    """A property of the decoders was violated."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise FuzzFailure(message)


def _canonical(event: ev.Event) -> str:
    """A comparable form of an event (NaN-safe, order-independent)."""
    def fix(v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        if isinstance(v, dict):
            return {str(k): fix(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [fix(x) for x in v]
        return v

    return json.dumps(fix(to_json_dict(event)), sort_keys=True, ensure_ascii=True)


def check_frame(codec: ProtoCodec | JsonCodec, frame: bytes | str, *, limit: int = LIMIT,
                allowed: Iterable[str] | None = ALL_CODECS) -> ev.Event | None:
    """Decode `frame`; check the properties above. Returns the event, or None if it was refused."""
    allowed = tuple(allowed) if allowed is not None else None
    try:
        event = codec.decode(frame, limit=limit, allowed=allowed)
    except RemoteProtocolError as exc:
        _require((exc.error_code, exc.close_code) in DOCUMENTED,
                 f"undocumented refusal {exc.error_code!r} / {exc.close_code!r}: {exc}")
        _require(exc.close_code is not None or exc.error_code in (ErrorCode.BAD_REQUEST,
                                                                  ErrorCode.UNSUPPORTED_MESSAGE),
                 f"{exc.error_code!r} must close the connection")
        _require(0 <= exc.stream_id <= 0xFFFFFFFF, f"bad stream id {exc.stream_id}")
        return None
    _require(isinstance(event, EVENT_TYPES), f"decode returned {event!r}")
    if codec.binary:
        sizes = [len(event.data or b"")] if isinstance(event, ev.Request | ev.Delta) else []
        _require(all(s <= limit for s in sizes), "decoded data larger than the limit")
    # what the server may send back or store must be valid Unicode everywhere (WebSocket text is UTF-8)
    text = JSON.encode(event)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FuzzFailure(f"decoded event holds a string that is not valid Unicode: {exc}") from None
    again = codec.encode(event)
    back = codec.decode(again, limit=max(limit, len(again) * 2), allowed=())
    _require(_canonical(back) == _canonical(event), f"round trip changed {event!r} into {back!r}")
    return event


# ================================================================================ ServerProtocol
FUZZ_SETTINGS = Settings(max_frame_size=LIMIT, max_decompressed_size=LIMIT, max_streams=4, rate_limit=50,
                         rate_burst=5, max_request_size=4096, max_session_lifetime=30)
_ACTIONS = (SendFrame, CloseConnection, StartStream, CancelStream, DeliverInput, Measured, Membership,
            bytes, str)  # str/bytes: a Delta's frame


def open_connection(subprotocol: str, now: float = 1000.0) -> ServerProtocol:
    """A server machine after Hello/Welcome (every codec negotiated on proto), through a ConnectionPair."""
    pair = ConnectionPair(FUZZ_SETTINGS, subprotocol, now=now, session_id="fuzz")
    conn = pair.server
    actions = conn.receive_data(pair.codec.encode(ev.Hello(client="fuzz", compression=ALL_CODECS,
                                                           revision=ev.REVISION)), now)  # (every kind it knows)
    _require(len(actions) == 1 and isinstance(actions[0], SendFrame) and conn.open, f"no welcome: {actions}")
    return conn


def _check_actions(conn: ServerProtocol, actions: Sequence[Any], was_closed: bool) -> None:
    codec = PROTO if conn.subprotocol == SUBPROTOCOL_PROTO else JSON
    if was_closed:
        _require(list(actions) == [], f"actions after close: {actions}")
    closes = [a for a in actions if isinstance(a, CloseConnection)]
    _require(len(closes) <= 1, f"closed twice: {actions}")
    if closes:
        _require(actions[-1] is closes[0] and conn.closed, f"close not last or state not closed: {actions}")
    for action in actions:
        _require(isinstance(action, _ACTIONS) and not isinstance(action, Authenticate | ResumeSession),
                 f"unexpected action {action!r}")
        data = action.data if isinstance(action, SendFrame) else action if isinstance(action, bytes | str) else None
        if data is not None:
            if isinstance(data, str):
                _require(not codec.binary, "text frame on the binary subprotocol")
                try:
                    data.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise FuzzFailure(f"server frame is not valid UTF-8 text: {exc}") from None
            else:
                _require(codec.binary, "binary frame on the JSON subprotocol")
            out = codec.decode(data, limit=2**31, allowed=conn.compression)
            _require(isinstance(out, ev.Welcome | ev.Delta | ev.End | ev.Error | ev.Ping | ev.Pong | ev.GoAway
                                | ev.Subscribed | ev.Push), f"server sent {out!r}")
        if isinstance(action, StartStream):  # what the model gets is valid Unicode text
            _require(_is_unicode(JSON.encode(action.request)), f"model input is not valid Unicode: {action!r}")
        if isinstance(action, CloseConnection):
            _require(isinstance(action.code, int) and 1000 <= action.code <= 4999, f"bad close code {action}")


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_connection(subprotocol: str, steps: Sequence[tuple[str, Any]]) -> ServerProtocol:
    """Run `steps` against a fresh connection after Hello, checking every answer.

    A step is ("frame", bytes | str), ("tick", seconds later), ("chunk", (stream index, str | bytes)),
    ("finish", stream index) or ("fail", stream index); stream indexes pick among started streams.
    """
    now = 1000.0
    conn = open_connection(subprotocol, now)
    started: list[int] = []
    for kind, arg in steps:
        was_closed = conn.closed
        if kind == "frame":
            actions = conn.receive_data(arg, now)
            started += [a.request.stream_id for a in actions if isinstance(a, StartStream)]
        elif kind == "tick":
            now += arg
            actions = conn.tick(now)
        elif started:
            sid = started[arg[0] % len(started)] if kind == "chunk" else started[arg % len(started)]
            if kind == "chunk":
                try:
                    actions = conn.send_chunk(sid, arg[1], now)
                except LocalProtocolError:  # a model bug (the driver fails the stream with model_error)
                    _require(isinstance(arg[1], str) and not _is_unicode(arg[1]), f"send_chunk refused {arg[1]!r}")
                    continue
            elif kind == "finish":
                actions = conn.finish_stream(sid, now)
            else:
                actions = conn.fail_stream(sid, now, ErrorCode.MODEL_ERROR, "model failed (Fuzz)")
        else:
            continue
        _check_actions(conn, actions, was_closed)
        if conn.closed:
            _require(conn.state is ConnState.CLOSED and conn.next_deadline() == math.inf, "closed but timers left")
    return conn


SUBPROTOCOLS = (SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON)
