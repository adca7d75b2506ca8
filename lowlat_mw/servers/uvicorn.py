"""uvicorn's HTTP protocols with a bound on the opening handshake (``--http lowlat_mw.servers.uvicorn:...``).

uvicorn has no limit on how long a client may take to send its request headers (a socket that
connects and says nothing, or drips its request a byte at a time, is held forever), and with its
default ``httptools`` parser no limit on their size (a WebSocket upgrade with megabytes of headers
is buffered whole). These subclasses add both, and change nothing once a request's headers are in:

* the request line and headers must arrive within ``handshake_timeout`` (the app's setting, or before the app is
  built ``LOWLAT_HANDSHAKE_TIMEOUT`` or its default of 10 s: :func:`~lowlat_mw.servers.serving.app_timeout`), or
  the server answers 408 and closes;
* they may take at most ``HANDSHAKE_HEADER_LIMIT`` bytes (16 KiB, as daphne's and h11's own
  limit), or the server answers 431 and closes.

    uvicorn myapp:app --ws websockets-sansio --http lowlat_mw.servers.uvicorn:HttpToolsProtocol ...

``lowlat-mw serve`` and ``lowlat_mw.servers.serving.run`` use it by default (``lowlat_mw.servers.serving.uvicorn_args``
gives the whole command line).

The WebSocket protocols (``WebSocketProtocol``, ``WSProtoProtocol``) bound what a flood of fragments
may cost, drain lowlat-mw connections before uvicorn's 1012 on shutdown, drop a connection whose peer
does not take its close within its app's ``close_timeout`` (5 s by default; ``_Direct.close_within``), and offer the
application direct writes to the connection's transport (``scope["extensions"]["lowlat.transport"]``,
:mod:`lowlat_mw.runtime.direct`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol as _H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol as _SansIOProtocol
from websockets.protocol import State as _WebSocketState

from lowlat_mw.observability.logs import CLIENT_LOGS
from lowlat_mw.runtime.direct import (
    EXTENSION,
    Expected,
    apply_mask,
    framed,
    message_limit,
    next_message,
    parser_idle,
    watch_parser,
)
from lowlat_mw.runtime.drain import drain_all, drain_on_shutdown
from lowlat_mw.servers.serving import (
    HeaderBudget,
    add_fragment,
    app_timeout,
    close_timeout_of,
    read_slices,
    several_workers,
    too_big_message,
)

__all__ = ["DrainingServer", "H11Protocol", "Http", "HttpToolsProtocol", "WSProtoProtocol", "WebSocketProtocol",
           "no_delay"]

FORCE_EXIT_POLL = 0.1  # seconds between looks at uvicorn's force_exit (a second Ctrl-C) while the drain runs


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain in its shutdown (what :func:`lowlat_mw.servers.serving.run` runs). The --ws shims
    drain on their own; this covers any other `ws` too, through the same mechanism (the shims' per-connection
    shutdown then finds the drain over). At module level: ``serve --workers`` hands it to each worker process."""

    def __init__(self, config: uvicorn.Config, drain_grace: float | None = None) -> None:
        super().__init__(config)
        self.drain_grace = drain_grace

    async def shutdown(self, sockets: Any = None) -> None:
        for server in self.servers:
            server.close()  # stop accepting first
        drain = asyncio.ensure_future(drain_all(self.drain_grace))
        while not drain.done() and not self.force_exit:  # a second Ctrl-C forces the exit, as uvicorn's own
            await asyncio.wait([drain], timeout=FORCE_EXIT_POLL)  # shutdown (it polls at the same pace)
        await super().shutdown(sockets)


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Turn Nagle's algorithm off on a TCP connection's socket (TCP_NODELAY).

    asyncio does it itself only for sockets made with ``proto=IPPROTO_TCP``; uvicorn's own listening
    socket (``--workers``, ``--fd``, what ``lowlat-mw serve --workers`` passes to its worker processes)
    and sockets handed to ``Server.run(sockets=...)`` are made with ``proto=0``, and their connections kept
    Nagle on: a reply's End written after its Delta then waited for the client's delayed ACK (~40 ms
    on Linux) before it left.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # (not TCP after all, or already closed)
            pass


