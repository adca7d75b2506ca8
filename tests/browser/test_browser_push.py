"""Server push (protocol v1.1) in the browser client: lowlat.js in a real headless Chromium against a real server.

The server is an app in uvicorn in this process (one for the module), so the test publishes with
``lowlat_mw.publish(..., store="memory")`` and its model ``announce`` publishes from inside a request. The page
subscribes to a group, gets what is published to the group and to its own session (JSON and Protobuf clients side
by side), is refused a group outside push_groups, leaves a group, joins its groups again after a drop that left it
on a new session, and turns a v1.0 server (a WebSocket stand-in) down clearly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import Uvicorn, start_uvicorn, wait_until
from prometheus_client import CollectorRegistry

import lowlat_mw
from lowlat_mw.demo import demo_model
from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.testing import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def announce(req: lowlat_mw.ModelRequest) -> Any:
    """Publish the prompt to params["target"]; reply with how many connections it reached."""
    yield str(await lowlat_mw.apublish(req.params["target"], req.prompt, store="memory"))


def publish(target: str, data: str | bytes) -> int:
    return lowlat_mw.publish(target, data, store="memory")


@pytest.fixture(scope="module")
def push_server() -> Iterator[Uvicorn]:
    app = LowLatASGI({"default": demo_model, "announce": announce}, client_path="/lowlat",
                     push_groups=("news", "team-*"), registry=CollectorRegistry())
    server = start_uvicorn(app)
    try:
        yield server
    finally:
        server.stop()


def run(page: Any, script: str, *args: Any) -> Any:
    """`script`'s body runs as an async function with `m` (the module) and `args`; returns what it returns."""
    result = page.execute_async_script(f"""
        const done = arguments[arguments.length - 1];
        const args = Array.from(arguments).slice(0, -1);
        import("/lowlat/lowlat.js").then(async (m) => {{ {script} }})
          .then(done, (err) => done({{ error: String(err && err.stack || err) }}));
    """, *args)
    assert not (isinstance(result, dict) and "error" in result), result
    return result


# Keeps what a client's "push" listener and its pushes() iterator saw in window.seen[name].
LISTEN = """
  window.seen ??= {};
  const listen = (name, client) => {
    const seen = window.seen[name] = { events: [], pushes: [], ended: null, subscribed: [] };
    const plain = (p) => ({ topic: p.topic, text: p.text ?? null, data: p.data ? Array.from(p.data) : null });
    client.on("push", (p) => seen.events.push(plain(p)));
    client.on("message", ({ msg }) => {
      if (msg.type === "subscribed") seen.subscribed.push([client.connections, msg.group, msg.code]);
    });
    const pushes = client.pushes();
    (async () => {
      try {
        for await (const p of pushes) seen.pushes.push(plain(p));
        seen.ended = "done";
      } catch (err) { seen.ended = err.name; }
    })();
    return seen;
  };
"""


def seen(page: Any, name: str) -> dict[str, Any]:
    return page.execute_script("return window.seen[arguments[0]]", name)


def pushes_of(page: Any, name: str, count: int) -> list[dict[str, Any]]:
    """The pushes client `name` got, once there are `count` (the "push" events saw the same ones)."""
    got = wait_until(lambda: (lambda s: s if len(s["pushes"]) >= count else None)(seen(page, name)),
                     what=f"{count} push(es) in the {name} client")
    assert got["events"] == got["pushes"]
    return got["pushes"]


