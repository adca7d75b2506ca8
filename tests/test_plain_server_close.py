"""A server that cannot drop a connection whose close goes unanswered still gets it released (issue 38, item 2).

Our uvicorn shims, daphne runner and Flask thread bridge drop a connection whose peer does not take its close within
``close_timeout``, and tell the driver when its socket is gone. Plain uvicorn (``--ws websockets-sansio``, no
lowlat-mw shim; gunicorn's UvicornWorker is the same) waits for a paused transport before it writes anything, the
close frame included: for a client that stopped reading the close never goes out and no ``websocket.disconnect``
ever comes. The driver then releases the connection itself (its slot, its session) about close_timeout after its
close, and says once per process that this server keeps such sockets.

A real uvicorn in the test's own loop (tests/uvicorn_support.py), a raw client with a small receive buffer that asks
for an endless stream and reads none of it.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import time
from typing import Any

import pytest
from support import wait_until
from uvicorn_support import WAIT, InProcessServer, client_frame

from lowlat_mw.errors import CloseCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.runtime import closing
from lowlat_mw.settings import SUBPROTOCOL_PROTO

CODEC = codec_for(SUBPROTOCOL_PROTO)
SLOW, CLOSE = 0.3, 0.3  # slow_consumer_timeout, close_timeout (s)
RCVBUF = 4096


async def flood(req: Any) -> Any:
    chunk = "x" * 65536
    while True:
        yield chunk


class Unread:
    """A client that asks for an endless stream through a small receive buffer, then reads nothing."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)  # (before connecting: the window scale)
        self.sock.setblocking(False)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_connect(self.sock, ("127.0.0.1", self.port))
        key = base64.b64encode(os.urandom(16)).decode()
        await loop.sock_sendall(self.sock, (
            f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: {SUBPROTOCOL_PROTO}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:  # (byte by byte: nothing of the WebSocket's is read past the response)
            byte = await loop.sock_recv(self.sock, 1)
            assert byte, head
            head += byte
        assert head.startswith(b"HTTP/1.1 101"), head
        await loop.sock_sendall(self.sock, client_frame(CODEC.encode(ev.Hello(client="unread", flow_window=0))))
        await loop.sock_sendall(self.sock, client_frame(CODEC.encode(ev.Request(stream_id=1, text="x"))))

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("ws", ["websockets", "wsproto"])
async def test_plain_uvicorn_releases_a_connection_whose_close_never_goes_out(ws: str, monkeypatch, caplog) -> None:
    pytest.importorskip(ws)
    # (Said once per process through CLIENT_LOGS.once, which the autouse fixture resets for each test.)
    caplog.set_level(logging.WARNING, logger="lowlat_mw")
    server = InProcessServer(flood, ws=ws, plain=True, slow_consumer_timeout=SLOW, close_timeout=CLOSE,
                             max_connections_per_client=1)
    endpoint = server.middleware.endpoint
    clients = [Unread(server.port), Unread(server.port)]
    async with asyncio.timeout(3 * WAIT), server:
        try:
            await clients[0].open()
            await wait_until(lambda: endpoint.limiter.total == 1, WAIT)
            start = time.monotonic()
            # The send blocks, 4003 after slow_consumer_timeout; its close frame never reaches the wire (uvicorn's send
            # waits for the paused transport), and no disconnect comes: the driver lets the connection go itself.
            await wait_until(lambda: endpoint.limiter.total == 0 and not endpoint.connections, WAIT)
            print(f"\nplain uvicorn ({ws}): released {time.monotonic() - start:.2f} s after the stream began "
                  f"(slow_consumer_timeout {SLOW} s, close_timeout {CLOSE} s + {closing.CLOSE_SLACK} s)")
            # the application's call ends too (not waiting on receive())
            await wait_until(lambda: server.returned == 1, WAIT)
            said = [r for r in caplog.records if "cannot drop" in r.getMessage()]
            assert len(said) == 1, [r.getMessage() for r in caplog.records]
            # One connection per client address: a new one is admitted, and served.
            await clients[1].open()
            await wait_until(lambda: endpoint.limiter.total == 1, WAIT)
            await wait_until(lambda: endpoint.limiter.total == 0 and not endpoint.connections, WAIT)
            await wait_until(lambda: server.returned == 2, WAIT)
            assert len([r for r in caplog.records if "cannot drop" in r.getMessage()]) == 1  # once per process
            closed = {s.labels.get("code"): s.value for m in server.registry.collect()
                      if m.name == "lowlat_connections_closed" for s in m.samples if s.name.endswith("_total")}
            assert closed.get(str(int(CloseCode.SLOW_CONSUMER))) == 2, closed
        finally:
            for client in clients:  # (uvicorn's shutdown waits for its connections: the peers go first)
                client.close()
