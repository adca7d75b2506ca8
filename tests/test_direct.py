"""Direct writes (lowlat_mw.runtime.direct): frames built by the driver and written to the server's transport.

The frames are checked with the `websockets` library's own parser; the driver is run with a fake
transport that logs its writes and the ASGI messages in one list, so the order on the wire is what
the tests assert. Ordering is proven with events (the loop turn ends, the transport resumes), never
with timing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from driver_support import endpoint_for
from hypothesis import given
from hypothesis import strategies as st
from support import wait_until as wait_for  # (named as before: the call sites stay as they were)
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from lowlat_mw.errors import CloseCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.runtime import closing as runtime_closing
from lowlat_mw.runtime.asgi import accept
from lowlat_mw.runtime.connection import ConnectionDriver
from lowlat_mw.runtime.direct import BURST, CORK_LIMIT, EXTENSION, expected, frame_header, next_message
from lowlat_mw.runtime.timers import MAX_SLACK
from lowlat_mw.runtime.writer import Turns
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO


def parse_frames(data: bytes) -> list[Frame]:
    """Every frame in `data`, parsed by websockets as a client reads a server's (unmasked) frames."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    frames = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=False)
        try:
            next(parser)
        except StopIteration as done:
            frames.append(done.value)
        else:
            raise AssertionError("incomplete frame")
    return frames


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
@pytest.mark.parametrize("text", [False, True])
def test_frame_header_makes_frames_websockets_parses(size: int, text: bool) -> None:
    payload = b"x" * size
    [frame] = parse_frames(frame_header(payload, text) + payload)
    assert frame.fin and frame.opcode is (Opcode.TEXT if text else Opcode.BINARY)
    assert frame.data == payload and not (frame.rsv1 or frame.rsv2 or frame.rsv3)


class FakeDirect:
    """A transport offered as the ``lowlat.transport`` extension, logging into `log` next to ASGI sends."""

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        self.log = log
        self.writable = asyncio.Event()
        self.writable.set()
        self.closing = False
        self.close_timeout: float | None = None  # (close_within: as our servers, it drops unanswered closes)

    def close_within(self, seconds: float) -> None:
        self.close_timeout = seconds

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after the transport closed"
        self.log.append(("write", data))

    def is_writable(self) -> bool:
        return self.writable.is_set()

    def wait_writable(self) -> Any:
        return self.writable.wait()

    def is_closing(self) -> bool:
        return self.closing


class Conn:
    """A driver on a FakeDirect: `log` holds ("write", bytes) and ("send", ASGI message) in order. `drops`: the
    server says it drops unanswered closes (DropsCloses: the FakeDirect is offered as it, as our servers do)."""

    def __init__(self, model: Any, subprotocol: str = SUBPROTOCOL_PROTO, drops: bool = False, **settings: Any) -> None:
        self.log: list[tuple[str, Any]] = []
        self.direct = FakeDirect(self.log)
        self.codec = codec_for(subprotocol)
        self.driver = ConnectionDriver(endpoint_for(model, **settings), send=self._send, subprotocol=subprotocol,
                                       direct=self.direct, closes=self.direct if drops else None)

    async def _send(self, message: Any) -> None:
        self.log.append(("send", message))
        if message["type"] == "websocket.close":
            self.direct.closing = True

    def writes(self) -> list[bytes]:
        return [data for kind, data in self.log if kind == "write"]

    def events(self) -> list[ev.Event]:
        out = []
        for frame in parse_frames(b"".join(self.writes())):
            data = frame.data if frame.opcode is Opcode.BINARY else frame.data.decode()
            out.append(self.codec.decode(data, limit=1 << 30, allowed=self.driver.protocol.compression))
        return out

    def closed(self) -> int | None:
        codes = [m["code"] for kind, m in self.log if kind == "send" and m["type"] == "websocket.close"]
        return codes[-1] if codes else None

    async def send(self, event: ev.Event) -> None:
        await self.driver.receive(self.codec.encode(event))