def _handshake_timeout() -> float:
    return app_timeout("handshake_timeout")


class _HandshakeBound:
    """Mixin: a deadline and a byte budget for the first request's line and headers."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        no_delay(transport)
        self._lowlat_budget = HeaderBudget()
        self._lowlat_timer: asyncio.TimerHandle | None = self.loop.call_later(
            _handshake_timeout(), self._lowlat_refuse, b"408 Request Timeout")

    def data_received(self, data: bytes) -> None:
        if self._lowlat_timer is None:
            super().data_received(data)  # type: ignore[misc]
            return
        head, rest = self._lowlat_budget.split(data)
        super().data_received(head)  # type: ignore[misc]
        if rest is not None and not self._lowlat_headers_in():
            self._lowlat_refuse(b"431 Request Header Fields Too Large")
            return
        if self._lowlat_headers_in():
            self._lowlat_done()
        protocol = self.transport.get_protocol()  # ourselves, or the WebSocket protocol after an upgrade
        if protocol is not self and getattr(self, "parser", None) is not None:
            # Upgraded: this object gets no more calls. httptools' parser holds its callbacks (bound methods of
            # this object): unlinked, both go by reference counting now, not at some later garbage collection.
            self.parser = None
        if rest is not None and not self.transport.is_closing():
            (super().data_received if protocol is self else protocol.data_received)(rest)  # type: ignore

    def connection_lost(self, exc: Exception | None) -> None:
        self._lowlat_done()
        super().connection_lost(exc)  # type: ignore[misc]

    def _lowlat_headers_in(self) -> bool:
        """The first request's headers are parsed: a response cycle runs, or the connection was upgraded."""
        return self.cycle is not None or self.transport.get_protocol() is not self

    def _lowlat_done(self) -> None:
        if self._lowlat_timer is not None:
            self._lowlat_timer.cancel()
            self._lowlat_timer = None

    def _lowlat_refuse(self, status: bytes) -> None:
        self._lowlat_done()
        if self.transport.is_closing() or self._lowlat_headers_in():
            return
        self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        self.transport.close()


class H11Protocol(_HandshakeBound, _H11Protocol):
    """uvicorn's h11 protocol with a bounded handshake (h11 bounds the header size itself as well)."""


_MISSING: dict[str, ImportError] = {}  # names this module lacks because an optional package is not installed

try:  # httptools is optional (uvicorn[standard] brings it; plain uvicorn parses with h11)
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpToolsProtocol
except ImportError as _no_httptools:  # pragma: no cover - depends on what is installed
    for _name in ("HttpToolsProtocol", "Http"):
        _MISSING[_name] = ImportError(f"lowlat_mw.servers.uvicorn:{_name} needs httptools (pip install "
                                      f"'lowlat-mw[serve]'): {_no_httptools}", name="httptools")
else:
    class HttpToolsProtocol(_HandshakeBound, _HttpToolsProtocol):
        """uvicorn's httptools protocol (its default) with a bounded handshake."""

    Http = HttpToolsProtocol  # short name for command lines: --http lowlat_mw.servers.uvicorn:Http


