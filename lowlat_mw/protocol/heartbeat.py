"""Sans-IO heartbeat manager and idle-timeout reaper: `now` goes in, decisions come out.

Heartbeat rules (docs/protocol.md, "Heartbeat"):

* A Ping is due ``interval`` seconds after the previous one (or after the connection opened).
* Any frame from the peer (a Pong included) proves it alive: after a Ping, if no frame at all
  arrives within ``timeout``, the peer is dead.
* Application traffic from the peer (anything but Ping/Pong) between two Pings doubles the
  interval, up to ``max_interval``; a period without it resets the interval to the base. So a
  busy connection is probed every 2 minutes and a quiet one every 30 s.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection

__all__ = ["Heartbeat", "HeartbeatAction", "HeartbeatFrames", "IdleReaper", "MadePing"]


class HeartbeatAction(enum.Enum):
    """What :meth:`Heartbeat.poll` asks the driver to do."""

    SEND_PING = "send_ping"
    PEER_DEAD = "peer_dead"


class Heartbeat:
    """Decides when to ping and when the peer is dead; measures RTT from Pongs."""

    __slots__ = ("alive_since_ping", "awaiting", "current", "interval", "last_ping_at", "max_interval",
                 "next_ping_at", "ping_id", "rtt", "rx_since_ping", "timeout")

    def __init__(self, interval: float, max_interval: float, timeout: float, now: float) -> None:
        self.interval, self.max_interval, self.timeout = interval, max_interval, timeout
        self.current = self.interval
        self.last_ping_at = now
        self.next_ping_at = now + interval
        self.ping_id = 0
        self.awaiting: int | None = None
        self.rx_since_ping = False  # application traffic since the last Ping (stretches the interval)
        self.alive_since_ping = False  # any frame since the last Ping (proves the peer alive)
        self.rtt: float | None = None

    def on_receive(self, now: float, application: bool = True) -> None:
        """A frame arrived from the peer; `application` is False for Ping/Pong."""
        self.alive_since_ping = True
        if application:
            self.rx_since_ping = True

    def on_pong(self, ping_id: int, now: float) -> None:
        """A Pong arrived; if it answers our latest Ping, record the RTT."""
        self.alive_since_ping = True
        if ping_id and ping_id == self.awaiting:
            self.rtt = now - self.last_ping_at
            self.awaiting = None

    def poll(self, now: float) -> HeartbeatAction | None:
        """Call at (or after) :meth:`deadline`; returns what to do now, if anything."""
        if self.awaiting is not None:
            if self.alive_since_ping:
                self.awaiting = None  # alive (a Pong may still come and give an RTT)
            elif now >= self.last_ping_at + self.timeout:
                return HeartbeatAction.PEER_DEAD
            else:
                return None
        if now < self.next_ping_at:
            return None
        self.current = min(self.current * 2, self.max_interval) if self.rx_since_ping else self.interval
        self.rx_since_ping = self.alive_since_ping = False
        self.ping_id = (self.ping_id % 0xFFFFFFFF) + 1
        self.awaiting = self.ping_id
        self.last_ping_at = now
        self.next_ping_at = now + self.current
        return HeartbeatAction.SEND_PING

    def deadline(self, answered: bool = False) -> float:
        """When :meth:`poll` next has something to do; `answered`: as if the Ping out were answered now (for a
        driver that watches that Pong's timeout apart)."""
        if self.awaiting is not None and not self.alive_since_ping and not answered:
            return self.last_ping_at + self.timeout
        return self.next_ping_at


class IdleReaper:
    """Closes a connection idle for `timeout` s: no application traffic, no stream running, and its session in no
    push group (a session in push groups is listening for pushes, not idle).

    ``last_activity`` is when the last application traffic happened: :meth:`touch` sets it, and the per-Delta
    path of :class:`~lowlat_mw.protocol.server.ServerProtocol` writes it as a plain field (a call per token costs).
    The rule itself lives only here, in :meth:`deadline` and :meth:`expired`.
    """

    __slots__ = ("last_activity", "timeout")

    def __init__(self, timeout: float, now: float) -> None:
        self.timeout = timeout
        self.last_activity = now

    def touch(self, now: float) -> None:
        """Application traffic (Request, Cancel, Delta, End, Error) happened."""
        self.last_activity = now

    def deadline(self, active_streams: int, groups: Collection[str] = ()) -> float:
        """When the connection becomes idle (infinity while a stream runs or the session is in push `groups`)."""
        return math.inf if active_streams or groups else self.last_activity + self.timeout

    def expired(self, now: float, active_streams: int, groups: Collection[str] = ()) -> bool:
        """True when the connection should be reaped now (see :meth:`deadline`)."""
        return now >= self.deadline(active_streams, groups)


class MadePing:
    """A heartbeat Ping made once (:class:`HeartbeatFrames`): its message, the Pong that answers it, and what a
    transport makes of them (`wire`: set by the first writer that writes it, then shared; opaque here)."""

    __slots__ = ("pong", "send", "wire")

    def __init__(self, send: object, pong: bytes | str) -> None:
        self.send = send  # the Ping's SendFrame
        self.pong = pong  # the Pong message, as the codec encodes it
        self.wire: object = None


class HeartbeatFrames:
    """Heartbeat Pings made once, per codec and Ping id, for every connection that shares this object (a loop's
    scheduler hands one to each of its connections). Every connection numbers its Pings 1, 2, 3..., so all idle
    connections share the same few; bounded by IDS per codec (a Ping a connection every 30 s: 4096 last more than a
    day), past which Pings are made each time."""

    __slots__ = ("made",)
    IDS = 4096

    def __init__(self) -> None:
        self.made: dict[tuple[object, int], MadePing] = {}

    def get(self, codec: object, ping_id: int, make: Callable[[], tuple[object, bytes | str]]) -> MadePing | None:
        """The Ping `ping_id` of `codec`, made with `make` (its SendFrame and Pong) the first time; None past IDS."""
        if ping_id > self.IDS:
            return None
        made = self.made.get((codec, ping_id))
        if made is None:
            made = self.made[(codec, ping_id)] = MadePing(*make())
        return made
