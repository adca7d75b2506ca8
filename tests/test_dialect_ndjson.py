"""A second wire protocol on the engine, through real servers: the ndjson dialect (tests/support/ndjson.py) is a
sans-IO machine plus a route, and gets streaming, cancel, disconnects, errors and metrics from the engine
(ModelRunner, Session, the driver) without a change to it. Served by uvicorn's own WebSocket protocol (ASGI send and
receive) and by lowlat-mw's (direct writes and reads), on 127.0.0.1, talked to by a plain `websockets` client."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.ndjson import NDJSON, NdjsonMachine
from support.time import seconds
from support.waits import wait_until_sync
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from lowlat_mw.errors import CloseCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.actions import CancelStream, StartStream
from lowlat_mw.protocol.base import CloseConnection, SendFrame
from lowlat_mw.protocol.dialect import ServerMachine
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.servers.cli import build_app
from lowlat_mw.settings import Settings

WAIT = seconds(10.0)
SERVERS = {
    "uvicorn": {"ws": "websockets-sansio"},  # ASGI send and receive
    "lowlat-uvicorn": {"ws": "lowlat_mw.servers.uvicorn:WebSocketProtocol",  # direct writes and reads
                       "http": "lowlat_mw.servers.uvicorn:HttpToolsProtocol"},
}


class Probe:
    """What the models tell the test, across the server's thread."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()


def models(probe: Probe) -> dict[str, Any]:
    async def tokens(req: Any) -> AsyncIterator[str]:
        for word in req.text.split():
            yield word + " "

    async def whole(req: Any) -> str:
        return req.text.upper()

    async def slow(req: Any) -> AsyncIterator[str]:
        probe.started.set()
        try:
            yield "first"
            await asyncio.sleep(60)
            yield "never"
        finally:
            probe.stopped.set()

    async def boom(req: Any) -> AsyncIterator[str]:
        yield "x"
        raise ValueError("no")

    async def paced(req: Any) -> AsyncIterator[str]:
        for i in range(8):
            await asyncio.sleep(0.1)
            yield str(i)

    return {"tokens": tokens, "whole": whole, "slow": slow, "boom": boom, "paced": paced}


