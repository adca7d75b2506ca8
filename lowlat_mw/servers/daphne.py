"""daphne with lowlat-mw's transport fixes: ``python -m lowlat_mw.servers.daphne [daphne options] app``.

It takes every daphne option and runs daphne itself, with what daphne has no option for:

* an oversized message or frame (over ``--websocket-max-message-size`` / ``--websocket-max-frame-size``)
  is refused with close code 1009; daphne's autobahn otherwise drops the TCP connection without a
  close frame (``failByDrop``), so clients see 1006 and cannot tell it from a network failure;
* the HTTP request that opens a connection must arrive within ``handshake_timeout`` (the setting,
  from ``settings.LOWLAT_MW`` or ``LOWLAT_HANDSHAKE_TIMEOUT``): Twisted's own limit is an idle timeout
  of 12 hours that every byte restarts, so a socket that says nothing, or drips its request a byte at
  a time, is otherwise held for as long as the client likes. A late one is answered 408 and closed,
  one whose line and headers pass 16 KiB (``HANDSHAKE_HEADER_LIMIT``) before they are in, 431;
* a fragmented message costs about its own size (small fragments share one buffer), not ~120
  bytes per fragment;
* a connection whose peer does not take its close (ours, or our answer to the peer's) within ``close_timeout``
  is aborted: Twisted otherwise keeps the socket until it has written what it holds, which a peer that stopped
  reading never lets happen;
* the WebSocket opening handshake timeout is never shorter than asked: autobahn's timer rounds it
  down to a whole second, which dropped about one healthy handshake in 400 (no HTTP response);
* on shutdown (SIGTERM, SIGINT) it stops listening (new connections are refused, as by uvicorn and
  gunicorn: a balancer sends them elsewhere) and lowlat-mw connections are drained before daphne cancels
  its applications: GoAway, running streams finish within the ``drain_grace`` setting, close 4002
  (:func:`lowlat_mw.runtime.drain.drain_all`). daphne alone cancels them at once and drops every
  connection without a close frame;
* writes have flow control: the connection's Twisted transport pauses the runner (``registerProducer``) while
  more than its buffer size (64 KiB) waits to go out, so direct writes and the ASGI ``websocket.send`` wait
  (:class:`DaphneDirect`, :meth:`DrainingServer.handle_reply`) and a client that stops reading gets 4003 after the
  ``slow_consumer_timeout`` setting instead of the server queueing the whole output. The socket is read on
  meanwhile, as uvicorn does: such a client's Cancel, Ack or close is handled, while the driver's own rule (it stops
  reading while an answer waits for the socket) and the control budget bound what it can pile up; of the protocol
  Pings it sends meanwhile only the latest is answered, once the socket takes it (RFC 6455 5.5.3), not one Pong kept
  per Ping;
* reads are fair: autobahn parses a whole socket read (64 KiB, thousands of tiny frames) in one callback and daphne
  queues every message for the application without a bound. Here reads go to autobahn by the read rule of all our
  servers (:func:`lowlat_mw.servers.serving.read_slices`): READ_SLICE bytes at a time, at most READ_BUDGET seconds
  of them per callback, none while the application has messages queued (as under our uvicorn protocols); each
  whole message goes to lowlat-mw's driver directly (:class:`DaphneDirect`, direct reads), not through a Channels
  consumer's dispatch: a burst of 10,000 Pings no longer stalls every other connection;
* the application learns the close code autobahn failed a connection with (1007 for a text frame that is not
  UTF-8, 1002, 1009): autobahn reports 1006 when a second check of the same frame drops the connection;
* it offers lowlat-mw direct writes (the ``lowlat.transport`` scope extension,
  :mod:`lowlat_mw.runtime.direct`): the driver frames its output and hands a loop turn's frames to
  autobahn's ``sendData`` in one piece, instead of one ASGI ``send`` per frame through daphne's reply path
  and autobahn's message framing (a 500-token reply took about two and a half times as long as under uvicorn).

``lowlat_mw.servers.serving.daphne_args(settings)`` gives the options that match the settings (size limits,
the WebSocket opening handshake timeout, no protocol pings). permessage-deflate stays off: daphne
never accepts it.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from collections.abc import Callable
from functools import partial
from types import MethodType
from typing import Any

try:
    import daphne.cli
    import daphne.server
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.http_protocol import HTTPFactory, WebRequest
    from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol
    from twisted.internet import defer, reactor
    from twisted.internet.interfaces import IPushProducer
    from zope.interface import implementer
except ImportError as _missing:  # (the Django extra brings them)
    _why = f"lowlat_mw.servers.daphne needs daphne: pip install 'lowlat-mw[django]' ({_missing})"
    if __name__ == "__main__":
        sys.exit(_why)  # (python -m lowlat_mw.servers.daphne: one line, no traceback)
    raise ImportError(_why, name=_missing.name) from _missing

from lowlat_mw.runtime.direct import EXTENSION
from lowlat_mw.runtime.drain import drain_all
from lowlat_mw.servers.serving import (
    DAPHNE_RUNSERVER,
    READ_BUDGET,
    READ_SLICE,
    HeaderBudget,
    add_fragment,
    app_timeout,
    close_timeout_of,
    read_slices,
    too_big_message,
)

__all__ = ["READ_BUDGET", "READ_SLICE", "BoundedHTTPFactory", "ClosingWebSocketFactory", "DaphneDirect",
           "DrainingServer", "OneBufferWebSocketProtocol", "install", "install_runserver", "main"]

# Why the socket is not read: input waits (for the application's queue, or the next loop turn); the driver asked
# (DirectReads.pause_reading). Not that output waits for the socket: the socket is read on meanwhile, as under uvicorn.
_HELD_READING, _HELD_APP = 1, 2


def _handshake_timeout() -> float:
    return app_timeout("handshake_timeout")


@implementer(IPushProducer)
class _Flow:
    """A connection's writability, kept by its Twisted transport: registered as the transport's streaming producer,
    it is paused while more than the transport's buffer size (64 KiB) waits to be sent, and resumed once all of it
    went to the socket. Writers wait on `writable`; the socket is read on meanwhile (the protocol answers only the
    latest protocol Ping then, once it is resumed: OneBufferWebSocketProtocol.onPing)."""

    __slots__ = ("protocol", "writable")

    def __init__(self, protocol: OneBufferWebSocketProtocol) -> None:
        self.protocol = protocol
        self.writable = asyncio.Event()
        self.writable.set()

    def pauseProducing(self) -> None:
        self.writable.clear()

    def resumeProducing(self) -> None:
        self.writable.set()
        self.protocol._lowlat_writable()

    def stopProducing(self) -> None:  # the connection is lost: nothing waits for it any more
        self.writable.set()


class _Inbox(asyncio.Queue):  # type: ignore[type-arg]
    """The application's queue of a WebSocket connection (daphne's is a plain asyncio.Queue): each time the
    application empties it, the connection's protocol reads on (OneBufferWebSocketProtocol._lowlat_drained)."""

    def __init__(self, protocol: OneBufferWebSocketProtocol) -> None:
        super().__init__()
        self.protocol: OneBufferWebSocketProtocol | None = protocol

    async def get(self) -> Any:
        message = await super().get()
        if self.protocol is not None and self.empty():
            self.protocol._lowlat_drained()
        return message