def __getattr__(name: str) -> Any:
    if name in _MISSING:
        raise _MISSING[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


LINGER = 5.0  # seconds a connection failed by a bad frame keeps reading (and dropping) before it closes


class _FairReads:
    """Mixin: socket reads go to the WebSocket parser by the servers' read rule
    (:func:`~lowlat_mw.servers.serving.read_slices`, as in the daphne runner): a slice at a time, none while the
    application has messages waiting (uvicorn's ``read_paused``: its queue; the driver's ``pause_reading``: direct
    reads) or once the connection failed, at most READ_BUDGET of them per callback; the rest is held, reading paused,
    until the application took its input or the next loop turn. uvicorn hands a whole read (up to 256 KiB) to its
    parser, which parses it and queues every message of it in one callback (wsproto: ~20 ms per 16 KiB of tiny
    frames), every other connection of the process waiting."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    _lowlat_direct: _Direct | None
    _lowlat_rest: memoryview | None = None  # the rest of a read, held back (reading paused) while not None
    _lowlat_read_paused = False

    @property
    def read_paused(self) -> bool:
        """uvicorn's: the application has messages queued; reading is paused until its ``receive`` took them."""
        return self._lowlat_read_paused

    @read_paused.setter
    def read_paused(self, paused: bool) -> None:
        self._lowlat_read_paused = paused
        if not paused and self._lowlat_rest is not None:  # uvicorn reads on: what is held goes first
            self.loop.call_soon(self._lowlat_read_on)

    def _lowlat_behind(self, data: bytes) -> None:
        """A read while one is held (reading was resumed meanwhile): it waits behind it."""
        self._lowlat_rest = memoryview(bytes(self._lowlat_rest or b"") + data)
        self.transport.pause_reading()

    def _lowlat_slices(self, data: bytes | memoryview, parse: Callable[[bytes], None]) -> None:
        """`data` to `parse` by the read rule; what is left is held."""
        rest = read_slices(data, parse, self._lowlat_stop)
        if rest is None or self._lowlat_failed():
            return
        self._lowlat_rest = rest
        self.transport.pause_reading()
        if not self._lowlat_waiting():  # this callback's budget is spent: the rest in the next loop turn
            self.loop.call_soon(self._lowlat_read_on)

    def _lowlat_waiting(self) -> bool:
        """The application has messages waiting: queued for its ``receive``, or in the driver (direct reads)."""
        direct = self._lowlat_direct
        return self._lowlat_read_paused or (direct is not None and direct.held)

    def _lowlat_failed(self) -> bool:
        """Nothing more is to be parsed: the connection is closing (or failed)."""
        return self.transport.is_closing()

    def _lowlat_stop(self) -> bool:
        return self._lowlat_waiting() or self._lowlat_failed()

    def _lowlat_read_on(self) -> None:
        rest = self._lowlat_rest
        if rest is None or self._lowlat_waiting():
            return  # (whoever waits reads on)
        self._lowlat_rest = None
        if not self._lowlat_failed():
            self.data_received(rest)  # type: ignore[attr-defined]
        if self._lowlat_rest is None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _lowlat_pause(self, pause: bool) -> None:
        """The driver's DirectReads.pause_reading / resume_reading: it has messages waiting to be handled."""
        direct = self._lowlat_direct
        if direct is not None:
            direct.held = pause
        if pause:
            self.transport.pause_reading()
        elif self._lowlat_rest is not None:
            self.loop.call_soon(self._lowlat_read_on)
        elif not self._lowlat_read_paused:
            self.transport.resume_reading()


PONG_HEAD = b"\x8a"  # the first byte of a server's Pong frame (FIN, opcode 10; control frames are never compressed)


class _LatestPong:
    """Mixin: while the transport takes nothing more (uvicorn's writes paused), only the latest protocol Ping is
    answered, once it takes writes again (RFC 6455 5.5.3 allows that). uvicorn reads on while its writes are paused,
    and answered every Ping at once: a client that sends Pings and reads nothing made it keep a Pong for each (+22 MiB
    of RSS for 24 MiB of Pings under websockets-sansio, +33 MiB under wsproto). The shims keep the latest in
    `_lowlat_pong` (handle_ping); the daphne runner does the same (OneBufferWebSocketProtocol.onPing)."""

    transport: asyncio.Transport
    writable: asyncio.Event
    close_sent: bool
    _lowlat_pong: bytes | None = None  # the latest Pong frame, held while writes are paused

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        pong = self._lowlat_pong
        if pong is not None:
            self._lowlat_pong = None
            if not self.close_sent and not self.transport.is_closing():
                self.transport.write(pong)


class _DrainOnShutdown:
    """Mixin: on server shutdown, lowlat-mw connections are drained before uvicorn's 1012.

    uvicorn asks every connection to shut down at once, and a WebSocket then sends 1012 at once:
    running streams are cut. Here the first such call starts the drain of every lowlat-mw connection
    of the process (GoAway, running streams finish within ``drain_grace``, close 4002:
    :func:`lowlat_mw.runtime.drain.drain_all`), and each connection's own shutdown waits for it. Other
    WebSocket routes of the app get their 1012 when the drain is over.
    """

    transport: asyncio.Transport

    def shutdown(self) -> None:
        parent = super().shutdown  # type: ignore[misc]
        drain = drain_on_shutdown(lambda: None if self.transport.is_closing() else parent())
        if drain is None:
            parent()
            return
        # uvicorn exits once its connections are closed, but waits for its background tasks: with shared sessions
        # the drain closes connections first and lets their streams run on, so it is one of them.
        tasks = self.tasks  # type: ignore[attr-defined]  # (the server state's)
        if drain not in tasks and not drain.done():
            tasks.add(drain)
            drain.add_done_callback(tasks.discard)


class _Direct:
    """The connection's transport as a :class:`~lowlat_mw.runtime.direct.DirectTransport` (uvicorn's own
    WebSocket protocol object keeps the handshake, the close, pings and the frame parsing); on
    :class:`WebSocketProtocol` also a :class:`~lowlat_mw.runtime.direct.DirectReads`, and the state of its direct
    reads: read on every socket read, so kept here, in slots, not on uvicorn's protocol object (its instance
    dictionary has too many keys for the interpreter's fast attribute access: each read there is a dictionary
    lookup, several per read of a heartbeat's Pong)."""

    __slots__ = ("_protocol", "_transport", "burst", "closing", "expect", "held", "idle", "is_writable", "limit",
                 "receiver", "wait_writable", "write")

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol
        self._transport = transport = protocol.transport
        self.closing = bool(protocol.close_sent)  # kept current by the protocol (_OffersDirect)
        self.expect: Expected | None = None  # (read by WebSocketProtocol.data_received)
        self.receiver: Callable[[bytes | str, int], None] | None = None  # direct reads (the driver's feed)
        self.idle = False  # reading directly: a receiver, no close sent, websockets' parser idle (parser_idle)
        self.burst = 0  # messages delivered from the current socket read
        self.limit: int | None = None  # the largest message websockets' parser takes in one frame (message_limit)
        self.write = transport.write
        self.is_writable = protocol.writable.is_set  # uvicorn's pause_writing / resume_writing set it
        self.wait_writable = protocol.writable.wait
        self.held = False  # the driver paused reading: it has messages waiting (_FairReads)

    def pause_reading(self) -> None:
        protocol = self._protocol
        if protocol is not None:
            protocol._lowlat_pause(True)

    def resume_reading(self) -> None:
        protocol = self._protocol
        if protocol is not None:
            protocol._lowlat_pause(False)

    def is_closing(self) -> bool:
        return self.closing or self._transport.is_closing()

    def close_within(self, seconds: float) -> None:
        """(DropsCloses) This connection's close_timeout: its app's, not the shortest of the process's."""
        protocol = self._protocol
        if protocol is not None:
            protocol._lowlat_close_timeout = seconds

    def set_receiver(self, receiver: Callable[[bytes | str, int], None]) -> bool:
        protocol = self._protocol
        if protocol is None or not isinstance(protocol, WebSocketProtocol) or not protocol.queue.empty():
            return False  # (wsproto: not offered) / messages already queued must be read through ASGI first
        self.limit = message_limit(protocol.conn)  # (websockets' limits are fixed per connection)
        self.receiver = receiver
        self.idle = not self.closing and parser_idle(protocol.conn)
        return True


class _HeldDisconnect(asyncio.Queue):  # type: ignore[type-arg]
    """uvicorn's receive queue of one connection, holding its ``websocket.disconnect`` back while the socket is
    still there (`held` is told, once) until :meth:`release` (the connection is lost)."""

    def __init__(self, held: Callable[[], None]) -> None:
        super().__init__()
        self.held: Callable[[], None] | None = held
        self.disconnect: Any = None

    def put_nowait(self, item: Any) -> None:
        if self.held is None or item["type"] != "websocket.disconnect":
            super().put_nowait(item)
        elif self.disconnect is None:
            self.disconnect = item
            self.held()

    def release(self) -> None:
        """The socket is gone: the disconnect goes to the app now (the first one held, then any later one)."""
        self.held = None  # (a bound method of the protocol: no reference cycle left behind)
        if self.disconnect is not None:
            super().put_nowait(self.disconnect)


class _ClosesWithin:
    """Mixin: a WebSocket whose close is under way is gone within ``close_timeout``, and the app is told it is gone
    (``websocket.disconnect``) only once its socket is.

    uvicorn waits for a paused transport (its write buffer over the high-water mark) before it writes anything,
    a close frame included, and closes the transport after the close frame (at once, or when the peer answers it);
    asyncio then closes the socket only once the write buffer is flushed. A peer that stopped reading lets neither
    happen: the socket stayed open for good, while the app had been told of the disconnect at once and counted
    the connection as gone. Here the close frame goes behind what is buffered without waiting, and a connection
    still there ``close_timeout`` after its close began (ours, the peer's answered, a shutdown's, a failed frame's,
    an app's that returned) is aborted: its buffer is dropped and the socket closed. The app's
    ``websocket.disconnect`` waits for that (uvicorn queues it as the close begins). ``close_timeout`` is the one
    the connection's driver gave (:meth:`_Direct.close_within`), its own app's; without a driver, the app's.
    """

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    writable: asyncio.Event
    disconnected: bool
    queue: _HeldDisconnect

    _lowlat_close_sent = False
    _lowlat_abort: asyncio.TimerHandle | None = None  # the close_timeout after the close began
    _lowlat_close_timeout: float | None = None  # the connection's driver's (_Direct.close_within)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = _HeldDisconnect(self._lowlat_closing)

    @property
    def close_sent(self) -> bool:
        return self._lowlat_close_sent

    @close_sent.setter
    def close_sent(self, value: bool) -> None:
        self._lowlat_close_sent = value
        if value:
            self._lowlat_closing()

    def _lowlat_closing(self) -> None:
        """The connection is closing (a close frame sent or queued, the app told, or the transport closing): it is
        gone within close_timeout."""
        if self._lowlat_abort is None and not self.disconnected:
            self._lowlat_abort = self.loop.call_later(self._lowlat_timeout(), self._lowlat_drop)

    def _lowlat_timeout(self) -> float:
        return close_timeout_of(self._lowlat_close_timeout)  # (a refused handshake, another app's route: the app's)

    def _lowlat_drop(self) -> None:
        self._lowlat_abort = None
        if not self.disconnected:
            logging.getLogger("lowlat_mw").debug("WebSocket of %s still open %.1f s after its close: aborted",
                                                 getattr(self, "client", None), self._lowlat_timeout())
            self.transport.abort()  # (connection_lost follows)

    def send(self, message: Any) -> Awaitable[None]:
        # (Not a coroutine itself: every other message is uvicorn's send, with no frame of ours on the way.)
        if message["type"] != "websocket.close" or self.writable.is_set():
            return super().send(message)  # type: ignore[misc,no-any-return]
        return self._lowlat_close_now(message)

    async def _lowlat_close_now(self, message: Any) -> None:
        """A close while the transport is paused: uvicorn's send would wait for a peer that may never read. It goes
        behind what is buffered now (uvicorn's send does not wait on a set event); close_timeout bounds the rest."""
        writable = self.writable
        ready = asyncio.Event()
        ready.set()
        self.writable = ready
        try:
            await super().send(message)  # type: ignore[misc]
        finally:
            self.writable = writable

    async def run_asgi(self) -> None:
        await super().run_asgi()  # type: ignore[misc]
        if self.transport.is_closing():  # (closed as the app returned)
            self._lowlat_closing()

    def connection_lost(self, exc: Exception | None) -> None:
        timer = self._lowlat_abort
        if timer is not None:
            timer.cancel()
            self._lowlat_abort = None
        self.queue.release()
        super().connection_lost(exc)  # type: ignore[misc]


class _OffersDirect:
    """Mixin: offer the ``lowlat.transport`` scope extension (lowlat_mw.runtime.direct) to the app, and keep
    its ``closing`` flag current: set as the connection starts closing (:class:`_ClosesWithin`: uvicorn's
    ``close_sent`` is a property there), and as it is lost (the driver reads a plain attribute before every write)."""

    # A slot, read on every socket read: uvicorn's protocol objects keep too many attributes in their instance
    # dictionary for the interpreter's fast attribute access (each read there is a dictionary lookup).
    __slots__ = ("_lowlat_direct",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lowlat_direct: _Direct | None = None  # (before uvicorn's __init__: it sets close_sent)
        super().__init__(*args, **kwargs)

    def _lowlat_closing(self) -> None:
        direct = self._lowlat_direct
        if direct is not None:
            direct.closing = True
            direct.idle = False
        super()._lowlat_closing()  # type: ignore[misc]

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)  # type: ignore[misc]
        scope = getattr(self, "scope", None)  # none when websockets refused the handshake itself
        if scope is not None:
            self._lowlat_direct = direct = _Direct(self)
            scope["extensions"][EXTENSION] = direct
            several_workers(self.config.workers, "uvicorn --workers")  # (said once per process)

    def connection_lost(self, exc: Exception | None) -> None:
        direct = self._lowlat_direct
        if direct is not None:
            direct.closing = True
            direct.idle = False
            # Unlink the connection's objects (this protocol <-> its _Direct, the driver's bound `feed`), so that
            # reference counting frees them when the connection ends instead of a garbage-collector pass much
            # later: a server with many short connections otherwise holds thousands of dead ones.
            direct._protocol = None
            direct.receiver = None
            self._lowlat_direct = None
        super().connection_lost(exc)  # type: ignore[misc]


class WebSocketProtocol(_FairReads, _LatestPong, _OffersDirect, _DrainOnShutdown, _ClosesWithin, _SansIOProtocol):
    """uvicorn's websockets-sansio protocol, with what a flood of tiny fragments may cost bounded.

    (``--ws lowlat_mw.servers.uvicorn:WebSocketProtocol``; ``lowlat_mw.servers.serving`` uses it.) uvicorn
    parses a whole socket read (up to 256 KiB) into frame objects before handling any, and keeps
    every fragment of a message as a bytes object of its own until the last one arrives: about
    120 bytes of memory per one-byte fragment, 12+ MiB for a 100 KB message sent one byte a frame.
    Here reads are parsed by the servers' read rule (:class:`_FairReads`) and small fragments are appended to one
    buffer, so a fragmented message costs about its own size, as with wsproto. Message size limits are websockets'
    own (``--ws-max-size``), unchanged.
    """

    _lowlat_lingering = False  # failed (close frame sent): reading and dropping until the peer or LINGER ends it

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        watch_parser(self.conn)  # (parser_idle: websockets' protocol made, nothing read yet)

    def data_received(self, data: bytes | memoryview) -> None:
        if self._lowlat_rest is not None:
            self._lowlat_behind(data)  # type: ignore[arg-type]
            return
        direct = self._lowlat_direct
        if direct is not None and direct.idle:  # direct reads: whole one-frame messages straight to the driver
            expect = direct.expect  # the heartbeat's Pong, awaited: known by its bytes, not parsed
            if expect is not None and len(data) == expect.size and data[0] == expect.b0 and data[1] == expect.b1 \
                    and apply_mask(data[6:], data[2:6]) == expect.payload:
                direct.expect = None
                direct.burst = 1
                direct.receiver(expect.message, 1)  # type: ignore[misc]  # (idle: a receiver is set)
                return
            direct.burst = 0
            taken = self._lowlat_read(data, direct)
            if taken == len(data):
                return
            if taken:
                data = data[taken:]
        elif self._lowlat_lingering:
            return
        elif direct is not None:
            direct.burst = 0
        self._lowlat_slices(data, super().data_received)
        direct = self._lowlat_direct  # (the rest went to websockets' parser: is it still between two messages?)
        if direct is not None and direct.receiver is not None:
            direct.idle = not direct.closing and parser_idle(self.conn)

    def _lowlat_read(self, data: bytes, direct: _Direct) -> int:
        """Hand the driver the messages at the start of `data` that are one whole frame each
        (:func:`~lowlat_mw.runtime.direct.next_message`), while websockets' parser waits between two
        messages with nothing buffered (`direct.idle`); returns the bytes taken. What it leaves (a control frame, a
        fragment, a partial frame, anything wrong) goes to websockets' parser, which meets it as it would
        have: at a frame boundary, in order."""
        receiver = direct.receiver
        limit = direct.limit
        transport = direct._transport  # (uvicorn's `self.transport`: a lookup in its instance dictionary)
        pos = 0
        end = len(data)
        while True:
            found = next_message(data, pos, True, limit)
            if found is None:
                return pos
            message, pos = found
            direct.burst = burst = direct.burst + 1
            receiver(message, burst)  # type: ignore[misc]
            if pos == end or not direct.idle or direct.held or direct.receiver is not receiver \
                    or transport.is_closing():
                return pos  # (the rest, if any: websockets', as if it had parsed it; held while the driver is)

    def _lowlat_failed(self) -> bool:
        return self._lowlat_lingering or self.conn.parser_exc is not None or self.transport.is_closing()

    def handle_parser_exception(self) -> None:
        """A frame failed the connection (too big, bad UTF-8, a protocol violation): the close frame goes out
        and then, unlike uvicorn, the socket is not closed at once. A peer still sending the rest of the
        message would find the socket closed with its data unread, and the kernel answers that with a TCP
        reset, which can destroy the close frame before the peer reads it: the client sees 1006 (reconnect)
        instead of 1009 or 1007 (final). Here the server sends the close frame and its FIN (write_eof), and
        keeps reading and dropping what arrives until the peer closes or LINGER seconds have passed."""
        close = self.conn.close_sent
        assert close is not None
        self.queue.put_nowait({"type": "websocket.disconnect", "code": close.code, "reason": close.reason})
        if close.code == 1009:  # a message over --ws-max-size: the protocol's Error goes before the close
            self.transport.write(framed(too_big_message(self.response.headers.get("Sec-WebSocket-Protocol"))))
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self._lowlat_lingering = True
        self.stop_keepalive()
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER, transport.close)

    def handle_ping(self) -> None:
        """websockets queued the Pong (with those of the other Pings of the same read): written, unless the
        connection failed earlier in the same read (nothing goes after the close frame and its FIN: the write raised
        "Cannot call write() after write_eof()"); while writes are paused only the latest Pong, once they resume
        (:class:`_LatestPong`)."""
        output = self.conn.data_to_send()  # (one frame each)
        if self._lowlat_lingering:
            return  # (dropped)
        if not self.writable.is_set():
            pongs = [frame for frame in output if frame[:1] == PONG_HEAD]
            if pongs:
                self._lowlat_pong = pongs[-1]
                output = [frame for frame in output if frame[:1] != PONG_HEAD]
        self.transport.write(b"".join(output))

    def handle_cont(self, event: Any) -> None:
        add_fragment(self.frames, event.data)
        if event.fin:
            self.send_receive_event_to_app()  # b"".join(frames) takes bytes and bytearrays alike

    def send_receive_event_to_app(self) -> None:
        """A whole message: to the driver (direct reads) or queued for ASGI ``receive``. Text that is not UTF-8
        closes with 1007 after one INFO line within the client's log budget: uvicorn logs an ERROR with a
        traceback per such frame, a log amplifier any client can use."""
        frames = self.frames
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        self.frames = []
        if self.close_sent:  # (as uvicorn: past websocket.close the message is dropped)
            return
        if self.curr_msg_data_type == "text":
            try:
                message: bytes | str = data.decode()
            except UnicodeDecodeError:
                if self.conn.state is not _WebSocketState.OPEN:
                    # A close is under way: the peer's, parsed from the same read (websockets answered it), ends
                    # the connection. A second close would raise InvalidState out of data_received (a traceback).
                    return
                client = self.client[0] if self.client else None
                CLIENT_LOGS.log(self.logger, logging.INFO, client,
                                "invalid UTF-8 in a text frame from %s: closing with 1007", client)
                self.conn.send_close(1007)
                self.handle_parser_exception()
                return
        else:
            message = data if type(data) is bytes else bytes(data)
        direct = self._lowlat_direct
        receiver = direct.receiver if direct is not None else None
        if receiver is None:
            self.queue.put_nowait({"type": "websocket.receive", "text": message} if type(message) is str
                                  else {"type": "websocket.receive", "bytes": message})
            if not self.read_paused:  # (as uvicorn: not read on until the app's receive took what is queued)
                self.read_paused = True
                self.transport.pause_reading()
            return
        direct.burst = burst = direct.burst + 1  # type: ignore[union-attr]
        receiver(message, burst)


