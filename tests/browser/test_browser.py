"""The browser client and the demo page in a real headless Chromium, against a real server.

One browser for the whole run and one `lowlat-mw serve` for the module keep this quick. The
demo page is driven as a person would (typing, clicking Send and Stop); what the page saw is read
from ``window.lowlatDemo``. Set DEMO_SCREENSHOT=docs/demo.png to refresh the README's
screenshot.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import PageServer, start_uvicorn, wait_until

from lowlat_mw.client import connect_sync
from lowlat_mw.errors import ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import ProtoCodec
from lowlat_mw.testing import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]


def js(page: Any, script: str, *args: Any) -> Any:
    return page.execute_script(script, *args)


def open_demo(page: Any, url: str) -> None:
    page.get(url)
    wait_until(lambda: js(page, "const d = window.lowlatDemo; return Boolean(d && d.client && d.client.connected)"),
               what="the demo page to connect")


def send_prompt(page: Any, prompt: str) -> None:
    from selenium.webdriver.common.by import By

    box = page.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(prompt)
    page.find_element(By.ID, "send").click()


def finished(page: Any, count: int = 1, timeout: float = 20.0) -> list[dict[str, Any]]:
    """The page's finished streams, once there are `count`."""
    return wait_until(lambda: (lambda s: s if len(s) >= count else None)(js(page, "return window.lowlatDemo.streams")),
                      timeout, what=f"{count} finished stream(s)")