async def end_of_turn() -> None:
    """Let the loop finish its current turn (the driver's held frames go out at its end)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def tokens(req: Any) -> Any:
    for i in range(int(req.params.get("n", 3))):
        yield f"t{i} "
        if req.params.get("hold"):  # the stream stays open (until cancelled) after its first token
            await asyncio.Event().wait()


@pytest.mark.parametrize("subprotocol", [SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON])
async def test_every_frame_goes_to_the_transport_and_none_through_asgi_send(subprotocol: str) -> None:
    conn = Conn(tokens, subprotocol)
    await conn.send(ev.Hello())
    await conn.send(ev.Request(stream_id=1, text="x", params={"n": 50}))
    await wait_for(lambda: any(isinstance(e, ev.End) for e in conn.events()))
    events = conn.events()
    assert isinstance(events[0], ev.Welcome)
    deltas = [e for e in events if isinstance(e, ev.Delta)]
    assert [d.text for d in deltas] == [f"t{i} " for i in range(50)]
    assert [d.seq for d in deltas] == list(range(1, 51)) and isinstance(events[-1], ev.End)
    assert not [m for kind, m in conn.log if kind == "send"]  # nothing through ASGI
    frames = parse_frames(b"".join(conn.writes()))
    assert {f.opcode for f in frames} == {Opcode.BINARY if subprotocol == SUBPROTOCOL_PROTO else Opcode.TEXT}
    await conn.driver.disconnected(1000)


async def test_a_turns_first_frame_goes_at_once_the_rest_in_one_write_at_its_end() -> None:
    conn = Conn(tokens)
    await conn.send(ev.Hello())
    assert len(conn.writes()) == 1  # Welcome: the first output of this turn, written at once
    await end_of_turn()
    # The model yields 20 tokens without waiting: one turn of the loop produces them all.
    await conn.send(ev.Request(stream_id=1, text="x", params={"n": 20}))
    await wait_for(lambda: any(isinstance(e, ev.End) for e in conn.events()))
    stream_writes = conn.writes()[1:]
    # the first Delta alone, then the rest of that turn (19 Deltas and the End) together
    assert [len(parse_frames(w)) for w in stream_writes] == [1, 20], [len(parse_frames(w)) for w in stream_writes]
    await conn.driver.disconnected(1000)


async def test_more_than_the_cork_limit_is_written_before_the_turn_ends() -> None:
    big = "y" * (CORK_LIMIT // 4)

    async def bulky(req: Any) -> Any:
        for _ in range(12):
            yield big

    conn = Conn(bulky)
    await conn.send(ev.Hello())
    await end_of_turn()
    await conn.send(ev.Request(stream_id=1, text="x"))
    await wait_for(lambda: any(isinstance(e, ev.End) for e in conn.events()))
    sizes = [len(w) for w in conn.writes()[1:]]
    assert len(sizes) >= 3 and max(sizes) <= CORK_LIMIT + len(big) + 64, sizes
    assert "".join(d.text for d in conn.events() if isinstance(d, ev.Delta)) == big * 12
    await conn.driver.disconnected(1000)


async def test_the_close_goes_after_every_frame_written_before_it() -> None:
    conn = Conn(tokens)
    await conn.send(ev.Hello())
    await end_of_turn()
    await conn.send(ev.Request(stream_id=1, text="x", params={"n": 5, "hold": True}))
    await conn.send(ev.Request(stream_id=1, text="again"))  # a stream id in use: Error, in the same turn
    await conn.driver.close(CloseCode.GOING_AWAY, "bye")  # still the same turn: held frames are flushed first
    kinds = [kind for kind, _ in conn.log]
    assert kinds[-1] == "send" and conn.closed() == CloseCode.GOING_AWAY
    assert "send" not in kinds[:-1]
    assert any(isinstance(e, ev.Error) for e in conn.events())
    await end_of_turn()
    assert [kind for kind, _ in conn.log][-1] == "send"  # nothing written after the close
    await conn.driver.disconnected(CloseCode.GOING_AWAY)


@pytest.mark.parametrize("how", ["flag", "refused"])
async def test_nothing_is_written_once_the_connection_is_closing(how: str) -> None:
    """The server sent a close frame on its own (the client closed), or its transport closed under the driver:
    the `closing` flag (read before every write) or the transport's refusal (RuntimeError) ends the writing,
    the stream's model is not failed by it, nothing more reaches the transport."""
    conn = Conn(tokens)
    await conn.send(ev.Hello())
    await end_of_turn()
    writes = len(conn.writes())
    refused: list[bytes] = []
    if how == "flag":
        conn.direct.closing = True
    else:
        def refuse(data: bytes) -> None:
            refused.append(data)
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

        conn.direct.write = refuse  # type: ignore[method-assign]
    await conn.send(ev.Request(stream_id=1, text="x", params={"n": 5}))
    await end_of_turn()
    await end_of_turn()
    assert conn.driver.writer.closing
    assert len(conn.writes()) == writes
    assert len(refused) <= 1  # the first refused write stops the rest
    await conn.driver.disconnected(1000)


async def test_a_paused_transport_holds_output_in_order_until_it_resumes() -> None:
    conn = Conn(tokens)
    await conn.send(ev.Hello())
    await end_of_turn()
    conn.direct.writable.clear()  # the transport's buffer is over its high-water mark
    await conn.send(ev.Request(stream_id=1, text="x", params={"n": 30}))
    await wait_for(lambda: conn.driver.writer.sender is not None)  # the first Delta waits for the transport
    # A Ping's Pong queues behind it (and, as through ASGI, reading waits while output is held back).
    ping = asyncio.create_task(conn.send(ev.Ping(id=7)))
    for _ in range(5):
        await end_of_turn()
    assert len(conn.writes()) == 1 and not ping.done()  # only the Welcome went out
    conn.direct.writable.set()
    await asyncio.wait_for(ping, 10.0)
    await wait_for(lambda: any(isinstance(e, ev.End) for e in conn.events()))
    events = conn.events()
    assert [e.seq for e in events if isinstance(e, ev.Delta)] == list(range(1, 31))
    pong = next(i for i, e in enumerate(events) if isinstance(e, ev.Pong))
    first = next(i for i, e in enumerate(events) if isinstance(e, ev.Delta))
    assert first < pong  # in the order the driver wrote them
    await conn.driver.disconnected(1000)


