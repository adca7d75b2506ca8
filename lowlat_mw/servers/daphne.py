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
  (:func:`lowlat_mw.drivers.aio.drain_all`). daphne alone cancels them at once and drops every
  connection without a close frame;
* it offers lowlat-mw direct writes (the ``lowlat.transport`` scope extension,
  :mod:`lowlat_mw.drivers.direct`): the driver frames its output and hands a loop turn's frames to
  autobahn's ``sendData`` in one piece, instead of one ASGI ``send`` per frame through daphne's reply path
  and autobahn's message framing (a 500-token reply took about two and a half times as long as under uvicorn).

``lowlat_mw.servers.serving.daphne_args(settings)`` gives the options that match the settings (size limits,
the WebSocket opening handshake timeout, no protocol pings). permessage-deflate stays off: daphne
never accepts it.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import daphne.cli
import daphne.server
from daphne.endpoints import build_endpoint_description_strings
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol
from twisted.internet import defer, reactor

from lowlat_mw.drivers.aio import drain_all
from lowlat_mw.drivers.direct import EXTENSION
from lowlat_mw.endpoint import Endpoint
from lowlat_mw.errors import SettingsError
from lowlat_mw.servers.serving import HeaderBudget, add_fragment, too_big_message
from lowlat_mw.settings import Settings

__all__ = ["BoundedHTTPFactory", "ClosingWebSocketFactory", "DaphneDirect", "DrainingServer",
           "OneBufferWebSocketProtocol", "install", "main"]


def _app_timeout(name: str) -> float:
    """The app's setting `name` (a timeout): the shortest of the endpoints the application made when daphne loaded
    it (each ``LowLatConsumer.as_asgi()``, from ``settings.LOWLAT_MW``); without one, the environment's or the
    default."""
    endpoints = list(Endpoint.instances)
    if endpoints:
        return min(getattr(e.settings, name) for e in endpoints)  # type: ignore[no-any-return]
    try:
        return getattr(Settings.load(), name)  # type: ignore[no-any-return]
    except SettingsError:  # the app reports the bad setting itself; bound the server all the same
        return getattr(Settings(), name)  # type: ignore[no-any-return]


def _handshake_timeout() -> float:
    return _app_timeout("handshake_timeout")


class OneBufferWebSocketProtocol(WebSocketProtocol):
    """daphne's WebSocket protocol, reassembling a fragmented message at about its own size.

    autobahn keeps a list with one bytes object per fragment until the message is complete (about
    120 bytes per one-byte fragment: 12 MiB for a 100 KB message sent one byte a frame); here small
    fragments are appended to one buffer and big ones kept whole (:func:`lowlat_mw.servers.serving.add_fragment`,
    as in the uvicorn shim). autobahn's onMessageEnd joins the list as before. The size limits
    (checked by autobahn as each frame begins) are unchanged.
    """

    def onMessageFrame(self, payload: Any) -> None:
        if not self.failedByMe:
            for piece in payload:
                add_fragment(self.message_data, piece)

    def dropConnection(self, abort: bool = False) -> None:
        super().dropConnection(abort)
        if not abort and self.transport is not None:
            # After answering the peer's close, autobahn closes gently: Twisted closes the socket once it has written
            # what it holds, which a peer that stopped reading never lets happen. (A close of ours is bounded by
            # closeHandshakeTimeout: ClosingWebSocketFactory.)
            reactor.callLater(_app_timeout("close_timeout"), _abort, self.transport)

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


def _abort(transport: Any) -> None:
    """Drop a TCP connection that is still there, with what it has not written (Twisted's abortConnection)."""
    if getattr(transport, "connected", False) and hasattr(transport, "abortConnection"):
        transport.abortConnection()


class DaphneDirect:
    """A daphne WebSocket connection as a :class:`~lowlat_mw.drivers.direct.DirectTransport`: whole frames go to
    autobahn's ``sendData`` (Twisted's transport buffers them; it never blocks). As daphne's own ``send``, it has
    no flow control of its own: always writable (the protocol's flow window bounds what a stream sends ahead).
    The accept and the close still go through ASGI ``send``, to daphne."""

    __slots__ = ("_protocol", "write")

    def __init__(self, protocol: WebSocketProtocol) -> None:
        self._protocol = protocol
        self.write = protocol.sendData
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

    def is_writable(self) -> bool:
        return True

    async def wait_writable(self) -> None:
        return None


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
        close = _app_timeout("close_timeout") + BATCHED_TIMER_ROUNDING
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
    coming back, again and again, while the drain runs (thousands of reconnects in a failover run)."""

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
        if scope.get("type") == "websocket" and isinstance(protocol, OneBufferWebSocketProtocol):
            scope["extensions"] = {**(scope.get("extensions") or {}), EXTENSION: DaphneDirect(protocol)}
        return super().create_application(protocol, scope)

    def listen_success(self, port: Any) -> None:
        self.lowlat_ports = [*getattr(self, "lowlat_ports", []), port]
        super().listen_success(port)

    def kill_all_applications(self) -> defer.Deferred[Any]:
        # A "before shutdown" trigger: Twisted waits for the Deferred. New connections are refused from now on; one
        # accepted just before is closed with 4002 at once (lowlat_mw.drivers.aio).
        for port in getattr(self, "lowlat_ports", ()):
            port.stopListening()
        drained: defer.Deferred[Any] = defer.Deferred.fromFuture(asyncio.ensure_future(drain_all()))
        drained.addErrback(lambda failure: None)
        drained.addCallback(lambda _: super(DrainingServer, self).kill_all_applications())
        return drained


LISTEN_BACKLOG = 2048  # as uvicorn's and gunicorn's; Twisted's default for daphne's -b/-p is 50


def _with_backlog(*args: Any, **kwargs: Any) -> list[str]:
    """daphne's endpoint strings for -b/-p, listening with a backlog of LISTEN_BACKLOG.

    With Twisted's default of 50, a burst of connections (200 at once in the transport suite)
    overflows the accept queue: the kernel drops the handshakes it cannot queue, and those
    clients are accepted only after SYN retransmits, seconds later.
    """
    return [f"{e}:backlog={LISTEN_BACKLOG}" if e.startswith("tcp:") and ":backlog=" not in e else e
            for e in build_endpoint_description_strings(*args, **kwargs)]


def install() -> None:
    """Make daphne's server build the factories above, drain on shutdown, and listen with a larger
    backlog (done by :func:`main`)."""
    daphne.server.HTTPFactory = BoundedHTTPFactory
    daphne.server.WebSocketFactory = ClosingWebSocketFactory
    daphne.cli.build_endpoint_description_strings = _with_backlog
    daphne.cli.CommandLineInterface.server_class = DrainingServer


def main(argv: list[str] | None = None) -> None:
    """daphne's command line, with :func:`install` applied."""
    from daphne.cli import CommandLineInterface

    install()
    CommandLineInterface().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