class OneBufferWebSocketProtocol(WebSocketProtocol):
    """daphne's WebSocket protocol with bounded, fair reads, flow-controlled writes and true close codes.

    * Fragments: autobahn keeps a list with one bytes object per fragment until the message is complete (about
      120 bytes per one-byte fragment: 12 MiB for a 100 KB message sent one byte a frame); here small fragments
      are appended to one buffer and big ones kept whole (:func:`lowlat_mw.servers.serving.add_fragment`, as in
      the uvicorn shim). The size limits (checked by autobahn as each frame begins) are unchanged.
    * Reads: autobahn parses all it is given at once, copying what is left of its buffer after every frame, and
      daphne queues each message for the application without a bound: one 64 KiB read of tiny frames held the
      reactor for 100-700 ms. Here a read goes to autobahn by the servers' read rule
      (:func:`~lowlat_mw.servers.serving.read_slices`): READ_SLICE bytes at a time; after a slice that queued
      a message the socket is not read until the application has taken what is queued (as uvicorn does), and
      past READ_BUDGET seconds in one callback the rest waits for the next loop turn. With direct reads
      (:meth:`DaphneDirect.set_receiver`) messages go to the driver instead of the queue, and the driver pauses the
      reads while it has messages waiting. Messages that arrive after our close frame are dropped, as uvicorn drops
      them.
    * Writes: the transport's producer is the connection's :class:`_Flow` (``writable``), not daphne's HTTP
      channel, which ignored it. While the transport holds more than its buffer size the socket is read on, as under
      uvicorn (Twisted resumes a producer only once its buffer is empty, which a client that stopped reading never
      lets happen: its Cancels, Acks and close went unread until the 4003); only the latest protocol Ping is answered
      then (:meth:`onPing`).
    * Closes: :meth:`onClose` reports the code autobahn failed the connection with (see there).
    """

    _lowlat_holds = 0  # _HELD_READING | _HELD_APP: why the transport's reading is paused
    _lowlat_pong: bytes | None = None  # the payload of the latest protocol Ping, to answer once the socket takes it
    _lowlat_pending: memoryview | None = None  # the rest of a read, held back (reading paused) while not None
    _lowlat_waiting = False  # held until the application has taken every queued message
    _lowlat_receiver: Any = None  # direct reads: the driver's feed(message, n) (DaphneDirect.set_receiver)
    _lowlat_burst = 0  # messages handed to the receiver in this callback
    flow: _Flow | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        transport = self.transport
        # daphne's HTTP channel registered itself as the transport's producer and stays so after the upgrade, where
        # pausing it does nothing: the WebSocket's flow takes its place.
        register = getattr(transport, "registerProducer", None)
        if register is not None:
            self.flow = _Flow(self)
            transport.unregisterProducer()
            register(self.flow, True)

    def dataReceived(self, data: bytes) -> None:
        pending = self._lowlat_pending
        if pending is not None:  # held back: after what waits (daphne resumes reading after an upgrade)
            self._lowlat_pending = memoryview(bytes(pending) + data)
            self._lowlat_hold(_HELD_READING, True, again=True)
            return
        self._lowlat_feed(data)

    def _lowlat_feed(self, data: bytes | memoryview) -> None:
        """Hand `data` to autobahn by the servers' read rule (:func:`~lowlat_mw.servers.serving.read_slices`): what
        is left waits, with reading paused, until the application took its input or the next loop turn."""
        self._lowlat_burst = 0
        rest = read_slices(data, super().dataReceived, self._lowlat_stop)
        if rest is None or self.state == self.STATE_CLOSED:
            return
        if not self._lowlat_holds & _HELD_APP:  # (the driver has messages waiting: it resumes, resume_reading)
            inbox = getattr(self, "application_queue", None)
            if isinstance(inbox, _Inbox) and not inbox.empty():  # the application has input: read on once it took it
                self._lowlat_waiting = True
            else:  # this callback's budget is spent: the rest in the next loop turn
                reactor.callLater(0, self._lowlat_read_on)
        self._lowlat_pending = rest
        self._lowlat_hold(_HELD_READING, True)

    def _lowlat_stop(self) -> bool:
        """Whether autobahn's input has to wait: the connection is closed, or the application has messages waiting
        (the driver's, with direct reads; daphne's queue otherwise)."""
        if self.state == self.STATE_CLOSED or self._lowlat_holds & _HELD_APP:
            return True
        inbox = getattr(self, "application_queue", None)
        return isinstance(inbox, _Inbox) and not inbox.empty()

    def _lowlat_drained(self) -> None:
        """The application took every message queued (from its `receive`): read on in a callback of its own."""
        if self._lowlat_waiting:
            self._lowlat_waiting = False
            reactor.callLater(0, self._lowlat_read_on)

    def _lowlat_read_on(self) -> None:
        data = self._lowlat_pending
        if data is None or self._lowlat_waiting or self._lowlat_holds & _HELD_APP:
            return
        self._lowlat_pending = None
        if data and self.state != self.STATE_CLOSED:
            self._lowlat_feed(data)
        if self._lowlat_pending is None:
            self._lowlat_hold(_HELD_READING, False)

    def _lowlat_hold(self, reason: int, hold: bool, again: bool = False) -> None:
        """Pause (`hold`) or resume reading the socket for `reason`; it is read while no reason holds it."""
        before = self._lowlat_holds
        after = before | reason if hold else before & ~reason
        self._lowlat_holds = after
        if bool(before) == bool(after) and not again:
            return
        transport = self.transport
        try:
            if after:
                transport.pauseProducing()
            else:
                transport.resumeProducing()
        except AttributeError:  # (no transport any more, or one that cannot pause)
            pass

    def _lowlat_pause(self, pause: bool) -> None:
        """The driver's DirectReads.pause_reading / resume_reading: it has messages waiting to be handled."""
        self._lowlat_hold(_HELD_APP, pause)
        if not pause and self._lowlat_pending is not None and not self._lowlat_waiting:
            reactor.callLater(0, self._lowlat_read_on)

    def onMessage(self, payload: Any, isBinary: bool) -> None:
        if self.state != self.STATE_OPEN:  # (past our close frame, as uvicorn: dropped, not queued)
            return
        receiver = self._lowlat_receiver
        if receiver is None:
            super().onMessage(payload, isBinary)
            return
        self.last_ping = time.time()  # (as daphne's onMessage)
        self._lowlat_burst = burst = self._lowlat_burst + 1
        receiver(payload if isBinary else payload.decode("utf8"), burst)  # (autobahn validated the UTF-8)

    def onPing(self, payload: bytes) -> None:
        """A protocol-level Ping: autobahn answers it at once. While the socket takes nothing more (the flow paused)
        only the latest is answered, once it does (RFC 6455 5.5.3 allows that): a client that sends Pings and reads
        nothing would otherwise make the server keep a Pong for each, the socket being read on meanwhile."""
        flow = self.flow
        if flow is not None and not flow.writable.is_set():
            self._lowlat_pong = payload
            return
        super().onPing(payload)

    def _lowlat_writable(self) -> None:
        """The socket took all that was written (the flow resumed): the latest Ping held meanwhile is answered."""
        pong = self._lowlat_pong
        if pong is not None:
            self._lowlat_pong = None
            super().onPing(pong)  # (autobahn's: a Pong while the connection is open)

    def onMessageFrame(self, payload: Any) -> None:
        if not self.failedByMe:
            for piece in payload:
                add_fragment(self.message_data, piece)

    _lowlat_close_timeout: float | None = None  # the connection's driver's (DaphneDirect.close_within)
    _lowlat_abort: Any = None  # the DelayedCall of dropConnection's abort

    def dropConnection(self, abort: bool = False) -> None:
        super().dropConnection(abort)
        if not abort and self.transport is not None and self._lowlat_abort is None:
            # After answering the peer's close, autobahn closes gently: Twisted closes the socket once it has written
            # what it holds, which a peer that stopped reading never lets happen. (A close of ours is bounded by
            # closeHandshakeTimeout: ClosingWebSocketFactory, DaphneDirect.close_within.) Cancelled as the connection
            # goes: the timer held the transport and this protocol for close_timeout after every graceful close.
            self._lowlat_abort = reactor.callLater(close_timeout_of(self._lowlat_close_timeout), _abort, self.transport)

    def connectionLost(self, *args: Any, **kwargs: Any) -> None:
        abort, self._lowlat_abort = self._lowlat_abort, None
        if abort is not None and abort.active():
            abort.cancel()
        super().connectionLost(*args, **kwargs)

    def _max_message_size_exceeded(self, msg_size: int, max_msg_size: int, reason: str) -> None:
        # autobahn fails a message or frame over --websocket-max-message-size / -frame-size with 1009 here,
        # before the application sees it: the protocol's Error goes first (docs/protocol.md 10.3).
        if self.state == self.STATE_OPEN and not self.failedByMe:
            message = too_big_message(self.websocket_protocol_in_use)
            if isinstance(message, str):
                self.sendMessage(message.encode(), isBinary=False)
            else:
                self.sendMessage(message, isBinary=True)
        super()._max_message_size_exceeded(msg_size, max_msg_size, reason)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        """The connection ended: daphne tells the application (``websocket.disconnect``) with `code`. When autobahn
        failed it (a text frame that is not UTF-8: 1007; a protocol violation: 1002; too big: 1009), that is the
        code it sent, not the 1006 it reports: autobahn checks a bad text frame twice, and the second check drops
        the TCP connection as if it had been lost. The application then knows the connection is not to be
        resumed, and logs what happened."""
        if self.failedByMe and self.localCloseCode is not None:
            code = self.localCloseCode
        if self.flow is not None:
            self.flow.writable.set()  # (nothing will be written any more: no writer waits)
        self._lowlat_receiver = None  # (the driver's bound method: freed with the connection)
        inbox = getattr(self, "application_queue", None)
        if isinstance(inbox, _Inbox):
            inbox.protocol = None
        super().onClose(wasClean, code, reason)


