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

from wsproto.events import CloseConnection, Message

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
    _finish(ws, BOUND)  # once more, after everything: nothing to do, nothing raised


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


def _until_close(sock: socket.socket) -> bytes:
    """What `sock` reads up to the end of the first close frame after the 101 response (nothing past it)."""
    data = b""
    while True:
        if b"\r\n\r\n" in data:
            rest = data[data.index(b"\r\n\r\n") + 4:]
            while len(rest) >= 2 and len(rest) >= 2 + (rest[1] & 0x7F):
                if rest[0] & 0x0F == 0x8:
                    return data
                rest = rest[2 + (rest[1] & 0x7F):]
        data += sock.recv(1)


def _frames(data: bytes) -> list[int]:
    """The opcodes of the (unmasked, short) server frames in `data`, after the 101 response."""
    data = data[data.index(b"\r\n\r\n") + 4:]
    opcodes = []
    while data:
        length = data[1] & 0x7F
        assert length < 126, data
        opcodes.append(data[0] & 0x0F)
        data = data[2 + length:]
    return opcodes


class HeldWrite:
    """Wraps the connection's wsproto ``send`` so that the first message sent through it stops once its frame is
    made (and, where the frame is written as it is made, written), before simple-websocket's own write, until
    :meth:`go`."""

    def __init__(self, ws: _Server) -> None:
        self.held, self._go = threading.Event(), threading.Event()
        send = ws.ws.send

        def held_send(event: Any) -> bytes:
            data: bytes = send(event)
            if isinstance(event, Message) and not self.held.is_set():
                self.held.set()
                assert self._go.wait(BOUND)
            return data

        ws.ws.send = held_send  # type: ignore[method-assign]

    def go(self) -> None:
        self._go.set()


def test_frames_reach_the_wire_in_the_order_they_were_made(connection) -> None:
    """A Delta's frame is made on one thread (the send pool) and the driver's close on another: the close frame goes
    out after the Delta, never before it with the Delta written after it (RFC 6455 5.5.1: nothing follows the close
    frame). simple-websocket made the frame under the lock and wrote it after letting go."""
    ws, client = connection
    held = HeldWrite(ws)
    delta, errors = _in_thread(lambda: ws.send(b"delta"))
    assert held.held.wait(BOUND)  # the Delta's frame is made
    closer, close_errors = _in_thread(lambda: ws.close(1000))  # the driver's close, on another thread, goes first
    closer.join(BOUND)
    assert not closer.is_alive() and close_errors == []
    held.go()
    delta.join(BOUND)
    assert errors == []
    client.sendall(_client_close())
    assert _frames(_read_all(client)) == [0x2, 0x8]


class ClosingSocket(socket.socket):
    """The server's socket, whose close (by simple-websocket's reader thread, the connection over) stops at its start
    until `go`, and whose shutdown is logged with it in `events`; `hold_shutdown`: shutdown stops too."""

    hold_shutdown = False

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self.closing, self.go = threading.Event(), threading.Event()
        self.shutting = threading.Event()
        self.events: list[str] = []

    def close(self) -> None:
        self.events.append("close")
        self.closing.set()
        assert self.go.wait(BOUND)
        super().close()

    def shutdown(self, how: int) -> None:
        self.events.append("shutdown")
        if self.hold_shutdown:
            self.shutting.set()
            assert self.go.wait(BOUND)
        super().shutdown(how)
        self.events.append("shut down")


@pytest.fixture
def held_close() -> Iterator[tuple[_Server, socket.socket, ClosingSocket]]:
    server_end, client_end = socket.socketpair()
    client_end.settimeout(BOUND)
    sock = ClosingSocket(server_end)
    ws = _Server(_environ(sock), max_message_size=1 << 20)
    yield ws, client_end, sock
    sock.go.set()
    client_end.close()
    ws.thread.join(BOUND)
    sock.close()


def _binary(payload: bytes) -> bytes:
    return bytes([0x82, len(payload)]) + payload


def test_nothing_is_written_after_the_answer_to_the_peers_close(held_close) -> None:
    """The driver's direct writes (the thread bridge's SocketWriter, on ``ws.sock``) race simple-websocket's reader
    thread answering the peer's close: a Delta written after that answer followed the close frame on the wire."""
    ws, client, sock = held_close
    client.sendall(_client_close())
    assert sock.closing.wait(BOUND)  # the reader answered the close and is closing the socket
    try:
        ws.sock.sendall(_binary(b"delta"))  # (what SocketWriter does)
    except OSError:  # refused: the close frame went out
        pass
    sock.go.set()
    assert _frames(_read_all(client)) == [0x8]


def test_the_drop_after_close_timeout_never_overlaps_the_sockets_close(held_close) -> None:
    """ThreadDriver's drop (close_timeout after its close: shut the socket down) and simple-websocket's reader closing
    the socket run on two threads: a shutdown reaching the descriptor after its close may hit another socket that
    got its number. They go one after the other: a shutdown under way holds the close back."""
    from driver_support import endpoint_for

    from lowlat_mw.runtime.threads import ThreadDriver

    ws, _client, sock = held_close
    driver = ThreadDriver(endpoint_for(lambda req: ""), send=ws.send, close=lambda code, reason: ws.close(code),
                          subprotocol=None, sock=ws.sock)
    try:
        sock.hold_shutdown = True
        drop, errors = _in_thread(driver._drop)
        assert sock.shutting.wait(BOUND)  # the drop is shutting the socket down
        closer, close_errors = _in_thread(ws.sock.close)  # the reader thread's close, meanwhile
        closer.join(0.5)  # (it waits for the shutdown; before, it went at once: the log shows which)
        sock.go.set()
        drop.join(BOUND)
        closer.join(BOUND)
        assert errors == close_errors == []
        assert sock.events.index("shut down") < sock.events.index("close"), sock.events
    finally:
        driver.disconnected(None)


def test_finish_waits_for_the_peers_answer_for_its_close_timeout(connection) -> None:
    """The connection's thread ends with _finish: our close, then simple-websocket's reader thread ends once the peer
    answers it, or the socket is shut down after the connection's close_timeout, not after a fixed 2 s."""
    ws, client = connection
    finish, errors = _in_thread(lambda: _finish(ws, 8.0))
    assert _close_frames(_until_close(client)) == [1000]
    client.settimeout(3.0)
    with pytest.raises(TimeoutError):  # (nothing: no EOF, the socket is not shut down before close_timeout)
        client.recv(1)
    client.settimeout(BOUND)
    client.sendall(_client_close())
    assert client.recv(1) == b""  # answered: the reader ends and closes the socket
    finish.join(BOUND)
    assert not finish.is_alive() and errors == []
