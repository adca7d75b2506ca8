"""The browser client as an npm package: `npm pack` in lowlat_mw/static gives a package whose ES module streams
from a real server under Node (full-duplex streams too: tool calls and input, through dropped connections) and
whose type declarations a strict TypeScript program compiles against.

Needs Node.js with npm and tests/node's packages (TypeScript, ws: `python3 dev.py test` installs them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.testing.pytest_plugin import RunningServer

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "lowlat_mw" / "static"
NODE_MODULES = ROOT / "tests" / "node" / "node_modules"
NPM, NODE = shutil.which("npm"), shutil.which("node")
needs_node = pytest.mark.skipif(
    NPM is None or NODE is None or not (NODE_MODULES / "typescript").exists() or not (NODE_MODULES / "ws").exists(),
    reason="needs node, npm and tests/node's packages (`python3 dev.py test` installs them)")

NODE_PROGRAM = """
import WebSocket from "ws";
import { connect, LowLatClient, VERSION, Backoff } from "lowlat-mw";

const out = { version: VERSION, replies: {} };
for (const mode of ["json", "proto"]) {
  const client = await connect(process.argv[2], { mode, WebSocket, backoff: new Backoff({ retries: 0 }) });
  let text = "";
  for await (const chunk of client.stream("a b c")) text += chunk;
  const stream = client.stream("x y");
  const end = await stream.done;
  out.replies[mode] = { text, finish: end.finish_reason, deltas: end.usage.deltas, state: client.state,
                        ttfd: typeof stream.timeToFirstDelta, isClient: client instanceof LowLatClient };
  // warm-up (v1.2): asked for, and as the option of a new connection (in the background)
  const warm = await client.warmup(`warm ${mode}`, { params: { k: 1 } });
  const option = await connect(process.argv[2], { mode, WebSocket, warmup: { text: `option ${mode}` } });
  for (let i = 0; i < 500 && option.warmups === 0; i++) await new Promise((r) => setTimeout(r, 10));
  out.replies[mode].warmup = { finish: warm.finish_reason, last: warm.last_seq, warmups: client.warmups,
                               option: option.warmups };
  option.close();
  client.close();
}
console.log(JSON.stringify(out));
"""

TYPED_PROGRAM = """
import {
  Backoff, connect, ContextDocument, DUPLEX_REVISION, LowLatClient, LowLatError, PROTOCOL_REVISION, StreamError,
  ToolCall, type Chunk, type End, type Input, type Push, type PushIterator, type Stream, type Tool, type Welcome,
} from "lowlat-mw";

