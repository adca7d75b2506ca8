"""The health check a balancer polls (the health_path setting): 200 and the process's load while it takes
connections, 503 once it drains; served by the Starlette middleware, the Flask extension and lowlat-mw serve."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from support.ports import free_port

from lowlat_mw import connect
from lowlat_mw.endpoint import Endpoint, health
from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.testing.pytest_plugin import RunningServer

WAIT = 30.0


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.headers["content-type"].startswith("application/json")
            assert resp.headers["cache-control"] == "no-store"
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_report_counts_connections_and_running_streams_and_says_draining() -> None:
    gate = asyncio.Event()

    async def held(req):
        yield "first "
        await gate.wait()
        yield "last"

    app = LowLatASGI(held, registry=CollectorRegistry(), health_path="/healthz")
    server = RunningServer(app, path="/").start()
    try:
        status, before = _get(f"{server.http_url}/healthz")
        assert status == 200 and before["status"] == "ok" and before["pid"] == os.getpid()

        async def main() -> None:
            async with asyncio.timeout(WAIT), connect(server.url) as a, connect(server.url) as b:
                streams = [a.stream("x"), a.stream("y"), b.stream("z")]
                for s in streams:
                    assert await anext(aiter(s)) == "first "
                status, report = await asyncio.to_thread(_get, f"{server.http_url}/healthz")
                assert status == 200
                assert (report["connections"], report["streams"]) == (2, 3)  # (this app's endpoint only)
                assert app.endpoint.load() == (2, 3)
                server_loop = app.endpoint.loops
                assert server_loop  # (the streams ran on the server's own loop)
                gate_loop = next(iter(server_loop))
                gate_loop.call_soon_threadsafe(gate.set)
                for s in streams:
                    assert [c async for c in s] == ["last"]

        asyncio.run(main())
        app.endpoint.draining = True  # (what Endpoint.drain sets first)
        status, report = _get(f"{server.http_url}/healthz")
        assert status == 503 and report["status"] == "draining"
    finally:
        app.endpoint.draining = False
        server.stop()


def test_the_flask_extension_serves_it() -> None:
    from flask import Flask

    from lowlat_mw.adapters.flask import LowLat

    flask = Flask(__name__)
    flask.config["LOWLAT_MW"] = {"path": "/ws", "health_path": "/healthz"}
    LowLat(flask, model=lambda req: "x", registry=CollectorRegistry())
    server = RunningServer(flask).start()
    try:
        status, report = _get(f"{server.http_url}/healthz")
        assert status == 200 and set(report) == {"status", "connections", "streams", "pid"}
    finally:
        server.stop()


def test_health_of_several_endpoints_is_draining_only_when_all_are() -> None:
    a = LowLatASGI(lambda req: "x", registry=CollectorRegistry()).endpoint
    b = LowLatASGI(lambda req: "x", registry=CollectorRegistry()).endpoint
    assert health([a, b]) == (200, {"status": "ok", "connections": 0, "streams": 0, "pid": os.getpid()})
    a.draining = True  # one app drained, the other still serves: the process is healthy
    assert health([a, b])[0] == 200 and a.health()[0] == 503 and b.health()[0] == 200
    b.draining = True
    assert health([a, b]) == (503, {"status": "draining", "connections": 0, "streams": 0, "pid": os.getpid()})
    assert a in Endpoint.instances and health()[1].keys() == {"status", "connections", "streams", "pid"}


@pytest.mark.timeout(120)
def test_serve_fails_its_health_check_while_it_drains(tmp_path) -> None:
    """SIGTERM with a stream running: the health check fails at once (refused: serve stops accepting first; or
    503), while the stream still finishes."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWLAT_")}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "lowlat_mw", "serve", "--port", str(port), "--delay", "0.1",
                                 "--drain-grace", "20", "--log-level", "warning"], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + WAIT
        while True:
            try:
                assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
                time.sleep(0.05)

        async def main() -> None:
            async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{port}/ws") as client:
                stream = client.stream("hello")
                await anext(aiter(stream))  # the demo model streams a word every 0.1 s: ~5 s in all
                proc.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + WAIT
                while True:  # serve stops accepting first, so a check is refused (or answered 503 meanwhile)
                    try:
                        reply = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/healthz")
                    except OSError:
                        break
                    if reply[0] == 503:
                        assert reply[1]["status"] == "draining" and reply[1]["streams"] == 1
                        break
                    assert time.monotonic() < deadline, reply
                    await asyncio.sleep(0.05)
                assert "You said: 'hello'" in "".join([c async for c in stream])  # finished within the grace

        asyncio.run(main())
        assert proc.wait(WAIT) in (0, -signal.SIGTERM), log.read_text()  # (uvicorn re-raises the signal it drained on)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