def test_subscribe_and_receive_group_and_session_pushes(page, push_server):
    page.get(f"{push_server.http_url}/lowlat/lowlat.js")  # a page of the server's origin, to import the module
    joined = run(page, LISTEN + """
        const out = {};
        window.clients = {};
        for (const mode of ["json", "proto"]) {
          const client = window.clients[mode] = new m.LowLatClient({ mode, backoff: { base: 0.05, retries: 2 } });
          listen(mode, client);
          await client.subscribe("news");
          await client.subscribe("news");  // (again: nothing changes)
          const refused = [];
          for (const group of ["admin", ""]) {
            refused.push(await client.subscribe(group).then(() => null, (err) => ({
              name: err.name, code: err.code, message: err.serverMessage, isStreamError: err instanceof m.StreamError,
            })));
          }
          // the model publishes the prompt to the group, from inside this request
          const reached = await client.complete({ text: `from ${mode}`, model: "announce",
                                                  params: { target: "group:news" } });
          out[mode] = { session: client.welcome.session_id, revision: client.welcome.revision,
                        groups: [...client.groups], refused, reached };
        }
        return out;
    """)
    for mode in ("json", "proto"):
        assert joined[mode]["revision"] == 3 and joined[mode]["groups"] == ["news"], joined  # a v1.3 server
        admin, empty = joined[mode]["refused"]
        assert admin["name"] == "StreamError" and admin["code"] == "unauthorized" and admin["isStreamError"], admin
        assert "push_groups" in admin["message"]
        assert empty["code"] == "bad_request" and "1 to 200 characters" in empty["message"], empty
    assert (joined["json"]["reached"], joined["proto"]["reached"]) == ("1", "2")  # proto joined after json's

    # from the server's side: to each client's own session (bytes), then to the group (text)
    for mode in ("json", "proto"):
        assert publish(f"session:{joined[mode]['session']}", f"for {mode} only".encode() + b"\x00\xff") == 1
    assert publish("group:news", "héllo \U0001f600") == 2
    for mode in ("json", "proto"):
        expected = [{"topic": "group:news", "text": "from proto", "data": None},
                    {"topic": f"session:{joined[mode]['session']}", "text": None,
                     "data": list(f"for {mode} only".encode() + b"\x00\xff")},
                    {"topic": "group:news", "text": "héllo \U0001f600", "data": None}]
        if mode == "json":
            expected.insert(0, {"topic": "group:news", "text": "from json", "data": None})
        assert pushes_of(page, mode, len(expected)) == expected

    # leaving the group: group pushes reach the other client only; closing ends the iterators
    left = run(page, """
        await window.clients.json.unsubscribe("news");
        return [...window.clients.json.groups];
    """)
    assert left == []
    assert publish("group:news", "after json left") == 1
    assert pushes_of(page, "proto", 4)[-1]["text"] == "after json left"
    run(page, "window.clients.json.close(); window.clients.proto.close();")
    for mode in ("json", "proto"):
        wait_until(lambda mode=mode: seen(page, mode)["ended"], what=f"the {mode} iterator to end")
        assert seen(page, mode)["ended"] == "done"
    assert len(seen(page, "json")["pushes"]) == 4


def test_a_client_in_a_group_reconnects_and_resumes_its_session_in_it(page, push_server):
    with FaultProxy(("127.0.0.1", push_server.port)) as proxy:
        page.get(f"http://127.0.0.1:{proxy.port}/lowlat/lowlat.js")
        first = run(page, LISTEN + """
            const client = window.client = new m.LowLatClient({ mode: "proto", backoff: { base: 0.05, retries: 20 } });
            window.states = [];
            client.on("statechange", (d) => window.states.push(d.state));
            listen("cut", client);
            await client.subscribe("team-7");
            return client.welcome.session_id;
        """)
        proxy.cut_all()  # no stream is open: only the group makes the client reconnect (and resume)
        wait_until(lambda: [2, "team-7", "unspecified"] in seen(page, "cut")["subscribed"],
                   what="the client to send its group's Subscribe again on its second connection")
        after = page.execute_script("""const c = window.client; return {
            session: c.welcome.session_id, resumed: c.resumed, groups: [...c.groups], states: window.states };""")
        assert after["session"] == first and after["resumed"] is True and after["groups"] == ["team-7"], after
        assert "reconnecting" in after["states"] and after["states"][-1] == "connected", after
        assert publish(f"session:{first}", "to the same session") == 1  # resumed: the same session
        assert publish("group:team-7", "still listening") == 1
        assert pushes_of(page, "cut", 2) == [{"topic": f"session:{first}", "text": "to the same session", "data": None},
                                             {"topic": "group:team-7", "text": "still listening", "data": None}]
        page.execute_script("window.client.close()")


