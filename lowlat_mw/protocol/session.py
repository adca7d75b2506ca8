"""Sans-IO session state: streams, replay buffers and flow control that outlive one WebSocket.

A session starts with a Hello and survives a dropped connection for ``resume_window`` seconds.
Every Delta sent is kept in its stream's replay buffer until the client acknowledges it (Ack),
so a client that reconnects with its resume token and the last seq it saw per stream gets
exactly what it missed, once, in order (docs/protocol.md, "Resume").

Memory is bounded twice: clients that send Acks get a flow-control window (the driver pauses the
model while ``blocked``); for clients that don't, the oldest buffered Deltas are dropped past
``resume_buffer_size``, and resuming below that point fails with ``resume_failed``.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Mapping
from typing import Any, Protocol

from ..errors import ErrorCode, LocalProtocolError
from ..settings import Settings
from . import events as ev
from .context import SessionContext
from .resume import SessionResume
from .stream import DELTA_OVERHEAD, StreamState, encoded_len

__all__ = ["DELTA_OVERHEAD", "ChunkTypeError", "MemorySessionStore", "Session", "SessionStore", "StreamState",
           "encoded_len", "normalize_chunk", "split_chunk"]

_NOTHING_FOLLOWED: frozenset[int] = frozenset()
MAX_FINISHED = 64    # finished streams remembered per session for resume, newest kept


class Session(SessionResume):
    """Streams of one client session; attached to at most one connection at a time."""

    def __init__(self, settings: Settings, *, now: float, session_id: str, secret: str) -> None:
        """`session_id` and `secret` make the resume token (the driver draws them: this module draws nothing)."""
        self.settings = settings
        self.session_id = session_id
        self.resume_token = f"{session_id}.{secret}"  # what a client presents (in Hello) to resume this session
        self.streams: dict[int, StreamState] = {}
        self.active = 0  # running streams, those without a terminal (asked on every timer tick: counted, not scanned)
        self.buffered = 0
        self.flow_window = 0
        self.pause_at = math.inf  # models pause while `buffered` is at least this (see `blocked`)
        self.attached = True
        self.detached_at: float | None = None
        self.window = settings.resume_window  # how long it waits for a resume once detached (see detach)
        self.created_at = now
        self._awaited: set[int] = set()  # listed by the last resume but unknown here: the client resends them
        self.principal: object | None = None  # who authenticated when the session began
        self._finished: list[int] = []  # (a list: an empty deque is a 64-slot block, ~600 B per connection)
        # What the buffer limit drops from, each in its drop order, so a drop never scans the session:
        # finished streams holding Deltas (finish order), then running ones (in the order they began holding).
        self._spill: dict[int, StreamState] = {}
        self._holders: dict[int, StreamState] = {}
        # Shared sessions (a session store across processes): what this session produced since the driver last
        # took it, oldest first, three items per record, flat (no tuple per Delta for the collector to track):
        # stream_id, 0, None for a stream that started; stream_id, seq, piece per Delta; stream_id, -1, End or
        # Error for its end. None: not shared. Streams in `followed` are another process's, relayed here: they
        # are not recorded again.
        self.journal: list[Any] | None = None
        self.followed: set[int] | frozenset[int] = _NOTHING_FOLLOWED  # (a set of its own once there is one)
        self.groups: frozenset[str] = frozenset()  # push groups the session is in (protocol v1.1; replaced on change)
        self.revision = 0  # the protocol revision of the client it was last welcomed to (Hello.revision)
        self.context: SessionContext | None = None  # context documents and kept turns (protocol v1.3), once used
        self.keeps_turns = False  # the client asked (Hello.history) and history_size allows it

    # ------------------------------------------------------------------ identity

    def contexts(self) -> SessionContext:
        """The session's context documents and kept turns (protocol v1.3), made on first use."""
        if self.context is None:
            self.context = SessionContext(self.settings)
        return self.context

    def token_matches(self, token: str) -> bool:
        """Constant-time check of a presented resume token."""
        return hmac.compare_digest(token.encode(), self.resume_token.encode())

    @staticmethod
    def session_id_of(token: str) -> str:
        """The session id part of a resume token ("" if malformed)."""
        sid, dot, _ = token.partition(".")
        return sid if dot else ""

    def belongs_to(self, principal: object | None) -> None:
        """The session is `principal`'s (who authenticated when it began): only they may resume it."""
        self.principal = principal

    def join(self, group: str, joined: bool) -> bool:
        """Put the session in push group `group` (`joined` false: take it out); False if that changed nothing."""
        groups = self.groups
        if (group in groups) == joined:
            return False
        self.groups = groups | {group} if joined else groups - {group}
        return True

    def rejoin(self, groups: frozenset[str]) -> None:
        """The push groups it was in, as a shared store kept them (a resume in another process)."""
        self.groups = groups

    # ------------------------------------------------------------------ journal (shared sessions)
    def take_journal(self) -> list[Any] | None:
        """What the session produced since the store last took it (see `journal`); journaling goes on afresh."""
        journal = self.journal
        if journal:
            self.journal = []
        return journal

    def shrink_journal(self, kept: list[Any]) -> None:
        """The store fell behind: what waits to be written becomes `kept` (its starts and ends: a gap, bounded)."""
        if self.journal is not None:
            self.journal = kept

    def requeue_journal(self, kept: list[Any]) -> None:
        """A write failed: `kept` (records it held) goes back before what the session produced since."""
        if self.journal is not None:
            self.journal[:0] = kept

    # ------------------------------------------------------------------ flow control
    def set_client_window(self, window: int) -> int:
        """Grant a flow-control window for a client that sends Acks (0: no Acks); returns it."""
        settings = self.settings
        self.flow_window = flow = min(window, settings.flow_window, settings.resume_buffer_size) if window else 0
        self._update_pause()
        return flow

    def _update_pause(self) -> None:
        if not self.attached and self.journal is not None:
            # Shared and detached: the output goes to the shared store, and the client may resume on another
            # process, which applies its flow window there (its Acks never come here): the models go on.
            self.pause_at = math.inf
        elif self.flow_window:
            self.pause_at = self.flow_window
        else:
            self.pause_at = math.inf if self.attached else self.settings.resume_buffer_size

    def start_journal(self) -> None:
        """Journal this session from now on (a shared session store takes what it produces; see `journal`)."""
        if self.journal is None:
            self.journal = []
            self._update_pause()

    @property
    def blocked(self) -> bool:
        """True while models must pause.

        For a client that sends Acks: its window of unacknowledged output is full. While no
        connection is attached: the replay buffer is full (pausing beats dropping what the
        client will ask for when it resumes).
        """
        return self.buffered >= self.pause_at

    @property
    def running(self) -> dict[int, StreamState]:
        """Streams whose model is still producing."""
        return {sid: st for sid, st in self.streams.items() if st.terminal is None}

    def running_count(self) -> int:
        """How many streams are running (the ``active`` count)."""
        return self.active

    # ------------------------------------------------------------------ streams
    def start(self, req: ev.Request, now: float) -> ev.Error | None:
        """Register stream `req.stream_id`; an Error when it cannot start."""
        sid = req.stream_id
        existing = self.streams.get(sid)
        if existing is not None and existing.running:
            # On stream 0: an Error on `sid` would mean "stream sid ended", and it has not.
            return ev.Error(stream_id=0, code=ErrorCode.STREAM_ID_IN_USE, message=f"stream {sid} is already running")
        if self.active >= self.settings.max_streams:
            return ev.Error(stream_id=sid, code=ErrorCode.TOO_MANY_STREAMS, retryable=True,
                            message=f"at most {self.settings.max_streams} concurrent streams per connection")
        if existing is not None:
            self._forget(sid)
        self._awaited.discard(sid)
        st = self.streams[sid] = StreamState(stream_id=sid, started_at=now)
        if self.keeps_turns and not req.warmup:  # (protocol v1.3) its turn is kept when it ends
            st.turn, st.asked = [], req
        self.active += 1
        if self.journal is not None:
            if sid in self.followed:
                self.followed.discard(sid)  # type: ignore[union-attr]
            self.journal += (sid, 0, None)
        return None

    def record(self, stream_id: int, piece: str | bytes, now: float) -> int | None:
        """Number and buffer one piece of output (already sized to fit a frame): its seq (None: not running)."""
        st = self.streams.get(stream_id)
        if st is None or st.terminal is not None:
            return None
        return self.record_in(st, stream_id, piece, encoded_len(piece), now)

    def record_in(self, st: StreamState, stream_id: int, piece: str | bytes, n: int, now: float) -> int:
        """:meth:`record` for a caller that holds `st`, running, and knows `piece`'s size in bytes `n` (a
        Delta's send path: no second lookup of the stream or of the piece's size)."""
        if st.first_chunk_at is None:
            st.first_chunk_at = now
        seq = st.seq = st.seq + 1
        st.out_bytes += n
        cost = n + DELTA_OVERHEAD
        if not st.pieces:
            self._holders[stream_id] = st
        st.pieces.append(piece)
        st.costs.append(cost)
        if st.turn is not None:
            st.turn.append(piece)
            st.turn_bytes += n
            if st.turn_bytes > self.settings.history_size:  # too big to keep as a turn: stop holding it now
                st.turn = None
        buffered = self.buffered = self.buffered + cost
        # Over the replay buffer: drop the oldest, unless this Delta is the one that fills a client's flow window
        # (a window as big as the buffer would otherwise never fill, and the models never pause): the window
        # pauses the models now, so the buffer passes its size by this one Delta at most, as the window does.
        if buffered > self.settings.resume_buffer_size and not (
                self.flow_window and buffered - cost < self.pause_at <= buffered):
            self._enforce_buffer_limit(st)
        journal = self.journal
        if journal is not None and stream_id not in self.followed:
            journal.append(stream_id)
            journal.append(seq)
            journal.append(piece)
        return seq

    def keep(self, stream_id: int, chunk: object, now: float) -> None:
        """A model's chunk while no connection is attached: record it for the resume, in pieces that
        each fit a frame (as a live connection would have sent them)."""
        if stream_id in self.streams:
            chunk = normalize_chunk(chunk)
            if type(chunk) is ev.ToolCall:  # (v1.3) one Delta, never split
                self.record(stream_id, tool_call_for(self, stream_id, chunk), now)
                return
            for piece in split_chunk(chunk, self.settings.max_frame_size - 32):
                self.record(stream_id, piece, now)

    def buffered_deltas(self, stream_id: int) -> list[ev.Delta]:
        """The Deltas of `stream_id` kept for a resume, oldest first."""
        st = self.streams.get(stream_id)
        return [ev.Delta.of(stream_id, seq, chunk) for seq, chunk, _ in st.buffer] if st is not None else []

    def _enforce_buffer_limit(self, current: StreamState) -> None:
        """Drop the oldest Deltas until the buffer fits: finished streams' first (oldest stream first), then
        other running streams', then `current`'s. O(1) per Delta dropped: only streams holding Deltas are
        visited, from the two drop-order maps, and a stream leaves its map when its buffer empties."""
        limit = self.settings.resume_buffer_size
        if self.buffered <= limit or not (self.attached or self.journal is not None):
            return  # while detached nothing is dropped: `blocked` pauses the models instead (unless shared)
        spill, holders = self._spill, self._holders
        while self.buffered > limit:
            if spill:
                st = next(iter(spill.values()))
            else:
                for st in holders.values():  # `current` is skipped, so at most two steps
                    if st is not current:
                        break
                else:
                    st = current
                if not st.pieces:
                    return
            self._drop_oldest(st)

    def _drop_oldest(self, st: StreamState) -> None:
        pieces = st.pieces
        pieces.popleft()
        self.buffered -= st.costs.popleft()
        st.lost_through = max(st.lost_through, st.seq - len(pieces))  # the seq just dropped
        if not pieces:
            self._emptied(st)

    def _emptied(self, st: StreamState) -> None:
        """`st`'s buffer became empty: nothing more to drop from it."""
        (self._holders if st.terminal is None else self._spill).pop(st.stream_id, None)

    def finish(self, stream_id: int, now: float, *, reason: str = "stop", timings_ms: Mapping[str, float] | None = None,
               error: ev.Error | ev.End | None = None) -> ev.End | ev.Error | None:
        """The stream's model finished or was cancelled (`reason`): its End; or it failed: `error`, its Error
        (or a ready-made End: a followed stream's, as the process that ran it made it).

        None when the stream is not running. The stream is remembered among the newest finished ones.
        """
        st = self.streams.get(stream_id)
        if st is None or not st.move("end"):
            return None
        terminal = error
        if terminal is None:
            timings = {"total": (now - st.started_at) * 1000}
            if st.first_chunk_at is not None:
                timings["first_delta"] = (st.first_chunk_at - st.started_at) * 1000
            if timings_ms:
                timings.update(timings_ms)
            terminal = ev.End(stream_id=stream_id, last_seq=st.seq, finish_reason=reason, timings_ms=timings,
                              usage={"deltas": st.seq, "output_bytes": st.out_bytes})
        st.terminal = terminal
        self.active -= 1
        context = self.context
        if context is not None:  # (protocol v1.3)
            context.given.pop(stream_id, None)
            if st.turn is not None and error is None and reason == "stop":
                context.keep_turn(st.asked, st.turn, st.parent)  # type: ignore[arg-type]
            st.turn = st.asked = None
        if self._holders.pop(stream_id, None) is not None:  # its Deltas are now the first to drop
            self._spill[stream_id] = st
        journal = self.journal
        if journal is not None and stream_id not in self.followed:
            journal += (stream_id, -1, st.terminal)
        finished = self._finished
        finished.append(stream_id)
        while len(finished) > MAX_FINISHED:
            self._forget(finished[0])
        return st.terminal

    def fail(self, stream_id: int, now: float, code: ErrorCode, message: str, *,
             retryable: bool = False) -> ev.Error | None:
        """The stream failed: its Error (see :meth:`finish`)."""
        error = ev.Error(stream_id=stream_id, code=code, message=message, retryable=retryable)
        return self.finish(stream_id, now, error=error)  # type: ignore[return-value]

    def refuse(self, stream_id: int, now: float, code: ErrorCode, message: str) -> ev.Error | None:
        """End running stream `stream_id` with its Error(`code`, `message`), marked cancelling (its model is to be
        stopped): an input it cannot take (v1.3). None if it was not running."""
        st = self.streams.get(stream_id)
        if st is None or not st.running:
            return None
        st.move("cancel")  # (a no-op when cancelling already)
        return self.fail(stream_id, now, code, message)

    def _forget(self, sid: int) -> None:
        st = self.streams.pop(sid, None)
        if st is not None:
            self.buffered -= sum(st.costs)
            self._holders.pop(sid, None)
            self._spill.pop(sid, None)
            if st.terminal is None:
                self.active -= 1
        if sid in self.followed:
            self.followed.discard(sid)  # type: ignore[union-attr]
        try:
            self._finished.remove(sid)
        except ValueError:
            pass

    def ack(self, stream_id: int, seq: int, done: bool = False) -> None:
        """The client has every Delta of `stream_id` up to `seq` (and, if `done`, its End)."""
        st = self.streams.get(stream_id)
        if st is None:
            return
        self._trim(st, seq)
        if done and st.move("done"):
            self._forget(stream_id)

    def _trim(self, st: StreamState, seq: int) -> None:
        seq = min(seq, st.seq)
        st.acked = max(st.acked, seq)
        pieces = st.pieces
        drop = seq - (st.seq - len(pieces))  # how many of the kept Deltas have a seq <= `seq`
        if drop > 0 and pieces:
            costs = st.costs
            if drop >= len(pieces):
                self.buffered -= sum(costs)
                pieces.clear()
                costs.clear()
            else:
                popleft = costs.popleft
                for _ in range(drop):
                    pieces.popleft()
                    self.buffered -= popleft()
            if not pieces:
                self._emptied(st)

