"""A client that stops reading is closed for good, on every server (issue 38, item 2).

Three clients (``max_connections_per_client`` is 3) open a stream of a model that writes a lot, with a
window far larger than what the sockets hold, and then read nothing, through a 4 KiB receive buffer. The
server's send blocks (or, where the server has no backpressure, the window fills); after
``slow_consumer_timeout`` it closes with 4003, and that close frame waits behind output the peer never
reads. The server must then drop the connection within ``close_timeout``: its socket closed (the server
process holds no descriptor for it any more), its thread (gunicorn) ended, and its connection slot released
only then. Checked twice per server (the second round also against the first round's thread count, pools
having grown to what the pattern needs); then a third round where the clients, once the server is blocked on
them, send a close frame themselves and still read nothing: the server's answer waits behind the same output,
and the connection must go within ``close_timeout`` of their close all the same. Then a new connection from
the same address is served.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conformance_servers import SERVERS, ServerProcess, base_env, http_get, server_argv, start_ready
from conformance_support import STARTUP_TIMES, assert_streams, measure
from prometheus_client.parser import text_string_to_metric_families
from support.raw import PROTO, hello, raw_connect
from support.waits import wait_until
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from lowlat_mw.errors import CloseCode, canonical_close_code
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import ProtoCodec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
SERVER_LEVEL = True  # the servers of conformance_servers.SERVERS (conftest)

CLIENTS = 3  # = max_connections_per_client
SLOW_TIMEOUT = 1.0
CLOSE_TIMEOUT = 2.0
WINDOW = 4 * 1024 * 1024  # bytes a client lets the server send ahead: more than the sockets hold
ENV = {
    "LOWLAT_SLOW_CONSUMER_TIMEOUT": str(SLOW_TIMEOUT),
    "LOWLAT_CLOSE_TIMEOUT": str(CLOSE_TIMEOUT),
    "LOWLAT_MAX_CONNECTIONS_PER_CLIENT": str(CLIENTS),
    "LOWLAT_FLOW_WINDOW": str(WINDOW),
    # (More than the window: a window as big as the replay buffer never fills, its oldest Deltas dropped first.)
    "LOWLAT_RESUME_BUFFER_SIZE": str(2 * WINDOW),
    "LOWLAT_RESUME_WINDOW": "1",  # the abandoned sessions (and their paused models) end soon
}
RCVBUF = 4096  # the stuck clients' socket receive buffer (the kernel doubles it)
TOKENS, TOKEN_SIZE = 1_000_000, 4096  # 4 GB if nothing stopped the model
# From the first token to the server-side socket closed: the send blocks at once, the 4003 comes 1 to 1.5
# slow_consumer_timeouts later, the drop close_timeout after it (daphne's batched timer: up to 1 s more). Measured
# on a loaded 2-core machine: 3.1-4.8 s (0.8-4.1 s when the clients close); the bound leaves 15 s more.
CLOSED_BOUND = 1.5 * SLOW_TIMEOUT + CLOSE_TIMEOUT + 1.0 + 15.0
SETTLE_BOUND = 20.0  # seconds for the server's descriptors and threads to come back to their baseline
PROBE_EVERY = 0.2
# Idle workers the server's thread pools may add in a round when their jobs happen to overlap more than in the
# first (gunicorn's lowlat-send and lowlat-mw-close pools; measured: +0 to +1). A connection that is not released
# holds at least two threads (its reader and its blocked send), so three of them six.
POOL_SLACK = 2


@pytest.fixture(scope="module", params=SERVERS)
def unread_server(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    """A server with a 1 s slow-consumer timeout, a 2 s close timeout and 3 connections per client address.

    gunicorn gets CLIENTS + 1 threads (the three connections and a probe): its pool is full after the first round,
    so that a pool thread started late in one round (a probe whose thread was not free yet) cannot pass for a
    thread a connection still holds. (Pools keep their idle threads: see POOL_SLACK.)"""
    framework = request.param
    env = base_env(conformance_dir, ENV)
    extra = ("--threads", str(CLIENTS + 1)) if framework == "flask" else ()
    srv = start_ready(f"unread-{framework}", framework, lambda p: server_argv(framework, p, extra=extra, env=env),
                      env, conformance_dir / "logs")
    STARTUP_TIMES.setdefault(srv.name, []).append(srv.ready_after or 0.0)
    try:
        yield srv
    finally:
        died = srv.proc.poll()
        srv.stop()
        if died is not None:
            pytest.fail(f"{srv.name} died during the tests (code {died})\n{srv.output()}")


# ================================================================================ the server process, from outside
def _processes(srv: ServerProcess) -> list[psutil.Process]:
    """The server's processes: itself and its children (gunicorn's worker)."""
    root = psutil.Process(srv.proc.pid)
    return [root, *root.children(recursive=True)]


def _fds_and_threads(srv: ServerProcess) -> tuple[int, int]:
    fds = threads = 0
    for proc in _processes(srv):
        try:
            fds += proc.num_fds()
            threads += proc.num_threads()
        except psutil.NoSuchProcess:
            pass
    return fds, threads


def _server_sockets(srv: ServerProcess, ports: set[int]) -> set[int]:
    """Which of the client ports `ports` the server process still holds a socket (a descriptor) for."""
    held: set[int] = set()
    for proc in _processes(srv):
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        held.update(c.raddr.port for c in conns if c.raddr and c.raddr.port in ports)
    return held


def _client_sockets(srv: ServerProcess) -> int:
    """How many connected TCP sockets (not listening ones) the server processes hold."""
    held = 0
    for proc in _processes(srv):
        try:
            held += sum(1 for c in proc.net_connections(kind="tcp") if c.raddr)
        except psutil.NoSuchProcess:
            pass
    return held


async def _settled(srv: ServerProcess) -> tuple[int, int]:
    """(descriptors, threads) once the server holds no client's socket (the connections before are gone, not
    closing) and then two looks 0.5 s apart agree (its thread pools are done winding down)."""
    await wait_until(lambda: _client_sockets(srv) == 0, timeout=SETTLE_BOUND, what=f"{srv.name} to hold no socket")
    looks = [await asyncio.to_thread(_fds_and_threads, srv)]

    async def steady() -> bool:
        await asyncio.sleep(0.5)  # the span the two looks must agree over (a steadiness check, not an ordering)
        looks.append(await asyncio.to_thread(_fds_and_threads, srv))
        return looks[-1] == looks[-2]

    deadline = time.monotonic() + SETTLE_BOUND
    while not await steady():
        assert time.monotonic() < deadline, f"{srv.name}'s descriptors and threads still changing: {looks[-5:]}"
    return looks[-1]


async def _back_to(srv: ServerProcess, fds: int, threads: int | None) -> tuple[int, int]:
    """Wait until the server holds at most `fds` descriptors (and `threads` threads); what it holds then. Past
    SETTLE_BOUND (a hang guard) it returns what it holds, for the caller's assertion to tell."""
    try:
        await wait_until(lambda: _within(_fds_and_threads(srv), fds, threads), timeout=SETTLE_BOUND,
                         what=f"{srv.name} back to {fds} descriptors, {threads} threads")
    except AssertionError:
        pass  # (the caller asserts on what it holds, with its own message)
    return await asyncio.to_thread(_fds_and_threads, srv)