async def test_a_heartbeat_is_a_written_ping_and_a_known_pong_that_leaves_the_timer_at_the_next_ping() -> None:
    """The Ping goes out from the timer with one write; the Pong that answers it is known by identity (the
    object the transport was told to await: not decoded) and its RTT observed. The Pong's timeout is watched
    apart (AsyncScheduler.watch), so the connection's timer goes to the next Ping at once, and the Pong does not
    move it (it used to go to the timeout at the Ping and back at the Pong: two moves per heartbeat)."""
    conn = ReadConn(echo)
    conn.read(ev.Hello())
    await end_of_turn()
    driver, proto = conn.driver, conn.driver.protocol
    scheduler = driver.scheduler
    due = proto.next_deadline()
    assert due == proto.heartbeat.next_ping_at
    writes = len(conn.log)
    pong = codec_for(SUBPROTOCOL_PROTO).encode(ev.Pong(id=1))
    assert driver.on_timer(due) == due + 30  # a Ping out: the timer where its Pong will put it, the next Ping
    assert conn.log[writes:] == [("write", conn.log[-1][1])] and conn.events()[-1] == ev.Ping(id=1)
    assert conn.direct.expect == expected(pong)  # awaited by the server
    [(when, token)] = [(when, token) for when, slot in scheduler._watches.items() for watcher, token in slot
                       if watcher is driver]
    assert token == pong and due + 10 <= when <= due + 10 + MAX_SLACK  # its timeout (on the scheduler's grid)
    driver.monotonic = lambda: due + 0.25
    proto.codec = None  # (the Pong must not need decoding)
    moves: list[Any] = []
    driver.reschedule = lambda: moves.append("reschedule")  # type: ignore[method-assign]
    scheduler.schedule = lambda target, when: moves.append((target, when))  # type: ignore[method-assign]
    try:
        conn.direct.receiver(conn.direct.expect.message, 1)  # what the transport hands over: the awaited object
        assert proto.heartbeat.rtt == 0.25 and proto.pong_frame is None and not proto.deadline_moved
        assert moves == [] and driver._scheduled == proto.heartbeat.next_ping_at == due + 30  # not moved by the Pong
        driver.on_watch(due + 10, token)  # the timeout comes: the Pong came, nothing to do
        assert moves == []
    finally:
        del scheduler.schedule, driver.reschedule
    [sample] = [s for m in driver.endpoint.registry.collect() if m.name == "lowlat_heartbeat_rtt_seconds"
                for s in m.samples if s.name.endswith("_count")]
    assert sample.value == 1
    await driver.disconnected(1000)


async def test_a_loops_connections_share_one_made_once_ping_owned_by_its_scheduler() -> None:
    """One cache of heartbeat Pings, owned by the loop's scheduler (no module-level memo): the machine's Ping and
    Pong and the writer's frame of it are made by the first connection that pings, and written as they are by the
    others."""
    conns = [ReadConn(echo), ReadConn(echo)]
    for conn in conns:
        conn.read(ev.Hello())
    await end_of_turn()
    first, second = (conn.driver for conn in conns)
    assert first.protocol.heartbeats is second.protocol.heartbeats is first.scheduler.heartbeats
    for conn in conns:
        conn.driver.on_timer(conn.driver.protocol.next_deadline())
        assert conn.events()[-1] == ev.Ping(id=1)
    made = first.protocol.ping_made
    assert made is not None and second.protocol.ping_made is made
    assert conns[0].log[-1][1] is conns[1].log[-1][1] is made.wire[0]  # one frame, written by both
    assert conns[0].direct.expect is conns[1].direct.expect is made.wire[1]
    for conn in conns:
        await conn.driver.disconnected(1000)


async def test_a_watched_pong_that_does_not_come_makes_the_timer_due_and_closes_with_4001() -> None:
    """The Pong's timeout is a watch, not the timer: when it comes with the Pong still awaited, the connection's
    timer runs then (not at the next Ping), and finds the peer dead. (Through a real server and the scheduler:
    tests/test_uvicorn_pong.py.)"""
    conn = ReadConn(echo)
    conn.read(ev.Hello())
    await end_of_turn()
    driver, proto = conn.driver, conn.driver.protocol
    due = proto.next_deadline()
    driver.on_timer(due)
    [pong] = [token for slot in driver.scheduler._watches.values() for watcher, token in slot if watcher is driver]
    moves: list[Any] = []
    driver.scheduler.schedule = lambda target, when: moves.append((target, when))  # type: ignore[method-assign]
    try:
        driver.on_watch(due + 10, pong)
    finally:
        del driver.scheduler.schedule
    assert moves == [(driver, due + 10)]  # due now: the scheduler runs it in the same wake-up
    driver.on_timer(due + 10)
    await wait_for(lambda: conn.closed() is not None)
    assert conn.closed() == CloseCode.HEARTBEAT_TIMEOUT
    await driver.disconnected(CloseCode.HEARTBEAT_TIMEOUT)


