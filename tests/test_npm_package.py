"""The browser client as an npm package: `npm pack` in lowlat_mw/static gives a package whose ES module streams
from a real server under Node and whose type declarations a strict TypeScript program compiles against.

Needs Node.js with npm and tests/node's packages (TypeScript, ws: `python3 dev.py test` installs them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lowlat_mw.drivers.asgi import LowLatASGI
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
  Backoff, connect, ContextDocument, LowLatClient, PROTOCOL_REVISION, StreamError, type End, type Push,
  type PushIterator, type Stream, type Welcome,
} from "lowlat-mw";

export async function main(url: string): Promise<string> {
  const client: LowLatClient = await connect(url, { mode: "proto", backoff: { retries: 2 }, auth: "token" });
  const welcome: Welcome | null = client.welcome;
  const stream: Stream = client.stream("hi", { params: { n: 1 }, onEnd(end: End) { console.log(end.finish_reason); } });
  let text = "";
  for await (const chunk of client.stream({ text: "x", model: "m" })) {
    text += typeof chunk === "string" ? chunk : String(chunk.length);
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
  client.close(1000);
  const tail = `${joined}${pushes.dropped}${warmups}${held}${answer}`;
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
  out[mode] = { revision: client.welcome.revision, skipped, refused, warmups: client.warmups,
                text: await client.complete("a b") };
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
        assert seen == {"revision": 1, "skipped": None, "refused": refused, "warmups": 0, "text": "ab"}, mode
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
