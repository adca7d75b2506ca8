"""The resume side of a :class:`~lowlat_mw.protocol.session.Session`: detaching and attaching, what a resuming
client missed (replay), and streams taken over from a shared store (restore). Sans-IO, as the session.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..errors import ErrorCode
from . import events as ev
from .state import StreamPhase
from .stream import DELTA_OVERHEAD, StreamState, encoded_len

if TYPE_CHECKING:
    from ..settings import Settings
    from .context import SessionContext

__all__ = ["EMPTY_WINDOW", "SessionResume"]

EMPTY_WINDOW = 10.0  # seconds a dropped session with nothing to resume is kept: the client may have sent a Request
                     # the drop lost, and its resume then gets "send it again" (protocol.md 14.2), not "expired"


class SessionResume:
    """A session's life across connections (mixed into Session): detach, attach, replay, restore."""

    settings: Settings
    streams: dict[int, StreamState]
    active: int
    buffered: int
    attached: bool
    detached_at: float | None
    window: float
    groups: frozenset[str]
    context: SessionContext | None
    followed: set[int] | frozenset[int]
    _awaited: set[int]
    _finished: list[int]
    _holders: dict[int, StreamState]
    _spill: dict[int, StreamState]
    # (and Session's _forget, _trim and _update_pause)

    def restore(self, stream_id: int, first_seq: int, pieces: list[str | bytes], terminal: ev.End | ev.Error | None,
                now: float, *, followed: bool = False) -> None:
        """Take over a stream from a shared store: its kept Deltas, seqs `first_seq` .. (Deltas below
        `first_seq` are gone: a resume below fails), and its End or Error if it has ended. `followed`: it is
        still running in another process, whose output this session relays (and does not journal again)."""
        self._forget(stream_id)
        st = StreamState(stream_id=stream_id, started_at=now, seq=first_seq - 1 + len(pieces),
                         lost_through=first_seq - 1, terminal=terminal,
                         phase=StreamPhase.RUNNING if terminal is None else StreamPhase.ENDED)
        for piece in pieces:
            cost = encoded_len(piece) + DELTA_OVERHEAD
            st.pieces.append(piece)
            st.costs.append(cost)
            st.out_bytes += cost - DELTA_OVERHEAD
            self.buffered += cost
        self.streams[stream_id] = st
        if terminal is None:
            self.active += 1
            if pieces:
                self._holders[stream_id] = st
        else:
            if pieces:
                self._spill[stream_id] = st
            self._finished.append(stream_id)
        if followed:
            if type(self.followed) is not set:
                self.followed = set()
            self.followed.add(stream_id)

    # ------------------------------------------------------------------ connection changes
    def detach(self, now: float) -> None:
        """The connection dropped; the session waits ``resume_window`` seconds for a resume (an empty one, nothing
        to resume but a Request the drop may have lost, EMPTY_WINDOW at most)."""
        self.attached = False
        self.detached_at = now
        self.window = self.settings.resume_window if self.worth_keeping() else min(self.settings.resume_window,
                                                                                    EMPTY_WINDOW)
        self._update_pause()

    def attach(self) -> None:
        """A connection took the session over."""
        self.attached = True
        self.detached_at = None
        self._update_pause()

    def expires_at(self) -> float:
        """When a detached session is given up (inf while attached)."""
        return math.inf if self.detached_at is None else self.detached_at + self.window

    def worth_keeping(self) -> bool:
        """Whether anything could still be resumed: a stream the client has not acknowledged as done,
        one the last resume reported unknown (its Request was lost; the client sends it again), or the
        push groups it is in (the server's joins among them: a new session would be in none)."""
        context = self.context
        return bool(self.streams or self._awaited or self.groups
                    or (context is not None and (context.documents or context.turns)))

    def input_seqs(self) -> dict[int, int]:
        """(v1.3) Running stream id -> seq of the last Input it got, for streams that got any: a resume's Welcome
        says so, and the client sends its later Inputs again."""
        return {sid: st.input_seq for sid, st in self.streams.items() if st.input_seq and st.terminal is None}

    def replay(self, last_seq: Mapping[int, int]) -> tuple[list[ev.Event], list[int]]:
        """What a resuming client missed: (events to send in order, stream ids to cancel).

        `last_seq` lists every stream the client still considers open, with the last seq it got.
        Streams it does not list are done for it: running ones are cancelled, finished ones
        forgotten. A listed stream whose missing Deltas were dropped from the buffer, or that
        the server does not know, gets an Error ``resume_failed``.
        """
        events: list[ev.Event] = []
        cancels: list[int] = []
        for sid, st in list(self.streams.items()):
            if sid not in last_seq:
                if st.running:  # (cancelling already or not: its stop is asked again)
                    st.move("cancel")
                    cancels.append(sid)
                elif st.move("done"):
                    self._forget(sid)
                continue
            have = last_seq[sid]
            if have < st.lost_through:
                err = ev.Error(stream_id=sid, code=ErrorCode.RESUME_FAILED,
                               message=f"replay buffer exceeded: deltas after seq {have} are gone")
                events.append(err)
                if st.running:  # (its model is stopped, its Error sent here: not ended as finish() ends one)
                    st.move("cancel")
                    st.move("end")
                    st.terminal = err
                    self.active -= 1
                    cancels.append(sid)
                self._forget(sid)
                continue
            self._trim(st, have)
            events.extend(ev.Delta.of(sid, seq, chunk) for seq, chunk, _ in st.buffer if seq > have)
            if st.terminal is not None:
                events.append(st.terminal)
        self._awaited = set()
        for sid in last_seq:
            if sid not in self.streams and not any(isinstance(e, ev.Error) and e.stream_id == sid for e in events):
                self._awaited.add(sid)
                events.append(ev.Error(stream_id=sid, code=ErrorCode.RESUME_FAILED, retryable=True,
                                       message=f"stream {sid} is unknown to this session"))
        return events, cancels
