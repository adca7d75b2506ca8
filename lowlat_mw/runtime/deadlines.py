"""A connection's timer: heartbeats, timeouts and stuck sends, from the loop's one scheduler.

:class:`Deadlines` is the part of :class:`~lowlat_mw.runtime.connection.ConnectionDriver` that the
:class:`~lowlat_mw.runtime.timers.AsyncScheduler` calls (:meth:`Deadlines.on_timer`, :meth:`Deadlines.on_watch`): it
ticks the machine (a Ping to send, a peer dead, the idle or handshake timeout), cancels a send blocked for
``slow_consumer_timeout``, and keeps the connection's one timer at its next deadline. No loop timer per frame or per
connection: one heap entry each, moved only when the deadline moves.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..protocol.base import SendFrame
from ..protocol.server import ServerProtocol

if TYPE_CHECKING:
    from .connection import ConnectionDriver

__all__ = ["Deadlines"]


class Deadlines:
    """The timer of one connection (a mixin of ConnectionDriver; its state is the driver's: ``_scheduled``,
    ``_answered``)."""

    __slots__ = ()

    def on_timer(self: ConnectionDriver, now: float) -> float:
        """Called by the scheduler when a deadline is due; returns the next one."""
        writer = self.writer
        writer.cancel_stuck(now, self.settings.slow_consumer_timeout)  # (its write then closes: 4003)
        proto = self.protocol
        actions = proto.tick(now)
        if actions:
            action = actions[0]
            made = proto.ping_made  # (the Ping's, if made once: a timer's one frame is a heartbeat's Ping)
            if len(actions) == 1 and type(action) is SendFrame and action.error is None and self._welcomed \
                    and writer.ping(action.data, proto.pong_frame, made if made is not None and made.send is action
                                    else None):
                # A heartbeat's Ping, written now by the corked writer (Writer.ping), its Pong awaited by the transport.
                if writer.expects and proto.pong_frame is not None and not writer.closing:
                    answered = self._await_pong(proto, now)
                    if answered is not None:
                        return answered
            else:
                rest = self._carry_out(actions)
                if rest is not None:  # a close (idle, dead peer) goes out in a task
                    self._spawn(rest)
        self._scheduled = self._next_deadline()
        return self._scheduled

    def _await_pong(self: ConnectionDriver, proto: ServerProtocol, now: float) -> float | None:
        """The transport knows the Pong (feed, _pong). Its timeout, if sooner than where the Pong will put this timer,
        is watched apart, and the timer goes there now (returned): the Pong moves nothing. None: the timeout comes
        first, the timer goes there."""
        hb = proto.heartbeat
        timeout = hb.last_ping_at + hb.timeout  # type: ignore[union-attr]
        proto.deadline_seen()  # (_next_deadline(True), written out: no send is under way)
        answered = proto.next_deadline(True)
        if timeout < answered:
            self.scheduler.watch(self, timeout, proto.pong_frame, now)
            self._scheduled = self._answered = answered
            return answered
        self._answered = math.nan
        return None

    def on_watch(self: ConnectionDriver, now: float, pong: object) -> None:
        """The timeout of the Pong that `pong` is (on_timer's watch): if it is still awaited, the timer is due now
        (unless the connection ended: its timer was cancelled, `_scheduled` is inf)."""
        if self.protocol.pong_frame is pong and self._scheduled != math.inf:
            self.scheduler.schedule(self, now)  # (the scheduler runs it right after this, in the same wake-up)

    def _next_deadline(self: ConnectionDriver, answered: bool = False) -> float:
        self.protocol.deadline_seen()
        return min(self.protocol.next_deadline(answered), self.writer.due(self.settings.slow_consumer_timeout))

    def reschedule(self: ConnectionDriver) -> None:
        """Move this connection's timer to its deadline, if that moved (earlier; or later, e.g. a Pong arrived:
        the scheduler then does not wake this connection at the Pong's timeout for nothing)."""
        when = self._next_deadline()
        if when != self._scheduled:
            self._scheduled = when
            self.scheduler.schedule(self, when)

    def watch_send(self: ConnectionDriver, since: float) -> None:
        """A send that may block began at `since` (Writer.write) and no deadline of the connection comes before
        1.5 x slow_consumer_timeout: the timer is armed for it. No loop timer per send (asyncio.timeout costs a
        TimerHandle each time): the connection's own timer checks it (Writer.cancel_stuck), so a stuck send is caught
        between 1x and 1.5x slow_consumer_timeout after it began."""
        self._scheduled = since + self.settings.slow_consumer_timeout
        self.scheduler.schedule(self, self._scheduled)
