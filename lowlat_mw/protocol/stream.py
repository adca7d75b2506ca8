"""One stream's bookkeeping on the server: its phase (moved only by :data:`~lowlat_mw.protocol.state.STREAM_MOVES`),
its numbering and the Deltas it keeps for a resume. Sans-IO: the times in it are given, never read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from . import events as ev
from .state import STREAM_MOVES, StreamPhase

__all__ = ["DELTA_OVERHEAD", "StreamState", "encoded_len"]

DELTA_OVERHEAD = 64  # bytes charged per buffered Delta on top of its chunk (object overhead)


@dataclass(slots=True)
class StreamState:
    """One stream's bookkeeping on the server."""

    stream_id: int
    started_at: float
    seq: int = 0
    first_chunk_at: float | None = None
    out_bytes: int = 0
    phase: StreamPhase = StreamPhase.RUNNING  # where it is in its life: moved only by the table (state.STREAM_MOVES)
    acked: int = 0
    lost_through: int = 0  # Deltas with seq <= this were dropped unacknowledged: no replay below
    # The Deltas kept for a resume: their chunks and costs (bytes + DELTA_OVERHEAD), oldest first, seqs
    # seq - len(pieces) + 1 .. seq (a buffer loses only its oldest). Two deques, not one of (seq, chunk,
    # cost) tuples: no container object per Delta for the garbage collector to count and visit.
    pieces: deque[str | bytes] = field(default_factory=deque)
    costs: deque[int] = field(default_factory=deque)
    terminal: ev.End | ev.Error | None = None  # its End or Error, set with its "end" move (by its Session only)
    input_seq: int = 0  # (v1.3) the seq of the last Input delivered to the model
    input_ended: bool = False  # (v1.3) an Input with end came
    # Protocol v1.3, in a session that keeps turns (Hello.history): the output so far (None: not kept), the
    # Request, and the kept turn it continues (stream id, serial).
    turn: list[str | bytes] | None = None
    turn_bytes: int = 0  # (the output's bytes so far: past history_size the turn is not kept, nor its pieces)
    asked: ev.Request | None = None
    parent: tuple[int, int] | None = None

    @property
    def buffer(self) -> list[tuple[int, str | bytes, int]]:
        """(seq, chunk, cost) of each kept Delta, oldest first."""
        first = self.seq - len(self.pieces) + 1
        return [(first + i, piece, cost) for i, (piece, cost) in enumerate(zip(self.pieces, self.costs, strict=True))]

    @property
    def running(self) -> bool:
        """True until the stream's End or Error was produced (RUNNING or CANCELLING: its model may still produce)."""
        return self.terminal is None

    @property
    def cancelling(self) -> bool:
        """Whether its stop was asked (CANCELLING; or STOPPED, ended since)."""
        phase = self.phase
        return phase is StreamPhase.CANCELLING or phase is StreamPhase.STOPPED

    def accepts(self, event: str) -> bool:
        """Whether its phase accepts `event` (an event of :data:`~lowlat_mw.protocol.state.STREAM_MOVES`)."""
        return event in STREAM_MOVES[self.phase]

    def move(self, event: str) -> bool:
        """Take `event`: move to the phase the table says; False (and no move) if its phase does not accept it."""
        to = STREAM_MOVES[self.phase].get(event)
        if to is None:
            return False
        self.phase = to
        return True

    def input_delivered(self, inp: ev.Input) -> None:
        """(v1.3) Client Input `inp`, accepted in seq order (:meth:`accepts` "input"), went to the model."""
        self.input_seq = inp.seq
        self.input_ended = inp.end


def encoded_len(piece: str | bytes | ev.ToolCall) -> int:
    """Bytes of `piece` in a frame (UTF-8 for text; a tool call: its size as a buffer counts it)."""
    if isinstance(piece, str):
        return len(piece) if piece.isascii() else len(piece.encode("utf-8", "surrogatepass"))
    return len(piece)