def _abort(transport: Any) -> None:
    """Drop a TCP connection that is still there, with what it has not written (Twisted's abortConnection)."""
    if getattr(transport, "connected", False) and hasattr(transport, "abortConnection"):
        transport.abortConnection()


class DaphneDirect:
    """A daphne WebSocket connection as a :class:`~lowlat_mw.runtime.direct.DirectReads`.

    Writes: whole frames go to autobahn's ``sendData``, Twisted's transport buffers them; writable while it holds at
    most its buffer size (the connection's :class:`_Flow`), so the driver waits, and a client that stops reading gets
    4003 after the ``slow_consumer_timeout`` setting. Reads: each whole message goes from autobahn straight to the
    driver (``set_receiver``), not through daphne's queue and a Channels consumer's dispatch (a task, a wait and a
    thread hop per message: several loop turns, so under a flood on another connection a client's own messages
    waited hundreds of milliseconds). The accept, the close and the disconnect still go through ASGI, to daphne."""

    __slots__ = ("_protocol", "is_writable", "pause_reading", "resume_reading", "wait_writable", "write")

    def __init__(self, protocol: OneBufferWebSocketProtocol) -> None:
        self._protocol = protocol
        self.write = protocol.sendData
        flow = protocol.flow
        if flow is None:  # (a transport without producers: always writable, as daphne's own send)
            flow = _Flow(protocol)
        self.is_writable = flow.writable.is_set
        self.wait_writable = flow.writable.wait
        self.pause_reading = partial(protocol._lowlat_pause, True)
        self.resume_reading = partial(protocol._lowlat_pause, False)
        no_delay = getattr(protocol.transport, "setTcpNoDelay", None)  # Twisted leaves Nagle's algorithm on
        if no_delay is not None:
            try:
                no_delay(True)
            except OSError:
                pass

    @property
    def closing(self) -> bool:
        """True once the WebSocket is no longer open (a close sent or received, or the connection lost)."""
        return self._protocol.state != WebSocketProtocol.STATE_OPEN  # type: ignore[no-any-return]

    def is_closing(self) -> bool:
        return self.closing

    def close_within(self, seconds: float) -> None:
        """(DropsCloses) This connection's close_timeout, its app's, not the shortest of the process's: autobahn's
        closeHandshakeTimeout (plus the batched timer's rounding) and the abort after a gentle drop."""
        protocol = self._protocol
        protocol._lowlat_close_timeout = seconds
        protocol.closeHandshakeTimeout = seconds + BATCHED_TIMER_ROUNDING

    def set_receiver(self, receiver: Callable[[bytes | str, int], None]) -> bool:
        """From now on hand each whole message to `receiver` (refused while messages wait in daphne's queue: they are
        read through ASGI first, and the connection keeps that path)."""
        protocol = self._protocol
        inbox = getattr(protocol, "application_queue", None)
        if not isinstance(inbox, _Inbox) or not inbox.empty() or protocol.state != WebSocketProtocol.STATE_OPEN:
            return False
        protocol._lowlat_receiver = receiver
        return True


