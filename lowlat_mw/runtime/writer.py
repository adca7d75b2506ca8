"""What a connection writes through: :class:`Writer` (ASGI ``send``) or :class:`CorkedWriter` (a direct transport).

The driver (:class:`~lowlat_mw.runtime.connection.ConnectionDriver`) makes frames and hands them to its writer; it
does not know which one it has. Speed comes from choosing the writer, never from a branch in the driver.

Invariant, for both: frames leave in the order they were made (one write at a time holds the connection's output,
later ones wait in arrival order); nothing leaves after the close. The corked writer also writes a loop turn's
frames in one ``write``: a turn's first output at once, what follows in the same turn when the turn ends (or at once
past CORK_LIMIT bytes); while the transport's flow control holds writes, frames wait (in order) until it takes them.

A send that stays blocked for ``slow_consumer_timeout`` is cancelled by the connection's timer (:meth:`Writer.due`,
:meth:`Writer.cancel_stuck`), and the connection closes with 4003.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from ..errors import CloseCode
from ..observability.logs import CLIENT_LOGS
from ..protocol.heartbeat import MadePing
from .direct import CORK_LIMIT, DirectTransport, Expected, expected, frame_header, framed

if TYPE_CHECKING:
    from .connection import ConnectionDriver

__all__ = ["CorkedWriter", "Turns", "Writer"]

log = logging.getLogger("lowlat_mw")

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Writer:
    """Writes a connection's frames as ASGI ``websocket.send`` messages, one at a time (the server's WebSocket
    protocol frames them). Also the base of :class:`CorkedWriter`: the output gate (one write at a time, the rest in
    arrival order, as an asyncio.Lock would, without one), the slow-consumer watch and the close."""

    __slots__ = ("closing", "conn", "late", "loop", "send", "send_since", "sender", "stuck", "waiters", "writing")

    turns: Turns | None = None  # (only a corked writer holds frames for the end of a loop turn)
    expects = False  # (only a transport with direct reads awaits a heartbeat's Pong by its bytes)

    def __init__(self, conn: ConnectionDriver, send: Send, loop: asyncio.AbstractEventLoop) -> None:
        self.conn: ConnectionDriver | None = conn  # (None once the socket is gone: no cycle keeps a closed one)
        self.loop = loop
        self.send = send  # the ASGI send: the close goes through it on every writer
        self.closing = False  # no frame may go out any more (a close was handed over, or the transport is going)
        self.writing = False  # a write holds the output
        self.waiters: deque[asyncio.Future[None]] | None = None  # writes waiting for it, in order (made on demand)
        # The send in progress (the task holding the output) and when it began: the connection's timer cancels it
        # once it stays blocked for slow_consumer_timeout (due, cancel_stuck), without a loop timer per frame.
        self.sender: asyncio.Task[Any] | None = None
        self.send_since = math.inf
        self.stuck: asyncio.Task[Any] | None = None  # the sender cancelled for it
        self.late = 1.5 * conn.settings.slow_consumer_timeout  # a send the connection's timer must come back for

    # ------------------------------------------------------------------ writes
    async def write(self, frames: list[bytes | str]) -> None:
        """Write `frames` in one go, after the writes before it (a no-op once closing)."""
        if self.closing:
            return
        try:
            if self.writing or self.waiters:  # another write holds the output: wait for it, in order
                await self.acquire()
            else:
                self.writing = True
            try:
                if self.closing:  # closed while this waited
                    return
                self.sender = asyncio.current_task(self.loop)
                conn: Any = self.conn
                self.send_since = since = conn.monotonic()
                if conn._scheduled > since + self.late:  # (no deadline of the connection's comes before it is stuck)
                    conn.watch_send(since)
                await self._out(frames)
            finally:
                self.sender = None
                self.writing = False  # (release, written out: the one call per ASGI send it would add)
                if self.waiters:
                    self._wake_next()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task is not self.stuck:
                raise
            self.stuck = None
            if task.uncancel() > 0:  # also cancelled for another reason
                raise
            await self._stuck()
        except Exception as exc:  # the socket went away under us
            log.debug("send failed, treating as disconnect: %r", exc)
            self.closing = True

    take: Callable[[Writer, list[bytes | str]], Awaitable[None] | None] = write  # type: ignore[assignment]
    """``take(frames)``: take `frames` for writing, in order after what was taken before. None if they were written,
    held or (closing) dropped now, without waiting; else the write to await. Through ASGI every send is awaited: it
    is :meth:`write` itself (no call in between, once per Delta)."""

    def _out(self, frames: list[bytes | str]) -> Awaitable[None]:
        """Send `frames` (the output is held): the one send to await, for one frame (the most often, a Delta)."""
        if len(frames) == 1:
            data = frames[0]
            if type(data) is bytes:
                return self.send({"type": "websocket.send", "bytes": data})
            return self.send({"type": "websocket.send", "text": data})
        return self._send_all(frames)

    async def _send_all(self, frames: list[bytes | str]) -> None:
        send = self.send
        for data in frames:
            if type(data) is bytes:
                await send({"type": "websocket.send", "bytes": data})
            else:
                await send({"type": "websocket.send", "text": data})

    def flush(self) -> None:
        """Write out what is held for the end of the loop turn (nothing through ASGI)."""

    def ping(self, ping: bytes | str, pong: bytes | str | None, made: MadePing | None) -> bool:
        """Write a heartbeat's Ping now if nothing of the connection waits or is held (True); False: it goes as any
        frame. Through ASGI it always goes as any frame. (`pong`: its answer; `made`: the Ping, if made once.)"""
        return False

    def gone(self) -> None:
        """The socket is gone: nothing more goes out, what is held is dropped, the connection is let go."""
        self.closing = True
        self.conn = None

    def first_delta(self) -> bool:
        """Fair pacing (docs/architecture.md): a stream's first Delta went out. True when another stream's went out in
        this loop turn too (a burst of Requests): the model's next step then waits for the next turn, after the other
        Requests read in this one. (Counted only in a turn that wrote: its end-of-turn callback resets the count.)"""
        turns = self.turns
        if turns is not None and turns.scheduled:
            turns.started += 1
            return turns.started > 1
        return False

    # ------------------------------------------------------------------ the output gate
    async def acquire(self) -> None:
        """Wait until no other write holds the output, then hold it (in arrival order; :meth:`release`)."""
        if not self.writing and not self.waiters:
            self.writing = True
            return
        waiters = self.waiters
        if waiters is None:
            waiters = self.waiters = deque()
        fut = self.loop.create_future()
        waiters.append(fut)
        try:
            try:
                await fut
            finally:
                waiters.remove(fut)
        except asyncio.CancelledError:
            if not self.writing:  # woken, then cancelled: the next in line goes
                self._wake_next()
            raise
        self.writing = True

    def release(self) -> None:
        self.writing = False
        if self.waiters:
            self._wake_next()

    def _wake_next(self) -> None:
        waiters = self.waiters
        if waiters:
            fut = waiters[0]
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ slow consumers and the close
    def due(self, timeout: float) -> float:
        """When the send in progress counts as stuck (inf: none is, or it was cancelled already)."""
        return self.send_since + timeout if self.sender is not None and self.stuck is None else math.inf

    def cancel_stuck(self, now: float, timeout: float) -> None:
        """Cancel the send in progress if it has been blocked for `timeout` seconds (:meth:`write` then closes)."""
        sender = self.sender
        if sender is not None and self.stuck is None and now >= self.send_since + timeout:
            self.stuck = sender
            sender.cancel()

    async def _stuck(self) -> None:
        conn = self.conn
        if conn is None:  # gone meanwhile
            return
        CLIENT_LOGS.log(log, logging.WARNING, conn.address, "send blocked for %g s: closing slow consumer %s",
                        conn.settings.slow_consumer_timeout, conn.info.client,
                        extra={"session_id": conn.protocol.session_id, "client": conn.info.client})
        conn.protocol.close(CloseCode.SLOW_CONSUMER, "send blocked")
        # (Not disconnected yet: the socket is there until the server closes or aborts it, close_timeout at most,
        # and it counts against the connection limits until the server says it is gone.)
        await conn.close_socket(CloseCode.SLOW_CONSUMER, "send blocked", locked=False)

    async def close(self, message: MutableMapping[str, Any], timeout: float, locked: bool) -> None:
        """Hand the server the close `message` (`locked`: after the writes before it), within `timeout`: a write
        blocked on a peer that does not read is not waited for past it (the close goes behind what the transport
        holds)."""
        self.closing = True
        if locked:
            try:
                async with asyncio.timeout(timeout):
                    await self.acquire()
            except TimeoutError:  # the write holding the output is stuck: the close goes without it
                locked = False
                log.debug("output blocked for %.1f s, closing without it", timeout)
        try:
            self.flush()  # what was sent before the close goes out before it
            async with asyncio.timeout(timeout):
                await self.send(message)
        finally:
            if locked:
                self.release()


class Turns:
    """Loop turns of one event loop, told apart for every corked writer with one callback per turn.

    A writer writes its first output of a turn at once and holds what follows for one write at
    the end of the turn. `turn` counts the end-of-turn callbacks (:meth:`end`) run so far: a writer
    whose last write was in an earlier `turn` writes at once. The first write of a turn (any
    connection's) schedules the callback, which writes out every writer in `held`. One handle per turn for all
    connections, not one per connection and turn: with many streams each sending a token per turn,
    those handles were a third of the objects the garbage collector saw per Delta.
    """

    __slots__ = ("__weakref__", "held", "scheduled", "started", "turn")
    by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turns] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.turn = 0
        self.scheduled = False
        self.held: list[CorkedWriter] = []  # writers holding frames
        # Streams whose first Delta went out in this turn: from the second on, a stream's model takes its next step
        # in the next turn, so a burst of Requests read in one turn gets all its first Deltas out first.
        self.started = 0

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> Turns:
        """The turns of `loop` (created on first use)."""
        turns = cls.by_loop.get(loop)
        if turns is None:
            turns = cls.by_loop[loop] = cls()
        return turns

    def end(self) -> None:
        """The turn's end (scheduled with ``call_soon`` by its first write, which sets `scheduled`)."""
        self.scheduled = False
        self.turn += 1
        self.started = 0
        held = self.held
        if held:
            self.held = []
            for writer in held:
                writer.flush()


class CorkedWriter(Writer):
    """Writes a connection's frames straight to the server's :class:`~lowlat_mw.runtime.direct.DirectTransport`,
    framed here, a loop turn's frames in one write (:class:`~lowlat_mw.runtime.direct.Turns`); the close still goes
    through ASGI ``send``, after what is held, so the server's WebSocket state machine sees it."""

    __slots__ = ("corked", "direct", "expects", "held", "turn", "turns")

    def __init__(self, conn: ConnectionDriver, send: Send, direct: DirectTransport, loop: asyncio.AbstractEventLoop,
                 expects: bool = False) -> None:
        super().__init__(conn, send, loop)
        self.direct = direct
        self.turns = Turns.of(loop)
        self.turn = -1  # the loop turn (Turns.turn) of this connection's last write
        self.held: list[bytes] = []  # frames (header, payload, ...) held for one write at the end of the loop turn
        self.corked = 0
        self.expects = expects  # (DirectReads.expect: the heartbeat's Pong awaited)

    def take(self, frames: list[bytes | str]) -> Awaitable[None] | None:
        """Held at once (None) unless another write holds the output or the transport's flow control holds writes."""
        if self.writing or self.waiters or not self.direct.is_writable():
            return self.write(frames)
        if not self.closing:
            self.hold(frames)
        return None

    async def write(self, frames: list[bytes | str]) -> None:
        if not self.writing and not self.waiters and self.direct.is_writable():  # (taken at once: no send to watch)
            if not self.closing:
                self.hold(frames)
            return
        await super().write(frames)

    async def _out(self, frames: list[bytes | str]) -> None:  # type: ignore[override]
        direct = self.direct  # held back by the transport's flow control
        while not direct.is_writable() and not direct.is_closing():
            await direct.wait_writable()
        self.hold(frames)

    def hold(self, frames: list[bytes | str]) -> None:
        """Frame `frames` for the transport. The first output of a loop turn is written at once (a reply's first
        frame waits for nothing); what follows in the same turn is held and written in one piece when the turn ends
        (at once past CORK_LIMIT bytes; see Turns). Nothing for a closing transport."""
        direct = self.direct
        if direct.closing:
            self.closing = True
            return
        turns: Turns = self.turns  # type: ignore[assignment]
        cork = self.held
        first = self.turn != turns.turn and not cork
        if first:  # the first output of this turn: written at once
            self.turn = turns.turn
            if not turns.scheduled:  # the turn ends when the loop has run what is ready now
                turns.scheduled = True
                self.loop.call_soon(turns.end)
            if len(frames) == 1:  # (most often a single Delta)
                data = frames[0]
                text = type(data) is not bytes
                if text:
                    data = data.encode()  # type: ignore[union-attr]
                try:
                    direct.write(frame_header(data, text) + data)  # type: ignore[arg-type,operator]
                except RuntimeError:  # the transport closed under us (see DirectTransport.closing)
                    self.closing = True
                return
        elif not cork:  # held until the turn ends
            turns.held.append(self)
        size = self.corked
        for data in frames:
            if type(data) is bytes:
                cork.append(frame_header(data, False))
            else:
                data = data.encode()  # type: ignore[union-attr]
                cork.append(frame_header(data, True))  # type: ignore[arg-type]
            cork.append(data)  # type: ignore[arg-type]
            size += len(data)
        self.corked = size
        if first or size >= CORK_LIMIT:
            self.flush()

    def flush(self) -> None:
        """Write what :meth:`hold` holds now (at the end of the turn, or before the close, so the order holds)."""
        cork = self.held
        if not cork:
            return
        self.held = []
        self.corked = 0
        direct = self.direct
        if direct.closing:
            self.closing = True
            return
        try:
            direct.write(b"".join(cork))
        except RuntimeError:  # the transport closed under us (see DirectTransport.closing)
            self.closing = True

    def ping(self, ping: bytes | str, pong: bytes | str | None, made: MadePing | None) -> bool:
        """The Ping written now (nothing of this connection is held, so the order holds), its frame made once with the
        Ping (`made`, shared by the loop's connections: HeartbeatFrames), and its Pong awaited by the transport."""
        direct = self.direct
        if self.held or self.writing or self.closing or direct.closing or not direct.is_writable():
            return False
        wire: tuple[bytes, Expected | None] | None = made.wire if made is not None else None  # type: ignore[assignment]
        if wire is None:
            wire = (framed(ping), expected(pong) if pong is not None else None)
            if made is not None:
                made.wire = wire
        if self.expects:
            direct.expect = wire[1]  # type: ignore[attr-defined]
        try:
            direct.write(wire[0])
        except RuntimeError:  # the transport closed under us (see DirectTransport.closing)
            self.closing = True
        return True

    def gone(self) -> None:
        super().gone()
        self.held = []  # (if it is in Turns.held, the end of the turn finds nothing to write)