class SessionStore(Protocol):
    """Where detached sessions wait to be resumed. The default keeps them in process memory."""

    def get(self, session_id: str) -> Any | None:
        """The stored session object, or None."""
        ...

    def put(self, session_id: str, value: Any) -> None:
        """Store (or replace) a session object."""
        ...

    def remove(self, session_id: str) -> None:
        """Forget a session."""
        ...


class MemorySessionStore:
    """In-process session store (one per endpoint; sessions do not survive the process)."""

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, session_id: str) -> Any | None:
        """The stored session object, or None."""
        return self._items.get(session_id)

    def put(self, session_id: str, value: Any) -> None:
        """Store (or replace) a session object."""
        self._items[session_id] = value

    def remove(self, session_id: str) -> None:
        """Forget a session."""
        self._items.pop(session_id, None)

    def values(self) -> list[Any]:
        """The stored session objects (a copy: safe from any thread)."""
        return list(self._items.values())


def tool_call_for(session: Session, stream_id: int, call: ev.ToolCall) -> ev.ToolCall:
    """`call` as its Delta carries it: with an id (``call_<stream>_<seq>`` if it had none); LocalProtocolError
    if the session's client does not speak v1.3, or the call would not fit a frame."""
    if session.revision < ev.DUPLEX_REVISION:
        raise LocalProtocolError(f"the client speaks protocol revision {session.revision}: a tool call needs v1.3 "
                                 f"(Hello.revision {ev.DUPLEX_REVISION})")
    size = len(call.name.encode()) + len(call.arguments.encode()) + len(call.id.encode())
    if size > session.settings.max_frame_size - 64:
        raise LocalProtocolError(f"a tool call of {size} bytes does not fit max_frame_size "
                                 f"({session.settings.max_frame_size})")
    if call.id:
        return call
    return ev.ToolCall(call.name, call.arguments, id=f"call_{stream_id}_{session.streams[stream_id].seq + 1}")


