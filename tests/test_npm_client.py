"""The npm package's client under Node, as a new user met it (issue 38, items 11, 16 and 17).

* Leaving a ``for await`` loop early cancels the stream (the model sees it while the connection stays open).
* Node 20 has no global WebSocket: connecting failed after 12.7 s of retries with a message about cross-origin pages
  (the real cause only in ``e.cause``); now it fails at once saying to pass one as the ``WebSocket`` option.
* With the ``ws`` package the client can tell why a handshake failed: a wrong Origin and a wrong path give different
  errors (the HTTP status and the server's text, or a hint), not retried; a first connection to a closed port fails
  at once instead of retrying.

Needs Node.js with npm and tests/node's packages (``python3 dev.py test`` installs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.models import StopProbe
from test_npm_package import NODE, needs_node, project  # noqa: F401 - project: the packed package's fixture

from lowlat_mw.testing.pytest_plugin import RunningServer

pytestmark = [pytest.mark.timeout(180), needs_node]

WAIT = 20.0  # seconds the probe model waits for the model it watches to stop


class Probe(StopProbe):
    """Model "long" streams until stopped and says so in its ``finally``; model "probe" answers whether the "long"
    stream of the same prompt stopped (waiting up to WAIT for it): the Node program asks in-band, connection open."""

    async def model(self, req: Any):  # (an async generator)
        if req.model == "probe":
            stopped = await asyncio.to_thread(self.event(req.prompt).wait, WAIT)
            yield "stopped" if stopped else "running"
            return
        async with contextlib.aclosing(self.ticks(req)) as ticks:  # (closed with this one: its finally runs now)
            async for tick in ticks:
                yield tick


def served(model: Any) -> RunningServer:
    from starlette.applications import Starlette

    from lowlat_mw.adapters.starlette import LowLatMiddleware

    app = Starlette()
    app.add_middleware(LowLatMiddleware, model=model, path="/ws", registry=CollectorRegistry())
    return RunningServer(app).start()


def run(project: Path, name: str, program: str, *args: str) -> Any:  # noqa: F811 - the fixture's value
    (project / name).write_text(program)
    result = subprocess.run([NODE, name, *args], cwd=project, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


LEAVE_PROGRAM = """
import WebSocket from "ws";
import { connect, Backoff } from "lowlat-mw";

const out = {};
for (const mode of ["json", "proto"]) {
  const client = await connect(process.argv[2], { mode, WebSocket, backoff: new Backoff({ retries: 0 }) });
  for (const how of ["break", "throw"]) {
    const prompt = `${how} ${mode}`;
    const got = [];
    try {
      for await (const chunk of client.stream(prompt, { model: "long" })) {
        got.push(chunk);
        if (got.length === 2 && how === "break") break;
        if (got.length === 2) throw new Error("boom");
      }
    } catch (error) {
      got.push(error.message);
    }
    // asked on the same connection: did the model stop while the client stayed connected?
    out[prompt] = { got, model: await client.complete(prompt, { model: "probe" }), state: client.state };
  }
  out[mode] = client.connections;
  client.close();
}
console.log(JSON.stringify(out));
"""


def test_leaving_a_for_await_loop_early_cancels_the_stream(project: Path) -> None:  # noqa: F811
    probe = Probe()
    server = served(probe.model)
    try:
        out = run(project, "leave.mjs", LEAVE_PROGRAM, server.url)
    finally:
        server.stop()
    for mode in ("json", "proto"):
        assert out[f"break {mode}"] == {"got": ["tick0 ", "tick1 "], "model": "stopped", "state": "connected"}
        assert out[f"throw {mode}"] == {"got": ["tick0 ", "tick1 ", "boom"], "model": "stopped", "state": "connected"}
        assert out[mode] == 1


NO_WEBSOCKET_PROGRAM = """
delete globalThis.WebSocket;  // as on Node 20 (Node 22 has one)
const { connect, LowLatClient, NoWebSocketError } = await import("lowlat-mw");

const out = {};
const started = Date.now();
try {
  await connect(process.argv[2], { backoff: { base: 0.5, factor: 2, retries: 5, jitter: false } });
  out.connected = true;
} catch (error) {
  const ours = typeof NoWebSocketError === "function" && error instanceof NoWebSocketError;
  Object.assign(out, { name: error.name, message: error.message, ours });
}
out.waited = Date.now() - started;
const client = new LowLatClient(process.argv[2]);
out.stream = await client.stream("x").done.then(() => "done", (error) => error.name);
out.state = client.state;
console.log(JSON.stringify(out));
"""


def test_node_without_a_websocket_fails_at_once_saying_what_to_pass(project: Path) -> None:  # noqa: F811
    server = served(Probe().model)
    try:
        out = run(project, "nows.mjs", NO_WEBSOCKET_PROGRAM, server.url)
    finally:
        server.stop()
    waited = out.pop("waited")
    assert out == {
        "name": "NoWebSocketError", "ours": True, "stream": "NoWebSocketError", "state": "idle",
        "message": "no WebSocket implementation: this runtime has none (Node.js before 22): pass one as the "
                   'WebSocket option, e.g. `import WebSocket from "ws"; await connect(url, { WebSocket })`'}
    assert waited < 5000  # not retried (the backoff given would have waited 15.5 s)


REFUSED_PROGRAM = """
import WebSocket from "ws";
import { LowLatClient } from "lowlat-mw";

const [url, closed] = process.argv.slice(2);
const out = {};
const cases = [["origin", url, { Origin: "http://evil.example" }], ["path", url.replace("/ws", "/wss"), {}],
               ["closed", closed, {}]];
for (const [name, target, headers] of cases) {
  let attempts = 0;
  class Counted extends WebSocket {
    constructor(address, protocols) {
      super(address, protocols, { headers });
      attempts++;
    }
  }
  const client = new LowLatClient(target, { WebSocket: Counted,
                                            backoff: { base: 0.01, cap: 0.05, retries: 5, jitter: false } });
  try {
    await client.connect();
    out[name] = "connected";
  } catch (error) {
    out[name] = { name: error.name, message: error.message, status: error.status ?? null, attempts,
                  state: client.state };
  }
}
console.log(JSON.stringify(out));
"""


def test_with_ws_a_wrong_origin_a_wrong_path_and_a_closed_port_say_which(project: Path,  # noqa: F811
                                                                          unused_port: int) -> None:
    server = served(Probe().model)
    try:
        out = run(project, "refused.mjs", REFUSED_PROGRAM, server.url, f"ws://127.0.0.1:{unused_port}/ws")
    finally:
        server.stop()
    assert out["origin"] == {
        "name": "HandshakeRefusedError", "status": 403, "attempts": 1, "state": "idle",
        "message": "handshake refused with HTTP 403: lowlat-mw: cross-origin WebSocket refused: the page's Origin is "
                   "not in the server's allowed_origins"}
    assert out["path"] == {
        "name": "HandshakeRefusedError", "status": 403, "attempts": 1, "state": "idle",
        "message": "handshake refused with HTTP 403: no reason given: no WebSocket route at /wss (Starlette and "
                   "FastAPI refuse an unknown path with 403), an Origin the server does not allow (allowed_origins), "
                   "or no subprotocol it serves"}
    assert out["closed"] == {
        "name": "ReconnectFailedError", "status": None, "attempts": 1, "state": "idle",
        "message": f"could not connect to ws://127.0.0.1:{unused_port}/ws after 1 attempt: connection refused "
                   "(nothing listens there: is the server running, on this port?)"}