# A WebSocket stand-in: answers the Hello with the Welcome given, then sends what the test asks for.
FAKE_SOCKET = """
  class FakeSocket {
    constructor(url, protocols) {
      this.protocol = protocols[0];
      this.readyState = 0;
      window.socket = this;
      setTimeout(() => { this.readyState = 1; this.onopen && this.onopen(); }, 0);
    }
    send(frame) {
      const msg = JSON.parse(frame);
      (window.sent ??= []).push(msg);
      if (msg.type === "hello") this.receive(window.welcome);
    }
    receive(msg) { this.onmessage && this.onmessage({ data: JSON.stringify(msg) }); }
    close() { this.readyState = 3; }
    drop(code, reason) { this.readyState = 3; this.onclose && this.onclose({ code, reason }); }
  }
  const welcome = { type: "welcome", session_id: "s1", resume_token: "", compression: [], max_frame_size: 1048576,
    max_decompressed_size: 0, max_streams: 8, heartbeat_interval_ms: 30000, idle_timeout_ms: 0, server: "fake",
    resumed: false, resume_window_ms: 0, flow_window: 0 };
"""


def test_a_v1_0_server_is_turned_down_and_the_iterator_rules(page, push_server):
    page.get(f"{push_server.http_url}/lowlat/lowlat.js")
    result = run(page, FAKE_SOCKET + """
        const out = {};
        // a v1.0 server: its Welcome has no revision
        window.welcome = welcome;
        const old = new m.LowLatClient("ws://127.0.0.1:9/ws", { WebSocket: FakeSocket });
        out.v10 = await old.subscribe("news").then(() => null, (err) => ({ name: err.name, message: err.message }));
        out.hello = window.sent[0];
        out.groups = [...old.groups];
        old.close();

        // a v1.1 one: a bounded iterator, an aborted one, and the end of a connection closed for good
        window.welcome = { ...welcome, revision: 1 };
        const client = new m.LowLatClient("ws://127.0.0.1:9/ws", { WebSocket: FakeSocket, maxPushes: 2 });
        await client.connect();
        const bounded = client.pushes();
        const stop = new AbortController();
        const aborted = client.pushes({ signal: stop.signal });
        for (const text of ["a", "b", "c"]) window.socket.receive({ type: "push", topic: "group:x", text });
        window.socket.receive({ type: "push", topic: "group:x", data: "AAH/" });
        window.socket.receive({ type: "push", topic: "group:x" });  // (neither text nor data: ignored)
        stop.abort();
        out.aborted = (await aborted.next()).done;
        out.dropped = bounded.dropped;
        window.socket.drop(1008, "policy");  // a final close code
        out.bounded = [];
        try {
          for await (const p of bounded) out.bounded.push(p.text ?? Array.from(p.data));
        } catch (err) { out.boundedError = [err.name, err.code]; }
        out.afterClose = await client.pushes().next().then(() => null, (err) => err.name);
        out.state = client.state;
        return out;
    """)
    assert result["v10"] == {"name": "LowLatError",
                             "message": "the server at ws://127.0.0.1:9/ws speaks protocol v1.0: it has no push groups"}
    assert result["hello"]["revision"] == 3 and result["groups"] == []  # the client speaks v1.3
    assert result["aborted"] is True
    assert result["dropped"] == 2 and result["bounded"] == ["c", [0, 1, 255]]
    assert result["boundedError"] == ["ConnectionClosedError", 1008]
    assert result["afterClose"] == "ConnectionClosedError" and result["state"] == "closed"
