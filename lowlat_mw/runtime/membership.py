"""A connection as a target of pushes (v1.1): reachable by its session, user and groups; pushes written in order.

:class:`PushTarget` is the part of :class:`~lowlat_mw.runtime.connection.ConnectionDriver` that the push hub
(:data:`~lowlat_mw.runtime.push.HUB`) and the machine's Membership actions talk to: its place in the hub's index,
the pushes that reach it (bounded while they wait for the connection's output), and joining or leaving groups.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from ..protocol.server import Membership
from . import push
from .push import principal_name
from .shared import shared_sessions
from .streams import ModelRunner

if TYPE_CHECKING:
    from .connection import ConnectionDriver

__all__ = ["PUSH_BACKLOG", "PUSH_LISTEN_WAIT", "PushTarget"]

PUSH_BACKLOG = 4 * 1024 * 1024  # bytes of pushes a connection may have waiting for its output; more are skipped
PUSH_LISTEN_WAIT = 5.0  # seconds a Subscribe's answer waits for this process to listen to the shared push channel


class PushTarget:
    """Pushes and push groups of one connection (a mixin of ConnectionDriver; its state is the driver's:
    ``member``, ``_push_backlog``)."""

    __slots__ = ()

    @property
    def reachable(self: ConnectionDriver) -> bool:
        """Whether pushes may reach this connection: open, and its session not moved to another one."""
        return not self._gone and not self._superseded

    def _reachable(self: ConnectionDriver) -> None:
        """The Welcome went out: pushes to who authenticated and to the session's groups reach this connection."""
        name = principal_name(self.protocol.principal)
        keys = [f"group:{group}" for group in self.protocol.session.groups]  # type: ignore[union-attr]
        if name is not None:
            keys.append(f"user:{name}")
        push.HUB.add(self, keys)

    def _member_now(self: ConnectionDriver) -> bool:
        """Whether a Membership can be carried out without waiting: no shared store, or its listener is on (or
        failing: Redis is down, and waiting would not bring it back)."""
        if not self.settings.shares_sessions:
            return True
        listener = push.HUB.listen(self.settings.session_store)
        return listener.ready.is_set() or listener.failing

    def _join_now(self: ConnectionDriver, change: Membership) -> bool:
        """The action table's Membership, if it needs no waiting (:meth:`_member_now`)."""
        if not self._member_now():
            return False
        self._membership(change)
        return True

    async def _join_later(self: ConnectionDriver, change: Membership) -> None:
        """The action table's Membership, once this process listens to the shared push channel (PUSH_LISTEN_WAIT at
        most), so that the Subscribed answer that follows means: pushes published from now on reach the connection."""
        waited = 0.0
        while not self._member_now() and waited < PUSH_LISTEN_WAIT:
            await asyncio.sleep(0.01)
            waited += 0.01
        self._membership(change)

    def _membership(self: ConnectionDriver, change: Membership) -> None:
        """The session joined or left a push group: index this connection as the session is now (a later change may
        have overtaken this one); keep a session in groups for a resume, as one with streams; tell the store."""
        session = self.protocol.session
        if session is None or self._superseded:
            return
        key = (f"group:{change.group}",)
        if change.group in session.groups:
            push.HUB.add(self, key)
            if self.runner is None:  # (what keeps a session for a resume, here and in Redis: docs/push.md)
                self.runner = ModelRunner(session, self)
        else:
            push.HUB.discard(self, key)
        shared = shared_sessions(self.endpoint)
        if shared is not None:
            shared.groups_changed(session)

    def push(self: ConnectionDriver, topic: str, body: str | bytes) -> None:
        """A push published to `topic` reached this connection (on its loop): send it, if it can go now."""
        writer = self.writer
        frame = None if writer.closing or self._superseded else self.protocol.push(topic, body)
        size = 0
        if frame is not None:
            data = frame.data
            size = len(data) if type(data) is bytes or data.isascii() else len(data.encode("utf-8", "surrogatepass"))
            if size > self.settings.max_frame_size:  # (JSON's base64 or escapes): a client may not take more
                frame = None
            elif self._push_backlog and self._push_backlog + size > PUSH_BACKLOG:  # a slow client: at most once
                frame = None
        if self.metrics is not None:
            self.metrics.inc("pushes", "sent" if frame is not None else "skipped")
        if frame is None:
            return
        if self._push_backlog:
            write: Awaitable[None] | None = writer.write([frame.data])
        else:  # nothing before it waits: out with this loop turn's other frames, if the writer takes it now
            write = writer.take([frame.data])
            if write is None:
                return
        self._push_backlog += size  # (a task per push, started in arrival order: pushes go out in the order they came)
        self._spawn(self._push_later(write, size))

    async def _push_later(self: ConnectionDriver, write: Awaitable[None], size: int) -> None:
        try:
            await write
        finally:
            self._push_backlog -= size

    def join_group(self: ConnectionDriver, group: str, joined: bool) -> None:
        """The server put this connection's session in push group `group` (or took it out): ``lowlat_mw.join``."""
        if self.writer.closing or self._superseded:
            return
        actions = self.protocol.join(group, joined, self.monotonic())
        if actions:
            self._spawn(self._act(actions))
        if self.protocol.deadline_moved:
            self.reschedule()