def _within(now: tuple[int, int], fds: int, threads: int | None) -> bool:
    return now[0] <= fds and (threads is None or now[1] <= threads)


def _closed_4003(port: int) -> float:
    """lowlat_connections_closed_total{code="4003"} of the server's /metrics."""
    status, body = http_get(port, "/metrics")
    assert status == 200, (status, body[:300])
    return sum(s.value for family in text_string_to_metric_families(body.decode()) for s in family.samples
               if s.name == "lowlat_connections_closed_total" and s.labels.get("code") == str(CloseCode.SLOW_CONSUMER))


# ================================================================================ clients
async def _probe(srv: ServerProcess) -> int | None:
    """A new connection from the same address: None if it was welcomed, else the close code it got. Returns once
    the server has closed its side too (so that probes never overlap: gunicorn's thread pool needs no more threads
    for them in one round than in another)."""
    code: int | None = None
    async with raw_connect(srv.url, [PROTO]) as ws:
        port = ws.transport.get_extra_info("sockname")[1]
        try:
            await hello(ws)
        except ConnectionClosed as exc:
            code = canonical_close_code(exc.rcvd.code) if exc.rcvd is not None else 1006
    deadline = time.monotonic() + SETTLE_BOUND
    while await asyncio.to_thread(_server_sockets, srv, {port}) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return code


