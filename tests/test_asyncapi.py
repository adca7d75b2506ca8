"""The AsyncAPI 3.0 document: valid against the AsyncAPI 3.0.0 JSON schema (@asyncapi/specs, from the npm registry
via `python3 dev.py test`), one message per protocol message kind whose schema the real JSON encoding satisfies,
and served where the settings say (Starlette/FastAPI, Flask, lowlat-mw serve), linked from FastAPI's OpenAPI."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest
from prometheus_client import CollectorRegistry

from lowlat_mw.asyncapi import MESSAGES, document
from lowlat_mw.errors import ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol import wire as codec
from lowlat_mw.settings import Settings
from lowlat_mw.testing.pytest_plugin import RunningServer

SCHEMA = Path(__file__).parent / "node" / "node_modules" / "@asyncapi" / "specs" / "schemas" / "3.0.0-without-$id.json"
needs_schema = pytest.mark.skipif(not SCHEMA.exists(), reason=f"{SCHEMA} is missing: `python3 dev.py test` installs "
                                  "it with npm (tests/node/package.json)")

SAMPLES = [
    ev.Hello(client="t", compression=("zstd",), resume_token="r", last_seq={3: 7}, flow_window=1024, auth="x"),
    ev.Welcome(session_id="s", resume_token="r", compression=("lz4",), max_frame_size=1, max_decompressed_size=2,
               max_streams=3, heartbeat_interval_ms=4, idle_timeout_ms=5, server="lowlat-mw", resumed=True,
               resume_window_ms=6, flow_window=7),
    ev.Request(stream_id=1, model="m", text="hi", params={"temperature": 0.5, "tags": ["a"]}),
    ev.Request(stream_id=3, messages=(ev.ChatMessage(role="user", content="hi"),)),
    ev.Request(stream_id=5, data=b"\x00\x01"),
    ev.Delta(stream_id=1, seq=1, text="a"),
    ev.Delta(stream_id=1, seq=2, data=b"\xff"),
    ev.End(stream_id=1, last_seq=2, finish_reason="stop", timings_ms={"total": 1.5}, usage={"deltas": 2}),
    ev.Error(stream_id=1, code=ErrorCode.MODEL_ERROR, message="boom", retryable=True),
    ev.Cancel(stream_id=1), ev.Ack(stream_id=1, seq=2, done=True), ev.Ping(id=9), ev.Pong(id=9),
    ev.GoAway(reason="drain", reconnect_after_ms=100),
    ev.Subscribe(id=1, group="news", leave=True), ev.Subscribed(id=1, group="news"),
    ev.Subscribed(id=2, group="x", code=ev.ErrorCode.UNAUTHORIZED, message="no"),
    ev.Push(topic="group:news", text="hi"), ev.Push(topic="session:s", data=b"\x00"),
    ev.Hello(client="c", revision=1), ev.Welcome(session_id="s", revision=1),
    ev.Request(stream_id=1, text="x", warmup=True), ev.Hello(revision=2), ev.Welcome(session_id="s", revision=2),
    ev.Delta(stream_id=1, seq=3, tool_call=ev.ToolCall("lookup", '{"q": 1}', id="c1")),
    ev.Input(stream_id=1, seq=1, tool_result=ev.ToolResult(id="c1", content="r", is_error=True)),
    ev.Input(stream_id=1, seq=2, text="more"), ev.Input(stream_id=1, seq=3, data=b"\x00", end=True),
    ev.Input(stream_id=1, seq=4, end=True), ev.Welcome(session_id="s", revision=3, resumed=True, input_seq={1: 2}),
    ev.Hello(revision=3, history=True), ev.Welcome(session_id="s", revision=3, contexts={"a.py": 4}),
    ev.Request(stream_id=2, text="x", contexts=("a.py",), continues=1),
    ev.Context(name="a.py", version=1, text="print(1)\n", sha256=b"\x01" * 32),
    ev.Context(name="a.py", version=2, base_version=1, patches=(ev.ContextPatch(offset=6, length=1, text="2"),)),
    ev.Context(name="a.py", version=2, drop=True),
    ev.ContextAck(name="a.py", version=2), ev.ContextAck(name="a.py", version=3, code=ErrorCode.CONTEXT_MISMATCH,
                                                          message="no"),
]


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


@needs_schema
@pytest.mark.parametrize("url", [None, "ws://127.0.0.1:8000", "wss://api.example.com"])
def test_the_document_is_valid_asyncapi_3(validator, url) -> None:
    doc = document(Settings(path="/ai/ws", max_streams=4), url=url)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == []
    assert doc["channels"]["lowlat"]["address"] == "/ai/ws" and doc["info"]["x-lowlat-limits"]["max_streams"] == 4
    broken = copy.deepcopy(doc)
    broken["operations"]["sendToClients"]["action"] = "publish"  # (AsyncAPI 2's word): the validator notices
    assert list(validator.iter_errors(broken))


def test_every_message_kind_is_described_and_its_schema_fits_the_real_encoding() -> None:
    doc = document()
    kinds = {codec.to_json_dict(sample)["type"] for sample in SAMPLES}
    assert kinds == set(MESSAGES) == set(doc["components"]["messages"]) == set(doc["channels"]["lowlat"]["messages"])
    event_classes = {getattr(ev, n) for n in ev.__all__ if isinstance(getattr(ev, n), type)
                     and getattr(getattr(ev, n), "__dataclass_fields__", None)
                     and n not in ("ChatMessage", "ToolCall", "ToolResult", "ContextPatch")}  # (parts of messages)
    assert event_classes == {cls for cls, _, _ in MESSAGES.values()}  # a new message kind must be described
    schemas = doc["components"]["schemas"]
    for sample in SAMPLES:
        encoded = codec.to_json_dict(sample)
        jsonschema.validate(encoded, schemas[type(sample).__name__])
        assert set(encoded) <= set(schemas[type(sample).__name__]["properties"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"type": "delta", "stream_id": -1, "seq": 1}, schemas["Delta"])
    received = {m["$ref"].rsplit("/", 1)[1] for m in doc["operations"]["receiveFromClients"]["messages"]}
    sent = {m["$ref"].rsplit("/", 1)[1] for m in doc["operations"]["sendToClients"]["messages"]}
    assert {"hello", "request", "cancel", "ack", "ping", "pong", "subscribe", "input", "context"} == received
    assert {"welcome", "delta", "end", "error", "goaway", "ping", "pong", "subscribed", "push", "context_ack"} == sent


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read().decode()


def _served(app) -> dict:
    server = RunningServer(app).start()
    try:
        status, kind, body = _get(f"{server.http_url}/asyncapi.json")
        assert status == 200 and kind.startswith("application/json"), (status, kind)
        doc = json.loads(body)
        assert doc["servers"]["default"]["host"] == f"127.0.0.1:{server.port}"
        return doc
    finally:
        server.stop()


def test_served_by_the_starlette_middleware_and_the_flask_extension() -> None:
    from flask import Flask
    from starlette.applications import Starlette
    from starlette.middleware import Middleware

    from lowlat_mw.adapters.flask import LowLat
    from lowlat_mw.adapters.starlette import LowLatMiddleware

    async def model(req):
        return "x"

    starlette = Starlette(middleware=[Middleware(LowLatMiddleware, model=model, path="/ws", max_streams=5,
                                                 asyncapi_path="/asyncapi.json", registry=CollectorRegistry())])
    assert _served(starlette)["info"]["x-lowlat-limits"]["max_streams"] == 5
    flask = Flask(__name__)
    flask.config["LOWLAT_MW"] = {"path": "/ws", "asyncapi_path": "/asyncapi.json", "max_streams": 6}
    LowLat(flask, model=model, registry=CollectorRegistry())
    assert _served(flask)["info"]["x-lowlat-limits"]["max_streams"] == 6


def test_fastapi_openapi_shows_the_websocket_with_a_link() -> None:
    from fastapi import FastAPI

    from lowlat_mw.adapters.starlette import LowLatMiddleware, document_websocket

    async def model(req):
        return "x"

    app = FastAPI()
    app.add_middleware(LowLatMiddleware, model=model, path="/ws", asyncapi_path="/asyncapi.json",
                       registry=CollectorRegistry())
    document_websocket(app, "/ws", "/asyncapi.json")
    operation = app.openapi()["paths"]["/ws"]["get"]
    assert "/asyncapi.json" in operation["description"] and {"101", "426"} <= set(operation["responses"])
    server = RunningServer(app).start()
    try:
        assert _get(f"{server.http_url}/ws")[0] == 426  # a plain GET: not a WebSocket
        assert "/ws" in json.loads(_get(f"{server.http_url}/openapi.json")[2])["paths"]
        assert _get(f"{server.http_url}/asyncapi.json")[0] == 200
    finally:
        server.stop()
