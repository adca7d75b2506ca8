"""Heartbeat manager and idle reaper, driven by a fake clock (plain numbers)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlat_mw.protocol.heartbeat import Heartbeat, HeartbeatAction, IdleReaper

PING, DEAD = HeartbeatAction.SEND_PING, HeartbeatAction.PEER_DEAD
T0 = 1000.0  # the clock does not start at zero


def hb(interval: float = 30.0, max_interval: float = 120.0, timeout: float = 10.0, now: float = T0) -> Heartbeat:
    return Heartbeat(interval, max_interval, timeout, now)


def pong(h: Heartbeat, now: float) -> None:
    """The peer answers the outstanding Ping (a Pong is a received frame, not application traffic)."""
    h.on_receive(now, application=False)
    h.on_pong(h.ping_id, now)


# ============================================================================ pinging
def test_first_ping_at_start_plus_interval() -> None:
    h = hb()
    assert h.deadline() == T0 + 30
    assert h.poll(T0) is None
    assert h.poll(T0 + 29.999) is None
    assert h.poll(T0 + 30) is PING
    assert h.ping_id == 1
    assert h.awaiting == 1


def test_poll_is_idempotent_between_deadlines() -> None:
    h = hb()
    assert h.poll(T0 + 30) is PING
    for t in (30.0, 31.0, 35.0, 39.999):
        assert h.poll(T0 + t) is None
    assert h.ping_id == 1  # no extra ping while one is outstanding


def test_late_poll_pings_once() -> None:
    h = hb()
    assert h.poll(T0 + 500) is PING  # the driver was late: one Ping, not a burst
    assert h.poll(T0 + 500) is None
    assert h.deadline() == T0 + 510


def test_pong_records_rtt() -> None:
    h = hb()
    assert h.rtt is None
    h.poll(T0 + 30)
    pong(h, T0 + 30.25)
    assert h.rtt == pytest.approx(0.25)
    assert h.awaiting is None


def test_pong_for_another_ping_is_ignored() -> None:
    h = hb()
    h.poll(T0 + 30)
    h.on_pong(h.ping_id + 7, T0 + 30.1)
    assert h.rtt is None
    assert h.awaiting == h.ping_id


def test_unsolicited_pong_before_any_ping_is_harmless() -> None:
    h = hb()
    h.on_pong(0, T0 + 1)  # id 0 never names a real Ping
    h.on_pong(1, T0 + 2)  # nor does an id we have not sent yet
    assert h.rtt is None
    assert h.poll(T0 + 30) is PING
    assert h.current == 30


def test_client_pings_are_not_traffic() -> None:
    h = hb()
    for k in range(1, 6):
        h.on_receive(T0 + 30 * k - 1, application=False)  # the peer pings us now and then
        assert h.poll(T0 + 30 * k) is PING
        pong(h, T0 + 30 * k + 0.1)
    assert h.current == 30


def test_ping_ids_increase_and_wrap_within_u32() -> None:
    h = hb(interval=1, max_interval=1, timeout=0.5)
    ids = []
    t = T0
    for _ in range(5):
        t = h.deadline()
        assert h.poll(t) is PING
        ids.append(h.ping_id)
        pong(h, t + 0.1)
    assert ids == [1, 2, 3, 4, 5]
    h.ping_id = 0xFFFFFFFF
    assert h.poll(h.deadline()) is PING
    assert h.ping_id == 1


# ============================================================================ peer death
def test_silent_peer_is_dead_exactly_at_ping_plus_timeout() -> None:
    h = hb()
    assert h.poll(T0 + 30) is PING
    assert h.deadline() == T0 + 40
    assert h.poll(T0 + 39.999999) is None
    assert h.poll(T0 + 40) is DEAD
    assert h.poll(T0 + 41) is DEAD  # stays dead


@pytest.mark.parametrize("application", [True, False], ids=["request", "client ping"])
def test_any_frame_after_ping_counts_as_alive(application: bool) -> None:
    h = hb()
    h.poll(T0 + 30)
    h.on_receive(T0 + 35, application=application)  # not a Pong
    assert h.deadline() == T0 + 60
    assert h.poll(T0 + 40) is None
    assert h.poll(T0 + 60) is PING
    assert h.rtt is None  # no Pong, no RTT


def test_pong_without_on_receive_also_proves_life() -> None:
    h = hb()
    h.poll(T0 + 30)
    h.on_pong(h.ping_id, T0 + 31)
    assert h.poll(T0 + 40) is None
    assert h.deadline() == T0 + 60


def test_late_pong_for_an_older_ping_proves_life_but_gives_no_rtt() -> None:
    h = hb(interval=1, max_interval=1, timeout=5)
    h.poll(T0 + 1)
    h.on_receive(T0 + 1.5, application=False)  # e.g. a client Ping: alive, Ping 1 no longer awaited
    assert h.poll(T0 + 2) is PING  # Ping 2
    h.on_pong(1, T0 + 2.5)  # the answer to Ping 1 arrives late
    assert h.rtt is None
    assert h.deadline() == T0 + 3  # but it proves the peer alive: no timeout, next Ping on schedule
    assert h.poll(T0 + 3) is PING


def test_frame_before_the_ping_does_not_count_for_it() -> None:
    h = hb()
    h.on_receive(T0 + 29)
    assert h.poll(T0 + 30) is PING
    assert h.poll(T0 + 40) is DEAD


def test_late_pong_after_timeout_deadline_but_before_poll_saves_the_peer() -> None:
    h = hb()
    h.poll(T0 + 30)
    pong(h, T0 + 40.5)  # the driver polls late; the Pong is already in
    assert h.poll(T0 + 41) is None


def test_timeout_longer_than_interval() -> None:
    h = hb(interval=1, max_interval=1, timeout=5)
    assert h.poll(T0 + 1) is PING
    for t in (2, 3, 4, 5.9):
        assert h.poll(T0 + t) is None  # no second Ping while the first is unanswered
    assert h.poll(T0 + 6) is DEAD


# ============================================================================ adaptive interval
def _run(h: Heartbeat, busy: list[bool]) -> list[float]:
    """Walk through pings; before each, the peer sends traffic when busy[i]. Returns ping times."""
    times = []
    for is_busy in busy:
        due = h.deadline()
        if is_busy:
            h.on_receive(due - 0.5)
        assert h.poll(due) is PING
        times.append(due)
        pong(h, due + 0.01)
    return times


def test_interval_doubles_while_peer_is_busy_and_caps_at_max() -> None:
    h = hb()
    times = _run(h, [False] + [True] * 6)
    gaps = [b - a for a, b in zip([T0, *times], times, strict=False)]
    assert gaps == pytest.approx([30, 30, 60, 120, 120, 120, 120])


def test_quiet_period_resets_interval_to_base() -> None:
    h = hb()
    times = _run(h, [False, True, True, True, False, False])
    gaps = [b - a for a, b in zip([T0, *times], times, strict=False)]
    assert gaps == pytest.approx([30, 30, 60, 120, 120, 30])
    # the gap after the quiet stretch is back to the base interval
    assert h.deadline() - times[-1] == pytest.approx(30)


def test_quiet_peer_that_answers_pings_is_probed_at_the_base_interval() -> None:
    # A Pong answering our own Ping is not traffic: an idle connection keeps the 30 s interval.
    h = hb()
    times = _run(h, [False] * 6)
    gaps = [b - a for a, b in zip([T0, *times], times, strict=False)]
    assert gaps == pytest.approx([30] * 6)


def test_traffic_without_pong_also_stretches() -> None:
    h = hb()
    assert h.poll(T0 + 30) is PING
    h.on_receive(T0 + 31)  # alive, but never answers with a Pong
    assert h.poll(T0 + 60) is PING
    assert h.deadline() == T0 + 70  # waiting for that one
    h.on_receive(T0 + 65)
    assert h.deadline() == T0 + 60 + 60  # traffic since the last ping: interval doubled


# ============================================================================ deadline() property
steps = st.lists(
    st.tuples(st.sampled_from(["recv", "pong", "wait"]), st.floats(0.001, 200, allow_nan=False)),
    max_size=40,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(
    st.floats(0.5, 60), st.integers(1, 8), st.floats(0.1, 90), steps,
)
def test_deadline_is_exactly_when_poll_next_acts(interval: float, mult: int, timeout: float,
                                                  script: list[tuple[str, float]]) -> None:
    h = hb(interval=interval, max_interval=interval * mult, timeout=timeout)
    now = T0
    for kind, dt in script:
        target = now + dt
        # Walk the clock through every deadline up to `target`.
        while h.deadline() <= target:
            d = h.deadline()
            # Just before the deadline nothing happens, and polling does not move it ...
            before = math.nextafter(d, -math.inf)
            if before >= now:
                assert h.poll(before) is None
                assert h.deadline() == d
            # ... and at the deadline (or right away if it already passed) something does.
            now = max(now, d)
            action = h.poll(now)
            assert action is not None
            if action is DEAD:
                assert h.poll(now + 1) is DEAD
                return
            if kind == "pong" and action is PING:
                now += min(timeout, h.current) / 2  # before the timeout and before the next Ping
                pong(h, now)
        now = max(now, target)
        assert h.poll(now) is None  # between deadlines nothing is due
        if kind == "recv":
            h.on_receive(now)


# ============================================================================ idle reaper
def test_reaper_expires_after_timeout_without_streams() -> None:
    r = IdleReaper(600, T0)
    assert r.deadline(0) == T0 + 600
    assert not r.expired(T0 + 599.999, 0)
    assert r.expired(T0 + 600, 0)


@pytest.mark.parametrize("streams", [1, 2, 8])
def test_reaper_never_expires_while_streams_run(streams: int) -> None:
    r = IdleReaper(600, T0)
    assert r.deadline(streams) == math.inf
    for t in (600, 6000, 1e9):
        assert not r.expired(T0 + t, streams)


def test_touch_pushes_the_deadline_out() -> None:
    r = IdleReaper(600, T0)
    r.touch(T0 + 500)
    assert r.deadline(0) == T0 + 1100
    assert not r.expired(T0 + 1099, 0)
    assert r.expired(T0 + 1100, 0)


def test_reaper_counts_from_stream_end() -> None:
    r = IdleReaper(10, T0)
    assert not r.expired(T0 + 100, 1)  # a long stream
    r.touch(T0 + 100)  # its End
    assert not r.expired(T0 + 109, 0)
    assert r.expired(T0 + 110, 0)


@pytest.mark.parametrize("streams", [0, 1])
def test_reaper_never_expires_while_the_session_listens_in_push_groups(streams: int) -> None:
    r = IdleReaper(10, T0)
    assert r.deadline(streams, {"news"}) == math.inf
    assert not r.expired(T0 + 1e9, streams, frozenset({"news"}))
    assert r.expired(T0 + 10, 0, frozenset())  # out of every group: idle again


def test_deadline_as_if_answered_is_the_next_ping() -> None:
    h = Heartbeat(30, 120, 10, T0)
    assert h.poll(T0 + 30) is HeartbeatAction.SEND_PING
    assert h.deadline() == T0 + 40  # the Pong's timeout
    assert h.deadline(answered=True) == T0 + 60  # where the Pong will put it