export async function main(url: string): Promise<string> {
  const client: LowLatClient = await connect(url, { mode: "proto", backoff: { retries: 2 }, auth: "token" });
  const welcome: Welcome | null = client.welcome;
  const stream: Stream = client.stream("hi", { params: { n: 1 }, onEnd(end: End) { console.log(end.finish_reason); } });
  let text = "";
  for await (const chunk of client.stream({ text: "x", model: "m" })) {
    text += typeof chunk === "string" ? chunk : chunk instanceof ToolCall ? chunk.name : String(chunk.length);
  }
  const end: End = await stream.done;
  const warmed: End | null = await client.warmup("system prompt", { model: "m" });  // v1.2
  const warmClient: LowLatClient = new LowLatClient(url, { warmup: { text: "system prompt", model: "m" } });
  const warmups: number = warmClient.warmups + (warmed?.last_seq ?? 0);
  // context (protocol v1.3)
  const doc: ContextDocument = await client.context("main.py", "print(1)\\n");
  doc.patch(6, 1, "2");
  doc.replace("print", "show");
  await doc.whenSynced(5000);
  const held: number = (client.welcome?.contexts["main.py"] ?? 0) + doc.version + doc.fullSends;
  const answer: string = await client.complete("q", { context: [doc, "other"], continues: stream });
  const rtt: number = await client.ping();
  const off = client.on("statechange", (detail) => console.log(detail.state, detail.previous));
  off();
  const wait: number = new Backoff({ base: 0.5 }).delay(1);
  // push (protocol v1.1)
  const revision: number = (welcome?.revision ?? 0) + PROTOCOL_REVISION;
  const listening = new AbortController();
  const pushes: PushIterator = client.pushes({ signal: listening.signal });
  const offPush = client.on("push", (push: Push) => {
    const body: string | Uint8Array = push.text !== undefined ? push.text : push.data;
    console.log(push.topic, body.length);
  });
  await client.subscribe("news", 5000);
  const joined: boolean = client.groups.has("news");
  for await (const push of pushes) {
    if (push.data !== undefined) console.log(push.data.byteLength);
    break;
  }
  listening.abort();
  await client.unsubscribe("news");
  offPush();
  try {
    await client.complete("y");
  } catch (err) {
    if (err instanceof StreamError) console.log(err.code, err.retryable);
  }
  // full-duplex streams (protocol v1.3)
  const lookup: Tool = async (args: { q: string }, call: ToolCall) => ({ temp: args.q.length, id: call.id });
  const agent: Stream = client.stream("paris", { model: "agent", tools: { lookup, clock: () => "noon" } });
  const seen: Chunk[] = [];
  for await (const chunk of agent) {
    seen.push(chunk);
    if (chunk instanceof ToolCall) {
      const args = chunk.args as { q: string } | null;
      await agent.sendResult(chunk, { temp: 21, q: args?.q }, { isError: false });
      await agent.sendResult(chunk.id, "no such city", { isError: true, end: false });
    } else if (typeof chunk === "string") {
      await agent.send(chunk);
      await agent.send(new Uint8Array([1, 2]), { end: false });
    }
  }
  await agent.endInput().catch((err: unknown) => err instanceof LowLatError);
  const sent: Input = { type: "input", stream_id: agent.id, seq: 1, tool_result: { id: "c", content: "{}" } };
  const inputSeq: number = (welcome?.input_seq[agent.id] ?? 0) + DUPLEX_REVISION + sent.seq;
  client.close(1000);
  const tail = `${joined}${pushes.dropped}${warmups}${inputSeq}${seen.length}${held}${answer}`;
  return `${text}${end.usage["deltas"]}${rtt}${wait}${welcome?.session_id}${revision}${tail}`;
}

