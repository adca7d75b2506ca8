"""The end of a connection: the close it sends, the socket gone, and a server that never says it is gone.

:class:`Closing` is the part of :class:`~lowlat_mw.runtime.connection.ConnectionDriver` that ends a connection: the
close goes out through its writer after what was written before it, within ``close_timeout``; the session is kept
for a resume or ended by the close code; the connection is let go when the server reports the socket gone
(:meth:`Closing.disconnected`), or, on a server that cannot drop a peer that does not take the close, CLOSE_SLACK
seconds after ``close_timeout`` (:meth:`Closing._unreported`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING

from ..errors import CloseCode, close_code_reconnects
from ..observability.logs import CLIENT_LOGS
from . import push
from .streams import ModelRunner

if TYPE_CHECKING:
    from .connection import ConnectionDriver

__all__ = ["CANNOT_DROP", "CLOSE_SLACK", "Closing"]

log = logging.getLogger("lowlat_mw")

# Seconds past close_timeout that a server which does not drop unanswered closes gets to report the socket gone before
# the driver lets the connection go itself (Closing._unreported).
CLOSE_SLACK = 1.0
CANNOT_DROP = (
    "this server cannot drop a WebSocket whose peer does not take its close (uvicorn's own --ws protocols, gunicorn's "
    "UvicornWorker, hypercorn...): such connections are released %.1f s after their close, but their sockets stay "
    "open until the peer reads or goes. lowlat-mw's uvicorn shims (lowlat-mw serve, --ws "
    "lowlat_mw.servers.uvicorn:WebSocketProtocol), daphne runner and Flask bridge drop them (docs/security.md)")

# Close codes after which the session is kept for resume (the client will reconnect).
RESUMABLE = frozenset({None, 1001, 1005, 1006, 1011, 1012, 1013, 1014,
                       CloseCode.HEARTBEAT_TIMEOUT, CloseCode.DRAINING, CloseCode.SLOW_CONSUMER})


class Closing:
    """How one connection ends (a mixin of ConnectionDriver; its state is the driver's: ``_close_sent``, ``_gone``,
    ``_drops``, ``_unreported_at``)."""

    __slots__ = ()

    async def close(self: ConnectionDriver, code: int = CloseCode.GOING_AWAY, reason: str = "server shutdown") -> None:
        """Close the WebSocket from the server side with `code` (idempotent)."""
        await self._act(self.protocol.close(code, reason))

    async def close_socket(self: ConnectionDriver, code: int, reason: str, *, locked: bool = True) -> None:
        """Hand the server the close (`locked`: after the writes before it). It always goes, within close_timeout:
        a write blocked on a peer that does not read is not waited for past it (the close goes behind what the
        transport holds), and the server then drops a connection its peer does not close within close_timeout
        (docs/protocol.md 12). The socket counts as open until the server says it is gone (:meth:`disconnected`)."""
        self.writer.closing = True
        self.scheduler.cancel(self)
        self._scheduled = math.inf
        if self._close_sent:
            return
        self._close_sent = True
        log.debug("closing connection %s: %s %s", self.protocol.session_id, code, reason,
                  extra={"session_id": self.protocol.session_id, "close_code": code})
        # A plain int: servers may check type(code) is int (daphne/autobahn refuse an IntEnum).
        message = {"type": "websocket.close", "code": int(code), "reason": reason}
        timeout = self.settings.close_timeout
        try:
            await self.writer.close(message, timeout, locked)
        except Exception as exc:
            log.debug("close failed: %r", exc)
        runner = self.runner
        if runner is not None and runner.driver is self:
            if not close_code_reconnects(code) or not self.protocol.resumable:
                # A final close (protocol error, idle...), or a dialect without resume: stop the models now.
                runner.destroy()
            elif code in RESUMABLE:
                # The client will resume: the session waits for it from now on, as once the socket is gone (which
                # may take close_timeout), its models paused when the replay buffer is full.
                runner.detach(self.monotonic())
        if not self._drops and not self._gone:  # a server that may never say the socket is gone
            self._unreported_at = self.loop.call_later(timeout + CLOSE_SLACK, self._unreported)

    def _unreported(self: ConnectionDriver) -> None:
        """close_timeout and CLOSE_SLACK after our close, a server that does not drop unanswered closes has not
        reported the socket gone: for a peer that stopped reading it never will (plain uvicorn's close waits behind
        the paused transport). The connection is let go here (its place in the limits, its session: as if the socket
        had dropped, 1006) and the task reading its ``receive`` ends; the socket is the server's."""
        self._unreported_at = None
        if self._gone:
            return
        CLIENT_LOGS.once(log, logging.WARNING, CANNOT_DROP, self.settings.close_timeout + CLOSE_SLACK)
        log.debug("connection %s: no disconnect %.1f s after its close, released", self.protocol.session_id,
                  self.settings.close_timeout + CLOSE_SLACK, extra={"session_id": self.protocol.session_id})
        self._spawn(self._let_go())

    async def _let_go(self: ConnectionDriver) -> None:
        await self.disconnected(1006)
        receiving, self.receiving = self.receiving, None
        if receiving is not None and not receiving.done():
            receiving.cancel()  # (LowLatASGI.serve takes it, `receiving` cleared, as the end of the connection)

    async def disconnected(self: ConnectionDriver, code: int | None = None) -> None:
        """The socket is gone (`code`: the peer's close code, if any): keep or end the session."""
        if self._gone:
            return
        self._gone = True
        self.writer.gone()
        if self._unreported_at is not None:
            self._unreported_at.cancel()
            self._unreported_at = None
        proto = self.protocol
        by = "server" if proto.close_code is not None else "client"
        final = proto.close_code if proto.close_code is not None else (code or 1006)
        log.info("connection %s closed by %s: %s %s", proto.session_id, by, final, proto.close_reason,
                 extra={"session_id": proto.session_id, "close_code": final, "closed_by": by,
                        "client": self.info.client})
        if self._handshake_span is not None:  # never got past Hello: the handshake failed with this close
            self._end_handshake(final)
        if self.metrics is not None:
            self.metrics.connection_closed(proto.stats, final, by)
        self.endpoint.connection_ended(self)
        sessions = push.HUB.sessions
        if sessions.get(proto.session_id) is self:
            del sessions[proto.session_id]
        if self.member:
            push.HUB.discard(self)
        proto.connection_lost()
        self.scheduler.cancel(self)
        self._scheduled = math.inf
        await self._keep_or_end(code)

    async def _keep_or_end(self: ConnectionDriver, code: int | None) -> None:
        """After the socket is gone: the session waits for a resume (`code` resumable) or ends with its models."""
        proto = self.protocol
        runner = self.runner
        if proto.close_code is not None:
            code = proto.close_code  # we closed: our reason decides
        resumable = code in RESUMABLE and close_code_reconnects(code) and proto.resumable  # (a dialect may have none)
        if runner is None and resumable and self._welcomed and not self._superseded \
                and proto.session is not None and self.endpoint.store.get(proto.session_id) is None:
            # A drop before any stream: the client may have sent a Request the drop lost. The session waits a
            # little (Session.EMPTY_WINDOW), so its resume is told to send it again rather than "expired".
            runner = self.runner = ModelRunner(proto.session, self)
        if runner is None or runner.driver is not self:
            return
        if resumable:
            runner.detach(self.monotonic())
        else:
            runner.destroy()
            if runner.tasks:
                await runner.wait_closed()

    async def drain(self: ConnectionDriver, grace: float | None = None, reconnect_after_ms: int = 0) -> None:
        """GoAway, let running streams finish for up to `grace` seconds (default: the ``drain_grace``
        setting), then close with 4002."""
        await self._act(self.protocol.drain(reconnect_after_ms))
        deadline = self.monotonic() + (self.settings.drain_grace if grace is None else grace)
        runner = self.runner
        shared = runner.shared if runner is not None else None
        if runner is not None and shared is not None and not shared.down and runner.models_running() \
                and self.protocol.resumable:
            # Shared sessions: the client moves to another process now and resumes there, which relays these
            # streams from the shared store while they go on here, detached, until they end or the grace is over.
            await self.close(CloseCode.DRAINING, "server shutting down")
            while runner.models_running() and self.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if runner.driver is None:  # (unless a resume took it here meanwhile)
                runner.destroy()  # what is still running ends in the store too, for its follower
            await shared.flushed()
            return
        # Wait on the model tasks, not the session's running count: a task ends only after its
        # End/Error went out, so the 4002 close never overtakes a stream's last message.
        while self.runner is not None and self.runner.tasks and self.monotonic() < deadline:
            if self.protocol.closed:
                return
            await asyncio.sleep(0.05)
        await self.close(CloseCode.DRAINING, "server shutting down")
