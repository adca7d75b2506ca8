"""One ConnectionDriver driven in process: no socket, no server, its ASGI sends collected and decoded.

What tests of the asyncio driver use (drain, metrics, model failures): frames go in with
``receive``, everything the driver sends comes out decoded in ``events``, and ``closed`` is the
close code it sent. ``Peer.admitted`` goes through the endpoint's admission first, as a server would.
"""

from __future__ import annotations

from typing import Any

from lowlat_mw.endpoint import Endpoint, Refuse
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.runtime.connection import ConnectionDriver
from lowlat_mw.settings import SUBPROTOCOL_JSON, Settings


class Peer:
    """A connection's driver and what it sent (decoded), and how it was closed."""

    def __init__(self, endpoint: Endpoint, subprotocol: str | None = SUBPROTOCOL_JSON, *, driver: bool = True) -> None:
        self.endpoint = endpoint
        self.codec = codec_for(subprotocol)
        self.sent: list[Any] = []
        self.events: list[ev.Event] = []
        self.closed: int | None = None
        self.driver: ConnectionDriver | None = None
        if driver:
            self.driver = ConnectionDriver(endpoint, send=self._send, subprotocol=subprotocol)

    @classmethod
    def admitted(cls, endpoint: Endpoint, subprotocol: str | None = SUBPROTOCOL_JSON) -> Peer:
        """A connection as a server opens it: admission first (a refusal closes it: no driver)."""
        answer = endpoint.admit([subprotocol] if subprotocol else [], None, "127.0.0.1", "127.0.0.1")
        if type(answer) is Refuse:
            peer = cls(endpoint, subprotocol, driver=False)
            peer.closed = answer.close_code if answer.status is None else answer.status
            return peer
        peer = cls(endpoint, subprotocol)
        assert peer.driver is not None
        peer.driver.address = answer.client
        return peer

    async def _send(self, message: Any) -> None:
        self.sent.append(message)
        if message["type"] == "websocket.send":
            data = message.get("bytes", message.get("text"))
            compression = self.driver.protocol.compression if self.driver is not None else ()
            self.events.append(self.codec.decode(data, limit=1 << 30, allowed=compression))
        elif message["type"] == "websocket.close":
            self.closed = message["code"]

    async def receive(self, event: ev.Event) -> None:
        """The client sends `event`."""
        assert self.driver is not None
        await self.driver.receive(self.codec.encode(event))

    async def hello_and_request(self, **params: Any) -> None:
        await self.receive(ev.Hello())
        await self.receive(ev.Request(stream_id=1, text="x", params=params))

    def texts(self) -> list[str]:
        return [e.text for e in self.events if isinstance(e, ev.Delta) and e.text is not None]

    async def gone(self) -> None:
        """The socket is gone (with the close code the server sent, if any)."""
        if self.driver is not None:
            await self.driver.disconnected(self.closed)


def endpoint_for(model: Any, **settings: Any) -> Endpoint:
    """An endpoint for `model` with these settings and a private metrics registry."""
    from prometheus_client import CollectorRegistry

    return Endpoint(model, Settings(**settings), registry=CollectorRegistry())


def allow_all(handshake: Any) -> str:
    """An authenticate hook (a sync one: it runs in a worker thread) that lets everyone in."""
    return "someone"
