"""Transport-level hardening, through every example app in its real server (docs/security.md, "Transport").

What the hosting server does before lowlat-mw sees a byte: permessage-deflate bombs, fragment floods,
slow and oversized opening handshakes. Each server runs the way ``server_argv`` (and the examples'
"Run:" lines) start it, with the options ``lowlat_mw.servers.serving`` derives from the settings, here the
defaults (``max_frame_size`` 1 MiB) and a 3 s ``handshake_timeout``. Variants: the four examples,
Starlette under uvicorn's wsproto implementation, ``lowlat-mw serve`` itself, and Starlette with
uvicorn's permessage-deflate turned on (not what we configure: websockets bounds inflation by
``--ws-max-size``, the one server where it could be on).

Raw sockets only: a hand-built client can send what a WebSocket library never would. Peak memory is
the serving process's VmHWM (``PeakRSS`` of test_conformance_limits.py).
"""

from __future__ import annotations

import asyncio
import base64
import os
import select
import socket
import statistics
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conformance_servers import ServerProcess, base_env, server_argv, start_ready, transport_settings
from conformance_support import KnownBug, measure
from support.raw import PROTO, raw_connect
from support.time import MARGIN, seconds
from support.waits import wait_until
from test_conformance_limits import PeakRSS, serving_pid

from lowlat_mw.errors import canonical_close_code
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import ProtoCodec
from lowlat_mw.servers.serving import HANDSHAKE_HEADER_LIMIT, transport_limit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Known gaps, measured (strict: a fix turns them into failures to remove here).
DEFLATE_MEMORY_XFAIL = (
    "KNOWN GAP (uvicorn websockets-sansio with --ws-per-message-deflate true, off by default): websockets stops "
    "inflating at --ws-max-size and closes with 1009, but holds the compressed frame (~255 KB), the inflated "
    "1 MiB and its zlib state at once: peak RSS +2.3 to +2.6 MiB, over 2x the limit (2 MiB)"
)

KiB, MiB = 1024, 1024 * 1024
HANDSHAKE_TIMEOUT = 3.0  # long enough for a few hundred normal handshakes while 200 slow sockets are held
ENV = {"LOWLAT_HANDSHAKE_TIMEOUT": str(HANDSHAKE_TIMEOUT)}
SETTINGS = transport_settings(ENV)
LIMIT = SETTINGS.max_frame_size  # 1 MiB: the default
MEMORY_BOUND = 2 * LIMIT  # peak RSS growth allowed while refusing (the "less than 2x the limit")

# variant -> (framework, uvicorn --ws, extra server args, permessage-deflate negotiated)
VARIANTS: dict[str, tuple[str, str, tuple[str, ...], bool]] = {
    "starlette": ("starlette", "websockets-sansio", (), False),
    "wsproto": ("starlette", "wsproto", (), False),
    "deflate": ("starlette", "websockets-sansio", ("--ws-per-message-deflate", "true"), True),
    "django": ("django", "", (), False),
    "flask": ("flask", "", (), False),
    "serve": ("serve", "", (), False),
}


# The tests that are not about permessage-deflate run on the servers as we configure them (not "deflate").
SHIPPED = pytest.mark.parametrize("srv", [v for v in VARIANTS if v != "deflate"], indirect=True)


