"""Scale-suite client process: thousands of cheap WebSocket connections, driven over stdin/stdout.

``python -m benchmarks._scale_client`` reads one JSON command per line on stdin and answers each
with one JSON line ``{"id": ..., ...}`` on stdout (commands run concurrently; ids match answers):

* ``{"cmd": "open", "group": g, "port": p, "n": n, "lowlat": bool, "concurrency": c, "timeout": s}``
  opens `n` more connections of group `g` to ``ws://127.0.0.1:p/ws``; a lowlat connection sends
  Hello and counts as open once Welcome arrived. Answers ``{"opened", "failed", "errors"}``.
* ``{"cmd": "stats", "group": g}``: ``{"open", "pings", "lost", "errors"}`` so far.
* ``{"cmd": "stream", "group": g, "tokens": t, "yield": bool, "delay": d, "timeout": s}``: every open
  connection of `g` sends one request at once (a model of t tokens, d seconds apart if it
  yields) and reads its reply; answers the per-request times to first delta (ms, from that
  request's send), deltas, errors and the monotonic times of the first send and last End
  (``time.monotonic`` is one system-wide clock, so the parent compares processes).
* ``{"cmd": "drop", "group": g}``: abort every connection of `g` (not counted as lost).
* ``{"cmd": "quit"}``.

The client is hand-rolled on asyncio protocols to stay cheap: a fixed handshake request, frames
masked with the all-zero key (legal: the masked payload equals the payload; a server cannot tell),
and the lowlat-mw protobuf codec only for what it must read (Welcome, Ping, Delta, End, Error).
Like the reference client it offers zstd, lz4 and snappy, sets ``flow_window`` (1 MiB) and sends
``Ack{done}`` after each End (with replies far below a quarter window, that is its only Ack). It
answers every protocol Ping with a Pong at once (and WebSocket pings with pongs), so the server's
heartbeat keeps idle connections alive. Raises RLIMIT_NOFILE to its hard limit.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.settings import SUBPROTOCOL_PROTO

from ._scale_server import die_with_parent, raise_nofile

CODEC = codec_for(SUBPROTOCOL_PROTO)
CODECS = ("zstd", "lz4", "snappy")  # what the Python client offers
LIMIT = 8 * 1024 * 1024


def frame(payload: bytes, opcode: int = 2) -> bytes:
    """One client WebSocket frame (FIN set), masked with the all-zero key."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


FLOW_WINDOW = 1024 * 1024  # as the reference client: it promises Acks, so the server frees its replay buffers
HELLO = frame(CODEC.encode(ev.Hello(client="lowlat-scale-bench", compression=CODECS, flow_window=FLOW_WINDOW)))