async def test_a_known_pong_keeps_a_deadline_move_that_waits_for_its_reschedule() -> None:
    """A stream's end moves the idle deadline sooner (`deadline_moved`) and reschedules after its End is written;
    a Pong known by identity that arrives while that write waits must not take the news away: the timer ends up
    at the idle deadline, not at the next Ping."""
    release = asyncio.Event()

    async def once(req: Any) -> Any:
        yield "a"
        await release.wait()

    conn = ReadConn(once, idle_timeout=2, slow_consumer_timeout=100)
    conn.read(ev.Hello())
    await end_of_turn()
    driver, proto = conn.driver, conn.driver.protocol
    conn.read(ev.Request(stream_id=1, text="x"))
    await end_of_turn()
    now = proto.heartbeat.next_ping_at
    driver.monotonic = lambda: now
    assert driver.on_timer(now) == proto.heartbeat.next_ping_at > now + 2  # a Ping out: the timer at the next Ping
    conn.direct.writable.clear()  # the End will wait for the transport
    release.set()
    await wait_for(lambda: driver.writer.sender is not None)  # the stream ended: its End waits to be written
    conn.direct.receiver(conn.direct.expect.message, 1)  # the Pong, meanwhile
    conn.direct.writable.set()
    await wait_for(lambda: driver.writer.sender is None)
    await end_of_turn()
    assert driver._scheduled == proto.next_deadline() == now + 2  # the idle deadline
    await driver.disconnected(1000)


async def test_a_transport_paused_past_slow_consumer_timeout_closes_with_4003() -> None:
    conn = Conn(tokens, slow_consumer_timeout=5.0)
    await conn.send(ev.Hello())
    await end_of_turn()
    conn.direct.writable.clear()
    await conn.send(ev.Request(stream_id=1, text="x", params={"n": 10}))
    await wait_for(lambda: conn.driver.writer.sender is not None)  # a write is waiting for the transport
    since = conn.driver.writer.send_since
    conn.driver.on_timer(since + 4.0)
    await end_of_turn()
    assert conn.closed() is None  # not stuck for long enough yet
    conn.driver.on_timer(since + 5.0)
    await wait_for(lambda: conn.closed() is not None)
    assert conn.closed() == CloseCode.SLOW_CONSUMER
    await conn.driver.disconnected(CloseCode.SLOW_CONSUMER)


async def _blocked_past_slow_consumer_timeout(conn: Conn) -> None:
    """Hello, then a held stream whose first write waits for a blocked transport, and the timer past
    slow_consumer_timeout (5 s): the driver has begun its close (4003)."""
    driver = conn.driver
    await conn.send(ev.Hello())
    await end_of_turn()
    conn.direct.writable.clear()
    await conn.send(ev.Request(stream_id=1, text="x", params={"n": 10, "hold": True}))
    await wait_for(lambda: driver.writer.sender is not None)
    driver.on_timer(driver.writer.send_since + 5.0)
    await wait_for(lambda: conn.closed() is not None)


async def test_after_a_4003_for_a_blocked_send_the_connection_counts_until_its_socket_is_gone(monkeypatch) -> None:
    """The close frame waits behind what the peer does not read: a server that drops unanswered closes (ours) drops
    the socket within close_timeout, and says so (disconnected). Until then the connection holds its place in the
    limits, however long that takes; its session waits for the resume from the close on (detached: its models pause
    once the replay buffer is full)."""
    monkeypatch.setattr(runtime_closing, "CLOSE_SLACK", 0.0)
    conn = Conn(tokens, drops=True, slow_consumer_timeout=5.0, close_timeout=0.05)
    driver = conn.driver
    assert conn.direct.close_timeout == 0.05  # the server was told this connection's own
    endpoint = driver.endpoint
    assert endpoint.admit((SUBPROTOCOL_PROTO,), None, None, "10.0.0.1") is not None
    driver.address = "10.0.0.1"  # (what the endpoint admitted it as)
    await _blocked_past_slow_consumer_timeout(conn)
    await wait_for(lambda: driver.runner is not None and driver.runner.driver is None)  # detached at the close
    assert conn.closed() == CloseCode.SLOW_CONSUMER
    await asyncio.sleep(0.3)  # (well past close_timeout: the server's word is waited for)
    assert driver in endpoint.connections and endpoint.limiter.total == 1  # the socket is still there
    await driver.disconnected(1006)  # the server dropped it
    assert driver not in endpoint.connections and endpoint.limiter.total == 0