BATCHED_TIMER_ROUNDING = 1  # seconds txaio's batched timers may fire early (they round the deadline down)


class ClosingWebSocketFactory(WebSocketFactory):
    """daphne's WebSocket factory, failing connections with a close frame (1009, 1002, ...), not a drop,
    and reassembling fragmented messages at about their size (:class:`OneBufferWebSocketProtocol`)."""

    protocol = OneBufferWebSocketProtocol

    def setProtocolOptions(self, **options: Any) -> None:
        # closeHandshakeTimeout: a connection whose peer has not answered our close frame within it is aborted (its
        # unwritten output dropped), so a peer that stopped reading cannot hold the socket: the app's close_timeout
        # (5 s by default). autobahn's 1 s default aborted (RST) busy clients before they read the close frame: they
        # saw 1006 instead of our code. autobahn arms it on the batched timer, which may fire up to a second early.
        close = app_timeout("close_timeout") + BATCHED_TIMER_ROUNDING
        options = {**options, "failByDrop": False, "closeHandshakeTimeout": close}
        # openHandshakeTimeout (daphne's --websocket_connect_timeout): autobahn arms it on txaio's batched
        # timer, which rounds the deadline down to a whole second (int(now + delay)), so a 1 s timeout fires
        # anywhere from 0 to 1 s after the upgrade and drops a healthy handshake that straddles a second
        # boundary with no HTTP response. One second more makes the effective deadline at least the option.
        if options.get("openHandshakeTimeout"):
            options["openHandshakeTimeout"] += BATCHED_TIMER_ROUNDING
        super().setProtocolOptions(**options)


