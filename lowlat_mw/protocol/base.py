"""What both protocol machines share: the codec, negotiated compression, heartbeat, state and counters.

:class:`Protocol` is the base of :class:`~lowlat_mw.protocol.server.ServerProtocol` and
:class:`~lowlat_mw.protocol.client.ClientProtocol` (one machine, two roles, as in websockets' sans-IO
``Protocol``). A driver feeds it WebSocket messages with :meth:`Protocol.receive_data` and the time
with :meth:`Protocol.tick`, and carries out the actions that come back. Which message a state accepts
is the table in :mod:`~lowlat_mw.protocol.state`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import CloseCode, RemoteProtocolError
from . import events as ev
from .heartbeat import Heartbeat, HeartbeatAction, HeartbeatFrames, MadePing
from .limits import TokenBucket
from .selector import CompressionSelector
from .state import ConnState
from .wire import ParamsMemo, codec_for

__all__ = ["CODEC_SLOTS", "CloseConnection", "FrameStats", "Measured", "Protocol", "SendFrame", "subprotocol_label"]


# ------------------------------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send this WebSocket message (bytes: binary frame, str: text frame).

    `error` is the Error it carries, if any, so the driver can log and count it (the machine does no I/O).
    """

    data: bytes | str
    error: ev.Error | None = None


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the WebSocket with `code` and `reason` (the server: and stop every running stream)."""

    code: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Measured:
    """A measurement for the driver to record: `name` is the metric (``heartbeat_rtt_seconds``), `value` its sample."""

    name: str
    value: float


# A Ping's payload is at most 8 bytes: never compressed unless the compressor's min_size is at most that (then it is
# framed as any message, not made once: HeartbeatFrames).
_PING_MAX = 8


# ------------------------------------------------------------------------------------ counters
CODEC_SLOTS = 5  # compression codec ids counted per connection: none, zstd, lz4, snappy, and the reserved 4
_SUBPROTOCOL_LABEL = {"lowlat.v1.proto": "proto", "lowlat.v1.json": "json", None: "json"}


def subprotocol_label(subprotocol: str | None) -> str:
    """The short label value for a subprotocol ("proto" or "json")."""
    return _SUBPROTOCOL_LABEL.get(subprotocol, "json")


class FrameStats:
    """Frames and bytes of one connection, by compression codec id: what the machine counts anyway.

    ``sent[3 * codec_id : 3 * codec_id + 3]`` is ``frames, bytes before compression, bytes on the
    wire`` (one flat list: small, as every connection has one) and ``received`` is ``[frames, bytes]``.
    The metrics read the open connections' counters at scrape time and fold a connection's into their
    totals when it closes, so metrics cost nothing per frame.
    """

    __slots__ = ("__weakref__", "label", "received", "sent")

    def __init__(self, label: str) -> None:
        self.label = label
        self.sent = [0] * (3 * CODEC_SLOTS)
        self.received = [0, 0]

    def count_sent(self, codec_id: int, raw: int, wire: int) -> None:
        """One frame sent."""
        sent, base = self.sent, 3 * codec_id
        sent[base] += 1
        sent[base + 1] += raw
        sent[base + 2] += wire

    def count_received(self, size: int) -> None:
        """One frame of `size` bytes received."""
        received = self.received
        received[0] += 1
        received[1] += size

    def by_codec(self) -> list[tuple[int, int, int]]:
        """(frames, bytes before compression, bytes on the wire) per codec id."""
        s = self.sent
        return [(s[i], s[i + 1], s[i + 2]) for i in range(0, len(s), 3)]

    @property
    def frames_out(self) -> int:
        return sum(self.sent[0::3])

    @property
    def payload_bytes_out(self) -> int:
        return sum(self.sent[1::3])

    @property
    def bytes_out(self) -> int:
        return sum(self.sent[2::3])

    @property
    def frames_in(self) -> int:
        return self.received[0]

    @property
    def bytes_in(self) -> int:
        return self.received[1]


# ------------------------------------------------------------------------------------ the machine
class Protocol:
    """One end of one lowlat-mw connection, as a state machine: messages and `now` in, actions out.

    Subclasses give the handlers (``_on_<name>``, looked up per state in ``HANDLERS``, built from the
    tables of :mod:`~lowlat_mw.protocol.state`), the messages that count as application traffic for
    the heartbeat (``APPLICATION``) and what to do with a bad or unexpected message.
    """

    HANDLERS: ClassVar[dict[ConnState, dict[type, Any]]] = {}
    APPLICATION: ClassVar[frozenset[type]] = frozenset()
    CONTROL: ClassVar[frozenset[type]] = frozenset()  # kinds the `control` budget counts (the server's)
    PEER_DEAD_REASON: ClassVar[str] = "no pong within heartbeat_timeout"
    params: ParamsMemo | None = None  # the codec's memo of Request params (a server's own), None: none

    def __init__(self, subprotocol: str | None, *, state: ConnState, max_frame_size: int,
                 max_decompressed_size: int, meter: Callable[[], float] | None = None,
                 heartbeats: HeartbeatFrames | None = None) -> None:
        """`meter`: a CPU clock the compressor times its own work with (None: its priors, deterministic);
        `heartbeats`: where Pings are made once, shared with other connections (None: this machine's own)."""
        self.subprotocol = subprotocol
        self.codec = codec_for(subprotocol)
        self.state = state
        self.max_frame_size = max_frame_size
        self.max_decompressed_size = max_decompressed_size
        self.meter = meter
        self.compression: tuple[str, ...] = ()  # negotiated codecs (both directions)
        self.compressor: CompressionSelector | None = None
        self.heartbeat: Heartbeat | None = None
        self.close_code: int | None = None
        self.close_reason = ""
        self.stats = FrameStats(subprotocol_label(subprotocol))
        # Set when next_deadline() may have moved earlier (or later, as when the awaited Pong arrives): the
        # driver re-arms its timer and clears it. Otherwise deadlines only move later, and a timer that fires
        # early finds nothing to do.
        self.deadline_moved = False
        # The Pong that answers the Ping out, as this codec encodes it (None: no Ping out): receive_data
        # knows it by its bytes and skips the decoding (every idle connection's heartbeat brings one).
        self.pong_frame: bytes | str | None = None
        self.heartbeats = heartbeats if heartbeats is not None else HeartbeatFrames()
        self.ping_made: MadePing | None = None  # the last Ping, if made once (its `wire` is the writer's)
        # A token bucket for the messages of the CONTROL kinds (and the undecodable ones that leave the connection
        # open): past it, _flooded() (the server's: Error rate_limited, close 1008). None: no budget.
        self.control: TokenBucket | None = None

    # ------------------------------------------------------------------ state
    def deadline_seen(self) -> None:
        """The driver has put its timer at :meth:`next_deadline`: ``deadline_moved`` is clear until it moves again."""
        self.deadline_moved = False

    @property
    def open(self) -> bool:
        """True between Welcome and close: frames can be sent."""
        return self.state is ConnState.OPEN

    @property
    def closed(self) -> bool:
        """True once a CloseConnection was returned or the peer went away."""
        return self.state is ConnState.CLOSED

    @property
    def compress_seconds(self) -> float:
        """CPU seconds spent compressing so far (measured with the meter; 0 without one)."""
        return self.compressor.spent if self.compressor is not None else 0.0

    def _negotiated(self, compression: tuple[str, ...], *, min_size: int = 512, link_mbps: float = 1000.0) -> None:
        self.compression = compression
        self.compressor = CompressionSelector(compression, min_size=min_size, link_mbps=link_mbps,
                                              clock=self.meter) if compression else None

    # ------------------------------------------------------------------ output
    def _frame(self, event: ev.Event) -> bytes | str:
        """`event` as a WebSocket message (compressed where it pays), counted."""
        data, raw, codec_id = self.codec.encode_frame(event, self.compressor)
        self.stats.count_sent(codec_id, raw, len(data) if type(data) is bytes else raw)
        return data

    def _close(self, code: int, reason: str) -> list[Any]:
        if self.state is ConnState.CLOSED:
            return []
        self.state = ConnState.CLOSED
        self.close_code, self.close_reason = code, reason
        return [CloseConnection(code, reason)]

    def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> list[Any]:
        """Close from this side (e.g. shutdown): the CloseConnection to carry out."""
        return self._close(code, reason)

    # ------------------------------------------------------------------ input
    def receive_data(self, data: bytes | str, now: float) -> list[Any]:
        """Handle one WebSocket message from the peer: the actions (and, for the client, events) it causes."""
        if data == self.pong_frame and self.state is ConnState.OPEN:
            return self._pong_arrived(len(data), now)
        if self.state is ConnState.CLOSED:
            return []
        size = len(data) if type(data) is not str or len(data) * 4 <= self.max_frame_size \
            else len(data.encode("utf-8", "surrogatepass"))  # a text frame's size is its UTF-8 length
        self.stats.count_received(size)
        hb = self.heartbeat
        if hb is not None and hb.awaiting is not None:
            self.deadline_moved = True  # proof of life while a Ping is out: the next Ping may be due sooner
        if size > self.max_frame_size:
            if hb is not None:
                hb.on_receive(now)
            return self._too_big(size)
        try:
            event = self.codec.decode(data, limit=self.max_decompressed_size, allowed=self.compression,
                                      params=self.params)
        except RemoteProtocolError as exc:
            if hb is not None:
                hb.on_receive(now)
            control = self.control
            if control is not None and exc.close_code is None and not control.take(now):
                return self._flooded()
            return self._bad_frame(exc)
        kind = type(event)
        control = self.control
        if control is not None and kind in self.CONTROL and not control.take(now):
            return self._flooded()
        if hb is not None:
            hb.on_receive(now, kind in self.APPLICATION)
        handler = self.HANDLERS[self.state].get(kind)
        if handler is None:
            return self._unexpected(event)
        return handler(self, event, now)  # type: ignore[no-any-return]

    def _too_big(self, size: int) -> list[Any]:
        raise NotImplementedError

    def _flooded(self) -> list[Any]:
        raise NotImplementedError

    def _bad_frame(self, exc: RemoteProtocolError) -> list[Any]:
        raise NotImplementedError

    def _unexpected(self, event: ev.Event) -> list[Any]:
        raise NotImplementedError

    def _on_ping(self, ping: ev.Ping, now: float) -> list[Any]:
        return [SendFrame(self._frame(ping.response()))]

    def _on_pong(self, pong: ev.Pong, now: float) -> list[Any]:
        hb = self.heartbeat
        if hb is None:
            return []
        awaited = hb.awaiting
        hb.on_pong(pong.id, now)
        if hb.awaiting is None:
            self.pong_frame = None
        if awaited is not None and hb.awaiting is None and hb.rtt is not None:
            return [Measured("heartbeat_rtt_seconds", hb.rtt)]
        return []

    def _pong_arrived(self, size: int, now: float) -> list[Any]:
        """:meth:`receive_data` of the awaited Pong (`pong_frame`, `size` bytes): :meth:`pong_arrived`, and its RTT
        to measure."""
        return [Measured("heartbeat_rtt_seconds", self.pong_arrived(now))]

    def pong_arrived(self, now: float) -> float:
        """The awaited Pong (`pong_frame`) arrived whole; returns its RTT. What decoding it and :meth:`_on_pong` do, by
        the same functions: counted, proof of life, the Ping answered. Only while `pong_frame` is set and the
        connection is open: :meth:`receive_data` checks; a driver that knows the message by identity (its transport
        awaited it) calls this instead, and measures the RTT itself."""
        pong = self.pong_frame
        self.pong_frame = None
        self.stats.count_received(len(pong))  # type: ignore[arg-type]  # (ASCII either way: a Pong's JSON, or bytes)
        hb: Any = self.heartbeat  # (set, and awaiting this Pong: pong_frame is set only while a Ping is out)
        self.deadline_moved = True
        hb.on_pong(hb.awaiting, now)
        return hb.rtt  # type: ignore[no-any-return]

    def _ping(self) -> list[Any]:
        """The Ping the heartbeat just asked for, framed (counted as :meth:`_frame` counts), and the Pong
        that will answer it noted (`pong_frame`)."""
        ping_id = self.heartbeat.ping_id  # type: ignore[union-attr]
        codec = self.codec
        compressor = self.compressor
        made = None
        if compressor is None or compressor.min_size > _PING_MAX:
            made = self.heartbeats.get(codec, ping_id, lambda: (SendFrame(codec.encode(ev.Ping(id=ping_id))),
                                                               codec.encode(ev.Pong(id=ping_id))))
        self.ping_made = made
        if made is None:
            self.pong_frame = codec.encode(ev.Pong(id=ping_id))
            return [SendFrame(self._frame(ev.Ping(id=ping_id)))]
        send, self.pong_frame = made.send, made.pong
        size = len(send.data)  # (uncompressed: codec id 0)
        self.stats.count_sent(0, size, size)
        return [send]

    # ------------------------------------------------------------------ time
    def _heartbeat_due(self, now: float) -> list[Any]:
        """Ping when one is due, close with 4001 when the peer stopped answering."""
        hb = self.heartbeat
        return [] if hb is None else self._heartbeat_answer(hb.poll(now))

    def _heartbeat_answer(self, action: HeartbeatAction | None) -> list[Any]:
        """What the heartbeat's `action` (:meth:`Heartbeat.poll`'s answer) asks: close 4001, a Ping, or nothing."""
        if action is HeartbeatAction.PEER_DEAD:
            return self._close(CloseCode.HEARTBEAT_TIMEOUT, self.PEER_DEAD_REASON)
        if action is HeartbeatAction.SEND_PING:
            return self._ping()
        if self.heartbeat.awaiting is None:  # type: ignore[union-attr]
            self.pong_frame = None  # (poll found the peer alive without the Pong)
        return []

    def next_deadline(self) -> float:
        """When :meth:`tick` next has something to do (inf when closed)."""
        if self.state is ConnState.CLOSED or self.heartbeat is None:
            return math.inf
        return self.heartbeat.deadline()

    def tick(self, now: float) -> list[Any]:
        """Timers: heartbeat pings and timeouts (the server adds its handshake timeout and idle reaper)."""
        if self.state is ConnState.CLOSED:
            return []
        return self._heartbeat_due(now)
