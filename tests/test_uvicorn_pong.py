"""The heartbeat's Pong shortcut of lowlat-mw's uvicorn protocol, in a real uvicorn on a loopback socket.

When the driver writes a heartbeat Ping it tells the transport which Pong will answer it
(``DirectReads.expect``); a socket read that is exactly that Pong, in one masked frame, goes to the driver
without websockets' parser. Everything else is parsed as before: these tests prove the shortcut is taken
(the expectation is consumed) and that it changes nothing a client can see.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.settings import SUBPROTOCOL_PROTO

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from uvicorn_support import WAIT, Conn, InProcessServer, client_frame

CODEC = codec_for(SUBPROTOCOL_PROTO)


def Server() -> InProcessServer:
    """A 1 s heartbeat whose Pong may take as long as a loaded machine needs."""
    return InProcessServer(record=True, heartbeat_interval=1.0, heartbeat_timeout=WAIT)


async def ping(conn: Conn) -> ev.Ping:
    event = await conn.event()
    assert isinstance(event, ev.Ping), event
    return event


async def test_the_awaited_pong_skips_the_parser_and_anything_else_is_parsed_as_before() -> None:
    async with asyncio.timeout(2 * WAIT), Server() as server:
        conn, _ = await server.connect()
        writer = conn.writer
        [direct] = server.offered
        first = await ping(conn)
        pong = CODEC.encode(ev.Pong(id=first.id))
        assert direct.expect is not None and direct.expect.message == pong  # armed before the Ping went out
        writer.write(client_frame(pong))  # one read, exactly the Pong: the shortcut
        while server.samples("lowlat_heartbeat_rtt_seconds") < 1:
            await asyncio.sleep(0.01)
        assert direct.expect is None  # taken by data_received, not by the parser

        second = await ping(conn)
        pong = CODEC.encode(ev.Pong(id=second.id))
        assert direct.expect is not None and direct.expect.message == pong
        # The Pong and a Ping of the client's in one read: not the awaited bytes, parsed; both handled.
        writer.write(client_frame(pong) + client_frame(CODEC.encode(ev.Ping(id=77))))
        assert await conn.event() == ev.Pong(id=77)
        while server.samples("lowlat_heartbeat_rtt_seconds") < 2:
            await asyncio.sleep(0.01)
        assert direct.expect is not None  # (left for a read that is exactly the Pong: none came)
        writer.close()


async def test_the_awaited_pong_inside_a_fragmented_message_is_a_protocol_error_as_before() -> None:
    """A data frame while a fragmented message is unfinished is a protocol violation (RFC 6455 5.4), even when
    its bytes are the awaited Pong: websockets' parser, which holds the fragment, decides (1002)."""
    async with asyncio.timeout(2 * WAIT), Server() as server:
        conn, _ = await server.connect()
        writer = conn.writer
        [direct] = server.offered
        first = await ping(conn)
        writer.write(client_frame(b"\x0a", fin=False) + client_frame(b"sync", opcode=0x9))  # a fragment, a WS ping
        assert await conn.frame() == (0xA, b"sync")  # the server has read the fragment
        assert direct.expect is not None
        writer.write(client_frame(CODEC.encode(ev.Pong(id=first.id))))  # one read, exactly the awaited Pong
        opcode, payload = await conn.frame()
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1002
        assert server.samples("lowlat_heartbeat_rtt_seconds") == 0
        writer.close()


