"""daphne with lowlat-mw's transport fixes: ``python -m lowlat_mw.adapters.daphne [daphne options] app``.

It takes every daphne option and runs daphne itself, with two things daphne has no option for:

* an oversized message or frame (over ``--websocket-max-message-size`` / ``--websocket-max-frame-size``)
  is refused with close code 1009; daphne's autobahn otherwise drops the TCP connection without a
  close frame (``failByDrop``), so clients see 1006 and cannot tell it from a network failure;
* the HTTP request that opens a connection must arrive within ``handshake_timeout`` (the setting,
  from ``settings.LOWLAT_MW`` or ``LOWLAT_HANDSHAKE_TIMEOUT``): Twisted's own limit is an idle timeout
  of 12 hours that every byte restarts, so a socket that says nothing, or drips its request a byte at
  a time, is otherwise held for as long as the client likes. A late one is answered 408 and closed.

``lowlat_mw.serving.daphne_args(settings)`` gives the options that match the settings (size limits,
the WebSocket opening handshake timeout, no protocol pings). Request headers are bounded by Twisted
itself (16 KiB, 500 headers). permessage-deflate stays off: daphne never accepts it.
"""

from __future__ import annotations

import sys
from typing import Any

import daphne.server
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.ws_protocol import WebSocketFactory
from twisted.internet import reactor

from lowlat_mw.errors import SettingsError
from lowlat_mw.settings import Settings

__all__ = ["BoundedHTTPFactory", "ClosingWebSocketFactory", "install", "main"]


def _handshake_timeout() -> float:
    values: dict[str, Any] = {}
    try:
        from lowlat_mw.adapters.channels import django_settings_dict

        values = dict(django_settings_dict())
    except Exception:  # no Django settings: the LOWLAT_* environment alone
        values = {}
    try:
        return Settings.load(values, source="settings.LOWLAT_MW").handshake_timeout
    except SettingsError:  # the app reports the bad setting itself; bound the handshake all the same
        return Settings().handshake_timeout


class ClosingWebSocketFactory(WebSocketFactory):
    """daphne's WebSocket factory, failing connections with a close frame (1009, 1002, ...), not a drop."""

    def setProtocolOptions(self, **options: Any) -> None:
        super().setProtocolOptions(**options, failByDrop=False)


class BoundedHTTPFactory(HTTPFactory):
    """daphne's HTTP factory, closing a connection whose first request is not in within the handshake timeout."""

    handshake_timeout: float | None = None

    def buildProtocol(self, addr: Any) -> Any:
        if self.handshake_timeout is None:
            type(self).handshake_timeout = _handshake_timeout()
        protocol = super().buildProtocol(addr)
        state = {"in": False}

        class MarkedRequest(WebRequest):
            def process(self) -> None:
                state["in"] = True
                super().process()

        protocol.requestFactory = MarkedRequest

        def expire() -> None:
            # Twisted wraps the HTTPChannel (for HTTP/2 negotiation): the transport is the channel's
            transport = getattr(getattr(protocol, "_channel", protocol), "transport", None)
            if transport is None and not state["in"]:  # not connected yet: look again shortly
                reactor.callLater(0.05, expire)
                return
            if not state["in"] and transport is not None and transport.connected:
                transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                transport.loseConnection()
                reactor.callLater(1.0, transport.abortConnection)

        reactor.callLater(self.handshake_timeout, expire)
        return protocol


def install() -> None:
    """Make daphne's server build the factories above (done by :func:`main`)."""
    daphne.server.HTTPFactory = BoundedHTTPFactory
    daphne.server.WebSocketFactory = ClosingWebSocketFactory


def main(argv: list[str] | None = None) -> None:
    """daphne's command line, with :func:`install` applied."""
    from daphne.cli import CommandLineInterface

    install()
    CommandLineInterface().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