class BoundedHTTPFactory(HTTPFactory):
    """daphne's HTTP factory, bounding the first request's line and headers by time and size.

    Not in within the handshake timeout: 408. Over ``HANDSHAKE_HEADER_LIMIT`` (16 KiB) before they are
    in: 431 (Twisted would drop a line over 16 KiB without a word, or answer a bare 400).
    """

    handshake_timeout: float | None = None
    adopts = False  # install_runserver: a daphne Server that builds this factory becomes a DrainingServer

    def __init__(self, server: Any) -> None:
        if self.adopts and type(server) is daphne.server.Server:
            _adopt(server)
        super().__init__(server)

    def buildProtocol(self, addr: Any) -> Any:
        if self.handshake_timeout is None:
            type(self).handshake_timeout = _handshake_timeout()
        protocol = super().buildProtocol(addr)
        state = {"in": False}
        budget = HeaderBudget()

        class MarkedRequest(WebRequest):
            def gotLength(self, length: int | None) -> None:
                state["in"] = True  # the request line and headers are in (a body is not bounded here)
                super().gotLength(length)

        protocol.requestFactory = MarkedRequest

        def transport_of() -> Any:
            # Twisted wraps the HTTPChannel (for HTTP/2 negotiation): the transport is the channel's
            return getattr(getattr(protocol, "_channel", protocol), "transport", None)

        def refuse(status: bytes) -> None:
            transport = transport_of()
            if not state["in"] and transport is not None and transport.connected:
                state["in"] = True  # answered: nothing more to bound
                transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                transport.loseConnection()
                reactor.callLater(1.0, transport.abortConnection)

        def expire() -> None:
            if transport_of() is None and not state["in"]:  # not connected yet: look again shortly
                reactor.callLater(0.05, expire)
                return
            refuse(b"408 Request Timeout")

        data_received = protocol.dataReceived

        def bounded_data_received(data: bytes) -> None:
            if state["in"]:
                data_received(data)
                return
            head, rest = budget.split(data)
            data_received(head)
            if rest is None:
                return
            if not state["in"]:
                refuse(b"431 Request Header Fields Too Large")
                return
            transport = transport_of()
            target = getattr(transport, "protocol", None)
            if transport is None or target is None or target is protocol:
                data_received(rest)
            elif transport.connected:  # upgraded: the rest is the WebSocket protocol's
                target.dataReceived(rest)

        protocol.dataReceived = bounded_data_received
        reactor.callLater(self.handshake_timeout, expire)
        return protocol