def text_of(page: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return page.find_element(By.ID, element_id).text


def reference_reply(port: int, prompt: str, **params: Any) -> str:
    """The same request through the Python client: what the page must show, token for token."""
    with connect_sync(f"ws://127.0.0.1:{port}/ws", mode="json") as client:
        return client.complete(prompt, params={**params, "delay": 0})


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def refused_handshakes(port: int) -> float:
    _, _, body = http_get(f"http://127.0.0.1:{port}/metrics")
    found = re.search(r'^lowlat_handshakes_refused_total\{[^}]*reason="forbidden"[^}]*\} (\S+)$', body.decode(), re.M)
    return float(found.group(1)) if found else 0.0


# ----------------------------------------------------------------------------- the demo page
@pytest.mark.parametrize("mode", ["json", "proto"])
def test_demo_page_streams_a_reply(page, demo_server, mode, tmp_path):
    prompt = f"streamed to a browser over {mode}"
    open_demo(page, f"{demo_server.http_url}/?mode={mode}&delay=0.01")
    assert text_of(page, "state") == "connected"
    send_prompt(page, prompt)
    [stream] = finished(page)
    expected = reference_reply(demo_server.port, prompt)
    assert stream["error"] is None and stream["finish"] == "stop", stream
    assert stream["text"] == expected
    assert stream["seqs"] == list(range(1, len(expected.split(" ")) + 1))  # one delta per word, in order
    assert text_of(page, "output") == expected
    assert text_of(page, "status").startswith(f"done: {len(stream['seqs'])} tokens")
    # the live numbers: time to first token, tokens/s, heartbeat RTT (a Ping from the page), bytes
    assert re.fullmatch(r"[\d.]+ ms", text_of(page, "ttft")), text_of(page, "ttft")
    assert re.fullmatch(r"[\d.]+", text_of(page, "tps")), text_of(page, "tps")
    wait_until(lambda: re.fullmatch(r"[\d.]+ ms", text_of(page, "rtt")), what="a heartbeat RTT")
    assert stream["raw"] == len(expected.encode())
    assert stream["wire"] > stream["raw"]
    per_token = math.floor((stream["wire"] - stream["raw"]) / len(stream["seqs"]) + 0.5)  # (JS Math.round)
    assert text_of(page, "bytes") == (f"{stream['wire']} B for {stream['raw']} B of text "
                                      f"({len(stream['seqs'])} tokens, {per_token} B framing each)")
    client = js(page, "const c = window.lowlatDemo.client; return {mode: c.mode, sub: c.codec.subprotocol}")
    assert client == {"mode": mode, "sub": f"lowlat.v1.{mode}"}

    shot = tmp_path / "demo.png"
    assert page.find_element("tag name", "body").screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("DEMO_SCREENSHOT")
    if target and mode == "proto":
        shutil.copyfile(shot, target)


def test_stop_cancels_the_reply(page, demo_server):
    open_demo(page, f"{demo_server.http_url}/?delay=0.1&tokens=12")
    send_prompt(page, "stop me")
    wait_until(lambda: js(page, "return window.lowlatDemo.seqs.length") >= 3, what="three tokens")
    page.find_element("id", "stop").click()
    [stream] = finished(page)
    full = reference_reply(demo_server.port, "stop me", tokens=12)
    assert stream["finish"] == "cancelled", stream
    assert 3 <= len(stream["seqs"]) < len(full.split(" "))
    assert full.startswith(stream["text"])
    assert stream["seqs"] == list(range(1, len(stream["seqs"]) + 1))
    assert text_of(page, "status").startswith("stopped after")
    assert not page.find_element("id", "stop").is_enabled()
    # the connection is still good for the next reply
    send_prompt(page, "again")
    second = finished(page, 2)[1]
    assert second["finish"] == "stop" and second["text"] == reference_reply(demo_server.port, "again", tokens=12)


def test_cut_connection_reconnects_and_resumes_without_loss(page, demo_server):
    prompt = "survive a dropped connection"
    with FaultProxy(("127.0.0.1", demo_server.port)) as proxy:
        # page and WebSocket both through the proxy: same origin, and the cut hits the live socket
        open_demo(page, f"http://127.0.0.1:{proxy.port}/?delay=0.08&tokens=30&backoff=0.3")
        send_prompt(page, prompt)
        wait_until(lambda: js(page, "return window.lowlatDemo.seqs.length") >= 5, what="five tokens")
        proxy.cut_all()
        [stream] = finished(page, timeout=30)
        states = js(page, "return window.lowlatDemo.states.map(s => s.label)")
    expected = reference_reply(demo_server.port, prompt, tokens=30)
    assert stream["error"] is None and stream["finish"] == "stop", stream
    assert stream["text"] == expected  # no token lost ...
    assert stream["seqs"] == list(range(1, 31))  # ... or repeated
    # the badge went connected -> reconnecting -> resumed
    cut = states.index("reconnecting")
    assert "connected" in states[:cut] and "resumed" in states[cut:], states
    assert js(page, "return window.lowlatDemo.client.resumes") >= 1


def test_dead_link_is_noticed_by_the_client_heartbeat(page, demo_server):
    with FaultProxy(("127.0.0.1", demo_server.port)) as proxy:
        page.get(f"http://127.0.0.1:{proxy.port}/lowlat/lowlat.js")
        js(page, """import("/lowlat/lowlat.js").then((m) => {
            const c = window.c = new m.LowLatClient("/ws", { heartbeatInterval: 300, heartbeatTimeout: 1000,
                                                          openTimeout: 1000, backoff: { base: 0.2, retries: 30 } });
            window.states = [];
            window.seqs = [];
            window.text = "";
            c.on("statechange", (d) => window.states.push([d.state, d.code ?? null, d.resumed]));
            c.stream("stalled link", { params: { delay: 0.1, tokens: 30 },
              onDelta(chunk, delta) { window.text += chunk; window.seqs.push(delta.seq); },
              onEnd(end) { window.result = end.finish_reason; },
              onError(err) { window.result = err.name; } });
        })""")
        wait_until(lambda: js(page, "return window.seqs ? window.seqs.length : 0") >= 3, what="three tokens")
        proxy.stall()  # the link goes silent: no close, no error, nothing
        wait_until(lambda: ["reconnecting", 4001, False] in js(page, "return window.states"),
                   what="the client heartbeat to give the silent connection up (4001)")
        proxy.resume()
        assert wait_until(lambda: js(page, "return window.result || null"), timeout=30, what="the end") == "stop"
        seen = js(page, "return [window.text, window.seqs, window.c.resumes]")
    expected = reference_reply(demo_server.port, "stalled link", tokens=30)
    assert seen[0] == expected and seen[1] == list(range(1, 31)) and seen[2] >= 1


def test_cross_origin_page_is_refused(page, demo_server):
    server = f"127.0.0.1:{demo_server.port}"
    other = PageServer({"/": f"""<!doctype html><meta charset=utf-8><title>another origin</title>
<script type="module">
import {{ LowLatClient }} from "http://{server}/lowlat/lowlat.js";
const client = new LowLatClient("ws://{server}/ws", {{ backoff: {{ base: 0.05, retries: 1 }} }});
client.connect().then(
  () => {{ window.result = {{ connected: true }}; }},
  (err) => {{ window.result = {{ connected: false, name: err.name, message: err.message, state: client.state,
                                  attempts: err.attempts }}; }});
</script>"""})
    try:
        before = refused_handshakes(demo_server.port)
        page.get(other.url + "/")
        result = wait_until(lambda: js(page, "return window.result || null"), what="the connect attempt to fail")
    finally:
        other.close()
    assert result["connected"] is False, result
    assert result["name"] == "ReconnectFailedError" and result["attempts"] == 2, result
    assert result["state"] == "idle"
    # the server refused both handshakes (HTTP 403 on the Origin check): not a network failure
    assert refused_handshakes(demo_server.port) - before == 2


def test_page_answers_server_heartbeats(page, demo_server):
    open_demo(page, f"{demo_server.http_url}/")
    js(page, """window.beats = {ping: 0, pong: 0};
        const c = window.lowlatDemo.client;
        c.on("message", ({msg}) => { if (msg.type === "ping") window.beats.ping++; });
        c.on("send", ({msg}) => { if (msg.type === "pong") window.beats.pong++; });""")
    # the server pings every 0.5 s (--set heartbeat_interval=0.5); every Ping gets its Pong at once
    beats = wait_until(lambda: (lambda b: b if b["ping"] >= 3 else None)(js(page, "return window.beats")),
                       what="three server Pings")
    assert beats["pong"] >= beats["ping"] - 1, beats
    assert js(page, "const c = window.lowlatDemo.client; return [c.state, c.connections]") == ["connected", 1]


def test_client_api_iteration_errors_and_close_codes(page, demo_server):
    page.get(f"{demo_server.http_url}/lowlat/lowlat.js")
    result = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        (async () => {
          const m = await import("/lowlat/lowlat.js");
          const out = {};
          const client = new m.LowLatClient({ mode: "proto", backoff: { base: 0.05, retries: 1 } });
          out.chunks = [];
          const iterated = client.stream("iterate", { params: { tokens: 4, delay: 0 } });
          for await (const chunk of iterated) out.chunks.push(chunk);
          const failing = client.stream({ text: "fail", params: { tokens: 5, fail_after: 2, delay: 0 } });
          try { await failing.text(); } catch (err) {
            out.modelError = { name: err.name, code: err.code, streamId: err.streamId, retryable: err.retryable,
                               isStreamError: err instanceof m.StreamError, deltas: failing.deltas };
          }
          const early = client.stream("break early", { params: { delay: 0.05 } });
          for await (const chunk of early) break;  // leaving the loop cancels the stream on the server
          out.early = await early.done.then((end) => end.finish_reason, (err) => err.name);
          out.rtt = await client.ping();
          // a message over the server's max_frame_size: Error message_too_big, close 1009 (final)
          const big = client.stream("x".repeat(1100000));
          out.big = await big.done.then(() => null, (err) => (
            { name: err.name, code: err.code, reconnect: err.reconnect, meaning: err.meaning }));
          out.stateAfterBig = client.state;
          out.afterClosed = await client.stream("more").done.then(() => null, (err) => err.name);
          out.alias = [m.canonicalCloseCode(4107), m.closeCodeReconnects(4102), m.closeCodeReconnects(1006),
                       m.closeCodeReconnects(4002), m.closeCodeReconnects(1000)];
          const b = new m.Backoff({ base: 1, factor: 2, cap: 30 });
          out.backoff = [0, 1, 2, 10].map((n) => b.ceiling(n));
          out.jitterOk = Array.from({ length: 50 }, (_, i) => b.delay(i % 6))
            .every((d, i) => d >= 0 && d <= b.ceiling(i % 6));
          return out;
        })().then(done, (err) => done({ error: String(err && err.stack || err) }));
    """)
    assert "error" not in result, result
    assert "".join(result["chunks"]) == reference_reply(demo_server.port, "iterate", tokens=4)
    assert result["modelError"] == {"name": "StreamError", "code": "model_error", "streamId": 2, "retryable": False,
                                    "isStreamError": True, "deltas": 2}
    assert result["early"] == "cancelled"
    assert result["rtt"] > 0
    assert result["big"] == {"name": "ConnectionClosedError", "code": 1009, "reconnect": False,
                             "meaning": "message too big"}
    assert result["stateAfterBig"] == "closed" and result["afterClosed"] == "ConnectionClosedError"
    assert result["alias"] == [1007, False, True, True, False]
    assert result["backoff"] == [1, 2, 4, 30] and result["jitterOk"]


# ----------------------------------------------------------------------------- the Protobuf codec
def test_protobuf_codec_matches_the_spec_and_the_python_codec(page, demo_server):
    page.get(f"{demo_server.http_url}/lowlat/lowlat.js")  # any page of the origin, to import the module
    py = ProtoCodec()
    from_python = {
        "welcome": py.encode(ev.Welcome(session_id="s1", resume_token="t.k", max_frame_size=1048576, max_streams=8,
                                        heartbeat_interval_ms=30000, server="lowlat-mw", resumed=True,
                                        resume_window_ms=60000, flow_window=262144, revision=1)),
        "end": py.encode(ev.End(stream_id=3, last_seq=41, finish_reason="cancelled",
                                timings_ms={"total": 1.5, "first_delta": 0.25},
                                usage={"deltas": 41, "output_bytes": 9})),
        "error": py.encode(ev.Error(stream_id=2, code=ErrorCode.RESUME_FAILED, message="gone", retryable=True)),
        "goaway": py.encode(ev.GoAway(reason="bye", reconnect_after_ms=500)),
        "data": py.encode(ev.Delta(stream_id=5, seq=300, data=bytes([0, 1, 2, 255]))),
        "text": py.encode(ev.Delta(stream_id=1, seq=1, text="héllo \U0001f600")),
        "ping": py.encode(ev.Ping(id=7)),
        # protocol v1.1
        "push_text": py.encode(ev.Push(topic="group:news", text="héllo")),
        "push_data": py.encode(ev.Push(topic="session:s1", data=bytes([0, 1, 255]))),
        "push_empty": py.encode(ev.Push(topic="user:ann", text="")),
        "subscribed": py.encode(ev.Subscribed(id=7, group="news")),
        "refused": py.encode(ev.Subscribed(id=9, group="admin", leave=True, code=ErrorCode.UNAUTHORIZED,
                                           message="not in push_groups")),
        # protocol v1.3
        "tool_call": py.encode(ev.Delta(stream_id=2, seq=3, tool_call=ev.ToolCall("lookup", '{"q": "é"}',
                                                                                   id="call_2_3"))),
        "bare_call": py.encode(ev.Delta(stream_id=2, seq=4, tool_call=ev.ToolCall("now", ""))),
        "input_seq": py.encode(ev.Welcome(session_id="s1", resumed=True, revision=3, input_seq={1: 2, 7: 300})),
    }
    result = page.execute_async_script("""
        const [frames, done] = [arguments[0], arguments[arguments.length - 1]];
        const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join(" ");
        const unhex = (h) => Uint8Array.from(h.split(" ").filter(Boolean), (x) => parseInt(x, 16)).buffer;
        import("/lowlat/lowlat.js").then(({ protoCodec, jsonCodec, ToolCall }) => {
          const decoded = {};
          for (const [k, h] of Object.entries(frames)) {
            const m = protoCodec.decode(unhex(h));
            if (m.data) m.data = Array.from(m.data);
            if (m.tool_call) m.tool_call = { isToolCall: m.tool_call instanceof ToolCall, ...m.tool_call };
            decoded[k] = m;
          }
          done({
            decoded,
            specDelta: protoCodec.decode(unhex("10 22 0c 08 01 10 01 1a 06 48 65 6c 6c 6f 21")),
            specHello: hex(protoCodec.encode({ type: "hello", client: "my-client/1.0", compression: ["zstd", "lz4"] })),
            request: hex(protoCodec.encode({ type: "request", stream_id: 9, model: "m",
              messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "hi \u00e9" }],
              params: { tokens: 3, temperature: 0.5, name: "x", on: true, none: null,
                        list: [1, "a", { deep: false }] } })),
            data: hex(protoCodec.encode({ type: "request", stream_id: 10, data: new Uint8Array([0, 200, 7]) })),
            hello: hex(protoCodec.encode({ type: "hello", client: "c", resume_token: "tok", last_seq: { 1: 41, 3: 0 },
              flow_window: 262144, auth: "secret" })),
            hello11: hex(protoCodec.encode({ type: "hello", client: "c", revision: 1 })),
            subscribe: [false, true].map((leave) => hex(protoCodec.encode(
              { type: "subscribe", id: 300, group: "team-\u00e9", leave }))),
            small: ["cancel", "ping", "pong", "ack"].map((type) => hex(protoCodec.encode(
              { type, stream_id: 4, id: 4, seq: 12, done: true }))),
            inputs: [  // (v1.3) as the client's Stream builds them
              { text: "more \u00e9" }, { text: "" }, { data: new Uint8Array([0, 255]) },
              { tool_result: { id: "call_2_3", content: JSON.stringify({ temp: 21 }) } },
              { tool_result: { id: "c", content: "RangeError: no", is_error: true }, end: true }, { end: true },
            ].map((item, i) => hex(protoCodec.encode({ type: "input", stream_id: 2, seq: i + 1, ...item }))),
            jsonInput: jsonCodec.encode({ type: "input", stream_id: 2, seq: 3, data: new Uint8Array([0, 255]) }),
            jsonCall: jsonCodec.decode(JSON.stringify({ type: "delta", stream_id: 1, seq: 2,
              tool_call: { id: "c1", name: "lookup", arguments: JSON.stringify({ q: 1 }) } })).tool_call,
            jsonWelcome: jsonCodec.decode('{"type":"welcome","resumed":true,"input_seq":{"1":2}}').input_seq,
          });
        }, (err) => done({ error: String(err) }));
    """, {k: v.hex(" ") for k, v in from_python.items()})
    assert "error" not in result, result
    d = result["decoded"]
    assert d["welcome"] == {"type": "welcome", "session_id": "s1", "resume_token": "t.k", "compression": [],
                            "max_frame_size": 1048576, "max_decompressed_size": 0, "max_streams": 8,
                            "heartbeat_interval_ms": 30000, "idle_timeout_ms": 0, "server": "lowlat-mw",
                            "resumed": True, "resume_window_ms": 60000, "flow_window": 262144, "revision": 1,
                            "input_seq": {}, "contexts": {}}
    assert d["end"] == {"type": "end", "stream_id": 3, "last_seq": 41, "finish_reason": "cancelled",
                        "timings_ms": {"total": 1.5, "first_delta": 0.25}, "usage": {"deltas": 41, "output_bytes": 9}}
    assert d["error"] == {"type": "error", "stream_id": 2, "code": "resume_failed", "message": "gone",
                          "retryable": True}
    assert d["goaway"] == {"type": "goaway", "reason": "bye", "reconnect_after_ms": 500}
    assert d["data"] == {"type": "delta", "stream_id": 5, "seq": 300, "data": [0, 1, 2, 255]}
    assert d["text"] == {"type": "delta", "stream_id": 1, "seq": 1, "text": "héllo \U0001f600"}
    assert d["ping"] == {"type": "ping", "id": 7}
    assert d["push_text"] == {"type": "push", "topic": "group:news", "text": "héllo"}
    assert d["push_data"] == {"type": "push", "topic": "session:s1", "data": [0, 1, 255]}
    assert d["push_empty"] == {"type": "push", "topic": "user:ann", "text": ""}
    assert d["subscribed"] == {"type": "subscribed", "id": 7, "group": "news", "leave": False, "code": "unspecified",
                               "message": ""}
    assert d["refused"] == {"type": "subscribed", "id": 9, "group": "admin", "leave": True, "code": "unauthorized",
                            "message": "not in push_groups"}
    assert d["tool_call"] == {"type": "delta", "stream_id": 2, "seq": 3, "tool_call": {
        "isToolCall": True, "id": "call_2_3", "name": "lookup", "arguments": '{"q": "é"}', "args": {"q": "é"}}}
    assert d["bare_call"]["tool_call"] == {"isToolCall": True, "id": "", "name": "now", "arguments": "",
                                           "args": None}
    assert d["input_seq"]["input_seq"] == {"1": 2, "7": 300} and d["input_seq"]["revision"] == 3
    assert result["jsonCall"] == {"id": "c1", "name": "lookup", "arguments": '{"q":1}', "args": {"q": 1}}
    assert result["jsonWelcome"] == {"1": 2}
    assert json.loads(result["jsonInput"]) == {"type": "input", "stream_id": 2, "seq": 3, "data": "AP8="}
    # docs/protocol.md's examples, byte for byte
    assert result["specDelta"] == {"type": "delta", "stream_id": 1, "seq": 1, "text": "Hello!"}
    assert result["specHello"] == ("10 0a 1a 0a 0d 6d 79 2d 63 6c 69 65 6e 74 2f 31 2e 30 "
                                   "12 04 7a 73 74 64 12 03 6c 7a 34")

    def decode(hexed: str) -> ev.Event:
        return py.decode(bytes.fromhex(hexed.replace(" ", "")), limit=1 << 20, allowed=())

    assert decode(result["request"]) == ev.Request(
        stream_id=9, model="m", messages=(ev.ChatMessage(role="system", content="Be brief."),
                                      ev.ChatMessage(role="user", content="hi é")),
        params={"tokens": 3, "temperature": 0.5, "name": "x", "on": True, "none": None,
                "list": [1, "a", {"deep": False}]})
    assert decode(result["data"]) == ev.Request(stream_id=10, data=bytes([0, 200, 7]))
    assert decode(result["hello"]) == ev.Hello(client="c", resume_token="tok", last_seq={1: 41, 3: 0},
                                               flow_window=262144, auth="secret")
    assert decode(result["hello11"]) == ev.Hello(client="c", revision=1)
    assert [decode(h) for h in result["subscribe"]] == [ev.Subscribe(id=300, group="team-é"),
                                                        ev.Subscribe(id=300, group="team-é", leave=True)]
    assert [decode(h) for h in result["small"]] == [
        ev.Cancel(stream_id=4), ev.Ping(id=4), ev.Pong(id=4), ev.Ack(stream_id=4, seq=12, done=True)]
    assert [decode(h) for h in result["inputs"]] == [
        ev.Input(stream_id=2, seq=1, text="more é"), ev.Input(stream_id=2, seq=2, text=""),
        ev.Input(stream_id=2, seq=3, data=b"\x00\xff"),
        ev.Input(stream_id=2, seq=4, tool_result=ev.ToolResult(id="call_2_3", content='{"temp":21}')),
        ev.Input(stream_id=2, seq=5, tool_result=ev.ToolResult(id="c", content="RangeError: no", is_error=True),
                 end=True),
        ev.Input(stream_id=2, seq=6, end=True)]


# ----------------------------------------------------------------------------- the React hook
@pytest.fixture(scope="module")
def react_modules(npm_react: Any) -> Path:
    """React 18's UMD builds from npm (examples/react/package.json), installed in the background."""
    problem = npm_react.wait()
    if problem:
        pytest.skip(f"the React example page is not tested: {problem}")
    return npm_react.folder / "node_modules"


