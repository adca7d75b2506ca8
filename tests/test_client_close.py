"""The Python client closes its socket even when the server stopped reading (issue 38, item 2, the client's side).

websockets' close writes the close frame and then waits for its write buffer to drain before its own close
timeout starts: behind output a server does not read, it waited for good, and the socket stayed open. The
client bounds it (twice the connection's close_timeout: the drain, then the closing handshake) and aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import pytest
from support import seconds, wait_until
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from lowlat_mw.client import connect
from lowlat_mw.errors import ClientError
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import JsonCodec
from lowlat_mw.settings import SUBPROTOCOL_JSON

CLOSE_TIMEOUT = 0.2  # the client connection's, set by the test (websockets' default is 10 s)
REQUEST = 16 * 1024 * 1024  # bytes the client sends: far more than the sockets between it and the server hold


class DeafServer:
    """One WebSocket connection on loopback: answers the handshake and the Hello, then reads nothing (a 4 KiB
    receive buffer), so whatever the client writes next backs up in the client."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (inherited by the accepted socket)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.listener.settimeout(10)
        self.port = self.listener.getsockname()[1]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10)
        with conn:
            ws = ServerProtocol(subprotocols=[Subprotocol(SUBPROTOCOL_JSON)], max_size=None)
            frames: list[object] = []
            while not frames:
                ws.receive_data(conn.recv(65536))
                for event in ws.events_received():
                    if hasattr(event, "opcode"):
                        frames.append(event)  # the Hello
                    else:  # the opening handshake's request
                        ws.send_response(ws.accept(event))
                        conn.sendall(b"".join(ws.data_to_send()))
            ws.send_text(JsonCodec().encode(ev.Welcome(session_id="s", heartbeat_interval_ms=60_000)).encode())
            conn.sendall(b"".join(ws.data_to_send()))
            self.done.wait(30)  # reading nothing more


@pytest.mark.timeout(30)
async def test_close_ends_the_connection_when_the_server_reads_nothing() -> None:
    server = DeafServer()
    try:
        async with asyncio.timeout(20):
            client = connect(f"ws://127.0.0.1:{server.port}/ws", mode="json")
            await client.open()
            ws = client._ws
            assert ws is not None
            ws.close_timeout = CLOSE_TIMEOUT
            stream = client.stream("x" * REQUEST)
            reading = asyncio.ensure_future(stream.text())  # sends the Request, which backs up
            # the client's writes are held back
            await wait_until(lambda: ws.transport.get_write_buffer_size() >= REQUEST // 2, seconds(20), interval=0.01)
            started = time.monotonic()
            await asyncio.wait_for(client.close(), 10)
            elapsed = time.monotonic() - started
            assert ws.state is State.CLOSED
            with contextlib.suppress(ClientError):
                await reading
    finally:
        server.done.set()
        server.thread.join(5)
        server.listener.close()
    print(f"\nclient close behind unread output: {elapsed:.2f} s (close_timeout {CLOSE_TIMEOUT} s)")
    assert elapsed < 2 * CLOSE_TIMEOUT + 2.0  # the drain, the handshake, and scheduling slack