class DrainingServer(daphne.server.Server):
    """daphne's server, draining lowlat-mw connections before it cancels the applications on shutdown; it stops
    listening first, as uvicorn and gunicorn do: a new connection is refused, so a balancer passes it on to
    another server at once (nginx's next or backup upstream) instead of the client being closed with 4002 and
    coming back, again and again, while the drain runs (thousands of reconnects in a failover run).

    It keeps no state of its own from ``__init__``, and its methods call daphne's by name, not through ``super()``:
    :func:`_adopt` gives runserver's daphne Server these methods, bound on the instance."""

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
        """daphne's, for a WebSocket of ours with the direct-writes extension and an :class:`_Inbox` as the
        application's queue (its reads pause while the application has input waiting)."""
        if scope.get("type") != "websocket" or not isinstance(protocol, OneBufferWebSocketProtocol):
            return daphne.server.Server.create_application(self, protocol, scope)
        scope["extensions"] = {**(scope.get("extensions") or {}), EXTENSION: DaphneDirect(protocol)}
        # (daphne.server.Server.create_application, with the queue ours)
        assert "application_instance" not in self.connections[protocol]
        inbox = _Inbox(protocol)
        scope.setdefault("asgi", {"version": "3.0"})
        application = self.application(scope=scope, receive=inbox.get, send=partial(self.handle_reply, protocol))
        if protocol not in self.connections:
            return None
        self.connections[protocol]["application_instance"] = asyncio.ensure_future(application)
        return inbox

    async def handle_reply(self, protocol: Any, message: dict[str, Any]) -> None:
        """daphne's, with flow control: a ``websocket.send`` waits while the connection's transport holds more than
        its buffer size (what direct writes wait for too), so an application writing through ASGI (``direct_writes``
        off) is held back by a client that does not read, as under uvicorn, and the driver closes it with 4003 after
        ``slow_consumer_timeout``. A close never waits."""
        flow = getattr(protocol, "flow", None)
        if flow is not None and message.get("type") == "websocket.send" and not flow.writable.is_set():
            await flow.writable.wait()
        await daphne.server.Server.handle_reply(self, protocol, message)

    def listen_success(self, port: Any) -> None:
        self.lowlat_ports = [*getattr(self, "lowlat_ports", []), port]
        daphne.server.Server.listen_success(self, port)

    def kill_all_applications(self) -> defer.Deferred[Any]:
        # A "before shutdown" trigger: Twisted waits for the Deferred. New connections are refused from now on; one
        # accepted just before is closed with 4002 at once (lowlat_mw.runtime.connection).
        for port in getattr(self, "lowlat_ports", ()):
            port.stopListening()
        drained: defer.Deferred[Any] = defer.Deferred.fromFuture(asyncio.ensure_future(drain_all()))
        drained.addErrback(lambda failure: None)
        drained.addCallback(lambda _: daphne.server.Server.kill_all_applications(self))
        return drained


