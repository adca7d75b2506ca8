"""The Flask adapter's WebSocket closes once, whoever closes it and in whatever order (issue 38, item 5).

Three threads can close a Flask connection at the same time: the driver's close (run in the send pool),
the connection's own thread when its reading loop ends (``_finish``), and simple-websocket's reader thread
answering the peer's close. simple-websocket's ``close`` checks ``connected`` and then sends; a close that
came in between raised wsproto's ``LocalProtocolError`` (or ``OSError`` once the reader had closed the
socket), uncaught, with its traceback in the server's log (about 1 in 3,800 fuzzed connections). Here the
first close is stopped inside that window with events, the other one runs, then the first goes on.
"""

from __future__ import annotations

import base64
import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("flask")
pytest.importorskip("simple_websocket")

from wsproto.events import CloseConnection

from lowlat_mw.adapters.flask import _finish, _Server

BOUND = 10.0  # seconds any wait may take (a loaded machine); each ends on an event long before


def _environ(sock: socket.socket) -> dict[str, Any]:
    return {"gunicorn.socket": sock, "HTTP_HOST": "127.0.0.1", "HTTP_UPGRADE": "websocket",
            "HTTP_CONNECTION": "Upgrade", "HTTP_SEC_WEBSOCKET_VERSION": "13",
            "HTTP_SEC_WEBSOCKET_KEY": base64.b64encode(os.urandom(16)).decode()}


def _client_close(code: int = 1000) -> bytes:
    """A masked close frame, as a client sends it."""
    payload, mask = code.to_bytes(2, "big"), os.urandom(4)
    return bytes([0x88, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _close_frames(data: bytes) -> list[int]:
    """The close codes of the (unmasked, short) server frames in `data`, after the 101 response."""
    data = data[data.index(b"\r\n\r\n") + 4:]
    codes = []
    while data:
        opcode, length = data[0] & 0x0F, data[1] & 0x7F
        assert length < 126, data
        if opcode == 0x8:
            codes.append(int.from_bytes(data[2:4], "big"))
        data = data[2 + length:]
    return codes


class HeldClose:
    """Wraps the connection's wsproto ``send`` so that the first close sent through it stops `where` ("before"
    wsproto's send, i.e. after simple-websocket checked ``connected``; or "after" it, with the frame made but not
    yet written) until :meth:`go`."""

    def __init__(self, ws: _Server, where: str) -> None:
        self.held, self._go = threading.Event(), threading.Event()
        self._first = True
        send = ws.ws.send

        def held_send(event: Any) -> bytes:
            first = isinstance(event, CloseConnection) and self._first
            if first:
                self._first = False
                if where == "before":
                    self._wait()
            data: bytes = send(event)
            if first and where == "after":
                self._wait()
            return data

        ws.ws.send = held_send  # type: ignore[method-assign]

    def _wait(self) -> None:
        self.held.set()
        assert self._go.wait(BOUND)

    def go(self) -> None:
        self._go.set()


@pytest.fixture
def connection() -> Iterator[tuple[_Server, socket.socket]]:
    server_end, client_end = socket.socketpair()
    client_end.settimeout(BOUND)
    ws = _Server(_environ(server_end), max_message_size=1 << 20)
    yield ws, client_end
    client_end.close()
    ws.thread.join(BOUND)
    server_end.close()


def _in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # (what the thread raised, for the test to show)
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_the_driver_and_the_connection_thread_closing_at_once_send_one_close(connection) -> None:
    """The driver's close (send pool) is past simple-websocket's ``connected`` check when the connection's thread
    ends and closes too (``_finish``): one close goes out, and neither raises."""
    ws, client = connection
    held = HeldClose(ws, "before")
    driver_close, errors = _in_thread(lambda: ws.close(1007, "invalid payload"))
    assert held.held.wait(BOUND)
    ws.close()  # what _finish does first, on the connection's thread
    held.go()
    driver_close.join(BOUND)
    assert errors == []
    client.sendall(_client_close())  # the peer answers: the reader thread ends and closes the socket
    assert _close_frames(_read_all(client)) == [1000]
    ws.thread.join(BOUND)
    _finish(ws)  # once more, after everything: nothing to do, nothing raised


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_close_racing_the_peers_close_raises_nothing(connection, where: str) -> None:
    """The peer's close arrives while the driver's close is in flight: simple-websocket's reader thread answers it
    and closes the socket. The driver's close then sends nothing ("before": wsproto's state is closed) or finds the
    socket closed ("after"): neither raises."""
    ws, client = connection
    held = HeldClose(ws, where)
    driver_close, errors = _in_thread(lambda: ws.close(1007, "invalid payload"))
    assert held.held.wait(BOUND)
    client.sendall(_client_close())
    ws.thread.join(BOUND)  # the reader answered (or not: "after" made the close already) and closed the socket
    assert not ws.thread.is_alive()
    held.go()
    driver_close.join(BOUND)
    assert errors == []
    assert len(_close_frames(_read_all(client))) <= 1
