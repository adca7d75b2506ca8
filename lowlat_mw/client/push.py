"""The client's push groups (protocol v1.1): joining and leaving them, and the pushes waiting to be read.
:class:`~lowlat_mw.client.aio.AsyncClient` is built on it."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..errors import ClientError, ErrorCode, StreamError
from ..protocol import events as ev
from .websocket import _keep_running

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection


class PushGroups:
    """The part of :class:`~lowlat_mw.client.aio.AsyncClient` that joins push groups and keeps their pushes until
    they are read (the connection joins them again on a new session: :mod:`lowlat_mw.client.reconnect`)."""

    def _init_pushes(self, max_pushes: int) -> None:
        """No group joined, no push waiting; keep at most `max_pushes` unread."""
        self.max_pushes = max_pushes  # pushes kept unread; past it the oldest is dropped (pushes_dropped)
        self.groups: set[str] = set()  # push groups joined: joined again on a connection of a new session
        self._subscribing: dict[int, asyncio.Future[ev.Subscribed]] = {}
        self._rejoining: dict[int, str] = {}  # Subscribes sent again on a new session, by id
        self._sub_ids = itertools.count(1)
        self._pushes: deque[ev.Push | BaseException] = deque()
        self._push_waiter: asyncio.Future[None] | None = None
        self.pushes_dropped = 0  # pushes dropped because max_pushes were waiting unread

    # ------------------------------------------------------------------ push (protocol v1.1)
    async def subscribe(self, group: str, timeout: float = 10.0) -> None:
        """Join push group `group`: once this returns, what the server publishes to ``group:<name>`` arrives in
        :meth:`pushes`. The client joins its groups again whenever it reconnects to a new session, and it
        reconnects on its own after a drop while it is in a group. StreamError if the server refuses
        (unauthorized: not in its ``push_groups``; bad_request), ClientError if it speaks protocol v1.0."""
        await self._membership(group, False, timeout)
        self.groups.add(group)
        self.protocol.listening = True

    async def unsubscribe(self, group: str, timeout: float = 10.0) -> None:
        """Leave push group `group` (not connected, with no session to resume: only forgotten, the next session
        is in no group)."""
        self.groups.discard(group)
        if self.connected or (self.protocol.can_resume and not self._user_closed):
            self.protocol.listening = bool(self.groups)
            await self._membership(group, True, timeout)

    async def _membership(self, group: str, leave: bool, timeout: float) -> None:
        """Send a Subscribe (or its leave) for `group` and wait for its answer; a refusal raises StreamError."""
        if not self.connected:
            await self.open()
        if not self.protocol.pushes:
            raise ClientError(f"the server at {self.url} speaks protocol v1.0: it has no push groups")
        sub_id = next(self._sub_ids) & 0xFFFFFFFF
        answer: asyncio.Future[ev.Subscribed] = asyncio.get_running_loop().create_future()
        self._subscribing[sub_id] = answer
        try:
            await self._send(self.protocol.subscribe(sub_id, group, leave=leave))
            async with asyncio.timeout(timeout):
                subscribed = await answer
        finally:
            self._subscribing.pop(sub_id, None)
        if subscribed.code is not ErrorCode.UNSPECIFIED:
            raise StreamError(subscribed.code, subscribed.message)

    def _pushed(self, item: ev.Push | BaseException) -> None:
        """Keep `item` (a push, or what ended the connection) for :meth:`next_push`, dropping the oldest past
        max_pushes."""
        pushes = self._pushes
        if type(item) is ev.Push and pushes and len(pushes) >= self.max_pushes:
            pushes.popleft()
            self.pushes_dropped += 1
        pushes.append(item)
        waiter = self._push_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_push(self, timeout: float | None = None) -> ev.Push:
        """The next push (its ``topic`` and ``body``: text or bytes), waiting up to `timeout` seconds (None: no
        limit; TimeoutError past it). Raises what ended the connection for good (ConnectionClosed,
        ReconnectFailed) once the pushes that came before are read."""
        async with asyncio.timeout(timeout):
            while not self._pushes:
                if self._push_waiter is not None:
                    raise ClientError("another task is already waiting for the next push")
                self._push_waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._push_waiter
                finally:
                    self._push_waiter = None
        item = self._pushes.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    async def pushes(self) -> AsyncIterator[ev.Push]:
        """Every push, as it arrives: ``async for push in client.pushes(): ...`` (ends with what ends the
        connection for good, see :meth:`next_push`)."""
        while True:
            yield await self.next_push()

    def _rejoin_groups(self, ws: ClientConnection) -> None:
        """Join every group again on the new connection `ws`: a new session is in none, a resumed one may have lost
        the last one joined (written to Redis 10 ms after it was answered); joining again changes nothing."""
        self._rejoining.clear()
        for group in sorted(self.groups):
            sub_id = next(self._sub_ids) & 0xFFFFFFFF
            self._rejoining[sub_id] = group
            _keep_running(self._io_tasks, self._send_quietly(ws, self.protocol.subscribe(sub_id, group)))