// @ts-expect-error: mode is "json" or "proto"
new LowLatClient("ws://127.0.0.1/ws", { mode: "xml" });
// @ts-expect-error: stream() wants a prompt
new LowLatClient().stream(42);
// @ts-expect-error: a patch's offset is a number
new ContextDocument().patch("0", 1, "x");
// @ts-expect-error: a push group is named by a string
void new LowLatClient().subscribe(["news"]);
// @ts-expect-error: the client's groups change through subscribe() and unsubscribe()
new LowLatClient().groups.add("news");
// @ts-expect-error: a stream's input is text or bytes
void new LowLatClient().stream("x").send(42);
// @ts-expect-error: a tool is a function
new LowLatClient().stream("x", { tools: { lookup: "sunny" } });
"""


async def words(req):
    for word in req.prompt.split():
        yield word


WARMED: list[str] = []
words.warmup = lambda req: WARMED.append(req.prompt)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Node project with the packed lowlat-mw (and tests/node's ws) in its node_modules."""
    where = tmp_path_factory.mktemp("npm")
    result = subprocess.run([NPM, "pack", "--pack-destination", str(where)], cwd=STATIC, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    [tarball] = where.glob("lowlat-mw-*.tgz")
    with tarfile.open(tarball) as tar:
        names = sorted(tar.getnames())
        tar.extractall(where / "unpacked", filter="data")
    assert names == ["package/lowlat.d.ts", "package/lowlat.js", "package/package.json"], names
    project = where / "project"
    (project / "node_modules").mkdir(parents=True)
    (where / "unpacked" / "package").rename(project / "node_modules" / "lowlat-mw")
    (project / "node_modules" / "ws").symlink_to(NODE_MODULES / "ws")
    (project / "package.json").write_text('{"type": "module", "private": true}')
    return project


@needs_node
def test_the_package_streams_under_node_in_both_modes(project: Path) -> None:
    (project / "main.mjs").write_text(NODE_PROGRAM)
    server = RunningServer(LowLatASGI(words, registry=CollectorRegistry()), path="/").start()
    try:
        result = subprocess.run([NODE, "main.mjs", server.url], cwd=project, capture_output=True, text=True,
                                timeout=60)
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    for mode in ("json", "proto"):
        assert out["replies"][mode] == {"text": "abc", "finish": "stop", "deltas": 2, "state": "connected",
                                        "ttfd": "number", "isClient": True,
                                        "warmup": {"finish": "warmup", "last": 0, "warmups": 1, "option": 1}}
    assert WARMED == ["warm json", "option json", "warm proto", "option proto"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert out["version"] == version == json.loads((STATIC / "package.json").read_text())["version"]


OLDER_SERVER_PROGRAM = """
import WebSocket from "ws";
import { connect, Backoff } from "lowlat-mw";

const out = {};
for (const mode of ["json", "proto"]) {
  const client = await connect(process.argv[2], { mode, WebSocket, backoff: new Backoff({ retries: 0 }) });
  const skipped = await client.warmup("w");
  let refused = null;  // a resend that meets an older server (what every send goes through)
  try { await client._stream("w", {}, true).text(); } catch (error) { refused = [error.noWarmup, error.message]; }
  const running = client.stream("c d");  // input (v1.3) is refused by the client itself: nothing is sent
  const noInput = await running.send("x").then(() => null, (error) => error.message);
  out[mode] = { revision: client.welcome.revision, skipped, refused, warmups: client.warmups,
                text: await client.complete("a b"), noInput, after: await running.text() };
  client.close();
}
console.log(JSON.stringify(out));
"""


@needs_node
def test_the_package_sends_no_warm_up_to_an_older_server(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lowlat_mw.protocol import events as ev

    (project / "older.mjs").write_text(OLDER_SERVER_PROGRAM)
    monkeypatch.setattr(ev, "REVISION", 1)  # the server's Welcome says v1.1
    WARMED.clear()
    server = RunningServer(LowLatASGI(words, registry=CollectorRegistry()), path="/").start()
    try:
        result = subprocess.run([NODE, "older.mjs", server.url], cwd=project, capture_output=True, text=True,
                                timeout=60)
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    refused = [True, "the server speaks protocol revision 1: it has no warm-up"]
    for mode, seen in json.loads(result.stdout).items():
        assert seen == {"revision": 1, "skipped": None, "refused": refused, "warmups": 0, "text": "ab",
                        "noInput": "the server speaks protocol revision 1: stream input needs v1.3",
                        "after": "cd"}, mode
    assert WARMED == []  # the hook never ran


@needs_node
def test_the_type_declarations_check_a_strict_program(project: Path) -> None:
    (project / "check.ts").write_text(TYPED_PROGRAM)
    tsc = [NODE, str(NODE_MODULES / "typescript" / "bin" / "tsc"), "--noEmit", "--strict", "--module", "nodenext",
           "--moduleResolution", "nodenext", "--target", "es2022", "--lib", "es2022,dom,dom.asynciterable",
           "--skipLibCheck", "false", "check.ts"]
    result = subprocess.run(tsc, cwd=project, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (project / "wrong.ts").write_text('import { connect } from "lowlat-mw";\nconst n: number = await connect("x");\n')
    result = subprocess.run([*tsc[:-1], "wrong.ts"], cwd=project, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "LowLatClient" in result.stdout  # the declarations are what is checked


# ----------------------------------------------------------------------------- full-duplex streams (protocol v1.3)
async def agent(req):
    """Asks the client to run a tool, waits for its answer, then echoes every further input until the input ends."""
    yield "asking;"
    call = req.tool_call("lookup", {"q": req.prompt})
    yield call
    result = await req.inputs.result(call)
    yield f"got:{result.content}:{int(result.is_error)};"
    async for item in req.inputs:
        yield f"in:{item if isinstance(item, str) else item.decode()};"
    yield "done;"


def agent_server() -> RunningServer:
    """The agent model behind the Starlette middleware, as an app serves it."""
    from starlette.applications import Starlette

    from lowlat_mw.adapters.starlette import LowLatMiddleware

    app = Starlette()
    app.add_middleware(LowLatMiddleware, model=agent, path="/ws", registry=CollectorRegistry())
    return RunningServer(app).start()


def run_node(project: Path, name: str, program: str, url: str) -> dict:
    (project / name).write_text(program)
    result = subprocess.run([NODE, name, url], cwd=project, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


DUPLEX_PROGRAM = """
import WebSocket from "ws";
import { connect, Backoff, DUPLEX_REVISION, LowLatError, PROTOCOL_REVISION, ToolCall } from "lowlat-mw";

const shown = (chunk) => (chunk instanceof ToolCall
  ? { call: chunk.name, args: chunk.args, id: chunk.id !== "" } : chunk);
const out = { revisions: [PROTOCOL_REVISION, DUPLEX_REVISION] };
for (const mode of ["json", "proto"]) {
  const client = await connect(process.argv[2], { mode, WebSocket, backoff: new Backoff({ retries: 0 }) });
  const seen = out[mode] = { revision: client.welcome.revision };
  // answered by hand: the call is a chunk; the result, more text, bytes and the end go back on the same stream
  const stream = client.stream("paris");
  seen.byHand = [];
  for await (const chunk of stream) {
    seen.byHand.push(shown(chunk));
    if (chunk instanceof ToolCall) {
      await stream.sendResult(chunk, { temp: 21 });
      await stream.send("more");
      await stream.send(new TextEncoder().encode("bytes"), { end: true });
    }
  }
  seen.byHandEnd = stream.end.finish_reason;
  seen.afterEnd = await stream.send("late").then(() => null, (e) => [e instanceof LowLatError, e.message]);
  // answered by the stream's own tools (sync, async, failing); the caller never sees the call
  const tools = {
    lookup: async ({ q }) => (q === "boom" ? Promise.reject(new RangeError("no such city")) : `sunny in ${q}`),
  };
  seen.tools = [];
  for (const prompt of ["rome", "boom"]) {
    const s = client.stream(prompt, { tools });
    const got = [];
    for await (const chunk of s) {
      got.push(shown(chunk));
      if (chunk.startsWith("got:")) await s.endInput();
    }
    seen.tools.push(got);
  }
  // with callbacks, a tool returning an object (sent as JSON)
  const called = [];
  const cb = client.stream("oslo", {
    tools: { lookup: (args, call) => ({ ...args, named: call.name }) },
    onDelta(chunk) {
      called.push(shown(chunk));
      if (chunk.startsWith("got:")) cb.endInput();
    },
  });
  await cb.done;
  seen.callbacks = called;
  // nobody answers: text() says so (instead of "[object Object]") and the stream is cancelled
  const unanswered = client.stream("x");
  seen.unanswered = await unanswered.text().then((t) => t, (e) => [e instanceof LowLatError, e.message]);
  seen.unansweredEnd = (await unanswered.done).finish_reason;
  seen.connections = client.connections;
  client.close();
}
console.log(JSON.stringify(out));
"""


@needs_node
def test_the_package_answers_tool_calls_and_sends_input_in_both_modes(project: Path) -> None:
    server = agent_server()
    try:
        out = run_node(project, "duplex.mjs", DUPLEX_PROGRAM, server.url)
    finally:
        server.stop()
    assert out.pop("revisions") == [3, 3]
    call = {"call": "lookup", "args": {"q": "paris"}, "id": True}
    for mode in ("json", "proto"):
        assert out[mode] == {
            "revision": 3,
            "byHand": ["asking;", call, 'got:{"temp":21}:0;', "in:more;", "in:bytes;", "done;"],
            "byHandEnd": "stop",
            "afterEnd": [True, "stream 1 has ended: it takes no more input"],
            "tools": [["asking;", "got:sunny in rome:0;", "done;"],
                      ["asking;", "got:RangeError: no such city:1;", "done;"]],
            "callbacks": ["asking;", 'got:{"q":"oslo","named":"lookup"}:0;', "done;"],
            "unanswered": [True, 'the model asked for tool "lookup": pass tools: { "lookup": fn } to answer it, '
                                 "or iterate the stream and answer with sendResult()"],
            "unansweredEnd": "cancelled",
            "connections": 1,
        }, mode


RESUME_PROGRAM = """
import WebSocket from "ws";
import { connect, Backoff, ToolCall } from "lowlat-mw";

const shown = (chunk) => (chunk instanceof ToolCall ? `call:${chunk.name}` : chunk);
const guard = setTimeout(() => { console.error("timed out"); process.exit(3); }, 60000);  // (a hang is a failure)
const out = {};
for (const mode of ["json", "proto"]) {
  const client = await connect(process.argv[2], { mode, WebSocket,
                                                  backoff: new Backoff({ base: 0.01, cap: 0.05, retries: 20 }) });
  const next = async (s) => shown((await s.next()).value);
  const seen = out[mode] = { got: [] };
  const stream = client.stream("oslo");
  seen.got.push(await next(stream));
  const call = (await stream.next()).value;
  seen.got.push(shown(call));
  // 1. the link dies before the answer leaves: it waits, and the resume sends it
  client._ws.terminate();
  await stream.sendResult(call, "cold");
  seen.got.push(await next(stream));
  await stream.send("one");
  seen.got.push(await next(stream));  // the server has inputs 1 and 2: the next resume must not count on more
  // 2. input 3 goes out on a connection that loses it, then the link dies; input 4 waits for the resume
  const ws = client._ws;
  ws.send = () => {};
  await stream.send("two");
  const welcomed = new Promise((resolve) => client.on("welcome", (w) => resolve(w.input_seq)));
  ws.terminate();
  await stream.send("three", { end: true });
  for await (const chunk of stream) seen.got.push(shown(chunk));
  seen.inputSeq = await welcomed;
  seen.end = stream.end.finish_reason;
  // 3. the Request and its input are lost together: the server never saw the stream, so the client sends the
  // Request again after the resume, and all its input after it (another stream keeps the session worth resuming)
  const keeper = client.stream("keep");
  seen.keeper = [await next(keeper)];
  const keeperCall = (await keeper.next()).value;
  seen.keeper.push(shown(keeperCall));
  const lostWs = client._ws;
  lostWs.send = () => {};
  const lost = client.stream("bergen");
  await lost.send("early");
  lostWs.terminate();
  seen.lost = [];
  for await (const chunk of lost) {
    seen.lost.push(shown(chunk));
    if (chunk instanceof ToolCall) await lost.sendResult(chunk, "rain", { end: true });
  }
  await keeper.sendResult(keeperCall, "sun", { end: true });
  for await (const chunk of keeper) seen.keeper.push(shown(chunk));
  seen.resends = lost.resends;
  seen.resumes = client.resumes;
  seen.connections = client.connections;
  client.close();
}
clearTimeout(guard);
console.log(JSON.stringify(out));
"""


@needs_node
def test_the_package_sends_input_exactly_once_through_dropped_connections(project: Path) -> None:
    server = agent_server()
    try:
        out = run_node(project, "resume.mjs", RESUME_PROGRAM, server.url)
    finally:
        server.stop()
    for mode in ("json", "proto"):
        assert out[mode] == {
            # each input reached the model once, in order (the model echoes what it read)
            "got": ["asking;", "call:lookup", "got:cold:0;", "in:one;", "in:two;", "in:three;", "done;"],
            "inputSeq": {"1": 2},  # the resumed Welcome: the server held inputs 1 and 2 of stream 1
            "end": "stop",
            "lost": ["asking;", "call:lookup", "got:rain:0;", "in:early;", "done;"],
            "keeper": ["asking;", "call:lookup", "got:sun:0;", "done;"],
            "resends": 1,
            "resumes": 3,
            "connections": 4,
        }, mode



CONTEXT_PROGRAM = """
import WebSocket from "ws";
import { createHash } from "node:crypto";
import { connect, Backoff, ContextDocument, CONTEXT_REVISION } from "lowlat-mw";

const hex = (text) => createHash("sha256").update(text, "utf8").digest("hex");
let seed = 7;
const random = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const alphabet = ["a", "b", " ", "\\\\n", "é", "€", "😀"];
const word = (n) => Array.from({ length: n }, () => alphabet[random(alphabet.length)]).join("");
const out = {};
for (const mode of ["json", "proto"]) {
  const client = await connect(process.argv[2], { mode, WebSocket, history: true,
                                                  backoff: new Backoff({ retries: 0 }) });
  const doc = await client.context("main.txt", word(3000));
  const checks = [];
  for (let i = 0; i < 40; i++) {
    let offset = random(doc.text.length + 1);
    let length = random(Math.min(8, doc.text.length - offset) + 1);
    try { doc.patch(offset, length, word(random(6))); } catch (e) { if (!(e instanceof RangeError)) throw e; continue; }
    await doc.whenSynced();  // the server checked its SHA-256 against ours
    if (i % 10 === 9) checks.push((await client.complete("q", { context: [doc] })) === `main.txt=${hex(doc.text)};`);
  }
  // A refusal (a patch on a version the server does not have): the whole text goes out again by itself.
  client._send({ type: "context", name: "main.txt", version: doc.version + 1, base_version: 999, patches: [] });
  await new Promise((r) => setTimeout(r, 0));
  for (let i = 0; i < 500 && doc.fullSends < 2; i++) await new Promise((r) => setTimeout(r, 10));
  await doc.whenSynced();
  const recovered = (await client.complete("q", { context: [doc] })) === `main.txt=${hex(doc.text)};`;
  const first = client.stream("hi");
  const firstText = await first.text();
  const continued = await client.complete("more", { continues: first });
  let unknown = null;
  try { await client.complete("x", { continues: 4242 }); } catch (e) { unknown = e.code; }
  out[mode] = { checks, recovered, refusal: doc.refusal && doc.refusal.code, fullSends: doc.fullSends,
                synced: doc.synced, isDoc: doc instanceof ContextDocument, revision: client.welcome.revision,
                CONTEXT_REVISION, firstText, continued, unknown };
  client.close();
}
console.log(JSON.stringify(out));
"""


async def context_echo(req):
    import hashlib

    for name, doc in sorted(req.context.items()):
        yield f"{name}={hashlib.sha256(doc.text.encode()).hexdigest()};"
    for turn in req.history:
        yield f"[{turn.prompt}>{turn.output}]"
    if not req.context and not req.history:
        yield f"echo:{req.prompt}"


@needs_node
def test_the_package_patches_a_context_document_and_continues_a_stream(project: Path) -> None:
    (project / "context.mjs").write_text(CONTEXT_PROGRAM)
    server = RunningServer(LowLatASGI(context_echo, registry=CollectorRegistry()), path="/").start()
    try:
        result = subprocess.run([NODE, "context.mjs", server.url], cwd=project, capture_output=True, text=True,
                                timeout=60)
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    for mode, seen in json.loads(result.stdout).items():
        assert seen == {"checks": [True] * 4, "recovered": True, "refusal": "context_mismatch", "fullSends": 2,
                        "synced": True, "isDoc": True, "revision": 3, "CONTEXT_REVISION": 3,
                        "firstText": "echo:hi", "continued": "[hi>echo:hi]", "unknown": "context_mismatch"}, mode


def test_the_wheel_carries_the_npm_package(tmp_path: Path) -> None:
    """Issue 38: the wheel shipped lowlat.js but not package.json or lowlat.d.ts, so the installed package's static
    folder was no npm package (docs/browser.md: `npm pack` it from a checkout or an install). Built with pip from a
    copy of the sources (an in-tree build would leave build/ and *.egg-info in the checkout), with this environment's
    setuptools and nothing from the network: no build isolation, no index."""
    import importlib.metadata
    import zipfile

    try:  # (pyproject.toml's build-system: setuptools>=77; pip's build isolation would download it)
        setuptools = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("setuptools is not installed here: building the wheel would download it")
    if int(setuptools.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools} is older than the build needs (>=77): building would download one")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("lowlat_mw", "adapters"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "node_modules",
                                                                                       "*.tgz"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "--disable-pip-version-check", "-q", "-w", str(tmp_path / "dist"), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    [wheel] = (tmp_path / "dist").glob("lowlat_mw-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"lowlat_mw/static/{p.name}" for p in STATIC.iterdir() if p.is_file() and p.suffix != ".tgz"}
    assert shipped <= names, sorted(shipped - names)
    package = json.loads(zipfile.ZipFile(wheel).read("lowlat_mw/static/package.json"))
    assert {f"lowlat_mw/static/{f}" for f in package["files"]} <= names  # everything `npm pack` would put in


CUT_STREAM_PROGRAM = """
import { connect, Backoff, StreamError } from "lowlat-mw";

// A WebSocket double, no server: a Welcome for the Hello, and for each Request one Delta, then what its text names:
// an older server's End "cancelled" for a stream it cut (force-stopped), today's Error{internal, retryable}, or
// nothing until the client's own Cancel.
class FakeSocket {
  constructor(url, protocols) {
    this.protocol = protocols[0];
    this.readyState = 0;
    this.bufferedAmount = 0;
    setTimeout(() => { this.readyState = 1; if (this.onopen) this.onopen(); }, 0);
  }
  reply(msg) { setTimeout(() => { if (this.onmessage) this.onmessage({ data: JSON.stringify(msg) }); }, 0); }
  send(frame) {
    const msg = JSON.parse(frame);
    const end = (sid) => ({ type: "end", stream_id: sid, last_seq: 1, finish_reason: "cancelled", timings_ms: {},
      usage: {} });
    if (msg.type === "hello") {
      this.reply({ type: "welcome", session_id: "s", resume_token: "s.t", revision: 3, flow_window: 0,
        heartbeat_interval_ms: 30000, max_streams: 8, max_frame_size: 1048576 });
    } else if (msg.type === "request") {
      if (msg.text === "lost") { // (as a resume answers a Request it never received: send it again)
        this.reply({ type: "error", stream_id: msg.stream_id, code: "resume_failed", retryable: true,
          message: `stream ${msg.stream_id} is unknown to this session` });
        return;
      }
      this.reply({ type: "delta", stream_id: msg.stream_id, seq: 1, text: "a;" });
      if (msg.text === "cut-old") this.reply(end(msg.stream_id));
      if (msg.text === "cut-new") {
        this.reply({ type: "error", stream_id: msg.stream_id, code: "internal", retryable: true,
          message: "stream interrupted: the server stopped its model before it finished" });
      }
    } else if (msg.type === "cancel") this.reply(end(msg.stream_id));
  }
  close() { this.readyState = 3; }
}

const client = await connect("ws://127.0.0.1:9/ws", { WebSocket: FakeSocket, backoff: new Backoff({ retries: 0 }) });
const out = {};
for (const text of ["cut-old", "cut-new"]) {
  const chunks = [];
  try {
    for await (const chunk of client.stream(text)) chunks.push(chunk);
    out[text] = { chunks, ended: "quietly" };
  } catch (error) {
    out[text] = { chunks, error: [error instanceof StreamError, error.code, error.retryable] };
  }
}
try { await client.complete("lost"); } catch (error) {  // (issue 38, item 15: sent twice, never received)
  out.lost = [error.name, error.retryable, error.message.includes("the request was not delivered"),
    error.message.includes("sent 2 times")];
}
const asked = client.stream("asked");
const chunks = [];
for await (const chunk of asked) { chunks.push(chunk); asked.cancel(); }
out.asked = { chunks, finish: (await asked.done).finish_reason };
client.close();
console.log(JSON.stringify(out));
"""


@needs_node
def test_the_package_never_ends_a_stream_the_server_cut_quietly(project: Path) -> None:
    # Issue 38, item 7: a stream cut by a forced server shutdown must raise, never end the iteration quietly: an
    # End "cancelled" the client did not ask for (an older server's) is a StreamError, as today's Error{internal}.
    out = run_node(project, "cut.mjs", CUT_STREAM_PROGRAM, "")
    error = {"chunks": ["a;"], "error": [True, "internal", True]}
    assert out == {"cut-old": error, "cut-new": error, "asked": {"chunks": ["a;"], "finish": "cancelled"},
                   "lost": ["ResumeFailedError", True, True, True]}, out
