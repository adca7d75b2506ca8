"""Session (replay buffers, Acks, flow control, resume) and the ServerProtocol's resume, drain
and Ack handling, sans-IO: fake clock numbers, no sockets, no sleeps (docs/protocol.md 13, 14)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lowlat_mw.endpoint import new_session_ids
from lowlat_mw.errors import ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol import session as session_module
from lowlat_mw.protocol.server import CancelStream, ResumeSession, StartStream
from lowlat_mw.protocol.session import DELTA_OVERHEAD, MAX_FINISHED, MemorySessionStore, Session
from lowlat_mw.protocol.state import StreamPhase
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings
from lowlat_mw.testing import ConnectionPair

T0 = 1000.0
SECRET = "c2VjcmV0LW9mLXRoZS10ZXN0LXNlc3Npb24"  # as long as a drawn one
BOTH = [SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON]


def cost(piece: str | bytes) -> int:
    return (len(piece) if isinstance(piece, bytes) else len(piece.encode())) + DELTA_OVERHEAD


def new_session(**overrides: Any) -> Session:
    return Session(Settings(**overrides), now=T0, session_id="sess", secret=SECRET)


def another_session(settings: Settings | None = None) -> Session:
    """A session with ids drawn as the drivers draw them (lowlat_mw.endpoint.new_session_ids)."""
    session_id, secret = new_session_ids()
    return Session(settings or Settings(), now=T0, session_id=session_id, secret=secret)


def started(*stream_ids: int, **overrides: Any) -> Session:
    s = new_session(**overrides)
    for sid in stream_ids:
        assert s.start(ev.Request(stream_id=sid, text="x"), T0) is None
    return s


def buffer_cost(s: Session) -> int:
    return sum(c for stream in s.streams.values() for _, _, c in stream.buffer)


def buffered_seqs(s: Session, sid: int) -> list[int]:
    return [seq for seq, _, _ in s.streams[sid].buffer]


def deltas_of(events: Iterable[ev.Event], sid: int) -> list[int]:
    return [e.seq for e in events if isinstance(e, ev.Delta) and e.stream_id == sid]


# ================================================================================ streams
def test_start_record_finish() -> None:
    s = started(1)
    pieces = ["Hel", "lo", b"\x00\xff", "é"]
    seqs = [s.record(1, p, T0 + 0.25 + i) for i, p in enumerate(pieces)]
    assert seqs == [1, 2, 3, 4]
    deltas = s.buffered_deltas(1)
    assert [d.seq for d in deltas] == [1, 2, 3, 4]
    assert [d.chunk for d in deltas] == pieces
    assert deltas[2].data == b"\x00\xff" and deltas[2].text is None
    assert s.buffered == sum(cost(p) for p in pieces) == buffer_cost(s)
    end = s.finish(1, T0 + 5)
    assert end == s.streams[1].terminal
    assert end.last_seq == 4 and end.finish_reason == "stop"
    assert end.usage == {"deltas": 4, "output_bytes": 3 + 2 + 2 + 2}
    assert end.timings_ms["total"] == pytest.approx(5000) and end.timings_ms["first_delta"] == pytest.approx(250)
    assert s.running == {} and s.running_count() == 0
    # Nothing more once it ended; the buffer stays until acknowledged.
    assert s.record(1, "late", T0 + 6) is None
    assert s.finish(1, T0 + 6) is None
    assert s.fail(1, T0 + 6, ErrorCode.MODEL_ERROR, "x") is None
    assert buffered_seqs(s, 1) == [1, 2, 3, 4]


def test_fail_ends_the_stream_with_an_error() -> None:
    s = started(3)
    s.record(3, "a", T0)
    err = s.fail(3, T0 + 1, ErrorCode.MODEL_ERROR, "model failed (ValueError)")
    assert err == ev.Error(stream_id=3, code=ErrorCode.MODEL_ERROR, message="model failed (ValueError)")
    assert s.streams[3].terminal is err and not s.streams[3].running
    assert s.finish(3, T0 + 2) is None
    assert s.record(3, "b", T0 + 2) is None


def test_finish_with_reason_and_extra_timings() -> None:
    s = started(1)
    end = s.finish(1, T0 + 1, reason="cancelled", timings_ms={"model": 1.5})
    assert end.finish_reason == "cancelled" and end.last_seq == 0
    assert end.timings_ms["model"] == 1.5 and "first_delta" not in end.timings_ms


def test_record_on_unknown_stream_is_ignored() -> None:
    s = new_session()
    assert s.record(9, "x", T0) is None and s.finish(9, T0) is None and s.buffered == 0


def test_seq_numbering_is_per_stream() -> None:
    s = started(1, 2)
    order = [1, 2, 2, 1, 2, 1, 1]
    seen = [(sid, s.record(sid, "t", T0)) for sid in order]
    assert [q for sid, q in seen if sid == 1] == [1, 2, 3, 4]
    assert [q for sid, q in seen if sid == 2] == [1, 2, 3]


def test_start_refuses_a_running_id_and_restarts_a_finished_one() -> None:
    s = started(1)
    s.record(1, "a", T0)
    err = s.start(ev.Request(stream_id=1, text="again"), T0)
    assert err is not None and err.code is ErrorCode.STREAM_ID_IN_USE and err.stream_id == 0
    s.finish(1, T0)
    assert s.start(ev.Request(stream_id=1, text="again"), T0 + 1) is None
    assert s.streams[1].seq == 0 and s.buffered == 0  # the old stream and its buffer are gone
    assert s.record(1, "b", T0 + 1) == 1


def test_max_streams_is_retryable() -> None:
    s = started(1, 2, max_streams=2)
    err = s.start(ev.Request(stream_id=3), T0)
    assert err.code is ErrorCode.TOO_MANY_STREAMS and err.retryable and err.stream_id == 3
    s.finish(1, T0)
    assert s.start(ev.Request(stream_id=3), T0) is None


# ================================================================================ acks
def test_ack_trims_the_buffer_and_the_byte_count() -> None:
    s = started(1, 2)
    for i in range(5):
        s.record(1, "x" * (i + 1), T0)
        s.record(2, "yy", T0)
    total = s.buffered
    s.ack(1, 3)
    assert buffered_seqs(s, 1) == [4, 5]
    assert s.buffered == total - sum(cost("x" * k) for k in (1, 2, 3)) == buffer_cost(s)
    assert s.streams[1].acked == 3
    s.ack(1, 2)  # stale: nothing changes
    assert buffered_seqs(s, 1) == [4, 5] and s.streams[1].acked == 3
    s.ack(1, 999)  # beyond what was sent: clamped
    assert buffered_seqs(s, 1) == [] and s.streams[1].acked == 5
    assert s.buffered == 5 * cost("yy") == buffer_cost(s)
    s.ack(42, 1)  # unknown stream: ignored
    assert s.buffered == buffer_cost(s)


def test_done_ack_forgets_a_finished_stream_only() -> None:
    s = started(1, 2)
    s.record(1, "a", T0)
    s.record(2, "b", T0)
    s.ack(2, 1, done=True)  # still running: only trims
    assert 2 in s.streams and buffered_seqs(s, 2) == []
    s.finish(1, T0)
    s.ack(1, 1, done=True)
    assert 1 not in s.streams and s.buffered == 0
    assert s.worth_keeping()  # stream 2 still runs


# ================================================================================ flow control
def test_flow_window_is_the_smallest_of_client_server_and_buffer() -> None:
    s = new_session(flow_window=1000, resume_buffer_size=800)
    assert s.set_client_window(5000) == 800
    assert s.set_client_window(300) == 300
    assert s.set_client_window(0) == 0 and s.flow_window == 0


def test_blocked_when_the_window_is_full_until_acked() -> None:
    s = started(1, flow_window=1000)
    s.set_client_window(1000)
    piece = "x" * 36  # costs 100
    for _ in range(9):
        s.record(1, piece, T0)
        assert not s.blocked
    s.record(1, piece, T0)
    assert s.buffered == 1000 and s.blocked
    s.ack(1, 1)
    assert not s.blocked
    s.record(1, piece, T0)
    assert s.blocked


def test_a_window_as_big_as_the_replay_buffer_still_fills_and_drops_nothing() -> None:
    # The Delta that reached the window went over the buffer too, which dropped the oldest first: the window never
    # filled and the models never paused (the client's window then bounded nothing).
    s = started(1, flow_window=1000, resume_buffer_size=1000)
    assert s.set_client_window(1000) == 1000
    for _ in range(9):
        s.record(1, "x" * 37, T0)  # costs 101: the tenth passes both the window and the buffer
        assert not s.blocked
    s.record(1, "x" * 37, T0)
    assert s.blocked and s.buffered == 1010
    assert s.streams[1].lost_through == 0 and buffered_seqs(s, 1) == list(range(1, 11))
    s.ack(1, 1)
    assert not s.blocked


def test_without_acks_an_attached_session_never_blocks_but_drops_oldest() -> None:
    s = started(1, resume_buffer_size=1000)
    for _ in range(50):
        s.record(1, "x" * 36, T0)
        assert not s.blocked
    assert s.buffered <= 1000 == buffer_cost(s)
    assert buffered_seqs(s, 1) == list(range(41, 51))
    assert s.streams[1].lost_through == 40


def test_detached_without_acks_blocks_at_the_buffer_size_and_drops_nothing() -> None:
    s = started(1, resume_buffer_size=1000)
    s.record(1, "x" * 36, T0)
    s.detach(T0 + 1)
    produced = 1
    while not s.blocked:
        s.record(1, "x" * 36 + "y", T0 + 1)  # costs 101: never lands exactly on the limit
        produced += 1
        assert produced < 100, "a detached session without Acks never paused its model"
    assert produced == 10 and s.buffered == 100 + 9 * 101
    assert s.streams[1].lost_through == 0
    events, _ = s.replay({1: 0})
    assert deltas_of(events, 1) == list(range(1, 11))


def test_detached_with_a_window_blocks_at_the_window() -> None:
    s = started(1, flow_window=500)
    s.set_client_window(500)
    s.detach(T0)
    while not s.blocked:
        s.record(1, "x" * 36, T0)
    assert s.buffered == 500


def test_buffer_overflow_drops_finished_streams_first() -> None:
    s = started(1, 2, resume_buffer_size=1000)
    for _ in range(5):
        s.record(1, "x" * 36, T0)
    s.finish(1, T0)
    for _ in range(6):
        s.record(2, "x" * 36, T0)
    assert s.buffered == 1000 and s.streams[1].lost_through == 1
    assert buffered_seqs(s, 2) == [1, 2, 3, 4, 5, 6]


def test_buffer_overflow_drops_other_running_streams_before_the_current_one() -> None:
    s = started(1, 2, resume_buffer_size=1000)
    for _ in range(5):
        s.record(1, "x" * 36, T0)
        s.record(2, "x" * 36, T0)
    s.record(2, "x" * 36, T0)  # over: stream 1's oldest goes, not the Delta just recorded
    assert buffered_seqs(s, 1) == [2, 3, 4, 5] and buffered_seqs(s, 2) == [1, 2, 3, 4, 5, 6]
    s.record(1, "x" * 36, T0)  # and now stream 2's
    assert buffered_seqs(s, 1) == [2, 3, 4, 5, 6] and buffered_seqs(s, 2) == [2, 3, 4, 5, 6]
    assert (s.streams[1].lost_through, s.streams[2].lost_through) == (1, 1)


def test_buffer_overflow_skips_finished_streams_that_were_acked_or_forgotten() -> None:
    s = started(1, 2, 3, resume_buffer_size=1000)
    for sid in (1, 2):
        for _ in range(3):
            s.record(sid, "x" * 36, T0)
        s.finish(sid, T0)
    s.ack(1, 3)             # stream 1's Deltas are acknowledged: nothing of it left to drop
    s.ack(2, 3, done=True)  # stream 2 is forgotten
    assert s.buffered == 0
    for _ in range(11):
        s.record(3, "x" * 36, T0)
    assert buffered_seqs(s, 3) == list(range(2, 12)) and s.streams[3].lost_through == 1
    assert s.streams[1].lost_through == 0 and 2 not in s.streams


def test_replay_below_the_dropped_point_fails_with_resume_failed() -> None:
    s = started(1, 2, resume_buffer_size=1000)
    for _ in range(15):
        s.record(1, "x" * 36, T0)
    assert s.streams[1].lost_through == 5
    s.detach(T0)
    events, cancels = s.replay({1: 4, 2: 0})
    errors = [e for e in events if isinstance(e, ev.Error)]
    assert [(e.stream_id, e.code, e.retryable) for e in errors] == [(1, ErrorCode.RESUME_FAILED, False)]
    assert "replay buffer exceeded" in errors[0].message
    assert deltas_of(events, 1) == []
    assert cancels == [1]  # it was running: its model is stopped
    assert 1 not in s.streams and 2 in s.streams and s.buffered == buffer_cost(s)


def test_replay_at_the_dropped_point_still_works() -> None:
    s = started(1, resume_buffer_size=1000)
    for _ in range(15):
        s.record(1, "x" * 36, T0)
    events, cancels = s.replay({1: 5})
    assert deltas_of(events, 1) == list(range(6, 16)) and cancels == []


# ================================================================================ replay
def test_replay_returns_exactly_the_missing_deltas_then_the_terminal() -> None:
    s = started(1, 2, 3, 4)
    for sid in (1, 2, 3, 4):
        for _ in range(6):
            s.record(sid, f"{sid}", T0)
    s.ack(1, 2)
    s.finish(1, T0)
    s.fail(2, T0, ErrorCode.MODEL_ERROR, "boom")
    s.detach(T0 + 1)
    events, cancels = s.replay({1: 4, 2: 6, 3: 3, 4: 6})
    assert deltas_of(events, 1) == [5, 6]
    assert deltas_of(events, 2) == []
    assert deltas_of(events, 3) == [4, 5, 6]
    assert deltas_of(events, 4) == []
    # Per stream: its Deltas in order, then its End/Error.
    assert [type(e).__name__ for e in events if e.stream_id == 1] == ["Delta", "Delta", "End"]
    assert [e for e in events if e.stream_id == 2] == [s.streams[2].terminal]
    assert cancels == []
    # What the client reported having is acknowledged by the resume.
    assert buffered_seqs(s, 3) == [4, 5, 6] and s.streams[3].acked == 3
    assert s.buffered == buffer_cost(s)


def test_replay_cancels_running_streams_the_client_did_not_list_and_forgets_finished_ones() -> None:
    s = started(1, 2, 3)
    for sid in (1, 2, 3):
        s.record(sid, "x", T0)
    s.finish(2, T0)
    events, cancels = s.replay({3: 1})
    assert cancels == [1]
    assert s.streams[1].cancelling and s.streams[1].running  # End("cancelled") comes from the driver
    assert 2 not in s.streams
    assert events == []


def test_replay_reports_unknown_listed_streams_as_retryable() -> None:
    s = started(1)
    events, cancels = s.replay({1: 0, 7: 0, 8: 3})
    errors = {e.stream_id: e for e in events if isinstance(e, ev.Error)}
    assert set(errors) == {7, 8}
    assert all(e.code is ErrorCode.RESUME_FAILED and e.retryable for e in errors.values())
    assert "unknown" in errors[7].message
    assert cancels == []


def test_a_session_waiting_for_resent_requests_is_worth_keeping() -> None:
    s = new_session()
    assert not s.worth_keeping()
    s.replay({5: 0})  # the Request of stream 5 was lost in the drop: the client will resend it
    assert s.worth_keeping()
    s.start(ev.Request(stream_id=5), T0)
    s.finish(5, T0)
    s.ack(5, 0, done=True)
    assert not s.worth_keeping()
    s.replay({6: 0})
    s.replay({})  # the client gave stream 6 up
    assert not s.worth_keeping()


def test_replay_is_repeatable_after_another_drop() -> None:
    s = started(1)
    for _ in range(10):
        s.record(1, "x", T0)
    first, _ = s.replay({1: 3})
    second, _ = s.replay({1: 6})  # the first replay was cut after seq 6
    assert deltas_of(first, 1) == list(range(4, 11))
    assert deltas_of(second, 1) == list(range(7, 11))


# ================================================================================ identity, lifetime
def test_resume_token_and_session_id_of() -> None:
    a, b = new_session(), another_session()
    assert a.resume_token.startswith("sess.") and len(a.resume_token) > 30
    assert Session.session_id_of(a.resume_token) == "sess"
    assert Session.session_id_of(b.resume_token) == b.session_id
    assert Session.session_id_of("abc.def.ghi") == "abc"
    assert Session.session_id_of("no-dot") == ""
    assert Session.session_id_of("") == ""
    assert Session.session_id_of(".x") == ""
    assert a.token_matches(a.resume_token)
    assert not a.token_matches(b.resume_token)
    assert not a.token_matches("sess." + "A" * 32)
    assert not a.token_matches("")
    assert not a.token_matches(a.resume_token + "x")
    assert not a.token_matches("sess.é")  # non-ASCII input is not an error


def test_token_matches_uses_a_constant_time_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, Any]] = []
    real = session_module.hmac.compare_digest

    def spy(x: Any, y: Any) -> bool:
        calls.append((x, y))
        return real(x, y)

    monkeypatch.setattr(session_module.hmac, "compare_digest", spy)
    s = new_session()
    assert s.token_matches(s.resume_token) and not s.token_matches("sess.wrong")
    assert len(calls) == 2


def test_tokens_are_unique_per_session() -> None:
    tokens = {another_session().resume_token for _ in range(50)}
    assert len(tokens) == 50


def test_finished_streams_beyond_max_finished_are_forgotten_oldest_first() -> None:
    s = new_session()
    for sid in range(1, MAX_FINISHED + 6):
        s.start(ev.Request(stream_id=sid), T0)
        s.record(sid, "x", T0)
        s.finish(sid, T0)
    assert len(s.streams) == MAX_FINISHED
    assert min(s.streams) == 6
    assert s.buffered == MAX_FINISHED * cost("x") == buffer_cost(s)


def test_expires_at_after_detach() -> None:
    s = new_session(resume_window=7.5)
    assert s.expires_at() == math.inf and s.attached
    s.detach(T0 + 2)
    assert not s.attached and s.expires_at() == T0 + 9.5
    s.attach()
    assert s.attached and s.expires_at() == math.inf


def test_memory_session_store() -> None:
    store = MemorySessionStore()
    assert len(store) == 0 and store.get("a") is None
    store.put("a", 1)
    store.put("a", 2)
    assert store.get("a") == 2 and len(store) == 1
    store.remove("a")
    store.remove("a")
    assert len(store) == 0


# ================================================================================ property
class SessionMachine(RuleBasedStateMachine):
    """Random interleavings of start / record / deliver / ack / finish / drop+resume.

    The client receives a prefix of each stream's Deltas (what it got before a drop), acks only
    what it received, and resumes with what it received. Invariants: `buffered` is the sum of
    the buffer costs; each buffer is a contiguous seq run ending at the stream's seq; a replay
    continues every listed stream exactly at received + 1, contiguously, then its terminal, or
    fails it with resume_failed only when Deltas it had not received were dropped.
    """

    def __init__(self) -> None:
        super().__init__()
        self.s = Session(Settings(resume_buffer_size=2000, max_streams=4), now=T0, session_id="sess", secret=SECRET)
        self.next_id = 1
        self.received: dict[int, int] = {}  # client: last seq received per open stream
        self.done: set[int] = set()         # client got End/Error: it acks done, then forgets

    def open_ids(self) -> list[int]:
        return sorted(self.received)

    @rule()
    def start(self) -> None:
        sid = self.next_id
        if self.s.start(ev.Request(stream_id=sid), T0) is None:
            self.next_id += 1
            self.received[sid] = 0

    @precondition(lambda self: self.received)
    @rule(data=st.data(), size=st.integers(0, 300))
    def record(self, data: st.DataObject, size: int) -> None:
        sid = data.draw(st.sampled_from(self.open_ids()))
        if self.s.blocked:
            return  # the driver pauses the model
        self.s.record(sid, "x" * size, T0)

    @precondition(lambda self: self.received)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """The client receives the next k Deltas the server sent."""
        sid = data.draw(st.sampled_from(self.open_ids()))
        stream = self.s.streams.get(sid)
        if stream is None:
            return
        k = data.draw(st.integers(0, stream.seq - self.received[sid]))
        self.received[sid] += k

    @precondition(lambda self: self.received)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.open_ids()))
        self.s.ack(sid, self.received[sid])

    @precondition(lambda self: self.received)
    @rule(data=st.data(), fail=st.booleans())
    def finish(self, data: st.DataObject, fail: bool) -> None:
        sid = data.draw(st.sampled_from(self.open_ids()))
        if fail:
            self.s.fail(sid, T0, ErrorCode.MODEL_ERROR, "x")
        else:
            self.s.finish(sid, T0)

    @rule(attach_first=st.booleans())
    def drop_and_resume(self, attach_first: bool) -> None:
        self.s.detach(T0)
        if attach_first:
            self.s.attach()
        before = {sid: (st_.lost_through, st_.seq, st_.terminal) for sid, st_ in self.s.streams.items()}
        events, cancels = self.s.replay(dict(self.received))
        self.s.attach()
        # The client listed every stream it has open: only a running stream that cannot be resumed
        # (Deltas it never got were dropped) is cancelled, to stop its model.
        failed = {sid for sid in self.open_ids() if self.received[sid] < before[sid][0]}
        assert set(cancels) == {sid for sid in failed if before[sid][2] is None}
        for sid in self.open_ids():
            mine = [e for e in events if e.stream_id == sid]
            lost_through, seq, terminal = before[sid]
            if self.received[sid] < lost_through:
                assert len(mine) == 1 and isinstance(mine[0], ev.Error)
                assert mine[0].code is ErrorCode.RESUME_FAILED and not mine[0].retryable
                del self.received[sid]
                continue
            seqs = [e.seq for e in mine if isinstance(e, ev.Delta)]
            assert seqs == list(range(self.received[sid] + 1, seq + 1))
            tail = [e for e in mine if not isinstance(e, ev.Delta)]
            assert tail == ([terminal] if terminal is not None else [])
            assert mine[:len(seqs)] == [e for e in mine if isinstance(e, ev.Delta)]
            self.received[sid] = seq
            if terminal is not None:  # the client now has the End/Error: Ack done
                self.s.ack(sid, seq, done=True)
                del self.received[sid]
                assert sid not in self.s.streams

    @invariant()
    def running_count_is_the_number_of_streams_without_a_terminal(self) -> None:
        assert self.s.running_count() == sum(1 for st in self.s.streams.values() if st.terminal is None)

    @invariant()
    def buffered_is_the_sum_of_buffer_costs(self) -> None:
        assert self.s.buffered == buffer_cost(self.s)
        assert self.s.buffered <= self.s.settings.resume_buffer_size

    @invariant()
    def the_drop_order_maps_hold_exactly_the_streams_holding_deltas(self) -> None:
        # What the buffer limit drops from without scanning the session (Session._spill, Session._holders).
        holding = {sid: stream for sid, stream in self.s.streams.items() if stream.buffer}
        assert {sid: id(v) for sid, v in self.s._holders.items()} == {
            sid: id(v) for sid, v in holding.items() if v.terminal is None}
        assert {sid: id(v) for sid, v in self.s._spill.items()} == {
            sid: id(v) for sid, v in holding.items() if v.terminal is not None}

    @invariant()
    def buffers_are_contiguous_runs_ending_at_seq(self) -> None:
        for stream in self.s.streams.values():
            seqs = [seq for seq, _, _ in stream.buffer]
            if seqs:
                assert seqs == list(range(seqs[0], stream.seq + 1))
                assert seqs[0] > stream.lost_through
                assert seqs[0] > stream.acked


TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])


# ================================================================================ connection
def opened(subprotocol: str = SUBPROTOCOL_PROTO, **hello: Any) -> tuple[ConnectionPair, ev.Welcome]:
    c = ConnectionPair(Settings(), subprotocol, now=T0)
    [welcome] = c.send(ev.Hello(client="t", **hello))
    assert isinstance(welcome, ev.Welcome)
    return c, welcome


def with_output(subprotocol: str = SUBPROTOCOL_PROTO) -> tuple[ConnectionPair, ev.Welcome]:
    """A connection whose session has stream 1 (finished, 5 Deltas) and stream 2 (running, 3)."""
    c, welcome = opened(subprotocol, flow_window=1 << 20)
    for sid, n in ((1, 5), (2, 3)):
        [start] = c.send(ev.Request(stream_id=sid, text="go"))
        assert isinstance(start, StartStream)
        for i in range(n):
            c.chunk(sid, f"{sid}:{i}")
    c.finish(1)
    c.conn.connection_lost()
    c.conn.session.detach(T0)
    return c, welcome


def client_of(subprotocol: str) -> ConnectionPair:
    return ConnectionPair(Settings(), subprotocol, now=T0, session_id="sess-2")


@pytest.mark.parametrize("subprotocol", BOTH)
def test_hello_with_a_resume_token_asks_the_driver_to_look_the_session_up(subprotocol: str) -> None:
    c = client_of(subprotocol)
    out = c.send(ev.Hello(resume_token="abc.secret", last_seq={1: 4, 2: 0}))
    assert out == [ResumeSession("abc.secret", "abc", {1: 4, 2: 0})]
    assert not c.conn.open  # no Welcome until the driver calls resume()


@pytest.mark.parametrize("subprotocol", BOTH)
def test_resume_welcomes_and_replays_what_was_missed(subprotocol: str) -> None:
    old, welcome = with_output(subprotocol)
    session = old.conn.session
    c = client_of(subprotocol)
    c.send(ev.Hello(resume_token=welcome.resume_token, last_seq={1: 2, 2: 1}, flow_window=4096))
    out = c.decode(c.conn.resume(session, T0 + 1))
    resumed = out[0]
    assert isinstance(resumed, ev.Welcome) and resumed.resumed
    assert resumed.session_id == welcome.session_id and resumed.resume_token == welcome.resume_token
    assert resumed.flow_window == 4096
    rest = out[1:]
    assert [(e.stream_id, e.seq) for e in rest if isinstance(e, ev.Delta)] == [(1, 3), (1, 4), (1, 5), (2, 2), (2, 3)]
    assert [e.chunk for e in rest if isinstance(e, ev.Delta)] == ["1:2", "1:3", "1:4", "2:1", "2:2"]
    assert isinstance(rest[3], ev.End) and rest[3].stream_id == 1 and rest[3].last_seq == 5
    assert c.conn.open and c.conn.session is session and session.attached
    # Live output continues with the next seq on the new connection.
    [live] = c.chunk(2, "2:3", at=T0 + 2)
    assert live.seq == 4


def test_resume_cancels_streams_the_client_no_longer_lists() -> None:
    old, welcome = with_output()
    c = client_of(SUBPROTOCOL_PROTO)
    c.send(ev.Hello(resume_token=welcome.resume_token, last_seq={}))
    out = c.decode(c.conn.resume(old.conn.session, T0 + 1))
    assert isinstance(out[0], ev.Welcome) and out[0].resumed
    assert out[1:] == [CancelStream(2)]
    assert 1 not in old.conn.session.streams  # finished and unlisted: forgotten


@pytest.mark.parametrize("subprotocol", BOTH)
def test_resume_of_an_unknown_session_is_a_new_session_and_fails_listed_streams(subprotocol: str) -> None:
    c = client_of(subprotocol)
    c.send(ev.Hello(resume_token="gone.secret", last_seq={3: 7, 4: 0}))
    out = c.decode(c.conn.resume(None, T0))
    welcome, *errors = out
    assert isinstance(welcome, ev.Welcome) and not welcome.resumed
    assert welcome.session_id != "gone" and welcome.resume_token != "gone.secret"
    assert sorted((e.stream_id, e.code, e.retryable) for e in errors) == [
        (3, ErrorCode.RESUME_FAILED, False), (4, ErrorCode.RESUME_FAILED, False)]
    assert c.conn.open and c.conn.session.streams == {}


def test_resume_of_an_unknown_session_without_streams_says_so_on_stream_0() -> None:
    c = client_of(SUBPROTOCOL_JSON)
    c.send(ev.Hello(resume_token="gone.secret"))
    welcome, error = c.decode(c.conn.resume(None, T0))
    assert not welcome.resumed
    assert error.stream_id == 0 and error.code is ErrorCode.RESUME_FAILED


def test_resume_with_a_wrong_secret_does_not_take_the_session_over() -> None:
    old, welcome = with_output()
    session = old.conn.session
    c = client_of(SUBPROTOCOL_PROTO)
    forged = f"{welcome.session_id}.not-the-secret"
    [action] = c.send(ev.Hello(resume_token=forged, last_seq={2: 0}))
    assert action.session_id == welcome.session_id
    welcome2, error = c.decode(c.conn.resume(session, T0))
    assert not welcome2.resumed and welcome2.session_id != welcome.session_id
    assert error.stream_id == 2 and error.code is ErrorCode.RESUME_FAILED
    assert c.conn.session is not session and not session.attached  # the real session still waits
    assert session.streams[2].seq == 3


@pytest.mark.parametrize("subprotocol", BOTH)
def test_drain_sends_goaway_once_then_refuses_requests(subprotocol: str) -> None:
    c, _ = opened(subprotocol)
    c.send(ev.Request(stream_id=1, text="running"))
    [goaway] = c.decode(c.conn.drain(reconnect_after_ms=250))
    assert isinstance(goaway, ev.GoAway) and goaway.reconnect_after_ms == 250
    assert c.conn.drain() == []
    [refused] = c.send(ev.Request(stream_id=2, text="new"))
    assert refused == ev.Error(stream_id=2, code=ErrorCode.DRAINING, retryable=True, message=refused.message)
    assert 2 not in c.conn.session.streams
    # The running stream goes on.
    [delta] = c.chunk(1, "still here")
    assert delta.seq == 1
    [end] = c.finish(1)
    assert isinstance(end, ev.End)


def test_drain_before_welcome_sends_nothing() -> None:
    c = client_of(SUBPROTOCOL_PROTO)
    assert c.conn.drain() == []


def test_ack_frames_in_json() -> None:
    c, _ = opened(SUBPROTOCOL_JSON, flow_window=1 << 20)
    c.send(ev.Request(stream_id=1, text="x"))
    for i in range(4):
        c.chunk(1, f"{i}")
    session = c.conn.session
    assert c.send_raw(json.dumps({"type": "ack", "stream_id": 1, "seq": 3})) == []
    assert buffered_seqs(session, 1) == [4]
    c.finish(1)
    assert c.send_raw('{"type":"ack","stream_id":1,"seq":4,"done":true}') == []
    assert 1 not in session.streams and session.buffered == 0


def test_ack_frames_in_proto() -> None:
    c, welcome = opened(SUBPROTOCOL_PROTO, flow_window=1000)
    assert welcome.flow_window == 1000
    c.send(ev.Request(stream_id=1, text="x"))
    session = c.conn.session
    while not session.blocked:
        c.chunk(1, "x" * 36)
    assert c.send(ev.Ack(stream_id=1, seq=session.streams[1].seq)) == []
    assert session.buffered == 0 and not session.blocked


def test_json_ack_with_a_bad_field_is_invalid_payload() -> None:
    c, _ = opened(SUBPROTOCOL_JSON)
    out = c.send_raw('{"type":"ack","stream_id":"one","seq":1}')
    assert isinstance(out[0], ev.Error) and out[0].code is ErrorCode.INVALID_PAYLOAD


@pytest.mark.parametrize("subprotocol", BOTH)
def test_chunks_sent_on_a_connection_count_their_utf8_bytes_in_the_buffer(subprotocol: str) -> None:
    """A Delta's send path sizes ASCII, non-ASCII and binary chunks for the replay buffer and the stream's
    output as Session.record does: UTF-8 bytes, plus DELTA_OVERHEAD each."""
    c, _ = opened(subprotocol, flow_window=1 << 20)
    [start] = c.send(ev.Request(stream_id=1, text="go"))
    assert isinstance(start, StartStream)
    pieces: list[str | bytes] = ["Hel", "lo ", "é", "日本", b"\x00\xff", bytearray(b"abc"), "😀"]
    for piece in pieces:
        c.chunk(1, piece)
    session = c.conn.session
    as_sent = [bytes(p) if isinstance(p, bytearray) else p for p in pieces]
    assert session.streams[1].out_bytes == sum(cost(p) - DELTA_OVERHEAD for p in as_sent) == 3 + 3 + 2 + 6 + 2 + 3 + 4
    assert session.buffered == sum(cost(p) for p in as_sent) == buffer_cost(session)
    assert list(session.streams[1].pieces) == as_sent and session.streams[1].seq == len(pieces)


# ================================================================================ state has one owner (issue 39)
def test_join_says_whether_the_groups_changed() -> None:
    s = new_session()
    assert s.join("news", True) and s.groups == {"news"}
    assert not s.join("news", True)  # in it already
    assert s.join("news", False) and s.groups == frozenset()
    assert not s.join("news", False)


def test_the_journal_is_taken_shrunk_and_requeued_by_its_session() -> None:
    s = new_session()
    assert s.take_journal() is None  # not shared: no journal
    s.shrink_journal([1])
    assert s.journal is None
    s.start_journal()
    s.start(ev.Request(stream_id=1), T0)
    taken = s.take_journal()
    assert taken == [1, 0, None] and s.journal == []
    s.record(1, "x", T0)
    s.requeue_journal(taken)  # a write failed: back before what came since
    assert s.journal == [1, 0, None, 1, 1, "x"]
    s.shrink_journal([1, 0, None])
    assert s.journal == [1, 0, None]


def test_a_stream_moves_only_as_the_phase_table_says() -> None:
    s = new_session()
    s.start(ev.Request(stream_id=1), T0)
    st = s.streams[1]
    assert st.phase is StreamPhase.RUNNING and st.accepts("input") and not st.accepts("done")
    assert st.move("cancel") and st.cancelling and not st.accepts("input")
    assert not st.move("cancel")  # a second Cancel: nothing moves
    assert s.finish(1, T0 + 1, reason="cancelled") is not None
    assert st.phase is StreamPhase.STOPPED and st.cancelling and not st.running
    assert s.finish(1, T0 + 2) is None  # ended once
    s.ack(1, st.seq, done=True)
    assert 1 not in s.streams and st.phase is StreamPhase.FORGOTTEN
    s.start(ev.Request(stream_id=2), T0)
    s.finish(2, T0 + 1)
    assert s.streams[2].phase is StreamPhase.ENDED and not s.streams[2].cancelling