async def test_the_shortcut_is_off_while_the_parser_holds_a_fragment_and_back_once_the_message_is_whole() -> None:
    """Whether websockets' parser is between two messages is kept on the transport (``idle``) and settled after each
    read the parser took: a Pong sent in two fragments, in two reads, is parsed (off in between), and the next
    Pong, one whole frame in one read, takes the shortcut again."""
    async with asyncio.timeout(2 * WAIT), Server() as server:
        conn, _ = await server.connect()
        writer = conn.writer
        [direct] = server.offered
        assert direct.idle
        first = await ping(conn)
        pong = CODEC.encode(ev.Pong(id=first.id))
        writer.write(client_frame(pong[:1], fin=False) + client_frame(b"sync", opcode=0x9))  # a fragment, a WS ping
        assert await conn.frame() == (0xA, b"sync")  # the server has read the fragment
        assert not direct.idle and direct.expect is not None
        writer.write(client_frame(pong[1:], opcode=0x0))  # the rest: a whole Pong, through the parser
        while server.samples("lowlat_heartbeat_rtt_seconds") < 1:
            await asyncio.sleep(0.01)
        assert direct.idle

        second = await ping(conn)
        assert direct.expect is not None and direct.expect.message == CODEC.encode(ev.Pong(id=second.id))
        writer.write(client_frame(direct.expect.message))
        while server.samples("lowlat_heartbeat_rtt_seconds") < 2:
            await asyncio.sleep(0.01)
        assert direct.expect is None  # taken by the shortcut
        writer.close()


async def test_the_awaited_pong_reaches_the_machine_without_its_decoder_and_is_counted_and_measured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver knows the awaited Pong by identity (the transport hands it the very object it was told to
    await) and gives it to ``ServerProtocol.pong_arrived``, not ``receive_data``: counted as a received frame
    with its bytes, its RTT measured, and the next Ping scheduled, as the decoding path would."""
    from lowlat_mw.protocol.server import ServerProtocol

    decoded: list[bytes | str] = []
    receive_data = ServerProtocol.receive_data

    def spy(self: ServerProtocol, data: bytes | str, now: float) -> list[object]:
        decoded.append(data)
        return receive_data(self, data, now)

    monkeypatch.setattr(ServerProtocol, "receive_data", spy)
    async with asyncio.timeout(2 * WAIT), Server() as server:
        conn, _ = await server.connect()
        [direct] = server.offered
        for n in (1, 2):
            got = await ping(conn)
            pong = CODEC.encode(ev.Pong(id=got.id))
            before = server.samples("lowlat_frames_received", "_total")
            conn.writer.write(client_frame(pong))
            while server.samples("lowlat_heartbeat_rtt_seconds") < n:
                await asyncio.sleep(0.01)
            assert direct.expect is None
            assert server.samples("lowlat_frames_received", "_total") == before + 1
            assert pong not in decoded  # (the Hello went through receive_data)
        assert decoded and isinstance(decoded[0], bytes)  # the spy does see what is decoded: the Hello
        conn.writer.close()


async def test_a_pong_that_does_not_come_closes_at_its_timeout_through_the_watch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The awaited Pong's timeout is a watch of the scheduler's (the connection's timer is at the next Ping, where
    the Pong would leave it). With the timeout sooner than the next Ping, a client that never answers is closed
    with 4001 by the watch: it finds the Pong still awaited and makes the timer due at once."""
    from lowlat_mw.errors import CloseCode
    from lowlat_mw.runtime.connection import ConnectionDriver

    overdue: list[tuple[bool, bool]] = []
    on_watch = ConnectionDriver.on_watch

    def spy(self: ConnectionDriver, now: float, pong: object) -> None:
        awaited = self.protocol.pong_frame is pong
        on_watch(self, now, pong)
        overdue.append((awaited, self.scheduler._queue._when.get(self) == now))  # (still awaited, timer due now)

    monkeypatch.setattr(ConnectionDriver, "on_watch", spy)
    async with asyncio.timeout(2 * WAIT), \
            InProcessServer(record=True, heartbeat_interval=1.0, heartbeat_timeout=0.3) as server:
        conn, _ = await server.connect()
        [direct] = server.offered
        await ping(conn)  # not answered
        assert direct.expect is not None
        opcode, payload = await conn.frame()
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == CloseCode.HEARTBEAT_TIMEOUT
        assert overdue == [(True, True)]  # the watch made the timer due: not the next Ping's timer
        conn.writer.close()