class ChunkTypeError(LocalProtocolError, TypeError):
    """A model chunk of a type no frame carries (`chunk`): the driver reports it as the model's TypeError."""

    def __init__(self, message: str, chunk: object) -> None:
        super().__init__(message)
        self.chunk = chunk


def normalize_chunk(chunk: object) -> str | bytes | ev.ToolCall:
    """A model's chunk as str or bytes (or, v1.3, a ToolCall); LocalProtocolError for anything a frame cannot
    carry."""
    if isinstance(chunk, bytearray | memoryview):
        return bytes(chunk)
    if isinstance(chunk, bytes):
        return chunk
    if type(chunk) is ev.ToolCall:
        return chunk
    if not isinstance(chunk, str):
        raise ChunkTypeError(f"model chunks must be str or bytes (or a ToolCall), got {type(chunk).__name__}", chunk)
    if not chunk.isascii():
        try:  # an unpaired surrogate cannot go out in a text frame (the send would fail and mute the socket)
            chunk.encode("utf-8")
        except UnicodeEncodeError:
            raise LocalProtocolError("model chunks must be valid Unicode text (unpaired surrogate)") from None
    return chunk


def split_chunk(chunk: str | bytes, limit: int) -> list[str | bytes]:
    """Split a chunk so each piece's encoded size fits in `limit` bytes (at character boundaries)."""
    if isinstance(chunk, bytes):
        if len(chunk) <= limit:
            return [chunk]
        return [chunk[i:i + limit] for i in range(0, len(chunk), limit)]
    if len(chunk) * 4 <= limit:
        return [chunk]
    raw = chunk.encode()
    if len(raw) <= limit:
        return [chunk]
    pieces: list[str | bytes] = []
    start = 0
    while start < len(raw):
        end = min(start + limit, len(raw))
        while end < len(raw) and (raw[end] & 0xC0) == 0x80:  # don't cut inside a UTF-8 sequence
            end -= 1
        if end == start:  # `limit` is smaller than this character: take the whole character
            end += 1
            while end < len(raw) and (raw[end] & 0xC0) == 0x80:
                end += 1
        pieces.append(raw[start:end].decode())
        start = end
    return pieces
