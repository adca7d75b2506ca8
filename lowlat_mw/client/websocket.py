"""The client's WebSocket: websockets' connection with messages handed straight to the client (:class:`_Connection`),
its bounded close, the heartbeat timer, and what a failed connection attempt means (nothing listens, a refusal).

Used by :mod:`lowlat_mw.client.reconnect` (which opens and reads the connection) and :mod:`lowlat_mw.client.aio`.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection
from websockets.frames import Frame, Opcode

from ..errors import HandshakeRefused
from ..protocol.base import CloseConnection, SendFrame
from ..runtime.direct import message_limit, next_message, parser_idle, watch_parser
from ..runtime.timers import AsyncScheduler

if TYPE_CHECKING:
    from .aio import AsyncClient


@dataclass(slots=True)
class _Closed:
    """How a connection ended: its close code (None: no close frame) and reason."""

    code: int | None
    reason: str


async def _close_ws(ws: ClientConnection, code: int = 1000, reason: str = "") -> None:
    """websockets' close of `ws`, bounded. It writes the close frame and waits for its write buffer to drain before
    its own close_timeout (10 s) starts, and a server that stopped reading never lets it drain: the close (and the
    socket) would wait for good. Past twice close_timeout (the drain, then the closing handshake) it is aborted."""
    timeout = ws.close_timeout if ws.close_timeout is not None else 10.0
    try:
        async with asyncio.timeout(2 * timeout):
            await ws.close(code, reason)
    except TimeoutError:
        ws.transport.abort()  # (connection_lost follows: the reader and every blocked send end)


def _keep_running(tasks: set[asyncio.Task[Any]], coro: Any) -> None:
    """Run `coro` (a Pong or Ping to send, a close) in a task of its own, kept in `tasks` until it is done."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


class _Timer:
    """One connection's heartbeat, driven by the loop's one scheduler: the machine's Pings and its 4001.

    The client pings the server when the connection is quiet and closes it with 4001 when the
    server stops answering, so a dead server is noticed even without server Pings.
    """

    def __init__(self, client: AsyncClient, ws: ClientConnection) -> None:
        self.client, self.ws = client, ws
        self.scheduler = AsyncScheduler.current()
        self.stopped = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.scheduler.schedule(self, client.protocol.next_deadline())

    def stop(self) -> None:
        self.stopped = True
        self.scheduler.cancel(self)

    def on_timer(self, now: float) -> float:
        if self.stopped:
            return math.inf
        proto = self.client.protocol
        for action in proto.tick(now):
            if isinstance(action, SendFrame):
                _keep_running(self._tasks, self.client._send_quietly(self.ws, action.data))
            elif isinstance(action, CloseConnection):
                self.stopped = True
                _keep_running(self._tasks, _close_ws(self.ws, action.code, action.reason))
                return math.inf
        proto.deadline_seen()
        return proto.next_deadline()


class _Connection(ClientConnection):
    """websockets' client connection, handing each whole message straight to the client from its
    ``data_received`` (`deliver`, set once the connection is open) instead of queueing it for a reader
    task to wake up for: one task switch less per message. Only while nothing is queued (order holds),
    and never again once a message comes fragmented (websockets reassembles those); control frames,
    bad UTF-8 and the close are websockets' own business as before."""

    deliver: Callable[[bytes | str], None] | None = None

    def __init__(self, protocol: Any, **kwargs: Any) -> None:
        super().__init__(protocol, **kwargs)
        watch_parser(protocol)  # (parser_idle: made before the connection reads anything)

    def data_received(self, data: bytes) -> None:
        """Messages that are one whole frame each (most are) are read here (lowlat_mw.runtime.direct.next_message)
        while websockets' parser waits between messages with nothing buffered or queued; from the first
        frame that is not one (a control frame, a fragment, a partial frame), websockets' parser reads on."""
        deliver = self.deliver
        if deliver is not None:
            proto = self.protocol
            if not len(self.recv_messages.frames) and parser_idle(proto):
                limit = message_limit(proto)
                pos = 0
                while True:
                    found = next_message(data, pos, False, limit)
                    if found is None:
                        break
                    message, pos = found
                    deliver(message)
                    if self.deliver is not deliver:
                        break
                if pos:
                    if pos == len(data):
                        return
                    data = data[pos:]
        super().data_received(data)

    def process_event(self, event: Any) -> None:
        deliver = self.deliver
        if deliver is not None and type(event) is Frame and self.response is not None:
            opcode = event.opcode
            if opcode is Opcode.BINARY or opcode is Opcode.TEXT:
                if not event.fin:
                    self.deliver = None  # a fragmented message: from here on through websockets' queue
                elif not len(self.recv_messages.frames):
                    if opcode is Opcode.BINARY:
                        deliver(bytes(event.data))
                        return
                    try:
                        text = bytes(event.data).decode()
                    except UnicodeDecodeError:
                        pass  # websockets closes with 1007
                    else:
                        deliver(text)
                        return
            elif opcode is Opcode.CONT:
                self.deliver = None
        super().process_event(event)


async def _nothing_listens(exc: BaseException, url: str, timeout: float) -> bool:
    """Whether a connection attempt to `url` was refused at every address of its host (a closed port): a first
    connection fails at once, no retry would find a server there. One address refused: ConnectionRefusedError.
    Several (``localhost`` may be ::1 and 127.0.0.1): asyncio joins their failures into one OSError that keeps only
    their text (no errno; Python 3.12's ``all_errors`` is not on every loop), so each address is tried again here."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    if type(exc) is not OSError or exc.errno is not None:  # (a timeout, an unreachable network: retried)
        return False
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme in ("wss", "https") else 80)
    except ValueError:
        return False
    return await _refused_everywhere(parts.hostname or "", port, timeout)


async def _refused_everywhere(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to `port` is refused at every address `host` resolves to (False at the first that
    answers, fails otherwise or takes longer than `timeout` seconds)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError):
        return False
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:
            return False
        try:
            sock.setblocking(False)
            async with asyncio.timeout(timeout):
                await loop.sock_connect(sock, address)
        except ConnectionRefusedError:
            continue
        except (OSError, TimeoutError):
            return False
        finally:
            sock.close()
        return False  # something listens there (now)
    return bool(infos)


def _refusal(response: Any, url: str) -> HandshakeRefused:
    """The error of a handshake answered with an HTTP status: the answer's text where it is short plain text (what
    lowlat-mw sends: which check refused), else a hint for the status."""
    body = bytes(response.body or b"")
    text = ""
    if response.headers.get("Content-Type", "").startswith("text/plain") and len(body) <= 500:
        text = body.decode(errors="replace").strip()
    return HandshakeRefused(response.status_code, text, path=urlsplit(url).path or "/")