async def test_a_server_that_cannot_drop_gets_its_connection_released_after_close_timeout(monkeypatch,
                                                                                          caplog) -> None:
    """A server that does not say it drops unanswered closes (plain uvicorn: its close frame waits for the paused
    transport, and no disconnect ever comes) gets no such wait: close_timeout and CLOSE_SLACK after the close, the
    driver lets the connection go itself (its place in the limits, its session), ends the task reading its ASGI
    receive, and says once per process that the server keeps such sockets."""
    monkeypatch.setattr(runtime_closing, "CLOSE_SLACK", 0.0)
    # (Said once per process through CLIENT_LOGS.once, which the autouse fixture resets for each test.)
    conn = Conn(tokens, slow_consumer_timeout=5.0, close_timeout=0.05, resume_window=600)
    driver = conn.driver
    endpoint = driver.endpoint
    assert endpoint.admit((SUBPROTOCOL_PROTO,), None, None, "10.0.0.1") is not None
    driver.address = "10.0.0.1"
    receiving = driver.receiving = asyncio.create_task(asyncio.Event().wait())  # (a server's receive(), for good)
    await _blocked_past_slow_consumer_timeout(conn)
    await wait_for(lambda: driver not in endpoint.connections and endpoint.limiter.total == 0)
    await wait_for(receiving.done)
    assert receiving.cancelled() and driver.receiving is None  # (LowLatASGI.serve knows its end by that)
    runner = endpoint.store.get(driver.protocol.session_id)
    assert runner is not None and runner.driver is None  # the session kept for the resume (4003 is resumable)
    said = [r for r in caplog.records if "cannot drop" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    other = Conn(tokens, close_timeout=0.05)  # a second one: not said again
    await other.send(ev.Hello())
    await end_of_turn()
    await other.driver.close(CloseCode.GOING_AWAY)
    await wait_for(lambda: other.driver._gone)
    assert len([r for r in caplog.records if "cannot drop" in r.getMessage()]) == 1
    runner.destroy()


async def test_a_disconnect_in_time_leaves_nothing_armed(monkeypatch) -> None:
    """The usual close: the server reports the socket gone before the bound; the driver's fallback is cancelled (no
    timer holds the connection)."""
    conn = Conn(tokens, close_timeout=5.0)
    driver = conn.driver
    await conn.send(ev.Hello())
    await end_of_turn()
    await driver.close(CloseCode.GOING_AWAY)
    timer = driver._unreported_at
    assert timer is not None
    await driver.disconnected(1000)
    assert timer.cancelled() and driver._unreported_at is None


async def test_nothing_is_written_to_a_closing_transport() -> None:
    conn = Conn(tokens)
    await conn.send(ev.Hello())
    await end_of_turn()
    conn.direct.closing = True  # the peer went away; FakeDirect.write would fail
    await conn.send(ev.Request(stream_id=1, text="x", params={"n": 10}))
    for _ in range(5):
        await end_of_turn()
    assert len(conn.writes()) == 1
    await conn.driver.disconnected(1006)


@pytest.mark.parametrize("direct_writes", [True, False])
async def test_accept_takes_the_extension_only_when_the_setting_allows(direct_writes: bool) -> None:
    endpoint = endpoint_for(tokens, direct_writes=direct_writes)
    log: list[tuple[str, Any]] = []
    offered = FakeDirect(log)

    async def send(message: Any) -> None:
        log.append(("send", message))

    scope = {"type": "websocket", "subprotocols": [SUBPROTOCOL_PROTO], "headers": [(b"host", b"127.0.0.1")],
             "client": ("127.0.0.1", 5000), "extensions": {EXTENSION: offered, "websocket.http.response": {}}}
    driver = await accept(endpoint, scope, send)
    assert driver is not None
    assert driver.direct is (offered if direct_writes else None)
    assert offered.close_timeout == endpoint.settings.close_timeout  # (told either way: it drops unanswered closes)
    assert driver._drops
    scope_without = {**scope, "extensions": {"websocket.http.response": {}}}
    other = await accept(endpoint, scope_without, send)
    assert other is not None and other.direct is None and not other._drops
    for d in (driver, other):
        await d.disconnected(1000)


# ================================================================================ direct reads
class FakeReads(FakeDirect):
    """A FakeDirect that also delivers messages straight to the driver (DirectReads), logging pauses."""

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        super().__init__(log)
        self.receiver: Any = None
        self.queued = False  # messages already in the server's ASGI queue: direct reads are refused
        self.expect: Any = None  # the message the driver awaits (a heartbeat's Pong)

    def set_receiver(self, receiver: Any) -> bool:
        if self.queued:
            return False
        self.receiver = receiver
        return True

    def pause_reading(self) -> None:
        self.log.append(("pause", None))

    def resume_reading(self) -> None:
        self.log.append(("resume", None))


class ReadConn(Conn):
    """A driver whose messages come through `feed` (a socket read of several messages: `read`)."""

    def __init__(self, model: Any, **settings: Any) -> None:
        self.log = []
        self.direct = FakeReads(self.log)
        self.codec = codec_for(SUBPROTOCOL_PROTO)
        self.driver = ConnectionDriver(endpoint_for(model, **settings), send=self._send,
                                       subprotocol=SUBPROTOCOL_PROTO, direct=self.direct)
        assert self.driver.read_directly()

    def read(self, *events: ev.Event) -> None:
        """One socket read carrying `events`: the server calls the receiver for each, in one go."""
        for n, event in enumerate(events, 1):
            self.direct.receiver(self.codec.encode(event), n)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.log]