class Unread:
    """A client that asks for a long stream through a small receive buffer and then reads none of it: websockets'
    sans-I/O client over a plain blocking socket, so nothing reads behind the test's back (calls block: run them in
    a thread)."""

    def __init__(self, srv: ServerProcess, tag: str) -> None:
        self.srv, self.tag = srv, tag
        self.codec = ProtoCodec()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)  # (before connecting: the window scale)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", srv.port))
        self.port = self.sock.getsockname()[1]
        self.ws = ClientProtocol(parse_uri(srv.url), subprotocols=[Subprotocol(PROTO)], max_size=None)
        self.ws.send_request(self.ws.connect())
        self._flush()
        self.events: list[Any] = []

    def _flush(self) -> None:
        self.sock.sendall(b"".join(self.ws.data_to_send()))

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if data:
            self.ws.receive_data(data)
        else:
            self.ws.receive_eof()
        self.events.extend(e for e in self.ws.events_received() if hasattr(e, "opcode"))  # (frames)
        if not data and not self.events:
            raise ConnectionError("closed by the server")

    def _next_frame(self) -> Any:
        while not self.events:
            self._read()
        return self.events.pop(0)

    def open(self) -> int | None:
        """Hello and, once welcomed, the Request: None; or the close code the server answered the Hello with."""
        while self.ws.state is State.CONNECTING:
            self._read()
        if self.ws.handshake_exc is not None:
            raise self.ws.handshake_exc
        self.ws.send_binary(self.codec.encode(ev.Hello(client="unread", flow_window=WINDOW)))
        self._flush()
        frame = self._next_frame()
        if frame.opcode is Opcode.CLOSE:
            return canonical_close_code(self.ws.close_rcvd.code) if self.ws.close_rcvd is not None else 1005
        welcome = self.codec.decode(frame.data, limit=WINDOW, allowed=())
        assert isinstance(welcome, ev.Welcome) and welcome.flow_window == WINDOW, welcome
        self.ws.send_binary(self.codec.encode(ev.Request(stream_id=1, model="count", text="x", params={
            "n": TOKENS, "size": TOKEN_SIZE, "every": 8, "tag": self.tag})))
        self._flush()
        return None

    def close(self) -> None:
        """Send a close frame (and go on reading nothing)."""
        self.ws.send_close(1000)
        self._flush()


async def _unread_client(srv: ServerProcess, tag: str) -> Unread:
    """A client that stopped reading, its stream started. Refused with 1013 (the slot of an earlier connection not
    released yet), it tries again."""
    deadline = time.monotonic() + SETTLE_BOUND
    while True:
        client = await asyncio.to_thread(Unread, srv, tag)
        refused = await asyncio.to_thread(client.open)
        if refused is None:
            return client
        client.sock.close()
        assert refused == 1013 and time.monotonic() < deadline, f"refused with {refused}"
        await asyncio.sleep(0.1)


async def _stalled(marks: Path, tag: str) -> None:
    """Wait (bounded) until the model of `tag` has stopped producing: the server is blocked on its client."""
    deadline = time.monotonic() + SETTLE_BOUND
    last, same = -1, 0
    while same < 3:
        assert time.monotonic() < deadline, f"the model of {tag} still producing after {SETTLE_BOUND} s"
        await asyncio.sleep(0.1)
        try:
            count = int((marks / f"{tag}.count").read_text())
        except (FileNotFoundError, ValueError):
            count = 0
        same = same + 1 if count == last and count else 0
        last = count


