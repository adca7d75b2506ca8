"""The Python client's direct delivery: messages go from websockets' data_received straight to the client.

A plain `websockets` server speaks the protocol by hand here, so the test decides how messages are framed
(fragmented or not) and proves the order holds either way.
"""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.server import serve
from websockets.frames import Frame, Opcode

from lowlat_mw.client import connect
from lowlat_mw.client.websocket import _Connection
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.settings import SUBPROTOCOL_PROTO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]
CODEC = codec_for(SUBPROTOCOL_PROTO)


def welcome() -> bytes:
    return CODEC.encode(ev.Welcome(session_id="s", resume_token="s.t", heartbeat_interval_ms=30_000,
                                   compression=(), resume_window_ms=0, flow_window=0))


async def test_the_client_reads_in_order_whether_messages_come_whole_or_fragmented() -> None:
    async def handler(ws):
        await ws.recv()  # Hello
        await ws.send(welcome())
        req = CODEC.decode(await ws.recv(), limit=1 << 20, allowed=None)
        sid = req.stream_id
        await ws.send(CODEC.encode(ev.Delta.of(sid, 1, "a")))  # whole: delivered directly
        frame = CODEC.encode(ev.Delta.of(sid, 2, "b"))
        await ws.send([frame[:3], frame[3:]])  # fragmented: websockets reassembles it, the rest follows it
        await ws.send(CODEC.encode(ev.Delta.of(sid, 3, "c")))
        await ws.send(CODEC.encode(ev.End(stream_id=sid, last_seq=3, finish_reason="stop")))
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, subprotocols=[SUBPROTOCOL_PROTO], compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(20), connect(f"ws://127.0.0.1:{port}") as client:
            assert isinstance(client._ws, _Connection)
            await asyncio.sleep(0)  # the reader task starts and turns direct delivery on
            assert client._ws.deliver is not None
            assert [c async for c in client.stream("go")] == ["a", "b", "c"]
            assert client._ws.deliver is None  # a fragmented message turned it off for this connection


def test_control_frames_bad_utf8_and_messages_behind_queued_ones_stay_with_websockets() -> None:
    seen: list[object] = []
    conn = _Connection.__new__(_Connection)
    conn.deliver = seen.append
    conn.response = object()  # past the handshake
    handled: list[Frame] = []

    class Queue:
        frames: list[Frame] = []

    conn.recv_messages = Queue()  # type: ignore[assignment]
    original = _Connection.__mro__[1].process_event
    try:
        _Connection.__mro__[1].process_event = lambda self, event: handled.append(event)  # type: ignore[method-assign]
        conn.process_event(Frame(Opcode.PING, b""))
        conn.process_event(Frame(Opcode.TEXT, b"\xff"))  # bad UTF-8: websockets closes with 1007
        conn.process_event(Frame(Opcode.TEXT, b"ok"))
        Queue.frames = [Frame(Opcode.BINARY, b"queued")]  # a message still queued for the reader task:
        conn.process_event(Frame(Opcode.BINARY, b"after"))  # the next one queues behind it (order holds)
    finally:
        _Connection.__mro__[1].process_event = original  # type: ignore[method-assign]
    assert seen == ["ok"]
    assert [(f.opcode, f.data) for f in handled] == [(Opcode.PING, b""), (Opcode.TEXT, b"\xff"),
                                                      (Opcode.BINARY, b"after")]
    assert conn.deliver is not None  # (still on: the reader catches up, then delivery is direct again)


def server_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """An unmasked server frame, built by hand (so several go out in one write)."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    head += bytes([n]) if n < 126 else bytes([126]) + n.to_bytes(2, "big")
    return head + payload


@pytest.mark.parametrize("fragmented", [False, True])
async def test_one_read_mixing_whole_messages_a_ping_and_a_fragment_is_read_in_order(fragmented: bool) -> None:
    """One server write: a whole Delta (read by the client's fast reader), a WebSocket ping (websockets'),
    a Delta whole or in two fragments, a Delta with a 16-bit length, the End. The client reads them all in
    order and answers the ping."""
    pongs: list[bytes] = []

    async def handler(ws):
        await ws.recv()  # Hello
        await ws.send(welcome())
        sid = CODEC.decode(await ws.recv(), limit=1 << 20, allowed=None).stream_id
        two = CODEC.encode(ev.Delta.of(sid, 2, "b"))
        parts = [server_frame(2, two[:3], fin=False), server_frame(0, two[3:])] if fragmented else [
            server_frame(2, two)]
        original = ws.protocol.recv_frame

        def recv_frame(frame: Frame) -> None:  # (sees the client's pong)
            if frame.opcode is Opcode.PONG:
                pongs.append(frame.data)
            original(frame)

        ws.protocol.recv_frame = recv_frame
        ws.transport.write(b"".join([
            server_frame(2, CODEC.encode(ev.Delta.of(sid, 1, "a"))), server_frame(9, b"hb"), *parts,
            server_frame(2, CODEC.encode(ev.Delta.of(sid, 3, "c" * 300))),
            server_frame(2, CODEC.encode(ev.End(stream_id=sid, last_seq=3, finish_reason="stop")))]))
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, subprotocols=[SUBPROTOCOL_PROTO], compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(20), connect(f"ws://127.0.0.1:{port}") as client:
            await asyncio.sleep(0)  # the reader task starts and turns direct delivery on
            assert [c async for c in client.stream("go")] == ["a", "b", "c" * 300]
            for _ in range(200):
                if pongs:
                    break
                await asyncio.sleep(0.01)
            assert pongs == [b"hb"]
            assert (client._ws.deliver is None) == fragmented