async def echo(req: Any) -> Any:
    yield req.text


async def test_a_fed_request_is_answered_before_the_read_returns() -> None:
    """No task, no loop turn: the Welcome, then the Delta (and the End) are out when feed returns."""
    conn = ReadConn(echo)
    conn.read(ev.Hello())
    await end_of_turn()
    conn.read(ev.Request(stream_id=1, text="hi"))
    assert [type(e) for e in conn.events()][:2] == [ev.Welcome, ev.Delta]
    await end_of_turn()
    assert [type(e) for e in conn.events()] == [ev.Welcome, ev.Delta, ev.End]
    assert "pause" not in conn.kinds() and "send" not in conn.kinds()
    await conn.driver.disconnected(1000)


async def test_a_burst_of_requests_in_one_turn_gets_every_first_delta_out_before_any_model_goes_on() -> None:
    """Fair scheduling: Requests read in one loop turn each get their first Delta written at once, in the read.
    The first stream's model runs on (a lone Request still ends in its first step); every later one takes its
    next step in the next turn, after the other first Deltas. One end-of-turn callback per turn serves every
    connection's held frames (not one per connection)."""
    resumed: list[int] = []

    async def model(req: Any) -> Any:
        yield "t0 "
        resumed.append(req.stream_id)  # the model's next step
        yield "t1 "
        yield "t2 "

    conns = [ReadConn(model) for _ in range(3)]
    for conn in conns:
        conn.read(ev.Hello())
    await end_of_turn()
    turns = Turns.of(asyncio.get_running_loop())
    before = turns.turn
    for sid, conn in enumerate(conns, 1):  # one turn: three Requests
        conn.read(ev.Request(stream_id=sid, text="x"))
    assert [conn.kinds().count("write") for conn in conns] == [2, 2, 2]  # the Welcome, then the first Delta
    assert resumed == [1]  # only the turn's first stream went on; the others wait for the next turn
    assert turns.scheduled and turns.held == [conns[0].driver.writer] and turns.started == 3
    await wait_for(lambda: all(any(isinstance(e, ev.End) for e in conn.events()) for conn in conns))
    assert resumed == [1, 2, 3]
    assert turns.turn == before + 2 and not turns.held and turns.started == 0  # two turns, one callback each
    assert conns[0].kinds().count("write") == 3  # its other Deltas and the End: one write at the turn's end
    for conn in conns:
        assert [type(e) for e in conn.events()] == [ev.Welcome, ev.Delta, ev.Delta, ev.Delta, ev.End]
        assert "".join(e.text for e in conn.events() if type(e) is ev.Delta) == "t0 t1 t2 "
        await conn.driver.disconnected(1000)


async def test_a_first_delta_that_wrote_nothing_is_not_counted_so_a_later_lone_request_still_runs_on() -> None:
    """Turns.started counts first Deltas only in a turn that wrote (its end resets the count): a stream whose
    first Delta met a closing transport, in a turn with no other write, leaves no count behind, and a lone
    Request in a later turn still ends in its first step."""
    gate = asyncio.Event()

    async def waits(req: Any) -> Any:
        await gate.wait()
        yield "late"

    late, lone = ReadConn(waits), ReadConn(echo)
    for conn in (late, lone):
        conn.read(ev.Hello())
    await end_of_turn()
    late.read(ev.Request(stream_id=1, text="x"))
    await end_of_turn()
    turns = Turns.of(asyncio.get_running_loop())
    late.direct.closing = True  # (the connection is going: nothing more is written to it)
    gate.set()
    await wait_for(lambda: not late.driver.runner.tasks)
    assert turns.started == 0
    lone.read(ev.Request(stream_id=1, text="alone"))
    assert [type(e) for e in lone.events()][:2] == [ev.Welcome, ev.Delta]
    assert not lone.driver.runner.tasks  # it ended in its first step: no task left behind
    await end_of_turn()
    assert [type(e) for e in lone.events()] == [ev.Welcome, ev.Delta, ev.End]
    for conn in (late, lone):
        await conn.driver.disconnected(1000)


async def test_a_message_that_waits_holds_the_ones_after_it_in_order_with_reading_paused() -> None:
    """The authenticate hook runs in a thread: the Request read with the Hello waits for it, then runs."""
    conn = ReadConn(echo, authenticate="driver_support:allow_all")
    conn.read(ev.Hello(auth="t"), ev.Request(stream_id=1, text="after the hello"))
    assert conn.kinds() == ["pause"]  # nothing answered yet: the hook is running
    # (the End, which follows the Delta in the same loop turn, is written when that turn ends)
    await wait_for(lambda: "resume" in conn.kinds() and any(isinstance(e, ev.End) for e in conn.events()))
    events = conn.events()
    assert [type(e) for e in events] == [ev.Welcome, ev.Delta, ev.End]
    assert events[1].text == "after the hello"
    assert [k for k in conn.kinds() if k in ("pause", "resume")] == ["pause", "resume"]
    await conn.driver.disconnected(1000)