@dataclass
class Served:
    url: str
    port: int
    probe: Probe
    registry: CollectorRegistry
    server: str

    def sample(self, name: str, **labels: str) -> float:
        return sum(s.value for m in self.registry.collect() for s in m.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture(params=list(SERVERS))
def served(request: pytest.FixtureRequest, uvicorn_server: Any) -> Iterator[Served]:
    probe, registry = Probe(), CollectorRegistry()
    app = LowLatASGI(models(probe), dialects={"/ndjson": NDJSON}, registry=registry)
    srv = uvicorn_server(app, path="/ndjson", **SERVERS[request.param])
    yield Served(srv.url, srv.port, probe, registry, request.param)


async def until_done(ws: ClientConnection) -> list[dict[str, Any]]:
    """The lines of one stream, up to the one that says done."""
    lines = []
    async with asyncio.timeout(WAIT):
        while True:
            line = json.loads(await ws.recv())
            lines.append(line)
            if line.get("done"):
                return lines


async def closed_with(ws: ClientConnection) -> int | None:
    """Read until the server closes; its close code."""
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(WAIT):
            while True:
                await ws.recv()
    return ws.close_code


def request(model: str, text: str = "") -> str:
    return json.dumps({"model": model, "input": text})


# ================================================================================ through a real server
def test_an_async_generator_model_streams_one_line_per_chunk(served: Served) -> None:
    async def main() -> None:
        async with connect(served.url) as ws:
            await ws.send(request("tokens", "to be or not"))
            assert await until_done(ws) == [{"delta": "to "}, {"delta": "be "}, {"delta": "or "}, {"delta": "not "},
                                            {"done": True, "reason": "stop"}]
            await ws.send(request("tokens", "again"))  # the next stream on the same connection
            assert await until_done(ws) == [{"delta": "again "}, {"done": True, "reason": "stop"}]

    asyncio.run(main())


def test_a_whole_reply_model_is_one_delta_then_done(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with connect(served.url, subprotocols=["ndjson"]) as ws:  # (offered: answered with it)
            assert ws.subprotocol == "ndjson"
            await ws.send(request("whole", "shout"))
            assert await until_done(ws) == [{"delta": "SHOUT"}, {"done": True, "reason": "stop"}]
        async with connect(served.url) as ws:  # (none offered: logged by its frames' label)
            await ws.send(request("whole", "again"))
            await until_done(ws)

    with caplog.at_level("INFO", logger="lowlat_mw"):
        asyncio.run(main())
    opened = [r.getMessage().partition("open: ")[2] for r in caplog.records if " open: " in r.getMessage()]
    assert opened == ["ndjson, compression none", "ndjson, compression none"]


def test_cancel_stops_the_model_and_the_stream_ends_cancelled(served: Served) -> None:
    async def main() -> None:
        async with connect(served.url) as ws:
            await ws.send(request("slow"))
            assert json.loads(await ws.recv()) == {"delta": "first"}
            await ws.send(json.dumps({"cancel": True}))
            assert await until_done(ws) == [{"done": True, "reason": "cancelled"}]
            assert served.probe.stopped.wait(WAIT), "the model's finally did not run"
            await ws.send(request("whole", "after"))  # the connection goes on
            assert await until_done(ws) == [{"delta": "AFTER"}, {"done": True, "reason": "stop"}]

    asyncio.run(main())


@pytest.mark.parametrize("how", ["close-1001", "abort"])
def test_a_client_that_leaves_stops_the_model(served: Served, how: str) -> None:
    # 1001 and a dropped socket keep a lowlat.v1 session for its resume; a dialect without resume stops its models.
    async def main() -> None:
        ws = await connect(served.url)
        await ws.send(request("slow"))
        assert json.loads(await ws.recv()) == {"delta": "first"}
        if how == "abort":
            ws.transport.abort()
        else:
            await ws.close(1001)
        assert await asyncio.to_thread(served.probe.stopped.wait, WAIT), "the model's finally did not run"

    asyncio.run(main())
    wait_until_sync(lambda: served.sample("lowlat_streams") == 0, WAIT, what="the stream to end")


def test_bad_messages_get_an_error_line_and_the_documented_close(served: Served) -> None:
    async def main() -> None:
        async with connect(served.url) as ws:
            await ws.send(json.dumps({"input": "no model"}))  # a bad request: an error line, the connection goes on
            assert json.loads(await ws.recv())["error"]["code"] == "bad_request"
            await ws.send(request("nobody"))  # an unknown model: the stream ends with the engine's error
            assert (await until_done(ws))[0]["error"]["code"] == "unknown_model"
            await ws.send(request("boom"))  # a failing model
            lines = await until_done(ws)
            assert lines[0] == {"delta": "x"} and lines[1]["error"]["code"] == "model_error"
            await ws.send(request("slow"))
            await ws.recv()
            await ws.send(request("whole", "two at once"))  # one stream at a time
            assert "running" in json.loads(await ws.recv())["error"]["message"]
        for payload, code, close in (("not json", "invalid_payload", CloseCode.INVALID_PAYLOAD),
                                     (b"\x00binary", "bad_request", CloseCode.UNSUPPORTED_DATA)):
            async with connect(served.url) as ws:
                await ws.send(payload)
                assert json.loads(await ws.recv())["error"]["code"] == code
                assert await closed_with(ws) == close

    asyncio.run(main())


def test_metrics_count_its_connections_streams_and_errors(served: Served) -> None:
    async def main() -> None:
        async with connect(served.url) as ws:
            for _ in range(3):
                await ws.send(request("tokens", "a b"))
                await until_done(ws)
            await ws.send(json.dumps({"model": 1}))
            await ws.recv()

    asyncio.run(main())
    assert served.sample("lowlat_streams_finished_total", model="tokens", outcome="stop") == 3
    assert served.sample("lowlat_errors_total", code="bad_request") == 1
    writes = "direct" if served.server == "lowlat-uvicorn" else "send"  # (the corked writer frames the dialect's too)
    assert served.sample("lowlat_connections_opened_total", subprotocol="ndjson", writes=writes) == 1
    assert served.sample("lowlat_frames_received_total", subprotocol="ndjson") == 4


def test_a_server_shutting_down_drains_a_dialects_connections(uvicorn_server: Any) -> None:
    # lowlat-mw's uvicorn protocols drain on shutdown: the running stream finishes, a new one is refused, then 4002.
    srv = uvicorn_server(LowLatASGI(models(Probe()), dialects={"/ndjson": NDJSON}, metrics=False), path="/ndjson",
                         **SERVERS["lowlat-uvicorn"])

    async def main() -> None:
        async with connect(srv.url) as ws:
            await ws.send(request("paced"))
            assert json.loads(await ws.recv()) == {"delta": "0"}
            stopping = asyncio.ensure_future(asyncio.to_thread(srv.stop))
            lines: list[dict[str, Any]] = []
            while True:  # until the drain began: then a new stream is refused as such
                await ws.send(request("whole", "late"))
                while "error" not in (line := json.loads(await ws.recv())):
                    lines.append(line)
                if line["error"]["code"] == "draining":
                    break
                await asyncio.sleep(0.02)
            lines += await until_done(ws)
            assert [line["delta"] for line in lines if "delta" in line] == [str(i) for i in range(1, 8)]
            assert lines[-1] == {"done": True, "reason": "stop"}
            assert await closed_with(ws) == CloseCode.DRAINING
            await stopping

    asyncio.run(main())


def test_lowlat_v1_and_the_dialect_share_a_path_told_apart_by_subprotocol(uvicorn_server: Any) -> None:
    # lowlat-mw serve's app (build_app), with the dialect at lowlat.v1's own path.
    srv = uvicorn_server(build_app(models(Probe()), dialects={"/ws": NDJSON}, metrics=False))
    codec = codec_for("lowlat.v1.json")

    async def main() -> None:
        async with connect(srv.url, subprotocols=["lowlat.v1.json"]) as ws:
            await ws.send(codec.encode(ev.Hello()))
            assert type(codec.decode(await ws.recv(), limit=1 << 20)) is ev.Welcome
        for offered in (["ndjson"], None):  # (none offered: the first dialect listed at the path)
            async with connect(srv.url, subprotocols=offered) as ws:
                await ws.send(request("whole", "hi"))
                assert await until_done(ws) == [{"delta": "HI"}, {"done": True, "reason": "stop"}]
        with pytest.raises(InvalidStatus) as refused:
            await connect(srv.url, subprotocols=["nothing.v9"])
        assert refused.value.response.status_code == 403

    asyncio.run(main())


def test_the_starlette_middleware_routes_dialects_with_no_change_of_its_own(uvicorn_server: Any,
                                                                          starlette_app: Any) -> None:
    srv = uvicorn_server(starlette_app(models(Probe()), dialects={"/ndjson": NDJSON}, metrics=False), path="/ndjson")

    async def main() -> None:
        async with connect(srv.url) as ws:
            await ws.send(request("tokens", "starlette"))
            assert await until_done(ws) == [{"delta": "starlette "}, {"done": True, "reason": "stop"}]

    asyncio.run(main())


def test_a_websocket_route_of_the_apps_own_serves_a_dialect(uvicorn_server: Any) -> None:
    # FastAPI/Starlette's route form: the app routes, the endpoint serves the socket in the dialect it is told.
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    from lowlat_mw.adapters.starlette import LowLatEndpoint

    lowlat = LowLatEndpoint(model=models(Probe()), metrics=False)

    async def ndjson_route(websocket: Any) -> None:
        await lowlat.serve_websocket(websocket, dialect=NDJSON)

    srv = uvicorn_server(Starlette(routes=[WebSocketRoute("/chat", ndjson_route)]), path="/chat")

    async def main() -> None:
        async with connect(srv.url) as ws:
            await ws.send(request("whole", "routed"))
            assert await until_done(ws) == [{"delta": "ROUTED"}, {"done": True, "reason": "stop"}]

    asyncio.run(main())


# ================================================================================ the machine alone (sans-IO)
def machine(**settings: Any) -> NdjsonMachine:
    return NdjsonMachine(Settings(**settings), subprotocol=None, now=0.0, session_id="s", secret="t")


def test_the_machine_is_a_server_machine_and_starts_open() -> None:
    m = machine()
    assert isinstance(m, ServerMachine) and m.state.name == "OPEN" and not m.resumable


def test_the_machine_turns_lines_into_stream_events_and_back() -> None:
    m = machine()
    [start] = m.receive_data(request("echo", "hi"), 1.0)
    assert type(start) is StartStream and start.request == ev.Request(stream_id=1, model="echo", text="hi")
    assert m.send_chunk(1, "h", 1.5) == ['{"delta":"h"}']
    assert m.next_deadline() == float("inf")  # a stream runs: never idle
    assert m.receive_data('{"cancel":true}', 2.0) == [CancelStream(1)]
    assert m.receive_data('{"cancel":true}', 2.1) == []  # (cancelling already)
    [end] = m.finish_stream(1, 3.0, reason="cancelled")
    assert end == SendFrame('{"done":true,"reason":"cancelled"}') and m.deadline_moved
    assert m.session.streams == {}  # (no resume: the session keeps nothing of it)


def test_an_idle_connection_closes_with_4000_at_its_deadline() -> None:
    m = machine(idle_timeout=30.0)
    assert m.next_deadline() == 30.0
    assert m.tick(29.9) == []
    assert m.tick(30.0) == [CloseConnection(CloseCode.IDLE_TIMEOUT, "idle")] and m.closed


def test_a_draining_machine_refuses_new_streams() -> None:
    m = machine()
    assert m.drain() == []
    [refusal] = m.receive_data(request("echo"), 1.0)
    assert refusal.error.code.wire_name == "draining"
