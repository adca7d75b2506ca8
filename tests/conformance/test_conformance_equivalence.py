"""One scripted session gives the same frames through the direct path and the ASGI path, on every server that
offers direct writes, in both wire formats (issue 39: the gate measures behaviour, not call counts).

Each server that offers direct writes (conformance_servers.DIRECT_WRITES among SERVERS: uvicorn with our
websockets-sansio and wsproto protocols, our daphne runner, gunicorn with our thread bridge) runs twice, side by
side: as shipped (frames built by lowlat-mw and written straight to the socket) and with ``direct_writes`` off
(every frame through ASGI ``send``, or the WebSocket library's ``send`` under the thread bridge). A plain
``websockets`` client plays one script against each and records every message it receives, as received (bytes on
``lowlat.v1.proto``, text on ``lowlat.v1.json``), and how each connection ended:

Hello and Welcome; a client Ping; three streams one after another (async generator, sync generator, binary
chunks; messages of each WebSocket length form, and four 30 KB Deltas of one loop turn, past the direct path's
CORK_LIMIT); a stream held by its model and cancelled once its first Delta showed it runs, with another stream
served meanwhile; a context document created and patched (protocol v1.3), and a request that reads it; a tool call
answered with a ToolResult, then more Input; a stream whose model waits for an Input; another Ping; the socket
dropped (no close frame); a resume on a new connection that replays what the client says it missed (the held
stream from its start, the tail of a finished one) and goes on live (the held stream cancelled); a drain
(``Endpoint.drain_each``, the API behind ``Endpoint.drain``, started by a model: GoAway, a new Request refused with
``draining``, the running stream ended by the client's Input, then close 4002).

Every step waits for the frames the previous one caused, and every model waits on the client's frames, never on
a clock (equivalence_models.py), so the sequence is one, whatever the load. Compression is off (the client offers
no codec and the servers have none: the server's per-message choice depends on measured speed), server Pings and
the idle timeout are out of reach (3,600 s), and a drain waits for its stream as long as it takes (``drain_grace``
60 s; each frame is awaited for up to BOUND, 30 s).

Normalized, because they differ between any two runs: the session id and resume token (same-length placeholders,
in place, wherever they occur), the values of ``End.timings_ms`` (0; the keys stay), and on lowlat.v1.proto the
order of a map's entries (the protobuf library writes them in an order that differs between two processes; seen
on End.timings_ms). Everything else, every other byte of every message and each connection's close code and
reason, must be identical.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conformance_servers import (
    DIRECT_WRITES,
    SERVERS,
    ServerProcess,
    base_env,
    http_get,
    server_argv,
    start_ready,
)
from support.raw import JSON, LIMIT, PROTO, raw_connect
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from lowlat_mw.errors import CloseCode, ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import JsonCodec, ProtoCodec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DIRECT_SERVERS = [s for s in SERVERS if s in DIRECT_WRITES]
SETTINGS = {
    "LOWLAT_MODEL": "equivalence_models:MODELS",
    "LOWLAT_COMPRESSION": "",  # (the client offers none either)
    "LOWLAT_HEARTBEAT_INTERVAL": "3600",
    "LOWLAT_HEARTBEAT_MAX_INTERVAL": "3600",
    "LOWLAT_IDLE_TIMEOUT": "3600",
    "LOWLAT_DRAIN_GRACE": "60",
}
BOUND = 30.0  # seconds any one awaited frame may take on a loaded machine (they take milliseconds)
DOC = "def answer():\n    return 41\n"
PATCHED = DOC.replace("41", "42")

Entry = tuple[Any, ...]  # ("frame", connection, bytes | str) | ("close", connection, code, reason) | ("dropped", n)


# ================================================================================ servers
@pytest.fixture(scope="module", params=DIRECT_SERVERS)
def pair(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[dict[str, ServerProcess]]:
    """The server, as shipped ("direct") and with direct writes off ("asgi"), started side by side."""
    framework = request.param

    def start(path: str) -> ServerProcess:
        extra = SETTINGS if path == "direct" else {**SETTINGS, "LOWLAT_DIRECT_WRITES": "false"}
        env = base_env(conformance_dir, extra)
        return start_ready(f"equivalence-{framework}-{path}", framework,
                           lambda p: server_argv(framework, p, env=env), env, conformance_dir / "logs")

    with ThreadPoolExecutor(2) as pool:
        started = dict(zip(("direct", "asgi"), pool.map(start, ("direct", "asgi")), strict=True))
    try:
        yield started
    finally:
        for srv in started.values():
            srv.stop()


def writes_of(srv: ServerProcess) -> dict[str, float]:
    """Connections the server opened, by how their frames went out ("direct" or "send"), from its /metrics."""
    status, body = http_get(srv.port, "/metrics")
    assert status == 200, body[:300]
    counts: dict[str, float] = {}
    for m in re.finditer(r'^lowlat_connections_opened_total\{[^}]*writes="(\w+)"[^}]*\} (\S+)$', body.decode(), re.M):
        counts[m[1]] = counts.get(m[1], 0.0) + float(m[2])
    return counts


# ================================================================================ the script
class Connection:
    """One connection of the script: sends events, and records every message it receives, as received."""

    def __init__(self, ws: ClientConnection, number: int, log: list[Entry]) -> None:
        self.ws, self.number, self.log = ws, number, log
        self.codec = ProtoCodec() if ws.subprotocol == PROTO else JsonCodec()

    async def send(self, event: ev.Event) -> None:
        await self.ws.send(self.codec.encode(event))

    async def until(self, done: Callable[[list[ev.Event]], bool]) -> list[ev.Event]:
        """Receive (each message within BOUND) until `done` holds of what came; what came."""
        seen: list[ev.Event] = []
        while not seen or not done(seen):
            try:
                async with asyncio.timeout(BOUND):
                    frame = await self.ws.recv()
            except TimeoutError:
                raise AssertionError(f"connection {self.number}: nothing more within {BOUND} s after "
                                     f"{[shown(e, 200) for e in seen]}") from None
            self.log.append(("frame", self.number, frame))
            seen.append(self.codec.decode(frame, limit=LIMIT))
        return seen

    async def until_closed(self) -> None:
        """Receive until the server closes (within BOUND per message); record the close."""
        try:
            await self.until(lambda seen: False)
        except ConnectionClosed as exc:
            rcvd = exc.rcvd
            self.log.append(("close", self.number, rcvd and rcvd.code, rcvd and rcvd.reason))


def a(kind: type, sid: int | None = None, **fields: Any) -> Callable[[list[ev.Event]], bool]:
    """`done` for Connection.until: a `kind` message came (of stream `sid`, with these field values)."""
    def match(e: ev.Event) -> bool:
        return (isinstance(e, kind) and (sid is None or getattr(e, "stream_id", None) == sid)
                and all(getattr(e, k) == v for k, v in fields.items()))
    return lambda seen: match(seen[-1])


def ended(*sids: int) -> Callable[[list[ev.Event]], bool]:
    """`done`: every stream of `sids` ended (End or Error)."""
    return lambda seen: {e.stream_id for e in seen if isinstance(e, (ev.End, ev.Error))} >= set(sids)


def sha(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


async def first_connection(c: Connection) -> ev.Welcome:
    """Everything up to the drop; the Welcome (its resume token)."""
    await c.send(ev.Hello(client="equivalence", revision=3))
    welcome = (await c.until(a(ev.Welcome)))[-1]
    await c.send(ev.Ping(id=1))
    await c.until(a(ev.Pong, id=1))
    # (frames of 7-bit, 16-bit and 64-bit lengths; four 30 KB Deltas of one loop turn pass the direct path's
    # CORK_LIMIT of 64 KiB)
    for sid, model, params in ((1, "agen", {"n": 4, "size": 30_000}), (2, "gen", {"n": 2, "size": 70_000}),
                               (3, "data", {"n": 2})):
        await c.send(ev.Request(stream_id=sid, model=model, text="hi", params=params))
        await c.until(ended(sid))
    await c.send(ev.Request(stream_id=4, model="held"))
    await c.until(a(ev.Delta, 4))  # it runs: held until cancelled, after the resume
    await c.send(ev.Request(stream_id=5, model="sync", text="meanwhile"))
    await c.until(ended(5))
    await c.send(ev.Context(name="doc", version=1, text=DOC, sha256=sha(DOC)))
    start = DOC.encode().index(b"41")
    await c.send(ev.Context(name="doc", version=2, base_version=1, sha256=sha(PATCHED),
                            patches=(ev.ContextPatch(offset=start, length=2, text="42"),)))
    await c.until(a(ev.ContextAck, version=2))
    await c.send(ev.Request(stream_id=6, model="context_echo", text="read", contexts=("doc",)))
    await c.until(ended(6))
    await c.send(ev.Request(stream_id=7, model="agent", text="q"))
    call = (await c.until(lambda seen: getattr(seen[-1], "tool_call", None) is not None))[-1].tool_call
    await c.send(ev.Input(stream_id=7, seq=1, tool_result=ev.ToolResult(id=call.id, content='{"a": 1}')))
    await c.until(a(ev.Delta, 7))
    await c.send(ev.Input(stream_id=7, seq=2, text="more", end=True))
    await c.until(ended(7))
    await c.send(ev.Request(stream_id=8, model="relay"))
    await c.until(a(ev.Delta, 8, seq=2))
    await c.send(ev.Input(stream_id=8, seq=1, text="go"))
    await c.until(ended(8))
    await c.send(ev.Ping(id=2))
    await c.until(a(ev.Pong, id=2))
    return welcome


async def second_connection(c: Connection, welcome: ev.Welcome) -> None:
    """The resume (stream 4 from its start, 8 after its third Delta), then the drain."""
    await c.send(ev.Hello(client="equivalence", revision=3, resume_token=welcome.resume_token, last_seq={4: 0, 8: 3}))
    await c.until(lambda seen: ended(8)(seen) and any(isinstance(e, ev.Delta) and e.stream_id == 4 for e in seen))
    await c.send(ev.Ping(id=3))
    await c.until(a(ev.Pong, id=3))
    await c.send(ev.Cancel(stream_id=4))
    await c.until(ended(4))
    await c.send(ev.Request(stream_id=9, model="drainer"))
    await c.until(a(ev.GoAway))
    await c.send(ev.Request(stream_id=10, model="sync", text="too late"))
    await c.until(ended(10))
    await c.send(ev.Input(stream_id=9, seq=1, text="bye", end=True))
    await c.until_closed()


async def play(srv: ServerProcess, subprotocol: str) -> list[Entry]:
    """The script against `srv`: what the client received, in order."""
    log: list[Entry] = []
    async with raw_connect(srv.url, [subprotocol]) as ws:
        welcome = await first_connection(Connection(ws, 1, log))
        ws.transport.abort()  # the drop: no close frame, the session left to resume
        log.append(("dropped", 1))
    async with raw_connect(srv.url, [subprotocol]) as ws:
        await second_connection(Connection(ws, 2, log), welcome)
    return log


# ================================================================================ normalizing
def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def fields(buf: bytes) -> Iterator[tuple[int, int, bytes, bytes]]:
    """The Protobuf fields of `buf`, in order: (number, wire type, the field's bytes, its payload)."""
    i = 0
    while i < len(buf):
        start, key, shift = i, 0, 0
        while True:
            key |= (buf[i] & 0x7F) << shift
            shift, i = shift + 7, i + 1
            if not buf[i - 1] & 0x80:
                break
        number, wire = key >> 3, key & 7
        if wire == 0:
            while buf[i] & 0x80:
                i += 1
            i += 1
            payload = b""
        elif wire in (1, 5):
            payload, i = buf[i:i + (8 if wire == 1 else 4)], i + (8 if wire == 1 else 4)
        else:
            assert wire == 2, (wire, buf)
            length, shift = 0, 0
            while True:
                length |= (buf[i] & 0x7F) << shift
                shift, i = shift + 7, i + 1
                if not buf[i - 1] & 0x80:
                    break
            payload, i = buf[i:i + length], i + length
        yield number, wire, buf[start:i], payload


# Map fields (Envelope field -> its message's map fields): the protobuf library writes a map's entries in an order of
# its own, which differs between two processes (seen on End.timings_ms), so their order is normalized.
MAPS = {2: (14, 15), 5: (4, 5)}  # Welcome.input_seq, Welcome.contexts; End.timings_ms, End.usage
TIMINGS = (5, 4)  # End.timings_ms: entries {1: key, 2: double}


def _normalized_proto(frame: bytes) -> bytes:
    """An uncompressed lowlat.v1.proto frame with the entries of each map in sorted order and every End.timings_ms
    value 0 (the key kept); every other byte as it was."""
    out = [frame[:1]]
    for number, wire, raw, payload in fields(frame[1:]):
        if number in MAPS and wire == 2:
            inner: list[bytes | int] = []  # the message's fields; a map's number where its first entry was
            entries: dict[int, list[bytes]] = {}
            for n, w, r, p in fields(payload):
                if n in MAPS[number] and w == 2:
                    if (number, n) == TIMINGS:
                        entry = b"".join(kr for kn, _, kr, _ in fields(p) if kn == 1) + b"\x11" + bytes(8)
                        r = r[:1] + varint(len(entry)) + entry
                    if n not in entries:
                        inner.append(n)
                    entries.setdefault(n, []).append(r)
                else:
                    inner.append(r)
            body = b"".join(b"".join(sorted(entries[x])) if isinstance(x, int) else x for x in inner)
            raw = raw[:1] + varint(len(body)) + body
        out.append(raw)
    return b"".join(out)


def _timings_zeroed_json(text: str) -> str:
    return re.sub(r'("timings_ms":\s*\{)([^{}]*)(\})',
                  lambda m: m[1] + re.sub(r"(:\s*)[-+0-9.eE]+", r"\g<1>0", m[2]) + m[3], text)


def normalized(log: list[Entry]) -> list[Entry]:
    """`log` with the session id and resume token replaced (same length, in place) and End.timings_ms values 0."""
    welcome = next(e for e in log if e[0] == "frame")[2]
    w = (ProtoCodec() if isinstance(welcome, bytes) else JsonCodec()).decode(welcome, limit=LIMIT)
    assert isinstance(w, ev.Welcome), w
    secrets = [(w.resume_token, "T"), (w.session_id, "S")]  # (the token holds the id: it goes first)
    out: list[Entry] = []
    for entry in log:
        if entry[0] == "frame":
            data = entry[2]
            if isinstance(data, bytes):
                for value, mark in secrets:
                    data = data.replace(value.encode(), mark.encode() * len(value.encode()))
                data = _normalized_proto(data)
            else:
                for value, mark in secrets:
                    escaped = json.dumps(value)[1:-1]
                    data = data.replace(escaped, mark * len(escaped))
                data = _timings_zeroed_json(data)
            entry = (entry[0], entry[1], data)
        out.append(entry)
    return out


def shown(value: object, most: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


def readable(log: list[Entry]) -> str:
    lines = []
    for i, entry in enumerate(log):
        if entry[0] == "frame":
            data = entry[2]
            codec = ProtoCodec() if isinstance(data, bytes) else JsonCodec()
            lines.append(f"{i:3d} conn {entry[1]}: {shown(data)}\n      {shown(codec.decode(data, limit=LIMIT))}")
        else:
            lines.append(f"{i:3d} {entry!r}")
    return "\n".join(lines)


def first_difference(one: list[Entry], other: list[Entry]) -> str:
    i = next((i for i, (x, y) in enumerate(zip(one, other, strict=False)) if x != y), min(len(one), len(other)))
    return (f"first difference at message {i} (of {len(one)} and {len(other)})\n"
            f"--- direct path:\n{readable(one[i:i + 3])}\n--- ASGI path:\n{readable(other[i:i + 3])}")


# ================================================================================ the test
def events_of(log: list[Entry]) -> list[ev.Event]:
    return [(ProtoCodec() if isinstance(e[2], bytes) else JsonCodec()).decode(e[2], limit=LIMIT)
            for e in log if e[0] == "frame"]


def check_script_ran(log: list[Entry]) -> None:
    """The session did what the script says (else two equal recordings could both be of something else)."""
    events = events_of(log)
    welcomes = [e for e in events if isinstance(e, ev.Welcome)]
    assert [w.resumed for w in welcomes] == [False, True], welcomes
    assert [e.id for e in events if isinstance(e, ev.Pong)] == [1, 2, 3]
    ends = {e.stream_id: e.finish_reason for e in events if isinstance(e, ev.End)}
    assert ends == {1: "stop", 2: "stop", 3: "stop", 4: "cancelled", 5: "stop", 6: "stop", 7: "stop", 8: "stop",
                    9: "stop"}, ends
    assert [e.code for e in events if isinstance(e, ev.ContextAck)] == [ErrorCode.UNSPECIFIED] * 2
    assert [(e.stream_id, e.code) for e in events if isinstance(e, ev.Error)] == [(10, ErrorCode.DRAINING)]
    assert sum(isinstance(e, ev.GoAway) for e in events) == 1
    replayed = [(e.stream_id, e.seq) for e in events[events.index(welcomes[1]):] if isinstance(e, ev.Delta)]
    assert (8, 4) in replayed and (8, 5) in replayed and (4, 1) in replayed, replayed
    assert log[-1][:3] == ("close", 2, CloseCode.DRAINING), log[-1]  # (its reason: none under daphne)


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_a_scripted_session_gives_the_same_frames_through_the_direct_and_the_asgi_path(pair, mode):
    subprotocol = PROTO if mode == "proto" else JSON
    before = {path: writes_of(srv) for path, srv in pair.items()}
    async with asyncio.timeout(120):
        logs = {path: await play(srv, subprotocol) for path, srv in pair.items()}
    after = {path: writes_of(srv) for path, srv in pair.items()}
    # Each server took its path: both connections' frames written straight to the socket, or through send.
    for path, srv in pair.items():
        took = "direct" if path == "direct" else "send"
        assert after[path].get(took, 0) - before[path].get(took, 0) == 2, (srv.name, before[path], after[path])
    check_script_ran(logs["direct"])
    direct, asgi = normalized(logs["direct"]), normalized(logs["asgi"])
    assert direct == asgi, first_difference(direct, asgi)