class Group:
    """The connections of one server (configuration) in this process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.conns: set[Conn] = set()
        self.pings = 0
        self.lost = 0  # connections that closed while not asked to
        self.errors: list[str] = []
        self.closing = False
        self.sid = 0
        self.pending = 0
        self.done: asyncio.Event | None = None

    def error(self, msg: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(msg)


class Conn(asyncio.Protocol):
    """One client WebSocket connection."""

    __slots__ = ("_request", "buf", "deltas", "end_at", "failed", "first_at", "frag", "group", "lowlat", "ready",
                 "sent_at", "streaming", "transport", "upgraded", "welcomed")

    def __init__(self, group: Group, lowlat: bool, request: bytes, ready: asyncio.Future[None]) -> None:
        self.group = group
        self.lowlat = lowlat
        self.ready = ready
        self.transport: Any = None
        self.buf = bytearray()
        self.frag: bytearray | None = None
        self.upgraded = False
        self.welcomed = False
        self.streaming = False
        self.failed = False
        self.sent_at = self.first_at = self.end_at = 0.0
        self.deltas = 0
        self._request = request

    # ------------------------------------------------------------------ asyncio protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        buf = self.buf
        buf += data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self._fail(f"handshake refused: {bytes(buf[:40])!r}")
                self.transport.close()
                return
            del buf[:end + 4]
            self.upgraded = True
            if self.lowlat:
                self.transport.write(HELLO)
            else:
                self._ready()
        pos, size = 0, len(buf)
        while size - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            n = b1 & 0x7F
            head = 2
            if n == 126:
                if size - pos < 4:
                    break
                n = int.from_bytes(buf[pos + 2:pos + 4], "big")
                head = 4
            elif n == 127:
                if size - pos < 10:
                    break
                n = int.from_bytes(buf[pos + 2:pos + 10], "big")
                head = 10
            if b1 & 0x80:  # a masked server frame: not expected, skip the key
                head += 4
            if size - pos < head + n:
                break
            payload = bytes(buf[pos + head:pos + head + n])
            pos += head + n
            opcode = b0 & 0x0F
            if opcode == 0:  # continuation
                if self.frag is None:
                    continue
                self.frag += payload
                if b0 & 0x80:
                    payload, opcode = bytes(self.frag[1:]), self.frag[0]
                    self.frag = None
                else:
                    continue
            elif not b0 & 0x80 and opcode in (1, 2):
                self.frag = bytearray((opcode,)) + payload
                continue
            self._message(opcode, payload, now)
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        group = self.group
        if self in group.conns:
            group.conns.discard(self)
            if not group.closing:
                group.lost += 1
                group.error(f"connection lost: {exc!r}")
        if self.streaming:
            self._stream_done(failed=True)
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"connection closed during the handshake: {exc!r}"))

    # ------------------------------------------------------------------ messages
    def _message(self, opcode: int, payload: bytes, now: float) -> None:
        if opcode == 8:
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            if not self.group.closing:
                self._fail(f"server closed with {code} {payload[2:].decode('utf-8', 'replace')!r}")
            self.transport.close()
            return
        if opcode == 9:  # a WebSocket ping (uvicorn's ws_ping_interval)
            self.transport.write(frame(payload, 0xA))
            self.group.pings += 1
            return
        if opcode not in (1, 2):
            return
        try:
            event = CODEC.decode(payload if opcode == 2 else payload.decode(), limit=LIMIT, allowed=CODECS)
        except Exception as exc:
            self._fail(f"undecodable frame: {exc!r}")
            return
        if isinstance(event, ev.Delta):
            if self.streaming:
                if not self.deltas:
                    self.first_at = now
                self.deltas += 1
        elif isinstance(event, ev.Ping):
            self.transport.write(frame(CODEC.encode(event.response())))
            self.group.pings += 1
        elif isinstance(event, ev.End):
            if self.lowlat:  # Ack done, as the reference client does after each stream (frees the replay)
                self.transport.write(frame(CODEC.encode(ev.Ack(stream_id=event.stream_id, seq=event.last_seq,
                                                               done=True))))
            if self.streaming:
                self.end_at = now
                if event.finish_reason != "stop" or event.last_seq != self.deltas:
                    self._fail(f"End {event.finish_reason!r} last_seq {event.last_seq} after {self.deltas} deltas")
                self._stream_done(failed=False)
        elif isinstance(event, ev.Welcome):
            self.welcomed = True
            self._ready()
        elif isinstance(event, ev.Error):
            self._fail(f"Error {event.code.wire_name}: {event.message}")
        elif isinstance(event, ev.GoAway):
            self._fail(f"GoAway {event.reason!r}")

    def _ready(self) -> None:
        if not self.ready.done():
            self.ready.set_result(None)

    def _fail(self, msg: str) -> None:
        self.group.error(msg)
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(msg))
        if self.streaming:
            self._stream_done(failed=True)

    def _stream_done(self, *, failed: bool) -> None:
        self.streaming = False
        self.failed = self.failed or failed
        group = self.group
        group.pending -= 1
        if group.pending <= 0 and group.done is not None:
            group.done.set()

    def start(self, data: bytes, now: float) -> None:
        self.streaming = True
        self.failed = False
        self.deltas = 0
        self.first_at = self.end_at = 0.0
        self.sent_at = now
        self.transport.write(data)


class Client:
    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.loop = asyncio.get_running_loop()

    def group(self, name: str) -> Group:
        if name not in self.groups:
            self.groups[name] = Group(name)
        return self.groups[name]

    async def open(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group = self.group(cmd["group"])
        port, n, lowlat = int(cmd["port"]), int(cmd["n"]), bool(cmd["lowlat"])
        timeout = float(cmd.get("timeout", 30.0))
        request = (f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Protocol: {SUBPROTOCOL_PROTO}\r\n\r\n").encode()
        todo = n
        opened = failed = 0
        errors: list[str] = []

        async def one() -> None:
            nonlocal opened, failed
            ready: asyncio.Future[None] = self.loop.create_future()
            conn: Conn | None = None
            try:
                async with asyncio.timeout(timeout):
                    _, conn = await self.loop.create_connection(lambda: Conn(group, lowlat, request, ready),
                                                                "127.0.0.1", port)
                    await ready
                group.conns.add(conn)
                opened += 1
            except Exception as exc:  # refused, timed out, closed: counted, the rest go on
                failed += 1
                if len(errors) < 5:
                    errors.append(repr(exc))
                if conn is not None and conn.transport is not None:
                    conn.transport.abort()

        async def worker() -> None:
            nonlocal todo
            while todo > 0:
                todo -= 1
                await one()

        await asyncio.gather(*(worker() for _ in range(max(1, min(int(cmd.get("concurrency", 32)), n)))))
        return {"opened": opened, "failed": failed, "errors": errors}

    def stats(self, cmd: dict[str, Any]) -> dict[str, Any]:
        g = self.group(cmd["group"])
        return {"open": len(g.conns), "pings": g.pings, "lost": g.lost, "errors": list(g.errors)}

    async def stream(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group = self.group(cmd["group"])
        tokens, cooperative, delay = int(cmd["tokens"]), bool(cmd["yield"]), float(cmd.get("delay", 0.0))
        group.sid += 1
        conns = [c for c in group.conns if c.welcomed or not c.lowlat]
        if not conns:
            return {"ttfd_ms": [], "deltas": 0, "errors": 0, "requests": 0, "first_send": 0.0, "last_end": 0.0}
        if conns[0].lowlat:
            data = frame(CODEC.encode(ev.Request(stream_id=group.sid, text="benchmark",
                                                 params={"tokens": tokens, "yield": cooperative,
                                                         "delay": delay})))
        else:
            data = frame(f"{tokens} {int(cooperative)} {delay!r}".encode(), 1)
        group.pending = len(conns)
        group.done = done = asyncio.Event()
        first_send = time.monotonic()
        for c in conns:
            c.start(data, time.monotonic())
        timed_out = False
        try:
            async with asyncio.timeout(float(cmd.get("timeout", 30.0))):
                await done.wait()
        except TimeoutError:
            timed_out = True
        group.done = None
        errors = 0
        ttfd: list[float] = []
        deltas = 0
        last_end = first_send
        for c in conns:
            if c.streaming:  # timed out
                c.streaming = False
                c.failed = True
            if c.failed or c.deltas != tokens:
                errors += 1
            if c.deltas:
                ttfd.append((c.first_at - c.sent_at) * 1000.0)
                deltas += c.deltas
            if c.end_at > last_end:
                last_end = c.end_at
        if timed_out:
            group.error(f"stream timed out with {group.pending} of {len(conns)} replies unfinished")
        return {"ttfd_ms": ttfd, "deltas": deltas, "errors": errors, "requests": len(conns),
                "first_send": first_send, "last_end": last_end, "timed_out": timed_out}

    def drop(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group = self.group(cmd["group"])
        group.closing = True
        conns = list(group.conns)
        group.conns.clear()
        for c in conns:
            c.transport.abort()
        return {"dropped": len(conns)}

    async def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        kind = cmd["cmd"]
        if kind == "open":
            return await self.open(cmd)
        if kind == "stats":
            return self.stats(cmd)
        if kind == "stream":
            return await self.stream(cmd)
        if kind == "drop":
            return self.drop(cmd)
        raise ValueError(f"unknown command {kind!r}")


async def serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    client = Client()
    out = sys.stdout
    tasks: set[asyncio.Task[None]] = set()

    def reply(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    async def run(cmd: dict[str, Any]) -> None:
        try:
            result = await client.handle(cmd)
            reply({"id": cmd.get("id"), "ok": True, **result})
        except Exception as exc:
            reply({"id": cmd.get("id"), "ok": False, "error": repr(exc)})

    reply({"id": 0, "ok": True, "ready": True})
    while True:
        line = await reader.readline()
        if not line:
            break
        cmd = json.loads(line)
        if cmd.get("cmd") == "quit":
            break
        task = loop.create_task(run(cmd))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for conn in [c for g in client.groups.values() for c in g.conns]:
        conn.group.closing = True
        conn.transport.abort()


def main() -> None:
    die_with_parent()
    raise_nofile()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve())


if __name__ == "__main__":
    main()