async def test_a_flood_in_one_read_is_handled_one_message_per_loop_turn_past_the_burst() -> None:
    conn = ReadConn(echo)
    conn.read(ev.Hello())
    await end_of_turn()
    pings = [ev.Ping(id=i) for i in range(1, BURST + 41)]
    conn.read(*pings)
    await end_of_turn()
    answered = sum(type(e) is ev.Pong for e in conn.events())
    assert BURST <= answered < len(pings)  # the burst at once, the rest later
    assert "pause" in conn.kinds()
    await wait_for(lambda: "resume" in conn.kinds())
    assert [e.id for e in conn.events() if type(e) is ev.Pong] == [p.id for p in pings]  # all, in order
    await conn.driver.disconnected(1000)


async def test_direct_reads_are_refused_while_messages_are_queued_and_asgi_receive_keeps_working() -> None:
    log: list[tuple[str, Any]] = []
    direct = FakeReads(log)
    direct.queued = True
    driver = ConnectionDriver(endpoint_for(echo), send=lambda m: asyncio.sleep(0), subprotocol=SUBPROTOCOL_PROTO,
                              direct=direct)
    assert not driver.read_directly() and direct.receiver is None
    await driver.receive(codec_for(SUBPROTOCOL_PROTO).encode(ev.Hello()))
    assert driver.protocol.session is not None
    await driver.disconnected(1000)


async def test_a_failure_handling_a_fed_message_closes_1011_and_is_logged(caplog: Any) -> None:
    conn = ReadConn(echo)

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug")

    conn.driver.protocol.receive_data = broken  # type: ignore[method-assign]
    conn.read(ev.Hello())
    await wait_for(lambda: conn.closed() is not None)
    assert conn.closed() == CloseCode.INTERNAL_ERROR
    assert "failed handling a message" in caplog.text
    await conn.driver.disconnected(CloseCode.INTERNAL_ERROR)