@pytest.fixture
def react_server(react_modules: Path) -> Iterator[Any]:
    """examples/react/app.py in uvicorn, with React's node_modules from the temporary folder."""
    from starlette.routing import Mount
    from starlette.staticfiles import StaticFiles

    from examples.react.app import app

    app.router.routes.insert(0, Mount("/react/node_modules", StaticFiles(directory=react_modules)))
    server = start_uvicorn(app)
    try:
        yield server
    finally:
        server.stop()
        del app.router.routes[0]


def test_react_hook_streams_resumes_and_cleans_up(page, react_server):
    page.get_log("browser")  # (drops what earlier tests logged)
    with FaultProxy(("127.0.0.1", react_server.port)) as proxy:
        page.get(f"http://127.0.0.1:{proxy.port}/react/?delay=0.08&tokens=30&backoff=0.3")
        wait_until(lambda: text_of(page, "state") == "connected", what="the hook to connect")
        page.find_element("id", "send").click()
        wait_until(lambda: len(text_of(page, "text").split(" ")) >= 5, what="five tokens")
        proxy.cut_all()
        wait_until(lambda: text_of(page, "result"), timeout=30, what="the reply to end")
        assert text_of(page, "result") == "finished: stop"
        assert text_of(page, "state") == "resumed"
        assert text_of(page, "text") == reference_reply(react_server.port, "Hello from React", tokens=30)
        # unmounting the component closes its WebSocket
        assert js(page, "return window.chatClient.state") == "connected"
        page.find_element("id", "toggle").click()
        wait_until(lambda: js(page, "return window.chatClient.state") == "closed", what="the socket to close")
        assert text_of(page, "unmounted").startswith("Unmounted")
    severe = [e["message"] for e in page.get_log("browser") if e["level"] == "SEVERE"]
    # the cut shows as one failed WebSocket in the console; nothing else may go wrong
    assert not [m for m in severe if "WebSocket" not in m], severe