try:  # wsproto is optional (uvicorn[standard] brings websockets, not wsproto)
    from uvicorn.protocols.websockets.wsproto_impl import FrameTooLargeError as _FrameTooLargeError
    from uvicorn.protocols.websockets.wsproto_impl import WebsocketBuffer as _WebsocketBuffer
    from uvicorn.protocols.websockets.wsproto_impl import WSProtocol as _WSProtoProtocol
    from wsproto.connection import ConnectionState as _ConnectionState
    from wsproto.events import CloseConnection as _CloseConnection
except ImportError as _missing:  # pragma: no cover - depends on what is installed
    _MISSING["WSProtoProtocol"] = ImportError(f"lowlat_mw.servers.uvicorn:WSProtoProtocol needs wsproto (pip "
                                              f"install wsproto): {_missing}", name="wsproto")
else:
    def _nothing() -> None:
        pass

    class _RefusingBuffer(_WebsocketBuffer):
        """uvicorn's message buffer, calling `refused` just before it refuses a message over ``--ws-max-size``
        (uvicorn then closes with 1009 at once)."""

        def __init__(self, max_length: int, refused: Callable[[], None]) -> None:
            super().__init__(max_length)
            self.refused = refused

        def extend(self, event: Any) -> None:
            try:
                super().extend(event)
            except _FrameTooLargeError:
                self.refused()
                raise

    class WSProtoProtocol(_FairReads, _LatestPong, _OffersDirect, _DrainOnShutdown, _ClosesWithin, _WSProtoProtocol):
        """uvicorn's wsproto protocol, closing with the right code on bad frames and bounded while reassembling.

        (``--ws lowlat_mw.servers.uvicorn:WSProtoProtocol``; ``lowlat_mw.servers.serving`` uses it for
        ``ws="wsproto"``.)

        * A frame wsproto cannot accept (RSV1 without permessage-deflate, a bad opcode, invalid UTF-8 in
          a text frame) becomes a ``CloseConnection`` event, which uvicorn answers by dropping the TCP
          connection without a close frame (the client sees 1006). Here the server sends that close
          frame (1002, 1007...) first, as RFC 6455 7.1.7 asks.
        * uvicorn hands a whole socket read (up to 256 KiB) to wsproto, which copies it into its buffer
          and turns it into message chunks before uvicorn counts any against ``--ws-max-size``, and queues every
          message of it in one callback. Here reads are parsed by the servers' read rule (:class:`_FairReads`):
          parsing stops as soon as the connection is closing, so refusing a message over the limit costs about the
          limit, not the limit plus what was in flight, and while the application has messages queued.
        """

        def data_received(self, data: bytes | memoryview) -> None:
            if self._lowlat_rest is not None:
                self._lowlat_behind(data)  # type: ignore[arg-type]
                return
            self._lowlat_slices(data, super().data_received)

        _lowlat_subprotocol: str | None = None

        def handle_ping(self, event: Any) -> None:
            """A protocol Ping: answered at once, as by uvicorn, or while writes are paused only the latest, once
            they resume (:class:`_LatestPong`)."""
            pong = self.conn.send(event.response())
            if self.writable.is_set():
                self.transport.write(pong)
            else:
                self._lowlat_pong = pong

        async def send(self, message: Any) -> None:
            if message["type"] == "websocket.accept":
                self._lowlat_subprotocol = message.get("subprotocol")
            await super().send(message)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.buffer = _RefusingBuffer(self.config.ws_max_size, self._too_big)

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            self.buffer.refused = _nothing  # (its bound method held this object: freed by reference counting now)

        def _too_big(self) -> None:
            # uvicorn closes a message over --ws-max-size with 1009 right after: the protocol's Error goes first.
            if not self.close_sent and not self.transport.is_closing():
                self.transport.write(framed(too_big_message(self._lowlat_subprotocol)))

        def handle_close(self, event: Any) -> None:
            if not self.close_sent and self.conn.state == _ConnectionState.OPEN and not self.transport.is_closing():
                # wsproto reports a frame it could not parse as a close it never received: send it.
                self.close_sent = True
                close = _CloseConnection(code=event.code, reason=(event.reason or "")[:120])
                self.transport.write(self.conn.send(close))
                self.queue.put_nowait({"type": "websocket.disconnect", "code": event.code, "reason": event.reason})
                self.transport.close()
                return
            super().handle_close(event)