# ================================================================================ the fast frame reader
def _wire(opcode: int, payload: bytes, *, fin: bool, rsv: int, mask: bytes | None, long16: bool) -> bytes:
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    flag = 0x80 if mask is not None else 0
    if n < 126 and not long16:
        head += bytes([flag | n])
    elif n < 1 << 16:
        head += bytes([flag | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([flag | 127]) + n.to_bytes(8, "big")
    if mask is None:
        return head + payload
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


def _websockets_reads(data: bytes, masked: bool, limit: int) -> tuple[Any, int] | None:
    """What websockets' parser makes of the frame at the start of `data`: (frame, bytes used), or None."""
    reader = StreamReader()
    reader.feed_data(data)
    parser = Frame.parse(reader.read_exact, mask=masked, max_size=limit, extensions=[])
    try:
        next(parser)
    except StopIteration as done:
        return done.value, len(data) - len(reader.buffer)
    except Exception:
        return None
    return None  # it wants more


@given(opcode=st.sampled_from([0, 1, 2, 3, 8, 9, 10]), fin=st.booleans(), rsv=st.sampled_from([0, 0, 0, 4, 1]),
       masked=st.booleans(), client=st.booleans(), long16=st.booleans(),
       payload=st.one_of(st.binary(max_size=300), st.text(max_size=200).map(str.encode),
                         st.sampled_from([b"\xff\xfe", b"caf\xc3", bytes(70000)])),
       cut=st.integers(0, 8), extra=st.binary(max_size=8))
def test_next_message_reads_what_websockets_reads_or_leaves_it(opcode: int, fin: bool, rsv: int, masked: bool,
                                                                client: bool, long16: bool, payload: bytes,
                                                                cut: int, extra: bytes) -> None:
    """Whenever the fast reader takes a frame, websockets' parser reads the same message from the same
    bytes; and it takes every whole, unfragmented, correctly masked text (valid UTF-8) or binary frame
    without RSV bits of at most the limit. Partial frames (`cut`), control frames, fragments, RSV bits,
    wrong masking, bad UTF-8 and frames over the limit are left to websockets."""
    limit = 65536
    wire = _wire(opcode, payload, fin=fin, rsv=rsv, mask=b"\x01\x82\x03\xf4" if masked else None, long16=long16)
    data = wire[:len(wire) - cut] if cut else wire + extra
    got = next_message(data, 0, client, limit)
    theirs = _websockets_reads(data, client, limit)
    if got is not None:
        assert theirs is not None
        frame, used = theirs
        message, end = got
        assert end == used == len(wire)
        assert frame.fin and frame.opcode in (Opcode.TEXT, Opcode.BINARY)
        assert message == (frame.data.decode() if frame.opcode is Opcode.TEXT else frame.data)
    ok_text = opcode != 1
    if opcode == 1:
        try:
            payload.decode()
            ok_text = True
        except UnicodeDecodeError:
            ok_text = False
    common = (not cut and fin and rsv == 0 and opcode in (1, 2) and masked == client and len(payload) <= limit
              and len(payload) < 1 << 16 and ok_text)
    assert (got is not None) == common


def _open_pair() -> tuple[Any, Any]:
    """websockets' sans-I/O server and client protocols, handshake done (both OPEN)."""
    from websockets.client import ClientProtocol
    from websockets.server import ServerProtocol
    from websockets.uri import parse_uri

    from lowlat_mw.runtime.direct import watch_parser

    client, server = ClientProtocol(parse_uri("ws://localhost/")), ServerProtocol()
    watch_parser(client)
    watch_parser(server)
    client.send_request(client.connect())
    server.receive_data(b"".join(client.data_to_send()))
    [request] = server.events_received()
    server.send_response(server.accept(request))
    client.receive_data(b"".join(server.data_to_send()))
    assert client.events_received()  # (the handshake's response)
    return server, client


@pytest.mark.parametrize("side", ["server", "client"])
def test_the_parser_is_idle_only_at_a_frame_boundary_not_after_a_header_whose_payload_is_to_come(side: str) -> None:
    """websockets takes a frame's header and mask out of its buffer as it reads them: after a read that ends right
    after a header its buffer is empty, and its parser waits for the payload. Then the next read is that payload,
    not frames of their own (a payload that looks like a whole frame must not be read as one)."""
    from lowlat_mw.runtime.direct import parser_idle

    conn = _open_pair()[0 if side == "server" else 1]
    masked = side == "server"  # (a server reads masked frames, a client unmasked ones)
    head = bytes((0x82, (0x80 if masked else 0) | 5)) + (b"\0\0\0\0" if masked else b"")
    assert parser_idle(conn)
    conn.receive_data(head)
    assert not conn.reader.buffer and not parser_idle(conn)  # (the buffer alone said idle here)
    conn.receive_data(b"hello")
    assert [f.data for f in conn.events_received()] == [b"hello"] and parser_idle(conn)
    conn.receive_data(head[:1])
    assert not parser_idle(conn)  # (half a header: buffered)
    conn.receive_data(head[1:] + b"hello")
    assert [f.data for f in conn.events_received()] == [b"hello"] and parser_idle(conn)


def _waits_between_frames(conn: Any) -> bool:
    """Where websockets' parser generator waits, read from its frames (what parser_idle did before issue 39): in
    ``StreamReader.at_eof``, between two frames. Tests only: lowlat_mw walks no generator (test_architecture)."""
    from websockets.streams import StreamReader

    waiting = conn.parser
    while getattr(waiting, "gi_yieldfrom", None) is not None:
        waiting = waiting.gi_yieldfrom
    return getattr(waiting, "gi_code", None) is StreamReader.at_eof.__code__


@pytest.mark.parametrize("side", ["server", "client"])
def test_the_watched_parser_is_idle_exactly_where_its_generator_waits_between_frames(side: str) -> None:
    """Differential: a run of data frames, a fragmented message with a Ping inside and a 16-bit length, cut at every
    byte, fed in two reads: after each read the watched reader's flag (parser_idle) says what the parser's own
    generator frames say, and never idle inside a fragmented message."""
    from lowlat_mw.runtime.direct import parser_idle

    masked = side == "server"

    def frame(op: int, payload: bytes, fin: bool = True) -> bytes:
        n = len(payload)
        head = bytes(((0x80 if fin else 0) | op,)) + (bytes(((0x80 if masked else 0) | n,)) if n < 126 else
                                                       bytes(((0x80 if masked else 0) | 126,)) + n.to_bytes(2, "big"))
        return head + (b"\0\0\0\0" if masked else b"") + payload

    before = frame(2, b"hello") + frame(1, b"x" * 300) + frame(1, b"par", fin=False)
    inside = frame(9, b"p") + frame(0, b"tial")
    wire = before + inside + frame(2, b"")
    fragmented = range(len(before), len(before + inside))  # (from the first fragment's end to the last one's)
    for cut in range(len(wire) + 1):
        conn = _open_pair()[0 if side == "server" else 1]
        for part, end in ((wire[:cut], cut), (wire[cut:], len(wire))):
            conn.receive_data(part)
            assert parser_idle(conn) == (_waits_between_frames(conn) and end not in fragmented), (cut, end)
        assert parser_idle(conn)
        conn.events_received()


def test_next_message_reads_a_run_of_frames_from_an_offset() -> None:
    a, b = _wire(2, b"one", fin=True, rsv=0, mask=None, long16=False), _wire(1, "два".encode(), fin=True, rsv=0,
                                                                              mask=None, long16=True)
    data = b"xx" + a + b
    first = next_message(data, 2, False, None)
    assert first == (b"one", 2 + len(a))
    assert next_message(data, first[1], False, None) == ("два", len(data))
    assert next_message(data, len(data), False, None) is None