# ----------------------------------------------------------------------------- static files
def test_static_files_over_http(demo_server):
    base = demo_server.http_url
    status, headers, body = http_get(f"{base}/lowlat/lowlat.js")
    assert status == 200 and headers["content-type"] == "text/javascript; charset=utf-8"
    assert b"export class LowLatClient" in body
    assert headers["access-control-allow-origin"] == "*" and headers["x-content-type-options"] == "nosniff"
    assert http_get(f"{base}/lowlat/lowlat.js", {"If-None-Match": headers["etag"]})[0] == 304
    for path in ("/", "/lowlat/", "/lowlat/demo.html"):
        status, headers, body = http_get(base + path)
        assert status == 200 and headers["content-type"].startswith("text/html"), path
        assert b'data-ws-path="/ws"' in body and b'src="/lowlat/demo.js"' in body and b'href="/metrics"' in body
    for path in ("/lowlat/nope.js", "/lowlat/../cli.py", "/lowlat/%2e%2e/cli.py", "/lowlat/static.py",
                 "/lowlat/package.json", "/lowlat/lowlat.d.ts"):  # (the npm package's files stay unserved)
        assert http_get(base + path)[0] == 404, path


def test_static_files_from_flask_and_django(tmp_path):
    from flask import Flask

    from lowlat_mw.adapters.flask import LowLat
    from lowlat_mw.demo import demo_model

    app = Flask(__name__)
    LowLat(app, model=demo_model, client_path="/static/lowlat", path="/ai")
    client = app.test_client()
    reply = client.get("/static/lowlat/lowlat.js")
    assert reply.status_code == 200 and reply.content_type == "text/javascript; charset=utf-8"
    assert client.get("/static/lowlat/lowlat.js", headers={"If-None-Match": reply.headers["ETag"]}).status_code == 304
    demo = client.get("/static/lowlat/")
    assert demo.status_code == 200 and b'data-ws-path="/ai"' in demo.data
    assert b'src="/static/lowlat/demo.js"' in demo.data
    assert client.get("/static/lowlat/missing.js").status_code == 404

    # Django in a subprocess: its settings are process-wide
    script = """
import json, django
from django.conf import settings
settings.configure(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"], LOWLAT_MW={})
django.setup()
from lowlat_mw.adapters.channels import client_urlpatterns
urlpatterns = client_urlpatterns("ui/lowlat/", ws_path="/ws/ai/")
from django.test import Client
c = Client()
js, demo, missing = c.get("/ui/lowlat/lowlat.js"), c.get("/ui/lowlat/"), c.get("/ui/lowlat/x.js")
print(json.dumps([js.status_code, js["Content-Type"], demo.status_code, demo.content.decode(), missing.status_code]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    js_status, js_type, demo_status, demo_html, missing = json.loads(out.stdout)
    assert (js_status, js_type, demo_status, missing) == (200, "text/javascript; charset=utf-8", 200, 404)
    assert 'data-ws-path="/ws/ai/"' in demo_html and 'src="/ui/lowlat/demo.js"' in demo_html


async def asgi_get(app: Any, path: str) -> tuple[int, str]:
    """GET `path` from an ASGI app in-process: (status, body)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]).decode()