@pytest.fixture(scope="module", params=list(VARIANTS))
def srv(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    name = request.param
    framework, ws, extra, _ = VARIANTS[name]
    env = base_env(conformance_dir, ENV)
    kwargs = {"ws": ws} if ws else {}
    server = start_ready(f"transport-{name}", framework,
                         lambda p: server_argv(framework, p, extra=extra, env=env, **kwargs), env,
                         conformance_dir / "logs")
    server.variant = name  # type: ignore[attr-defined]
    yield server
    died = server.proc.poll()
    server.stop()
    if died is not None:
        pytest.fail(f"{server.name} died during the tests (code {died})\n{server.output()}")


# ================================================================================ a raw WebSocket client
def _upgrade_request(port: int, *, extensions: str | None = None, pad: int = 0) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    lines = ["GET /ws HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", f"Sec-WebSocket-Protocol: {PROTO}"]
    if extensions:
        lines.append(f"Sec-WebSocket-Extensions: {extensions}")
    if pad:
        lines.append("X-Padding: " + "a" * pad)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def frame(opcode: int, payload: bytes, *, fin: bool = True, rsv1: bool = False) -> bytes:
    """A masked client frame."""
    head = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    if payload:
        m = int.from_bytes(mask * (n // 4 + 1), "little") & ((1 << (8 * n)) - 1)
        payload = (int.from_bytes(payload, "little") ^ m).to_bytes(n, "little")
    return head + mask + payload


class RawWS:
    """A blocking raw WebSocket connection (frames by hand; the server's frames parsed by hand)."""

    def __init__(self, port: int, *, extensions: str | None = None, rcvbuf: int | None = None) -> None:
        """`rcvbuf`: the socket's kernel receive buffer (no autotuning), for a client that stops reading."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(_upgrade_request(port, extensions=extensions))
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, f"closed during the handshake: {self.buf!r}"
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.headers = head.decode("latin-1").lower()
        assert head.startswith(b"HTTP/1.1 101"), head
        self.inflater = zlib.decompressobj(-15)  # the server's frames, if it accepted permessage-deflate

    def close(self) -> None:
        self.sock.close()

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("EOF")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self) -> tuple[int, bytes]:
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._read(8))[0]
        payload = self._read(n)
        if b0 & 0x40:
            payload = self.inflater.decompress(payload + b"\x00\x00\xff\xff")
        return b0 & 0x0F, payload

    def send_event(self, event: ev.Event) -> None:
        self.sock.sendall(frame(2, ProtoCodec().encode(event)))

    def recv_event(self) -> ev.Event:
        while True:
            opcode, payload = self.recv_frame()
            if opcode == 2:
                return ProtoCodec().decode(payload, limit=64 * MiB, allowed=())
            if opcode == 8:
                raise ConnectionError(f"closed {struct.unpack('!H', payload[:2])[0] if payload else None}")

    def until_closed(self, timeout: float = 10.0) -> int | None:
        """The server's close code (None: the connection ended without a close frame)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                opcode, payload = self.recv_frame()
                if opcode == 8:
                    return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
        except (ConnectionError, OSError):
            return None

    def send_until_closed(self, wire: bytes) -> int | None:
        """Send `wire`, then the server's close code. The server may refuse and close before all of it
        is written (a broken pipe here): its close frame is read all the same."""
        try:
            self.sock.sendall(wire)
        except OSError:
            pass
        return self.until_closed()

    def hello(self) -> None:
        self.send_event(ev.Hello(client="conformance-transport"))
        assert isinstance(self.recv_event(), ev.Welcome)


def request_of_size(size: int, sid: int = 1) -> bytes:
    """A Request frame (our 1-byte header + Protobuf) of exactly `size` bytes."""
    base = len(ProtoCodec().encode(ev.Request(stream_id=sid, model="sync", text="")))
    for pad in range(size - base - 8, size - base + 1):
        data = ProtoCodec().encode(ev.Request(stream_id=sid, model="sync", text="x" * pad))
        if len(data) == size:
            return data
    raise AssertionError(size)


def served(ws: RawWS, sid: int = 1) -> bool:
    """The Request `sid` was answered with a Delta and an End."""
    seen = []
    while True:
        event = ws.recv_event()
        if isinstance(event, ev.Ping):
            ws.send_event(event.response())
            continue
        seen.append(type(event).__name__)
        if isinstance(event, ev.End | ev.Error):
            return seen[0] == "Delta" and seen[-1] == "End"


def deflated(data: bytes) -> bytes:
    """permessage-deflate payload (RFC 7692: raw deflate, final 4 bytes 00 00 ff ff removed)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return (c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]


_BOMB: list[bytes] = []


def deflate_bomb() -> bytes:
    """A 256 MiB Request (zeros inside its text) deflated to ~250 KB."""
    if not _BOMB:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        head = ProtoCodec().encode(ev.Request(stream_id=1, model="sync", text=""))
        out = [c.compress(head)]
        zeros = bytes(MiB)
        out += [c.compress(zeros) for _ in range(256)]
        _BOMB.append((b"".join(out) + c.flush(zlib.Z_SYNC_FLUSH))[:-4])
    return _BOMB[0]


def peak(srv: ServerProcess, action: Callable[[], object]) -> tuple[object, PeakRSS]:
    with PeakRSS(serving_pid(srv)) as rss:
        result = action()
    return result, rss


def record(srv: ServerProcess, case: str, outcome: str, rss: PeakRSS) -> None:
    measure(f"transport {case} {srv.variant}",  # type: ignore[attr-defined]
            f"{outcome}; server peak RSS +{rss.growth / MiB:.2f} MiB (bound {MEMORY_BOUND / MiB:.0f} MiB, "
            f"{rss.method})")


def warm(srv: ServerProcess) -> None:
    """One served request of the biggest size first, so one-off allocations are not counted.

    It ends with a close handshake and waits for the server's end of the TCP connection, which every
    server sends only once it has finished with the connection. Under load, a warm-up connection that
    the server was still tearing down kept its threads busy (gunicorn's gthread: a pool thread and
    simple-websocket's reader thread), so the measured connection got fresh ones, whose first big
    allocations (a new malloc arena) were then counted as its growth."""
    ws = RawWS(srv.port)
    try:
        ws.hello()
        ws.sock.sendall(frame(2, request_of_size(LIMIT)))
        assert served(ws)
        ws.sock.sendall(frame(8, struct.pack("!H", 1000)))
        assert ws.until_closed(timeout=30) == 1000
        ws.sock.settimeout(30)
        while ws.sock.recv(65536):  # (the server's FIN)
            pass
    finally:
        ws.close()


# ================================================================================ permessage-deflate
def send_until_closed(srv: ServerProcess, wire: bytes, extensions: str | None = None) -> tuple[int | None, Any]:
    """Open a connection (Hello), send `wire`, wait for the close: (close code, the server's peak RSS meanwhile)."""
    ws = RawWS(srv.port, extensions=extensions)
    try:
        ws.hello()
        return peak(srv, lambda: ws.send_until_closed(wire))
    finally:
        ws.close()


def test_deflate_negotiated_only_where_bounded(srv):
    ws = RawWS(srv.port, extensions="permessage-deflate; client_max_window_bits")
    try:
        negotiated = "permessage-deflate" in ws.headers
    finally:
        ws.close()
    assert negotiated is VARIANTS[srv.variant][3], ws.headers


def test_deflate_bomb_is_refused_with_bounded_memory(srv, request):
    """A ~250 KB compressed frame inflating to 256 MiB: 1009 where deflate is on, 1002 (RSV1 not
    negotiated) where it is off; either way nothing is inflated past the limit."""
    warm(srv)
    on = VARIANTS[srv.variant][3]
    if srv.variant == "deflate":
        request.applymarker(pytest.mark.xfail(strict=False, raises=KnownBug, reason=DEFLATE_MEMORY_XFAIL))
    bomb = frame(2, deflate_bomb(), rsv1=True)
    code, rss = send_until_closed(srv, bomb, extensions="permessage-deflate" if on else None)
    record(srv, "deflate-bomb", f"{len(bomb):,} B frame inflating to 256 MiB closed {code}", rss)
    if srv.variant == "deflate":
        assert canonical_close_code(code) == 1009, code
        assert rss.growth < 4 * LIMIT, rss.growth  # bounded by the limit, not by the 256 MiB it would inflate to
        if rss.growth >= MEMORY_BOUND:
            raise KnownBug(f"peak RSS +{rss.growth / MiB:.1f} MiB")
    assert rss.growth < MEMORY_BOUND, rss.growth
    assert canonical_close_code(code) == (1009 if on else 1002), code
    assert rss.growth < MEMORY_BOUND, rss.growth


def test_deflated_message_at_the_limit_is_accepted(srv):
    on = VARIANTS[srv.variant][3]
    data = request_of_size(LIMIT)
    ws = RawWS(srv.port, extensions="permessage-deflate" if on else None)
    try:
        ws.hello()
        ws.sock.sendall(frame(2, deflated(data), rsv1=True) if on else frame(2, data))
        assert served(ws)
    finally:
        ws.close()


def test_deflated_message_just_over_the_limit_is_refused_with_1009(srv):
    on = VARIANTS[srv.variant][3]
    data = request_of_size(transport_limit(SETTINGS) + 1)
    ws = RawWS(srv.port, extensions="permessage-deflate" if on else None)
    try:
        ws.hello()
        code = ws.send_until_closed(frame(2, deflated(data), rsv1=True) if on else frame(2, data))
    finally:
        ws.close()
    assert canonical_close_code(code) == 1009, code


@pytest.mark.parametrize("srv", ["starlette", "serve"], indirect=True)  # lowlat_mw.servers.uvicorn:WebSocketProtocol
def test_a_message_over_the_limit_is_refused_without_a_reset_while_the_client_still_sends(srv):
    """The server refuses an oversized message as soon as its header arrives, while the client is still
    sending the rest. It sends its close frame (1009) and FIN and keeps reading (and dropping) until the
    client is done: closing at once would leave the rest unread, the kernel would answer it with a TCP
    reset, and a client (a browser) could lose the close frame to it and see 1006 instead (it would then
    reconnect and try to resume, rather than report "message too big")."""
    ws = RawWS(srv.port)
    try:
        ws.hello()
        ws.sock.sendall(frame(2, request_of_size(transport_limit(SETTINGS) + 64 * KiB)))  # no reset: all sent
        assert ws.until_closed() == 1009
        ws.sock.settimeout(10)
        assert ws.sock.recv(65536) == b""  # then the server's FIN, not a reset
    finally:
        ws.close()


@SHIPPED
def test_one_read_mixing_whole_messages_control_frames_fragments_and_a_partial_frame(srv):
    """One socket write carrying: a Request in one frame, a WebSocket ping, a Request in two fragments, a
    Request in one frame with a 16-bit length, then the first half of a last Request (its second half
    follows). Every Request is served in order and the ping answered: the fast reader of lowlat-mw's
    protocol (one-frame messages) hands over to the general parser and back at frame boundaries."""
    ws = RawWS(srv.port)
    try:
        ws.hello()
        one, two, three = (ProtoCodec().encode(ev.Request(stream_id=i, model="agen", text=t, params={"n": 1}))
                           for i, t in ((1, "a"), (2, "b" * 40), (3, "c" * 300)))
        four = frame(2, ProtoCodec().encode(ev.Request(stream_id=4, model="agen", text="d", params={"n": 1})))
        wire = b"".join([frame(2, one), frame(9, b"hb"), frame(2, two[:10], fin=False), frame(0, two[10:]),
                         frame(2, three), four[:5]])
        ws.sock.sendall(wire)
        time.sleep(0.05)  # (a separate read, most likely: the rest of the last frame)
        ws.sock.sendall(four[5:])
        ends, pongs, first_delta = [], 0, {}
        while len(ends) < 4:
            opcode, payload = ws.recv_frame()
            if opcode == 0xA:
                pongs += 1
                assert payload == b"hb"
                continue
            assert opcode == 2, opcode
            event = ProtoCodec().decode(payload, limit=64 * MiB, allowed=())
            if isinstance(event, ev.Delta):
                first_delta.setdefault(event.stream_id, len(first_delta))
            elif isinstance(event, ev.End):
                ends.append(event.stream_id)
            else:
                assert isinstance(event, ev.Ping), event
                ws.send_event(event.response())
        assert sorted(ends) == [1, 2, 3, 4]
        assert first_delta == {1: 0, 2: 1, 3: 2, 4: 3}  # handled in the order they came (eager model start)
        assert pongs == 1
    finally:
        ws.close()


@SHIPPED
def test_nothing_follows_the_servers_close_frame_when_the_client_closes_mid_stream(srv):
    """A stream sends a Delta every millisecond; the client sends a close frame. The server answers with
    its own close frame, and no frame follows it (RFC 6455 5.5.1), however the stream's next Deltas race
    the close (on lowlat-mw's protocol the driver stops writing once the connection's `closing` flag is set
    or the transport refuses a write: tests/test_direct.py)."""
    for attempt in range(5):  # (a few times: the race falls differently each time)
        ws = RawWS(srv.port)
        try:
            ws.hello()
            ws.send_event(ev.Request(stream_id=1, model="agen", text="x", params={"n": 100_000, "delay": 0.001}))
            deltas = 0
            while deltas < 20 + 10 * attempt:
                opcode, payload = ws.recv_frame()
                if opcode == 2 and isinstance(ProtoCodec().decode(payload, limit=64 * MiB, allowed=()), ev.Delta):
                    deltas += 1
            ws.sock.sendall(frame(8, struct.pack("!H", 1000)))
            ws.sock.settimeout(10)
            while ws.recv_frame()[0] != 8:  # Deltas already on their way, then the close reply
                pass
            after = []
            try:
                while True:
                    after.append(ws.recv_frame()[0])
            except (ConnectionError, OSError):
                pass  # EOF: the server closed the TCP connection
            assert after == [], after
        finally:
            ws.close()


# ================================================================================ fragments
FRAGMENTS = 100_000


@SHIPPED
def test_message_in_100000_one_byte_fragments(srv, request):
    """A 100,000-byte Request in 100,000 one-byte frames: within max_frame_size, so it is served, in
    bounded time, and the server's memory grows by less than 2x the limit while reassembling it."""
    warm(srv)
    data = request_of_size(FRAGMENTS)
    wire = b"".join([frame(2, data[:1], fin=False), *(frame(0, data[i:i + 1], fin=False)
                                                     for i in range(1, FRAGMENTS - 1)), frame(0, data[-1:])])
    ws = RawWS(srv.port)
    try:
        ws.hello()
        start = time.monotonic()

        def send() -> bool:
            ws.sock.sendall(wire)
            return served(ws)

        ok, rss = peak(srv, send)
        elapsed = time.monotonic() - start
    finally:
        ws.close()
    record(srv, "100000-fragments", f"{len(wire):,} B on the wire, served={ok} after {elapsed:.2f} s", rss)
    assert ok
    assert elapsed < 20, elapsed
    assert rss.growth < MEMORY_BOUND, f"peak RSS +{rss.growth / MiB:.1f} MiB"


@SHIPPED
def test_fragmented_message_over_the_limit_is_refused_with_1009(srv):
    warm(srv)
    chunk = bytes(64 * KiB)
    n = 2 * LIMIT // len(chunk)  # 2 MiB in 64 KiB fragments
    wire = b"".join([frame(2, b"\x10" + chunk[1:], fin=False), *(frame(0, chunk, fin=False) for _ in range(n - 2)),
                     frame(0, chunk)])
    code, rss = send_until_closed(srv, wire)
    record(srv, "fragmented-over-limit", f"2 MiB in {n} fragments closed {code}", rss)
    assert canonical_close_code(code) == 1009, code
    assert rss.growth < MEMORY_BOUND, rss.growth


# ================================================================================ handshakes
SLOW_SOCKETS = 200
NORMAL_GAP = 0.005  # between a normal client's handshakes: ~200-400 of them while the 200 are held
# Normal handshakes measured while slow sockets are held: the slow sockets reconnect (each held until the server
# closes it) until there are this many. At the first 3 s alone, a loaded machine got 108 (django, 4 busy loops;
# 170-300 otherwise), and a p99 of ~100 samples is their second slowest: one scheduling hiccup.
MIN_NORMAL = 200


async def _slow_socket(port: int, drip: bool, connected: list[bool], first_closed: list[bool],
                       enough: asyncio.Event) -> list[tuple[float, float]]:
    """Connect and send nothing (or drip the request a byte a second) until the server closes the connection,
    then again, until `enough` is set. For each connection, the seconds until the server closed it from before the
    connect (the server's deadline cannot start earlier) and from the connect (the client's view). `connected`
    gets an entry once the first connection is up, `first_closed` once it is closed."""
    request = _upgrade_request(port)
    held: list[tuple[float, float]] = []
    while True:
        before = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = time.monotonic()
        if not held:
            connected.append(True)

        async def dripper(writer: asyncio.StreamWriter = writer) -> None:
            for i in range(len(request)):
                try:
                    writer.write(request[i:i + 1])
                    await writer.drain()
                except OSError:
                    return
                await asyncio.sleep(1.0)  # the drip itself: a byte a second

        task = asyncio.create_task(dripper()) if drip else None
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT + seconds(10)):  # (a hang guard: the bounds are below)
                while await reader.read(4096):
                    pass
        except (OSError, TimeoutError):
            pass
        finally:
            end = time.monotonic()
            held.append((end - before, end - start))
            if task is not None:
                task.cancel()
            writer.close()
        if len(held) == 1:
            first_closed.append(True)
        if enough.is_set():
            return held


@SHIPPED
async def test_silent_and_dripping_sockets_are_closed_within_the_handshake_timeout(srv):
    """200 sockets connect at once and send nothing, or drip their request a byte a second: each is
    closed within the handshake timeout (3 s), while a normal client's handshakes, back to back all
    that time (at least MIN_NORMAL: the slow sockets connect again until there are), have a p99 under
    100 ms, and an HTTP upload whose headers came at once but whose body takes longer than the timeout
    is answered by the app (neither 408 nor 431)."""
    failures: list[str] = []
    connected: list[bool] = []
    first_closed: list[bool] = []
    enough = asyncio.Event()  # the normal client has its handshakes: the slow sockets stop connecting again
    slow = [asyncio.ensure_future(_slow_socket(srv.port, i % 2 == 1, connected, first_closed, enough))
            for i in range(SLOW_SOCKETS)]
    # and a slow upload: its headers are in at once, its body takes longer than the handshake timeout
    upload, upload_body = _post(srv.port, 64 * KiB)
    upload.sendall(upload_body[:1000])
    upload_rest = [upload_body[1000:]]

    def send_upload_rest() -> None:
        """The upload's body, once the handshake timeout of the sockets that connected with it is past."""
        if upload_rest:
            try:
                upload.sendall(upload_rest.pop())
            except OSError:
                pass

    async def normal_handshakes() -> list[float]:
        times: list[float] = []
        await wait_until(lambda: len(connected) == SLOW_SOCKETS or any(task.done() for task in slow),
                         what="the slow sockets to connect")
        guard = time.monotonic() + seconds(30)  # a hang guard: the count is asserted below
        while not all(task.done() for task in slow):  # until the server has closed every slow socket
            if len(first_closed) == SLOW_SOCKETS:
                send_upload_rest()
            if len(times) >= MIN_NORMAL or time.monotonic() > guard:
                enough.set()
            start = time.monotonic()
            try:
                async with raw_connect(srv.url, [PROTO]):
                    times.append(time.monotonic() - start)
            except Exception as exc:
                failures.append(f"{time.monotonic() - start:.3f} s after connecting: {exc!r} ({exc.__cause__!r})")
            await asyncio.sleep(NORMAL_GAP)  # the gap between a normal client's handshakes (not an ordering wait)
        return times

    normal = await normal_handshakes()
    held = await asyncio.gather(*slow)
    send_upload_rest()
    upload_status = await asyncio.to_thread(_status, upload)
    assert not failures, f"normal handshakes failed: {failures}\n{srv.output()[-4000:]}"
    silent = [h for i, socket_held in enumerate(held) if i % 2 == 0 for h in socket_held]
    drip = [h for i, socket_held in enumerate(held) if i % 2 == 1 for h in socket_held]
    p99 = statistics.quantiles(normal, n=100, method="inclusive")[98]
    measure(f"transport slow-handshake {srv.variant}",
            f"{len(silent)} silent closed after min {min(t for t, _ in silent):.2f} s (from before the connect), "
            f"max {max(t for _, t in silent):.2f} s (from the connect), {len(drip)} dripping after min "
            f"{min(t for t, _ in drip):.2f} s, max {max(t for _, t in drip):.2f} s (handshake_timeout "
            f"{HANDSHAKE_TIMEOUT} s); normal handshake p50 "
            f"{statistics.median(normal) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {max(normal) * 1000:.1f} ms "
            f"over {len(normal)}; an upload: {upload_status}")
    # slack: 200 sockets accepted at once on a loaded 2-core machine, and the shims' timer granularity
    late = [t for _, t in silent + drip if t >= HANDSHAKE_TIMEOUT + MARGIN]
    assert not late, (late, silent, drip)
    # held until the deadline, not refused at once: timed from before the connect, since the server's clock starts
    # at its accept, which may come before the client sees its connect on a loaded machine (django: closes 2.96 s
    # after the client's connect, with a 3 s timeout)
    early = [t for t, _ in silent if t <= HANDSHAKE_TIMEOUT - 0.5]
    assert not early, (early, silent)
    assert len(normal) >= MIN_NORMAL, f"only {len(normal)} normal handshakes in {seconds(30)} s"
    assert p99 < 0.100, normal
    # the deadline is for the request line and headers: a body may take its time
    assert _answered_by_the_app(upload_status), upload_status


@SHIPPED
@pytest.mark.parametrize("pad", [64 * KiB, MiB])
def test_oversized_handshake_headers_are_refused(srv, pad):
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    try:
        sock.sendall(_upgrade_request(srv.port, pad=pad))
    except OSError:
        pass
    status = _status(sock)
    measure(f"transport header-{pad // KiB}KiB {srv.variant}", status)
    assert status.startswith("HTTP/1.1 431 "), status


@SHIPPED
def test_headers_within_the_limit_are_accepted(srv):
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    try:
        sock.sendall(_upgrade_request(srv.port, pad=HANDSHAKE_HEADER_LIMIT // 2 - 512))
        assert sock.recv(200).startswith(b"HTTP/1.1 101")
    finally:
        sock.close()


def _post(port: int, body_size: int) -> tuple[socket.socket, bytes]:
    """A socket with an HTTP POST's request line and headers sent, and the body it announced."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=HANDSHAKE_TIMEOUT + 10)
    sock.sendall((f"POST /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/octet-stream\r\n"
                  f"Content-Length: {body_size}\r\nConnection: close\r\n\r\n").encode())
    return sock, b"x" * body_size


def _status(sock: socket.socket) -> str:
    """The status line of the server's answer on `sock` (which it closes), or what happened instead."""
    try:
        return sock.recv(200).split(b"\r\n", 1)[0].decode("latin-1") or "closed without a response"
    except OSError as exc:
        return f"no response ({exc!r})"
    finally:
        sock.close()


def _answered_by_the_app(status: str) -> bool:
    """An HTTP answer, and not the handshake bounds' (408 or 431)."""
    return status.startswith("HTTP/1.1 ") and status[9:12] not in ("408", "431")


@SHIPPED
def test_request_bodies_are_not_bounded_like_headers(srv):
    """The 16 KiB bound is for the request line and headers only: a plain HTTP request whose 64 KiB body
    comes in the same reads gets the app's own answer (405, or whatever the path says to a POST), never
    431. (A body still arriving after handshake_timeout: the slow-socket test.)"""
    sock, body = _post(srv.port, 64 * KiB)
    sock.sendall(body)
    status = _status(sock)
    measure(f"transport http-body {srv.variant}", f"64 KiB body in the same reads: {status}")
    assert _answered_by_the_app(status), status


@SHIPPED
async def test_clients_that_never_close_do_not_stall_the_server(srv):
    """5 clients send a complete request (``Connection: close``), read the answer, and then keep their
    socket open: another client's handshakes meanwhile are not held up. (gunicorn's gthread lingered on
    each such socket for up to 2 s in its main loop, stalling every accept: ThreadWorker closes off it.)"""
    lingering = []
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nConnection: close\r\n\r\n".encode())
        lingering.append(sock)
    try:
        times = []
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            start = time.monotonic()
            async with raw_connect(srv.url, [PROTO]):
                times.append(time.monotonic() - start)
            await asyncio.sleep(0.01)
        answers = [s.recv(100).split(b"\r\n", 1)[0] for s in lingering]
    finally:
        for sock in lingering:
            sock.close()
    measure(f"transport lingering-clients {srv.variant}",
            f"{len(times)} handshakes while 5 answered clients kept their sockets open: max {max(times) * 1000:.1f} ms")
    assert all(a.startswith(b"HTTP/1.1 ") for a in answers), answers
    assert max(times) < 0.5, times


PING_FLOOD = 24 * MiB  # of protocol-level Pings: a Pong kept for each would hold about as much
PING_FLOOD_BOUND = 8 * MiB  # peak RSS growth allowed meanwhile
STALLED = 3.0  # seconds the server takes nothing: it stopped reading (a server may, while its Pongs cannot go out)


def _flood(sock: socket.socket, chunk: bytes, total: int) -> tuple[int, bytes]:
    """Send `chunk` again and again, `total` bytes, as fast as the server reads; stop early once it took nothing for
    STALLED seconds. (bytes sent, what is left of the chunk under way: its frames still to go, the first maybe cut.)"""
    sock.setblocking(False)
    sent, pending = 0, memoryview(chunk)
    progress = time.monotonic()
    while sent < total:
        try:
            n = sock.send(pending)
        except BlockingIOError:
            n = 0
        if n:
            sent += n
            progress = time.monotonic()
            pending = pending[n:] or memoryview(chunk)
        elif time.monotonic() - progress > STALLED:
            break
        else:
            select.select([], [sock], [], 0.1)
    sock.setblocking(True)
    return sent, bytes(pending) if len(pending) != len(chunk) else b""


@SHIPPED
def test_a_client_that_floods_protocol_pings_and_reads_nothing_costs_bounded_memory(srv):
    """A client sends WebSocket Pings (125-byte payloads) as fast as the server reads them and reads nothing. A server
    that reads on while its writes are held (uvicorn does, and so does the daphne runner) would queue a Pong for each
    Ping (+25 MiB under uvicorn for 32 MiB of Pings, +43 MiB with wsproto); here the server keeps only the latest
    Pong while its socket takes nothing (RFC 6455 5.5.3 allows answering only the most recent Ping), or stops reading
    (gunicorn's reader thread waits on its Pong). Reading again, the client gets a Pong for its last Ping, and the
    connection serves requests."""
    ws = RawWS(srv.port, rcvbuf=4 * KiB)
    try:
        ws.hello()
        chunk = frame(9, b"p" * 125) * 512
        with PeakRSS(serving_pid(srv)) as rss:
            sent, rest = _flood(ws.sock, chunk, PING_FLOOD)
            time.sleep(0.5)  # (what the server read last is handled)
        ws.sock.settimeout(30)
        last = b"the last ping"
        seen: dict[str, int] = {"pongs": 0}

        def read() -> None:  # until the Pong of the last Ping (the server may answer every Ping before it, or not)
            while True:
                opcode, payload = ws.recv_frame()
                if opcode == 10:
                    seen["pongs"] += 1
                    if payload == last:
                        return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        ws.sock.sendall(rest + frame(9, last))
        reader.join(60)
        assert not reader.is_alive(), "no Pong for the last Ping"
        ws.send_event(ev.Request(stream_id=1, model="sync", text="after the flood"))
        assert served(ws)
    finally:
        ws.close()
    measure(f"transport protocol-ping flood {srv.variant}",  # type: ignore[attr-defined]
            f"{sent / MiB:.1f} MiB of Pings from a client not reading: server peak RSS +{rss.growth / MiB:.2f} MiB "
            f"(bound {PING_FLOOD_BOUND / MiB:.0f} MiB, {rss.method}); then {seen['pongs']} Pongs as it read")
    assert rss.growth < PING_FLOOD_BOUND, f"peak RSS +{rss.growth / MiB:.1f} MiB during a flood of protocol Pings"
