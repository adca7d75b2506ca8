"""The same app under each of uvicorn's WebSocket implementations; subprotocol negotiation.

The raw-client tests speak the protocol with plain `websockets` and the generated Protobuf
module / hand-written JSON, as a third-party client following docs/protocol.md would.
"""

from __future__ import annotations

import asyncio
import importlib
import json

import pytest
from support.raw import JSON, PROTO, raw_connect
from websockets.exceptions import InvalidStatus

from lowlat_mw.client import connect
from lowlat_mw.proto import lowlat_v1_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

_LEGACY_WARNING = "ignore::uvicorn.config.UvicornDeprecationWarning"


def _ws_param(name):
    if name != "websockets":
        return pytest.param(name)
    # uvicorn marks its legacy `websockets` implementation deprecated with a UserWarning subclass
    # (UvicornDeprecationWarning) on import; that warning is expected for this parameter only.
    return pytest.param(name, marks=pytest.mark.filterwarnings(_LEGACY_WARNING))


WS_IMPLS = [_ws_param(n) for n in ("websockets-sansio", "wsproto", "websockets")]


def _require_impl(ws):
    module = {
        "websockets-sansio": "uvicorn.protocols.websockets.websockets_sansio_impl",
        "wsproto": "uvicorn.protocols.websockets.wsproto_impl",
        "websockets": "uvicorn.protocols.websockets.websockets_impl",
    }[ws]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(f"uvicorn ws={ws!r} is not importable here: {exc}")


async def echo_words(req):
    for word in req.prompt.split():
        await asyncio.sleep(0)
        yield word + "|"


@pytest.mark.parametrize("mode", ["proto", "json"])
@pytest.mark.parametrize("ws", WS_IMPLS)
async def test_streaming_under_each_uvicorn_ws_implementation(uvicorn_server, starlette_app, ws, mode):
    _require_impl(ws)
    srv = uvicorn_server(starlette_app(echo_words), ws=ws)
    async with asyncio.timeout(10), connect(srv.url, mode=mode) as client:
        stream = client.stream("one two three")
        assert [c async for c in stream] == ["one|", "two|", "three|"]
        assert stream.end.usage["deltas"] == 3
        assert client.welcome is not None
        assert await client.complete("again and again") == "again|and|again|"


def _pb_frame(env: pb.Envelope) -> bytes:
    return b"\x10" + env.SerializeToString()


def _pb_parse(frame: bytes) -> pb.Envelope:
    assert isinstance(frame, bytes), f"expected a binary frame, got {frame!r}"
    assert frame[0] == 0x10, f"uncompressed v1 header expected, got {frame[0]:#x}"
    return pb.Envelope.FromString(frame[1:])


@pytest.mark.parametrize("ws", WS_IMPLS)
async def test_proto_offered_gives_binary_frames(uvicorn_server, starlette_app, ws):
    _require_impl(ws)
    srv = uvicorn_server(starlette_app(echo_words), ws=ws)
    async with asyncio.timeout(10), raw_connect(srv.url, [PROTO]) as conn:
        assert conn.subprotocol == PROTO
        hello = pb.Envelope()
        hello.hello.client = "raw"
        await conn.send(_pb_frame(hello))
        welcome = _pb_parse(await conn.recv())
        assert welcome.WhichOneof("msg") == "welcome" and welcome.welcome.session_id
        req = pb.Envelope()
        req.request.stream_id = 7
        req.request.text = "a b"
        await conn.send(_pb_frame(req))
        kinds, texts = [], []
        while True:
            env = _pb_parse(await conn.recv())
            kinds.append(env.WhichOneof("msg"))
            if kinds[-1] == "delta":
                assert env.delta.stream_id == 7
                texts.append(env.delta.text)
            if kinds[-1] == "end":
                assert env.end.stream_id == 7 and env.end.last_seq == 2
                break
        assert kinds == ["delta", "delta", "end"]
        assert texts == ["a|", "b|"]


@pytest.mark.parametrize(
    "offered", [[JSON], [], [JSON, PROTO], ["x-unknown", JSON]], ids=["json", "none", "json-first", "unknown-first"]
)
@pytest.mark.parametrize("ws", WS_IMPLS)
async def test_json_gives_text_frames(uvicorn_server, starlette_app, ws, offered):
    _require_impl(ws)
    srv = uvicorn_server(starlette_app(echo_words), ws=ws)
    async with asyncio.timeout(10), raw_connect(srv.url, offered) as conn:
        assert conn.subprotocol == (JSON if offered else None)
        await conn.send(json.dumps({"type": "hello", "client": "raw"}))
        frame = await conn.recv()
        assert isinstance(frame, str), f"expected a text frame, got {frame!r}"
        assert json.loads(frame)["type"] == "welcome"
        await conn.send(json.dumps({"type": "request", "stream_id": 3, "text": "x y z"}))
        objs = []
        while not objs or objs[-1]["type"] != "end":
            frame = await conn.recv()
            assert isinstance(frame, str), f"expected a text frame, got {frame!r}"
            objs.append(json.loads(frame))
        assert [o.get("text") for o in objs[:-1]] == ["x|", "y|", "z|"]
        assert [o["seq"] for o in objs[:-1]] == [1, 2, 3]
        assert objs[-1]["last_seq"] == 3 and objs[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize("ws", WS_IMPLS)
async def test_unknown_subprotocol_is_refused(uvicorn_server, starlette_app, ws):
    _require_impl(ws)
    srv = uvicorn_server(starlette_app(echo_words), ws=ws)
    async with asyncio.timeout(10):
        with pytest.raises(InvalidStatus) as info:
            async with raw_connect(srv.url, ["lowlat.v2.proto", "chat"]):
                pass
        assert info.value.response.status_code == 403
        # and the server still serves a good client
        async with raw_connect(srv.url, [JSON]) as conn:
            assert conn.subprotocol == JSON


async def test_proto_only_server_refuses_json_and_no_offer(uvicorn_server, starlette_app):
    srv = uvicorn_server(starlette_app(echo_words, subprotocols=[PROTO]))
    async with asyncio.timeout(10):
        for offered in ([JSON], []):
            with pytest.raises(InvalidStatus) as info:
                async with raw_connect(srv.url, offered):
                    pass
            assert info.value.response.status_code == 403
        async with connect(srv.url) as client:
            assert await client.complete("still fine") == "still|fine|"
