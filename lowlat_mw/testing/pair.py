"""A client and a server protocol machine joined in memory, with a fake clock (h11's ``ConnectionPair``).

    pair = ConnectionPair.ready()                       # Hello -> Welcome done, both sides OPEN
    start, = pair.request(ev.Request(stream_id=1, text="hi"))   # the client's Request reaches the server
    deltas = pair.chunk(1, "Hel") + pair.chunk(1, "lo")         # the model's output, as the client reads it
    end, = pair.finish(1)

No sockets and no sleeps: time is the number ``pair.now`` that a test moves. Each method that makes
one side speak returns what the other side made of it: the server's actions with every SendFrame
decoded back into its event (``send``, ``send_raw``, ``request``...), or the client machine's events
(``deliver``, ``chunk``, ``finish``...). ``send`` and ``send_raw`` put any message or bytes on the
wire as a client would, bypassing the client machine's own checks, for the server's tests of bad input.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..protocol import events as ev
from ..protocol.base import CloseConnection, SendFrame
from ..protocol.client import ClientProtocol
from ..protocol.selector import CompressionSelector
from ..protocol.server import ServerProtocol
from ..protocol.session import Session
from ..protocol.wire import codec_for
from ..settings import SUBPROTOCOL_PROTO, Settings

__all__ = ["T0", "ConnectionPair"]

T0 = 5000.0  # the fake clock never starts at zero
SECRET_1, SECRET_2 = "RmFrZVNlY3JldEZvclRlc3RzT25seTEy", "RmFrZVNlY3JldEZvclRlc3RzT25seTIy"  # as long as drawn ones


class ConnectionPair:
    """A :class:`ServerProtocol` and a :class:`ClientProtocol` on the two ends of an in-memory wire."""

    def __init__(self, settings: Settings | None = None, subprotocol: str | None = SUBPROTOCOL_PROTO, *,
                 now: float = T0, session_id: str = "sess-1", secret: str = SECRET_1,
                 client: ClientProtocol | None = None, **client_options: Any) -> None:
        """A transport-level connection, before any Hello. `client`: a client machine to reuse (a
        reconnect of the same client); else one is made with `client_options`."""
        self.settings = settings or Settings()
        self.subprotocol = subprotocol
        self.now = now
        self.server = ServerProtocol(self.settings, subprotocol=subprotocol, now=now, session_id=session_id,
                                     secret=secret)
        self.client = client or ClientProtocol(subprotocol, **client_options)
        self.codec = codec_for(subprotocol)

    @classmethod
    def ready(cls, settings: Settings | None = None, subprotocol: str | None = SUBPROTOCOL_PROTO, *,
              compression: Sequence[str] = (), **options: Any) -> ConnectionPair:
        """A connection after Hello and Welcome (the client offering `compression`)."""
        pair = cls(settings, subprotocol, compression=tuple(compression), **options)
        welcome = pair.hello()
        assert [type(e) for e in welcome] == [ev.Welcome], welcome
        return pair

    @property
    def conn(self) -> ServerProtocol:
        """The server machine (the name the server's unit tests use)."""
        return self.server

    # ------------------------------------------------------------ helpers
    def _at(self, at: float | None) -> float:
        if at is not None:
            self.now = at
        return self.now

    def decode(self, actions: Iterable[Any]) -> list[Any]:
        """The server's output as the client end of the wire reads it: each frame decoded to its event
        (SendFrame actions and the raw frames of ``send_chunk``); other actions pass through."""
        out = []
        for action in actions:
            data = action.data if isinstance(action, SendFrame) else action
            if isinstance(data, bytes | str):
                assert isinstance(data, bytes if self.codec.binary else str)
                out.append(self.codec.decode(data, limit=2**31, allowed=self.server.compression))
            else:
                out.append(action)
        return out

    def frames(self, actions: Iterable[Any]) -> list[bytes | str]:
        """The frames among the server's output (SendFrame data, or the raw frames of ``send_chunk``)."""
        return [a.data if isinstance(a, SendFrame) else a for a in actions if isinstance(a, SendFrame | bytes | str)]

    # ------------------------------------------------------------ client -> server
    def send(self, event: ev.Event, *, at: float | None = None,
             compressor: CompressionSelector | None = None) -> list[Any]:
        """Put `event` on the wire as a client would (without the client machine): the server's answer."""
        return self.send_raw(self.codec.encode(event, compressor), at=at)

    def send_raw(self, data: bytes | str, *, at: float | None = None) -> list[Any]:
        """Put raw bytes (or text) on the wire: the server's answer, decoded."""
        return self.decode(self.server.receive_data(data, self._at(at)))

    def hello(self, *, resume: bool = False, at: float | None = None, session: Session | None = None) -> list[Any]:
        """The client machine connects (Hello, resuming if `resume`) and reads the server's answer.

        For a resume, `session` is what the server's store holds (the driver's lookup); returns the
        client's events (Welcome, replayed Deltas...) followed by the server's other actions.
        """
        now = self._at(at)
        actions = self.server.receive_data(self.client.connect(now, resume=resume), now)
        rest = [a for a in actions if not isinstance(a, SendFrame)]
        if any(type(a).__name__ == "ResumeSession" for a in rest):
            actions = self.server.resume(session, now)
            rest = [a for a in actions if not isinstance(a, SendFrame)]
        return self.deliver(actions) + rest

    def request(self, request: ev.Request, *, at: float | None = None) -> list[Any]:
        """The client machine starts a stream: the server's answer (StartStream, or an Error frame, decoded)."""
        return self.decode(self.server.receive_data(self.client.request(request), self._at(at)))

    def client_says(self, frame: bytes | str | None, *, at: float | None = None) -> list[Any]:
        """A frame the client machine produced (an Ack, a Cancel, a Pong...) reaches the server."""
        if frame is None:
            return []
        return self.decode(self.server.receive_data(frame, self._at(at)))

    # ------------------------------------------------------------ server -> client
    def deliver(self, actions: Iterable[Any], *, at: float | None = None) -> list[Any]:
        """The server's frames reach the client machine: the client's events and actions, in order.

        A frame the client answers by itself (a Pong for a Ping) goes back to the server at once.
        """
        now = self._at(at)
        out: list[Any] = []
        for frame in self.frames(actions):
            for item in self.client.receive_data(frame, now):
                if isinstance(item, SendFrame):
                    self.server.receive_data(item.data, now)
                out.append(item)
        return out

    def chunk(self, sid: int, chunk: str | bytes, *, at: float | None = None) -> list[Any]:
        """The server's model produced `chunk`: its Delta frames, decoded (:meth:`deliver`: the client's view)."""
        return self.decode(self.server.send_chunk(sid, chunk, self._at(at)))

    def finish(self, sid: int, *, at: float | None = None, **kw: Any) -> list[Any]:
        """The server's model finished: its End, decoded."""
        return self.decode(self.server.finish_stream(sid, self._at(at), **kw))

    # ------------------------------------------------------------ time
    def tick(self, at: float) -> list[Any]:
        """Move the clock to `at` and run the server's timers: what they sent, decoded."""
        self.now = at
        return self.decode(self.server.tick(at))

    def run_until(self, end: float, *, answer_pings: bool = True, rtt: float = 0.05) -> list[tuple[float, Any]]:
        """Move the clock to `end`, ticking the server at every deadline; the client answers Pings after `rtt`."""
        log: list[tuple[float, Any]] = []
        while not self.server.closed:
            due = self.server.next_deadline()
            if due > end:
                break
            for item in self.tick(max(due, self.now)):
                log.append((self.now, item))
                if isinstance(item, ev.Ping) and answer_pings:
                    for reply in self.send(ev.Pong(id=item.id), at=self.now + rtt):
                        log.append((self.now, reply))
        self.now = max(self.now, end)
        return log

    # ------------------------------------------------------------ queries
    def close_of(self, items: Iterable[Any]) -> CloseConnection | None:
        """The one CloseConnection among `items`, if any."""
        found = [i for i in items if isinstance(i, CloseConnection)]
        assert len(found) <= 1
        return found[0] if found else None

    def reconnect(self, *, session_id: str = "sess-2", secret: str = SECRET_2) -> ConnectionPair:
        """The same client on a new connection to a new server machine (after a drop), at the same time."""
        self.client.connection_lost()
        return ConnectionPair(self.settings, self.subprotocol, now=self.now, session_id=session_id, secret=secret,
                              client=self.client)

    @property
    def next_deadline(self) -> float:
        """The server's next deadline (inf when closed)."""
        return self.server.next_deadline() if not self.server.closed else math.inf