LISTEN_BACKLOG = 2048  # as uvicorn's and gunicorn's; Twisted's default for daphne's -b/-p is 50


def _backlog(endpoints: list[str]) -> list[str]:
    """daphne's endpoint strings, a TCP one listening with a backlog of LISTEN_BACKLOG.

    With Twisted's default of 50, a burst of connections (200 at once in the transport suite)
    overflows the accept queue: the kernel drops the handshakes it cannot queue, and those
    clients are accepted only after SYN retransmits, seconds later.
    """
    return [f"{e}:backlog={LISTEN_BACKLOG}" if e.startswith("tcp:") and ":backlog=" not in e else e
            for e in endpoints]


def _with_backlog(*args: Any, **kwargs: Any) -> list[str]:
    """daphne's endpoint strings for -b/-p (build_endpoint_description_strings), with :func:`_backlog`."""
    return _backlog(build_endpoint_description_strings(*args, **kwargs))


def install() -> None:
    """Make daphne's server build the factories above, drain on shutdown, and listen with a larger
    backlog (done by :func:`main`)."""
    daphne.server.HTTPFactory = BoundedHTTPFactory
    daphne.server.WebSocketFactory = ClosingWebSocketFactory
    daphne.cli.build_endpoint_description_strings = _with_backlog
    daphne.cli.CommandLineInterface.server_class = DrainingServer


def install_runserver() -> None:
    """Make daphne's ``manage.py runserver`` this runner, whole: :func:`install`, and a :class:`DrainingServer` for
    its server (direct writes and reads, flow control, fair reads, the drain, the backlog), so that what the guide's
    development server does is what ``python -m lowlat_mw.servers.daphne`` does.

    For a server built from now on, the command's ``server_cls``. The one being built as this is called is daphne's
    own: runserver looks its server class up before it imports the application, and so the Channels adapter that
    calls this (``self.server_cls(application=self.get_application(options), ...)``); it becomes a DrainingServer as
    it starts, when it builds its HTTP factory, before it listens or takes a connection (:func:`_adopt`)."""
    runserver = importlib.import_module(DAPHNE_RUNSERVER)
    install()
    runserver.Command.server_cls = DrainingServer
    BoundedHTTPFactory.adopts = True


def _adopt(server: daphne.server.Server) -> None:
    """Give daphne's `server` the methods of a :class:`DrainingServer` (which adds no state of its own, only methods),
    each bound on the instance, where an attribute shadows its class's method (every caller looks them up on the
    server: ``self.server.create_application``, ``self.kill_all_applications`` as ``run`` registers it), and its TCP
    endpoints the runner's backlog: called as its ``run`` builds its HTTP factory, before it uses any of them."""
    for name, method in vars(DrainingServer).items():
        if callable(method) and not name.startswith("__"):
            setattr(server, name, MethodType(method, server))
    server.endpoints = _backlog(list(server.endpoints))


def main(argv: list[str] | None = None) -> None:
    """daphne's command line, with :func:`install` applied."""
    from daphne.cli import CommandLineInterface

    install()
    CommandLineInterface().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
