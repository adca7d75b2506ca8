"""The heartbeat's Pong shortcut of lowlat-mw's uvicorn protocol, in a real uvicorn on a loopback socket.

When the driver writes a heartbeat Ping it tells the transport which Pong will answer it
(``DirectReads.expect``); a socket read that is exactly that Pong, in one masked frame, goes to the driver
without websockets' parser. Everything else is parsed as before: these tests prove the shortcut is taken
(the expectation is consumed) and that it changes nothing a client can see.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
from typing import Any

import pytest

from lowlat_mw.drivers.direct import EXTENSION
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.codec import codec_for
from lowlat_mw.settings import SUBPROTOCOL_PROTO

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

CODEC = codec_for(SUBPROTOCOL_PROTO)
WAIT = 30.0  # generous: a loaded CI machine


def client_frame(payload: bytes, opcode: int = 0x2, fin: bool = True) -> bytes:
    """One client frame, masked with a random key (as every client must, RFC 6455 5.3)."""
    key = os.urandom(4)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    n = len(payload)
    head = bytes(((0x80 if fin else 0) | opcode,))
    head += bytes((0x80 | n,)) if n < 126 else struct.pack("!BH", 0x80 | 126, n)
    return head + key + masked


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(opcode, payload) of the next server frame (unmasked, small)."""
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    return b0 & 0x0F, await reader.readexactly(n)


async def next_event(reader: asyncio.StreamReader) -> Any:
    """The next protocol message (WebSocket control frames: returned as ("control", opcode, payload))."""
    opcode, payload = await read_frame(reader)
    if opcode >= 0x8:
        return ("control", opcode, payload)
    return CODEC.decode(payload, limit=1 << 20)


class Server:
    """uvicorn with lowlat-mw's WebSocket protocol and the middleware (1 s heartbeat), in this event loop; keeps
    the ``lowlat.transport`` extension each connection was offered."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry
        from starlette.applications import Starlette

        from lowlat_mw.adapters.starlette import LowLatMiddleware
        from lowlat_mw.servers.uvicorn import WebSocketProtocol

        async def echo(req: Any) -> Any:
            yield req.text

        self.registry = CollectorRegistry()
        inner = LowLatMiddleware(Starlette(), model=echo, path="/ws", registry=self.registry, heartbeat_interval=1.0,
                                 heartbeat_timeout=WAIT)
        self.offered: list[Any] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "websocket":
                self.offered.append(scope["extensions"][EXTENSION])
            await inner(scope, receive, send)

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, ws=WebSocketProtocol, lifespan="off", log_level="warning",
                                ws_ping_interval=None, ws_per_message_deflate=False)
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Server:
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        async with asyncio.timeout(WAIT):
            while not self.server.started:
                await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        assert self.task is not None
        await asyncio.wait_for(self.task, WAIT)
        self.sock.close()

    def rtts(self) -> float:
        """Heartbeat RTTs the middleware observed."""
        return sum(s.value for m in self.registry.collect() if m.name == "lowlat_heartbeat_rtt_seconds"
                   for s in m.samples if s.name.endswith("_count"))

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A WebSocket on /ws (proto subprotocol), Hello sent, Welcome read."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write((f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                      f"Sec-WebSocket-Protocol: {SUBPROTOCOL_PROTO}\r\n\r\n").encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        writer.write(client_frame(CODEC.encode(ev.Hello())))
        assert isinstance(await next_event(reader), ev.Welcome)
        return reader, writer


async def ping(reader: asyncio.StreamReader) -> ev.Ping:
    event = await next_event(reader)
    assert isinstance(event, ev.Ping), event
    return event


async def test_the_awaited_pong_skips_the_parser_and_anything_else_is_parsed_as_before() -> None:
    async with asyncio.timeout(2 * WAIT), Server() as server:
        reader, writer = await server.connect()
        [direct] = server.offered
        first = await ping(reader)
        pong = CODEC.encode(ev.Pong(id=first.id))
        assert direct.expect is not None and direct.expect.message == pong  # armed before the Ping went out
        writer.write(client_frame(pong))  # one read, exactly the Pong: the shortcut
        while server.rtts() < 1:
            await asyncio.sleep(0.01)
        assert direct.expect is None  # taken by data_received, not by the parser

        second = await ping(reader)
        pong = CODEC.encode(ev.Pong(id=second.id))
        assert direct.expect is not None and direct.expect.message == pong
        # The Pong and a Ping of the client's in one read: not the awaited bytes, parsed; both handled.
        writer.write(client_frame(pong) + client_frame(CODEC.encode(ev.Ping(id=77))))
        assert await next_event(reader) == ev.Pong(id=77)
        while server.rtts() < 2:
            await asyncio.sleep(0.01)
        assert direct.expect is not None  # (left for a read that is exactly the Pong: none came)
        writer.close()


async def test_the_awaited_pong_inside_a_fragmented_message_is_a_protocol_error_as_before() -> None:
    """A data frame while a fragmented message is unfinished is a protocol violation (RFC 6455 5.4), even when
    its bytes are the awaited Pong: websockets' parser, which holds the fragment, decides (1002)."""
    async with asyncio.timeout(2 * WAIT), Server() as server:
        reader, writer = await server.connect()
        [direct] = server.offered
        first = await ping(reader)
        writer.write(client_frame(b"\x0a", fin=False) + client_frame(b"sync", opcode=0x9))  # a fragment, a WS ping
        assert await next_event(reader) == ("control", 0xA, b"sync")  # the server has read the fragment
        assert direct.expect is not None
        writer.write(client_frame(CODEC.encode(ev.Pong(id=first.id))))  # one read, exactly the awaited Pong
        event = await next_event(reader)
        assert event[:2] == ("control", 0x8) and struct.unpack("!H", event[2][:2])[0] == 1002
        assert server.rtts() == 0
        writer.close()
