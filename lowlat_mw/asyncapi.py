"""An AsyncAPI 3.0 document of a lowlat-mw endpoint, generated from the protocol's message types and the app's
settings: a machine-readable description for code generators, API catalogues and reviewers (docs/protocol.md is
the human one).

    document(settings, url="wss://api.example.com")   # a dict, ready for json.dumps

Each message kind of the wire protocol is one AsyncAPI message with a JSON Schema of its JSON encoding (the
``lowlat.v1.json`` subprotocol; ``lowlat.v1.proto`` carries the same fields in Protobuf, lowlat_mw/proto). The
operations say which side sends what, from the server's point of view. The adapters serve it at the
``asyncapi_path`` setting.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Union
from urllib.parse import urlsplit

from ._version import __version__
from .errors import CloseCode, ErrorCode
from .protocol import events as ev
from .settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings

__all__ = ["MESSAGES", "asyncapi_json", "document"]

# Every message kind, its JSON "type", and who sends it (docs/protocol.md).
MESSAGES: dict[str, tuple[type, str, str]] = {
    # name: (event class, sent by, summary)
    "hello": (ev.Hello, "client", "Opens the session (or resumes one): the first message of a connection."),
    "welcome": (ev.Welcome, "server", "Accepts the session: its id, resume token and the negotiated limits."),
    "request": (ev.Request, "client", "Starts a stream: a prompt (text, chat messages or bytes) for a model."),
    "delta": (ev.Delta, "server", "One chunk of a stream's output, numbered by seq from 1."),
    "end": (ev.End, "server", "A stream finished: why, its usage and its server-side timings."),
    "error": (ev.Error, "server", "An error for one stream (ending it) or, with stream_id 0, the connection."),
    "cancel": (ev.Cancel, "client", "Stops a stream; the server ends it with finish_reason 'cancelled'."),
    "ack": (ev.Ack, "client", "Flow control: the client consumed a stream up to seq."),
    "ping": (ev.Ping, "both", "Heartbeat probe; answered by a Pong with the same id."),
    "pong": (ev.Pong, "both", "Answer to a Ping."),
    "goaway": (ev.GoAway, "server", "The server is draining: finish, then reconnect (and resume) elsewhere."),
    "subscribe": (ev.Subscribe, "client", "v1.1: joins (or, with leave, leaves) a named push group."),
    "subscribed": (ev.Subscribed, "server", "v1.1: the answer to a Subscribe with the same id: done, or refused."),
    "push": (ev.Push, "server", "v1.1: a message the server published to the client's session, user or group."),
    "input": (ev.Input, "client", "v1.3: more input for a running stream (text, bytes, a tool call's result) "
                                  "and/or its end; numbered by seq from 1."),
    "context": (ev.Context, "client", "v1.3: sets, patches (UTF-8 byte offsets, SHA-256 checked) or drops a named "
                                      "context document of the session."),
    "context_ack": (ev.ContextAck, "server", "v1.3: the answer to a Context with the same name and version: done, "
                                             "or refused (the document is then gone: send its whole text)."),
}


def _schema(hint: Any) -> dict[str, Any]:
    """JSON Schema of one field's JSON encoding, from its type hint."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _schema(args[0])
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer", "minimum": 0}
    if hint is float:
        return {"type": "number"}
    if hint is str:
        return {"type": "string"}
    if hint is bytes:
        return {"type": "string", "contentEncoding": "base64"}
    if hint is ErrorCode:
        return {"type": "string", "enum": [code.wire_name for code in ErrorCode]}
    if hint is ev.ChatMessage:
        return {"type": "object", "required": ["role", "content"],
                "properties": {"role": {"type": "string"}, "content": {"type": "string"}}}
    if hint is ev.ToolCall:
        return {"type": "object", "required": ["name"], "description": "v1.3: the model asks the client to run a tool",
                "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                               "arguments": {"type": "string", "description": "JSON text"}}}
    if hint is ev.ToolResult:
        return {"type": "object", "required": ["id"], "description": "v1.3: the answer to the tool call `id`",
                "properties": {"id": {"type": "string"}, "content": {"type": "string"},
                               "is_error": {"type": "boolean"}}}
    if hint is ev.ContextPatch:
        return {"type": "object", "properties": {"offset": {"type": "integer", "minimum": 0},
                                                 "length": {"type": "integer", "minimum": 0},
                                                 "text": {"type": "string"}}}
    if origin is tuple:
        return {"type": "array", "items": _schema(typing.get_args(hint)[0])}
    if origin is Mapping or origin is dict:
        key, value = typing.get_args(hint)
        values = {} if value is Any else _schema(value)
        if key is int:  # stream ids as JSON object keys
            return {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": values}
        return {"type": "object", "additionalProperties": values}
    return {}


def _payload(name: str, cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {"type": {"const": name}}
    required = ["type"]
    for f in dataclasses.fields(cls):
        properties[f.name] = _schema(hints[f.name])
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    return {"type": "object", "required": required, "properties": properties}


def document(settings: Settings | None = None, *, url: str | None = None, title: str = "lowlat-mw endpoint",
             version: str = __version__) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of an endpoint with `settings` (default: the defaults), served at `url`
    (``ws://host:port`` or ``wss://...``; without it the document names no server)."""
    settings = settings or Settings()
    limits = {
        "max_frame_size": settings.max_frame_size, "max_streams": settings.max_streams,
        "heartbeat_interval_s": settings.heartbeat_interval, "idle_timeout_s": settings.idle_timeout,
        "resume_window_s": settings.resume_window, "compression": list(settings.compression),
        "subprotocols": list(settings.subprotocols),
    }
    messages = {
        name: {"name": name, "title": cls.__name__, "summary": summary, "contentType": "application/json",
               "payload": {"$ref": f"#/components/schemas/{cls.__name__}"}}
        for name, (cls, _, summary) in MESSAGES.items()
    }
    channel_messages = {name: {"$ref": f"#/components/messages/{name}"} for name in MESSAGES}

    def operation(action: str, names: list[str], summary: str) -> dict[str, Any]:
        return {"action": action, "channel": {"$ref": "#/channels/lowlat"}, "summary": summary,
                "messages": [{"$ref": f"#/channels/lowlat/messages/{n}"} for n in names]}

    received = [n for n, (_, by, _) in MESSAGES.items() if by in ("client", "both")]
    sent = [n for n, (_, by, _) in MESSAGES.items() if by in ("server", "both")]
    doc: dict[str, Any] = {
        "asyncapi": "3.0.0",
        "info": {
            "title": title, "version": version,
            "description": (
                "A lowlat-mw endpoint (wire protocol v1): one WebSocket per client, many streams multiplexed on "
                f"it. Subprotocols: `{SUBPROTOCOL_JSON}` (text frames, the JSON described here) and "
                f"`{SUBPROTOCOL_PROTO}` (binary frames: the same messages in Protobuf, a codec byte first). "
                "Close codes: " + ", ".join(f"{int(c)} {c.name.lower()}" for c in CloseCode) + "."),
            "x-lowlat-limits": limits,
        },
        "defaultContentType": "application/json",
        "channels": {"lowlat": {
            "address": settings.path,
            "title": "lowlat-mw WebSocket",
            "messages": channel_messages,
            "bindings": {"ws": {"method": "GET", "bindingVersion": "0.1.0"}},
        }},
        "operations": {
            "receiveFromClients": operation("receive", received, "What a client sends (Hello first)."),
            "sendToClients": operation("send", sent, "What the server sends (Welcome first)."),
        },
        "components": {
            "messages": messages,
            "schemas": {cls.__name__: _payload(name, cls) for name, (cls, _, _) in MESSAGES.items()},
        },
    }
    if url:
        parts = urlsplit(url)
        doc["servers"] = {"default": {"host": parts.netloc, "protocol": parts.scheme or "ws",
                                      "description": "The WebSocket endpoint; the channel address is its path."}}
        doc["channels"]["lowlat"]["servers"] = [{"$ref": "#/servers/default"}]
    return doc


def asyncapi_json(settings: Settings, url: str | None) -> bytes:
    """:func:`document` as JSON bytes (what the adapters serve), made once per settings and URL where the
    settings can be a cache key (an ``authenticate`` hook that is an unhashable object cannot)."""
    try:
        return _cached_json(settings, url)
    except TypeError:  # (unhashable settings)
        return _cached_json.__wrapped__(settings, url)


@functools.lru_cache(maxsize=32)
def _cached_json(settings: Settings, url: str | None) -> bytes:
    return json.dumps(document(settings, url=url), indent=2).encode()