async def test_client_path_setting_and_serve_defaults(monkeypatch):
    import argparse

    from lowlat_mw import static_files
    from lowlat_mw.errors import SettingsError
    from lowlat_mw.servers.cli import _serve_options, build_app
    from lowlat_mw.settings import Settings

    monkeypatch.delenv("LOWLAT_CLIENT_PATH", raising=False)
    ns = argparse.Namespace(set=[], path=None, metrics_path=None, client_path=None)
    assert _serve_options(ns)["client_path"] == "/lowlat"
    ns.client_path = ""
    assert _serve_options(ns)["client_path"] == ""
    ns.client_path, ns.path = None, "/lowlat"  # the WebSocket took the default: keep off it
    assert "client_path" not in _serve_options(ns)
    for bad in ("lowlat", "/", "/ws", "/metrics/"):
        with pytest.raises(SettingsError, match="client_path"):
            Settings(client_path=bad, metrics_path="/metrics")
    settings = Settings(client_path="/ui/")
    assert static_files.lookup("/ui", settings).name == "demo.html"
    assert static_files.lookup("/ui/lowlat.js", settings).name == "lowlat.js"
    for other in ("/uix/lowlat.js", "/ui/x/lowlat.js", "/lowlat.js", "/ui/static_files.py"):
        assert static_files.lookup(other, settings) is None, other
    assert static_files.lookup("/ui/lowlat.js", Settings()) is None  # off by default
    assert static_files.respond(static_files.asset("lowlat.js"), "POST").status == 405
    head = static_files.respond(static_files.asset("lowlat.js"), "HEAD")
    assert head.status == 200 and head.body == b"" and dict(head.headers)["content-length"] != "0"

    off = build_app(None, client_path="")  # demo off: the text home page
    assert "lowlat-mw is serving" in (await asgi_get(off, "/"))[1]
    assert (await asgi_get(off, "/lowlat/lowlat.js"))[0] == 404
    on = build_app(None, client_path="/lowlat")
    assert 'src="/lowlat/demo.js"' in (await asgi_get(on, "/"))[1]
    assert (await asgi_get(on, "/elsewhere"))[0] == 404  # other paths reach the app