async def _round(srv: ServerProcess, marks: Path, fds: int, threads: int | None,
                 peer_closes: bool = False) -> tuple[float, int, tuple[int, int]]:
    """Three clients stop reading (and, with `peer_closes`, send a close once the server is blocked on them);
    returns (seconds until the server closed all their sockets, probes refused meanwhile, the server's descriptors
    and threads afterwards)."""
    before = await asyncio.to_thread(_closed_4003, srv.port)
    tags = [f"unread-{srv.framework}-{time.monotonic_ns()}-{i}" for i in range(CLIENTS)]
    clients = [await _unread_client(srv, tag) for tag in tags]
    ports = {client.port for client in clients}
    start = time.monotonic()
    refused = 0
    try:
        if peer_closes:
            async def stall_then_close(client: Unread, tag: str) -> None:
                await _stalled(marks, tag)
                await asyncio.to_thread(client.close)

            await asyncio.gather(*(stall_then_close(client, tag) for client, tag in zip(clients, tags, strict=True)))
        # While all three sockets are there, the three connections count against the limit: a fourth from the
        # same address is refused with 1013 (until the server has closed one of them, the last look says).
        while True:
            code = await _probe(srv)
            held = await asyncio.to_thread(_server_sockets, srv, ports)
            if len(held) < CLIENTS:
                break
            assert code == 1013, (f"a fourth connection got {code} (None: welcomed) while the server still held the "
                                  f"sockets of the {CLIENTS} connections that stopped reading")
            refused += 1
            assert time.monotonic() - start < CLOSED_BOUND, \
                f"{len(held)} sockets of clients that stopped reading still open {CLOSED_BOUND} s after their stream"
            await asyncio.sleep(PROBE_EVERY)
        while held:
            assert time.monotonic() - start < CLOSED_BOUND, \
                f"{len(held)} sockets of clients that stopped reading still open {CLOSED_BOUND} s after their stream"
            await asyncio.sleep(0.05)
            held = await asyncio.to_thread(_server_sockets, srv, ports)
        closed_after = time.monotonic() - start
    finally:
        for client in clients:
            client.sock.close()
    if not peer_closes:
        closed = await asyncio.to_thread(_closed_4003, srv.port) - before
        assert closed == CLIENTS, f"{closed} connections closed with 4003, not {CLIENTS}"
    return closed_after, refused, await _back_to(srv, fds, threads)


async def test_clients_that_stop_reading_are_dropped_within_close_timeout(unread_server, marks_dir):
    srv = unread_server
    async with asyncio.timeout(140):
        await assert_streams(srv.url)  # (what serving a stream creates once, before the baseline)
        fds, threads = await _settled(srv)
        closed_1, refused_1, after_1 = await _round(srv, marks_dir, fds, None)
        assert after_1[0] <= fds, f"the server holds {after_1[0]} descriptors, {fds} before the clients came"
        # Thread pools grew to what the round needed (gunicorn's, the send pool): the second round needs no more,
        # and every thread of its connections ends.
        _, threads = await _settled(srv)
        closed_2, refused_2, after_2 = await _round(srv, marks_dir, fds, threads + POOL_SLACK)
        assert after_2[0] <= fds, f"the server holds {after_2[0]} descriptors, {fds} before the clients came"
        if srv.framework == "flask":  # a thread per connection, its reader and its send: gone with the socket
            assert after_2[1] <= threads + POOL_SLACK, \
                f"the server runs {after_2[1]} threads, {threads} after the first round"
        # The clients close, blocked behind what they do not read: the server's answer waits behind it too.
        closed_3, refused_3, after_3 = await _round(srv, marks_dir, fds, threads + POOL_SLACK, peer_closes=True)
        assert after_3[0] <= fds, f"the server holds {after_3[0]} descriptors, {fds} before the clients came"
        if srv.framework == "flask":
            assert after_3[1] <= threads + POOL_SLACK, \
                f"the server runs {after_3[1]} threads, {threads} after the first round"
        await assert_streams(srv.url)  # the address's slots are free again: a new connection is served
    measure(f"unread close {srv.framework}",
            f"sockets closed {closed_1:.2f} / {closed_2:.2f} s after the stream began (slow_consumer_timeout "
            f"{SLOW_TIMEOUT} s, close_timeout {CLOSE_TIMEOUT} s), {closed_3:.2f} s with the clients closing; a 4th "
            f"connection refused {refused_1} / {refused_2} / {refused_3} times meanwhile; fds {fds} -> {after_1[0]} / "
            f"{after_2[0]} / {after_3[0]}, threads {threads} -> {after_2[1]} / {after_3[1]}")
