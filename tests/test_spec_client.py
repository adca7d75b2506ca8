"""A minimal client written only from docs/protocol.md, run against a real server.

The client side uses nothing from lowlat_mw: plain ``websockets`` and ``json`` for the JSON
subprotocol, and for ``lowlat.v1.proto`` the stdlib plus ``google.protobuf`` with the shipped
schema compiled at test time (``grpc_tools.protoc --descriptor_set_out``) into a private
descriptor pool. Only the server fixture imports lowlat_mw. Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

pytestmark = pytest.mark.integration

SCHEMA = Path(__file__).resolve().parents[1] / "lowlat_mw" / "proto" / "lowlat_v1.proto"
PROTO = "lowlat.v1.proto"
JSON_SP = "lowlat.v1.json"
TIMEOUT = 10.0

# First 10 words of the demo model's reply to the prompt "hi" (tokens=10).
DEMO_REPLY_10 = "Hello! This is the lowlat-mw demo model. You said: 'hi'."


# ==================================================================================== server
@pytest.fixture(scope="module")
def server_url() -> Any:
    """A real uvicorn server (websockets-sansio) serving the demo model at /ws, in a thread."""
    import uvicorn
    from starlette.applications import Starlette

    from lowlat_mw.adapters.starlette import LowLatMiddleware
    from lowlat_mw.demo import demo_model

    app = Starlette()
    app.add_middleware(LowLatMiddleware, model=demo_model, path="/ws")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # (asyncio: TCP_NODELAY)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, ws="websockets-sansio", log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while not server.started:
            assert thread.is_alive(), "uvicorn exited during startup"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not shut down"


def _connect(url: str, subprotocols: list[str] | None = None) -> connect:
    # proxy=None: never route loopback tests through an environment proxy.
    return connect(url, subprotocols=subprotocols, proxy=None, compression=None, open_timeout=TIMEOUT)  # type: ignore[arg-type]


# ==================================================================================== JSON client
class JsonClient:
    """docs/protocol.md sections 5.2 and 6: one JSON object per text frame."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, **msg: Any) -> None:
        await self.ws.send(json.dumps(msg))

    async def recv(self) -> dict[str, Any]:
        frame = await self.ws.recv()
        assert isinstance(frame, str), "JSON connections carry text frames only"
        msg = json.loads(frame)
        assert isinstance(msg, dict) and isinstance(msg.get("type"), str)
        return msg

    async def handshake(self) -> dict[str, Any]:
        await self.send(type="hello", client="spec-test/1")
        welcome = await self.recv()
        assert welcome["type"] == "welcome"
        return welcome

    async def collect(self, stream_id: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Deltas of `stream_id` until its End or Error (answering Pings on the way)."""
        deltas: list[dict[str, Any]] = []
        while True:
            msg = await self.recv()
            if msg["type"] == "ping":
                await self.send(type="pong", id=msg["id"])
            elif msg.get("stream_id") != stream_id:
                continue
            elif msg["type"] == "delta":
                deltas.append(msg)
            elif msg["type"] in ("end", "error"):
                return deltas, msg


def _check_stream(deltas: list[Any], end: Any, n: int, text_of: Any) -> str:
    """Section 8.2/8.3: seq is 1..n, End.last_seq == n; returns the concatenated text."""
    assert [d.seq if hasattr(d, "seq") else d["seq"] for d in deltas] == list(range(1, n + 1))
    last_seq = end.last_seq if hasattr(end, "last_seq") else end["last_seq"]
    reason = end.finish_reason if hasattr(end, "finish_reason") else end["finish_reason"]
    assert last_seq == n
    assert reason == "stop"
    return "".join(text_of(d) for d in deltas)


async def _json_stream(ws: ClientConnection) -> None:
    client = JsonClient(ws)
    welcome = await client.handshake()
    assert welcome["compression"] == []  # JSON is never compressed
    assert welcome["max_streams"] >= 1 and welcome["max_frame_size"] > 0
    assert welcome["resumed"] is False
    await client.send(type="request", stream_id=1, model="demo", text="hi", params={"delay": 0, "tokens": 10})
    deltas, end = await client.collect(1)
    assert end["type"] == "end", end
    assert _check_stream(deltas, end, 10, lambda d: d["text"]) == DEMO_REPLY_10
    assert end["usage"]["deltas"] == 10


async def test_json_stream_text_frames(server_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, [JSON_SP]) as ws:
            assert ws.subprotocol == JSON_SP
            await _json_stream(ws)


async def test_no_subprotocol_means_json(server_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url) as ws:
            assert ws.subprotocol is None
            await _json_stream(ws)


async def test_first_supported_offer_wins(server_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, ["lowlat.v9.json", JSON_SP, PROTO]) as ws:
            assert ws.subprotocol == JSON_SP
        async with _connect(server_url, [PROTO, JSON_SP]) as ws:
            assert ws.subprotocol == PROTO


async def test_unsupported_subprotocol_refused_with_403(server_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(InvalidStatus) as info:
            async with _connect(server_url, ["lowlat.v9.proto", "chat"]):
                pass
        assert info.value.response.status_code == 403


async def test_cross_origin_refused_same_host_allowed(server_url: str) -> None:
    # Section 3: a browser Origin from another host is refused with HTTP 403; the same host is fine.
    host = server_url.removeprefix("ws://").split("/", 1)[0]
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(InvalidStatus) as info:
            async with connect(server_url, origin="http://evil.example", proxy=None, open_timeout=TIMEOUT):  # type: ignore[arg-type]
                pass
        assert info.value.response.status_code == 403
        async with connect(server_url, origin=f"http://{host}", proxy=None, open_timeout=TIMEOUT) as ws:  # type: ignore[arg-type]
            await JsonClient(ws).handshake()


async def test_json_errors_keep_connection_open(server_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, [JSON_SP]) as ws:
            client = JsonClient(ws)
            await client.handshake()
            await client.send(type="ping", id=42)
            assert await client.recv() == {"type": "pong", "id": 42}
            await client.send(type="frobnicate", stream_id=1)  # unknown kind: section 2
            err = await client.recv()
            assert (err["type"], err["stream_id"], err["code"]) == ("error", 0, "unsupported_message")
            await client.send(type="request", stream_id=0, text="hi")  # section 8.1
            err = await client.recv()
            assert (err["type"], err["stream_id"], err["code"]) == ("error", 0, "bad_request")
            await client.send(type="request", stream_id=7, text="a", data="YQ==")  # two inputs: 8.1
            err = await client.recv()
            assert (err["type"], err["stream_id"], err["code"]) == ("error", 7, "bad_request")
            await client.send(type="welcome", session_id="x")  # server-only kind: section 8.5
            err = await client.recv()
            assert (err["type"], err["stream_id"], err["code"]) == ("error", 0, "protocol_error")
            # Still open: a stream works.
            await client.send(type="request", stream_id=7, text="hi", params={"delay": 0, "tokens": 10})
            deltas, end = await client.collect(7)
            assert _check_stream(deltas, end, 10, lambda d: d["text"]) == DEMO_REPLY_10


async def test_json_cancel_and_stream_limits(server_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, [JSON_SP]) as ws:
            client = JsonClient(ws)
            welcome = await client.handshake()
            slow = {"delay": 0.05, "tokens": 100_000}
            limit = welcome["max_streams"]
            for sid in range(1, limit + 1):
                await client.send(type="request", stream_id=sid, text="hi", params=slow)
            await client.send(type="request", stream_id=1, text="hi", params=slow)
            await client.send(type="request", stream_id=limit + 1, text="hi", params=slow)
            seqs: dict[int, int] = {}
            ends: dict[int, dict[str, Any]] = {}
            errors: dict[int, dict[str, Any]] = {}

            async def track() -> None:
                msg = await client.recv()
                if msg["type"] == "delta":
                    assert msg["seq"] == seqs.get(msg["stream_id"], 0) + 1
                    seqs[msg["stream_id"]] = msg["seq"]
                elif msg["type"] == "end":
                    ends[msg["stream_id"]] = msg
                elif msg["type"] == "error":
                    errors[msg["stream_id"]] = msg
                elif msg["type"] == "ping":
                    await client.send(type="pong", id=msg["id"])
                else:
                    pytest.fail(f"unexpected {msg}")

            while len(errors) < 2:
                await track()
            assert errors[0]["code"] == "stream_id_in_use"  # on stream 0: stream 1 keeps running
            assert errors[limit + 1]["code"] == "too_many_streams"
            assert errors[limit + 1]["retryable"] is True
            # Cancel everything; each running stream ends with End("cancelled"), seq contiguous.
            for sid in range(1, limit + 1):
                await client.send(type="cancel", stream_id=sid)
            await client.send(type="cancel", stream_id=999)  # unknown id: ignored
            while len(ends) < limit:
                await track()
            assert set(errors) == {0, limit + 1}  # no Error ended a running stream
            for sid, end in ends.items():
                assert end["finish_reason"] == "cancelled"
                assert end["last_seq"] == seqs.get(sid, 0)
            # The stream ids are free again.
            await client.send(type="request", stream_id=1, text="hi", params={"delay": 0, "tokens": 10})
            deltas, end = await client.collect(1)
            assert _check_stream(deltas, end, 10, lambda d: d["text"]) == DEMO_REPLY_10


async def test_json_binary_frame_closes_1003(server_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, [JSON_SP]) as ws:
            client = JsonClient(ws)
            await client.handshake()
            await ws.send(b"\x10")
            err = await client.recv()
            assert (err["type"], err["stream_id"], err["code"]) == ("error", 0, "invalid_payload")
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1003


async def test_json_first_message_must_be_hello(server_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, [JSON_SP]) as ws:
            client = JsonClient(ws)
            await client.send(type="request", stream_id=1, text="hi")
            err = await client.recv()
            assert (err["type"], err["stream_id"], err["code"]) == ("error", 0, "protocol_error")
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1002


# ==================================================================================== proto client
@dataclass
class Schema:
    """Message classes built from the shipped .proto in a private descriptor pool."""

    Envelope: Any
    error_names: dict[int, str]


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> Schema:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("proto") / "lowlat_v1.desc"
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    rc = protoc.main([
        "protoc", f"-I{SCHEMA.parent}", f"-I{include}", f"--descriptor_set_out={out}", "--include_imports",
        str(SCHEMA),
    ])
    assert rc == 0, "protoc failed"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()  # not the default pool: no clash with lowlat_mw.proto
    for fd in fds.file:
        pool.Add(fd)
    envelope = message_factory.GetMessageClass(pool.FindMessageTypeByName("lowlat.v1.Envelope"))
    # Section 6: JSON spelling = lower-case enum name; ERROR_CODE_UNSPECIFIED is "unspecified".
    enum = pool.FindEnumTypeByName("lowlat.v1.ErrorCode")
    names = {v.number: ("unspecified" if v.number == 0 else v.name.lower()) for v in enum.values}
    return Schema(envelope, names)


CODEC_IDS = {"zstd": 1, "lz4": 2, "snappy": 3}


class ProtoClient:
    """docs/protocol.md section 5.1: header byte (0x10 | codec id) + Envelope."""

    def __init__(self, ws: ClientConnection, schema: Schema, offer: list[str]) -> None:
        self.ws, self.schema, self.offer = ws, schema, offer
        self.negotiated: list[str] = []
        self.limit = 8 * 1024 * 1024
        self.codecs_seen: list[int] = []

    def envelope(self, **kw: Any) -> Any:
        return self.schema.Envelope(**kw)

    async def send(self, env: Any, codec: str | None = None) -> int:
        """Send `env`, compressed with `codec` when that makes it smaller; returns the codec id used."""
        payload = env.SerializeToString()
        codec_id = 0
        if codec is not None:
            assert codec in self.negotiated
            compressed = _compress(codec, payload)
            if len(compressed) < len(payload):  # section 10.4: only when strictly smaller
                codec_id, payload = CODEC_IDS[codec], compressed
        await self.ws.send(bytes((0x10 | codec_id,)) + payload)
        return codec_id

    async def recv(self) -> Any:
        frame = await self.ws.recv()
        assert isinstance(frame, bytes), "lowlat.v1.proto carries binary frames only"
        assert frame, "empty binary frame"
        header = frame[0]
        assert header >> 4 == 1, f"frame version {header >> 4}"
        codec_id = header & 0x0F
        self.codecs_seen.append(codec_id)
        payload = frame[1:]
        if codec_id:
            names = {v: k for k, v in CODEC_IDS.items()}
            assert names.get(codec_id) in self.negotiated, f"codec id {codec_id} was not negotiated"
            payload = _decompress(names[codec_id], payload, self.limit)
        return self.schema.Envelope.FromString(payload)

    async def handshake(self) -> Any:
        hello = self.envelope()
        hello.hello.client = "spec-test/1"
        hello.hello.compression.extend(self.offer)
        await self.send(hello)
        env = await self.recv()
        assert self.codecs_seen[-1] == 0, "Welcome is never compressed"
        assert env.WhichOneof("msg") == "welcome"
        self.negotiated = list(env.welcome.compression)
        return env.welcome

    def request(self, stream_id: int, text: str, params: dict[str, Any]) -> Any:
        env = self.envelope()
        req = env.request
        req.stream_id, req.model, req.text = stream_id, "demo", text
        for key, value in params.items():
            if isinstance(value, str):
                req.params.fields[key].string_value = value
            else:
                req.params.fields[key].number_value = value
        return env

    async def collect(self, stream_id: int) -> tuple[list[Any], Any]:
        deltas: list[Any] = []
        while True:
            env = await self.recv()
            kind = env.WhichOneof("msg")
            if kind == "ping":
                pong = self.envelope()
                pong.pong.id = env.ping.id
                await self.send(pong)
            elif kind == "delta" and env.delta.stream_id == stream_id:
                deltas.append(env.delta)
            elif kind in ("end", "error") and getattr(env, kind).stream_id == stream_id:
                return deltas, getattr(env, kind)


def _compress(codec: str, data: bytes) -> bytes:
    assert codec == "zstd", "this client only implements zstd"
    import zstandard

    return zstandard.ZstdCompressor(level=1, write_content_size=True).compress(data)


def _decompress(codec: str, data: bytes, limit: int) -> bytes:
    assert codec == "zstd", "this client only offers zstd"
    import zstandard

    return zstandard.ZstdDecompressor().decompress(data, max_output_size=limit)


@pytest.mark.parametrize("offer", [["zstd"], []], ids=["zstd", "no-compression"])
async def test_proto_stream_binary_frames(server_url: str, schema: Schema, offer: list[str]) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, [PROTO, JSON_SP]) as ws:
            assert ws.subprotocol == PROTO
            client = ProtoClient(ws, schema, offer)
            welcome = await client.handshake()
            assert list(welcome.compression) == offer
            assert welcome.max_frame_size > 0 and welcome.max_streams >= 1
            assert welcome.session_id and not welcome.resumed
            params: dict[str, Any] = {"delay": 0, "tokens": 10}
            if offer:
                # Section 10.2: after Welcome either side may compress with a negotiated codec.
                params["padding"] = "x" * 4096
            used = await client.send(client.request(1, "hi", params), codec=offer[0] if offer else None)
            assert used == (CODEC_IDS[offer[0]] if offer else 0)
            deltas, end = await client.collect(1)
            assert end.DESCRIPTOR.name == "End", f"stream failed: {end}"
            assert _check_stream(deltas, end, 10, lambda d: d.text) == DEMO_REPLY_10
            assert end.usage["deltas"] == 10
            assert set(client.codecs_seen) <= {0} | {CODEC_IDS[c] for c in offer}


async def test_proto_errors(server_url: str, schema: Schema) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, [PROTO]) as ws:
            client = ProtoClient(ws, schema, [])
            await client.handshake()
            # An Envelope whose message kind is unknown (field 100; 15 is Input since v1.3): unsupported_message,
            # stays open.
            await ws.send(b"\x10\xa2\x06\x00")
            env = await client.recv()
            assert env.WhichOneof("msg") == "error"
            assert (env.error.stream_id, schema.error_names[env.error.code]) == (0, "unsupported_message")
            # Compressed frame with a codec that was not negotiated: Error then close 1007.
            await ws.send(b"\x11" + b"\x00" * 8)
            env = await client.recv()
            assert schema.error_names[env.error.code] == "unsupported_compression"
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1007


async def test_proto_text_frame_closes_1003(server_url: str, schema: Schema) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, [PROTO]) as ws:
            client = ProtoClient(ws, schema, [])
            await client.handshake()
            await ws.send('{"type":"ping","id":1}')
            env = await client.recv()
            assert (env.error.stream_id, schema.error_names[env.error.code]) == (0, "invalid_payload")
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1003


async def test_proto_bad_frame_version_closes_1002(server_url: str, schema: Schema) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with _connect(server_url, [PROTO]) as ws:
            client = ProtoClient(ws, schema, [])
            await client.handshake()
            await ws.send(b"\x20")
            env = await client.recv()
            assert (env.error.stream_id, schema.error_names[env.error.code]) == (0, "protocol_error")
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1002
