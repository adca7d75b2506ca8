"""Timers: the sans-IO DeadlineQueue, and the asyncio / thread schedulers that drive it.

The queue is tested with plain numbers. The schedulers own a real clock, so their tests use real
deadlines of a few milliseconds, bounded by short timeouts.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlat_mw.runtime.timers import MAX_SLACK, AsyncScheduler, DeadlineQueue, ThreadScheduler, fire_time

INF = math.inf


# ============================================================================ DeadlineQueue
def test_pop_due_returns_keys_in_deadline_order() -> None:
    q = DeadlineQueue()
    for key, when in [("a", 3.0), ("b", 1.0), ("c", 2.0), ("d", 9.0)]:
        q.set(key, when)
    assert len(q) == 4
    assert q.next_deadline() == 1.0
    assert q.pop_due(0.5) == []
    assert q.pop_due(3.0) == ["b", "c", "a"]  # due at exactly its deadline
    assert len(q) == 1
    assert q.next_deadline() == 9.0


def test_ties_pop_in_scheduling_order() -> None:
    q = DeadlineQueue()
    for key in "xyz":
        q.set(key, 5.0)
    assert q.pop_due(5.0) == ["x", "y", "z"]


@pytest.mark.parametrize(("first", "second"), [(1.0, 5.0), (5.0, 1.0)], ids=["later", "earlier"])
def test_replacing_a_deadline(first: float, second: float) -> None:
    q = DeadlineQueue()
    q.set("k", first)
    q.set("other", 3.0)
    q.set("k", second)
    assert len(q) == 2
    assert q.next_deadline() == min(second, 3.0)
    assert q.pop_due(min(first, second)) == (["k"] if second < first else [])
    assert q.pop_due(10.0) == (["other"] if second < first else ["other", "k"])
    assert q.pop_due(100.0) == []  # the stale entry never fires
    assert len(q) == 0


def test_setting_the_same_deadline_twice_is_one_entry() -> None:
    q = DeadlineQueue()
    q.set("k", 2.0)
    q.set("k", 2.0)
    assert q.pop_due(2.0) == ["k"]
    assert q.pop_due(2.0) == []


def test_discard() -> None:
    q = DeadlineQueue()
    q.set("a", 1.0)
    q.set("b", 2.0)
    q.discard("a")
    q.discard("never-scheduled")  # no error
    assert len(q) == 1
    assert q.next_deadline() == 2.0
    assert q.pop_due(10.0) == ["b"]


def test_inf_unschedules() -> None:
    q = DeadlineQueue()
    q.set("a", 1.0)
    q.set("a", INF)
    q.set("b", INF)  # never scheduled at all
    assert len(q) == 0
    assert q.next_deadline() == INF
    assert q.pop_due(1e18) == []


def test_rescheduling_back_to_an_old_deadline_fires_once() -> None:
    q = DeadlineQueue()
    q.set("k", 1.0)
    q.set("k", 2.0)
    q.set("k", 1.0)
    q.discard("k")
    q.set("k", 1.0)
    assert q.pop_due(5.0) == ["k"]
    assert q.pop_due(5.0) == []


def test_next_deadline_skips_stale_entries() -> None:
    q = DeadlineQueue()
    q.set("a", 1.0)
    q.set("b", 2.0)
    q.set("a", 3.0)
    q.discard("b")
    assert q.next_deadline() == 3.0
    assert DeadlineQueue().next_deadline() == INF


def test_stale_entries_do_not_pile_up() -> None:
    q = DeadlineQueue()
    for i in range(10_000):
        q.set("busy", 1000.0 + i)  # a connection whose deadline keeps moving
    q.set("idle", 5.0)
    assert q.pop_due(6.0) == ["idle"]
    assert len(q._times) <= 64  # compacted: only live entries remain
    assert q.next_deadline() == 1000.0 + 9999


ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 5), st.one_of(st.integers(0, 20).map(float), st.just(INF))),
        st.tuples(st.just("discard"), st.integers(0, 5), st.just(0.0)),
        st.tuples(st.just("pop"), st.just(0), st.integers(0, 20).map(float)),
    ),
    max_size=60,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_queue_matches_a_dict_model(script: list[tuple[str, int, float]]) -> None:
    q = DeadlineQueue()
    model: dict[int, float] = {}
    order: dict[int, int] = {}  # when each key's deadline was last changed (ties pop in that order)
    for step, (op, key, value) in enumerate(script):
        if op == "set":
            if value == INF:
                model.pop(key, None)
            else:
                if model.get(key) != value:
                    order[key] = step
                model[key] = value
            q.set(key, value)
        elif op == "discard":
            model.pop(key, None)
            q.discard(key)
        else:
            due = q.pop_due(value)
            expected = {k for k, w in model.items() if w <= value}
            assert sorted(due) == sorted(expected)  # each due key exactly once
            assert due == sorted(due, key=lambda k: (model[k], order[k]))  # in deadline order, ties as set
            for k in due:
                del model[k]
        assert len(q) == len(model)
        assert q.next_deadline() == min(model.values(), default=INF)


# ============================================================================ shared target
class Target:
    """A timer target that records when it fired and asks to be called again per `plan`."""

    def __init__(self, name: str, log: list[tuple[str, float]], plan: Callable[[int, float], float] | None = None,
                 on_fire: Callable[[], None] | None = None) -> None:
        self.name, self.log, self.plan, self.on_fire = name, log, plan, on_fire
        self.fired = 0
        self.threads: set[str] = set()

    def on_timer(self, now: float) -> float:
        self.fired += 1
        self.threads.add(threading.current_thread().name)
        self.log.append((self.name, now))
        nxt = self.plan(self.fired, now) if self.plan else INF
        if self.on_fire:
            self.on_fire()
        return nxt


class Boom:
    fired = 0

    def on_timer(self, now: float) -> float:
        self.fired += 1
        raise RuntimeError("broken target")


# ============================================================================ AsyncScheduler
def _live_handles(loop: asyncio.AbstractEventLoop, sched: AsyncScheduler) -> int:
    scheduled = getattr(loop, "_scheduled", None)
    if scheduled is None:  # pragma: no cover - not a BaseEventLoop
        return 1
    return sum(1 for h in scheduled if not h.cancelled() and getattr(h, "_callback", None) == sched._fire)


async def _wait(event: asyncio.Event, timeout: float = 1.0) -> None:
    await asyncio.wait_for(event.wait(), timeout)


async def test_async_scheduler_fires_in_deadline_order_from_one_handle() -> None:
    loop = asyncio.get_running_loop()
    sched = AsyncScheduler(loop)
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    tasks_before = len(asyncio.all_tasks())
    t0 = time.monotonic()
    offsets = {"a": 0.030, "b": 0.010, "c": 0.020, "d": 0.015, "e": 0.025}
    targets = {}
    for name, off in offsets.items():
        targets[name] = Target(name, log, on_fire=lambda: len(log) == len(offsets) and done.set())
        sched.schedule(targets[name], t0 + off)
    assert len(sched) == 5
    assert len(asyncio.all_tasks()) == tasks_before  # no task per target
    assert _live_handles(loop, sched) == 1  # one loop timer for all of them
    await _wait(done)
    assert [name for name, _ in log] == ["b", "d", "c", "e", "a"]
    for name, fired_at in log:
        assert fired_at >= t0 + offsets[name]
    assert all(t.threads == {threading.current_thread().name} for t in targets.values())
    assert len(sched) == 0
    assert _live_handles(loop, sched) == 0  # nothing left armed


async def test_async_scheduler_reschedules_from_on_timer_return_value() -> None:
    sched = AsyncScheduler(asyncio.get_running_loop())
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    target = Target("t", log, plan=lambda n, now: now + 0.005 if n < 3 else INF,
                    on_fire=lambda: len(log) == 3 and done.set())
    sched.schedule(target, time.monotonic() + 0.005)
    await _wait(done)
    await asyncio.sleep(0.02)  # would fire a 4th time if inf did not unschedule
    assert target.fired == 3
    times = [t for _, t in log]
    assert all(b - a >= 0.005 - 1e-9 for a, b in itertools.pairwise(times))  # (float rounding of now + 0.005)
    assert len(sched) == 0


async def test_async_scheduler_moving_a_deadline() -> None:
    sched = AsyncScheduler(asyncio.get_running_loop())
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    late = Target("late", log, on_fire=done.set)
    moved = Target("moved", log)
    early = Target("early", log)
    t0 = time.monotonic()
    sched.schedule(moved, t0 + 0.005)
    sched.schedule(late, t0 + 0.030)
    sched.schedule(moved, t0 + 0.020)  # later: the armed handle fires early, finds nothing, re-arms
    sched.schedule(early, t0 + 0.040)
    sched.schedule(early, t0 + 0.010)  # earlier: re-armed sooner
    await _wait(done)
    assert [n for n, _ in log] == ["early", "moved", "late"]
    assert log[1][1] >= t0 + 0.020


async def test_async_scheduler_cancel_and_inf() -> None:
    sched = AsyncScheduler(asyncio.get_running_loop())
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    t0 = time.monotonic()
    cancelled, unscheduled, kept = Target("x", log), Target("y", log), Target("z", log, on_fire=done.set)
    sched.schedule(cancelled, t0 + 0.005)
    sched.schedule(unscheduled, t0 + 0.005)
    sched.schedule(kept, t0 + 0.015)
    sched.cancel(cancelled)
    sched.schedule(unscheduled, INF)
    await _wait(done)
    assert [n for n, _ in log] == ["z"]


async def test_async_scheduler_survives_a_broken_target(caplog: pytest.LogCaptureFixture) -> None:
    sched = AsyncScheduler(asyncio.get_running_loop())
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    boom = Boom()
    t0 = time.monotonic()
    sched.schedule(boom, t0 + 0.002)
    sched.schedule(Target("ok", log, on_fire=done.set), t0 + 0.004)
    with caplog.at_level(logging.ERROR, logger="lowlat_mw"):
        await _wait(done)
    assert boom.fired == 1
    assert "timer callback failed" in caplog.text
    assert len(sched) == 0  # the broken target is dropped, not retried in a loop


async def test_async_scheduler_past_deadline_fires_soon() -> None:
    sched = AsyncScheduler(asyncio.get_running_loop())
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    sched.schedule(Target("past", log, on_fire=done.set), time.monotonic() - 5)
    await _wait(done, 0.5)
    assert len(log) == 1


class Watching(Target):
    """A target that also watches: `due` tokens make its timer due at the watch (as a Pong still awaited)."""

    def __init__(self, name: str, log: list[tuple[str, float]], sched: AsyncScheduler, due: set[object],
                 on_fire: Callable[[], None] | None = None) -> None:
        super().__init__(name, log, on_fire=on_fire)
        self.sched, self.due = sched, due
        self.watched: list[tuple[object, float]] = []

    def on_watch(self, now: float, token: object) -> None:
        self.watched.append((token, now))
        if token in self.due:
            self.sched.schedule(self, now)


async def test_async_scheduler_watches_fire_in_order_never_early_and_share_the_targets_wake_up() -> None:
    """A watch is called at its time, never cancelled; a watcher that makes its timer due then has it run in the
    same wake-up (the same `now`), before the timer's own, later deadline."""
    loop = asyncio.get_running_loop()
    sched = AsyncScheduler(loop)
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    answered = Watching("answered", log, sched, set())
    overdue = Watching("overdue", log, sched, {"pong 2"}, on_fire=done.set)
    t0 = time.monotonic()
    sched.schedule(answered, t0 + 30)
    sched.schedule(overdue, t0 + 30)  # (the next Ping: far away)
    sched.watch(overdue, t0 + 0.02, "pong 2", t0)
    sched.watch(answered, t0 + 0.01, "pong 1", t0)
    assert _live_handles(loop, sched) == 1 and len(sched) == 2  # the watches hold no timer of their own
    await _wait(done)
    assert [token for token, _ in answered.watched] == ["pong 1"] and answered.watched[0][1] >= t0 + 0.01
    [(token, watched_at)] = overdue.watched
    assert token == "pong 2" and watched_at >= t0 + 0.02
    assert log == [("overdue", watched_at)]  # its timer ran in the watch's wake-up
    assert sched._watches == {} and len(sched) == 1  # answered's timer is left (overdue's: Target plans no more)
    sched.cancel(answered)


async def test_watches_of_one_wake_up_share_a_list_and_a_fired_list_is_never_reused() -> None:
    """The Pings of one wake-up watch the same timeout from the same `now`: one list, no second grid lookup. Once
    that list fired, a watch of the same deadline from the same `now` gets a list of its own, and fires too."""
    loop = asyncio.get_running_loop()
    sched = AsyncScheduler(loop)
    log: list[tuple[str, float]] = []
    first = asyncio.Event()
    a, b = Watching("a", log, sched, set()), Watching("b", log, sched, {"pong b"}, on_fire=first.set)
    t0 = time.monotonic()
    sched.watch(a, t0 + 0.01, "pong a", t0)
    sched.watch(b, t0 + 0.01, "pong b", t0)
    assert list(sched._watches.values()) == [[(a, "pong a"), (b, "pong b")]]
    await _wait(first, 10.0)
    assert a.watched == [("pong a", a.watched[0][1])] and a.watched[0][1] >= t0 + 0.01 and sched._watches == {}
    done = asyncio.Event()
    c = Watching("c", log, sched, {"stale now"}, on_fire=done.set)
    sched.watch(c, t0 + 0.01, "stale now", t0)  # (a caller's stale `now`: already due, still called)
    assert len(sched._watches) == 1
    await _wait(done, 10.0)
    assert [token for token, _ in c.watched] == ["stale now"] and sched._watches == {}


async def test_a_watch_made_by_a_watcher_and_due_at_once_fires_and_so_does_the_next_one_of_that_time() -> None:
    """A watcher that watches again, for a time already due: that list is made, fired and gone in the same wake-up;
    a later watch of the same time and `now` (a target's, in that wake-up) must not be appended to it."""
    sched = AsyncScheduler(asyncio.get_running_loop())
    fired: list[str] = []
    done = asyncio.Event()

    class Again:
        def __init__(self, name: str) -> None:
            self.name = name

        def on_watch(self, now: float, token: object) -> None:
            fired.append(self.name)
            if self.name == "first":
                sched.watch(Again("due at once"), now, "t", now)
            if self.name == "last":
                done.set()

    class WatchesToo:
        def on_timer(self, now: float) -> float:
            sched.watch(Again("last"), now, "t", now)
            return INF

    t0 = time.monotonic()
    sched.watch(Again("first"), t0 + 0.005, "t", t0)
    sched.schedule(WatchesToo(), t0 + 0.005)
    await _wait(done, 10.0)
    assert fired == ["first", "due at once", "last"] and sched._watches == {}


async def test_targets_of_one_wake_up_with_different_next_deadlines_each_fire_at_their_own() -> None:
    """_fire reuses the grid time of the previous target's next deadline only when the deadline is the same."""
    loop = asyncio.get_running_loop()
    sched = AsyncScheduler(loop)
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    t0 = time.monotonic()
    soon = Target("soon", log, plan=lambda n, now: now + 0.05 if n == 1 else INF)
    later = Target("later", log, plan=lambda n, now: now + 0.5 if n == 1 else INF,
                   on_fire=lambda: done.set() if later.fired == 2 else None)
    also_soon = Target("also soon", log, plan=lambda n, now: now + 0.05 if n == 1 else INF)
    for target in (soon, later, also_soon):
        sched.schedule(target, t0 + 0.01)
    await _wait(done, 10.0)
    first = {name: at for name, at in log[:3]}
    assert len(set(first.values())) == 1  # one wake-up
    woke = first["soon"]
    again = {name: at for name, at in log[3:]}
    assert [name for name, _ in log[3:]][-1] == "later"  # after both "soon" ones: not the grid time of the last
    assert again["soon"] >= woke + 0.05 and again["also soon"] >= woke + 0.05
    assert again["later"] >= woke + 0.5  # never early: not the grid time of the deadline before it


async def test_async_scheduler_survives_a_broken_watcher(caplog: pytest.LogCaptureFixture) -> None:
    sched = AsyncScheduler(asyncio.get_running_loop())
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    ok = Watching("ok", log, sched, {"t"}, on_fire=done.set)
    t0 = time.monotonic()
    sched.watch(Boom(), t0 + 0.002, "t", t0)  # (no on_watch at all)
    sched.watch(ok, t0 + 0.004, "t", t0)
    with caplog.at_level(logging.ERROR, logger="lowlat_mw"):
        await _wait(done)
    assert "timer callback failed" in caplog.text and [n for n, _ in log] == ["ok"]


def test_the_scheduler_of_a_finished_loop_and_what_it_holds_go_when_another_loop_starts() -> None:
    """A scheduler refers to its loop (its timer handle does), so its weak key in ``by_loop`` never died by itself:
    every finished loop stayed, with every target still in its queue. A new loop's scheduler drops them."""
    import gc
    import weakref

    class Held:
        def on_timer(self, now: float) -> float:
            return now + 3600

    refs: list[weakref.ref[object]] = []

    async def leave_a_timer() -> None:
        sched = AsyncScheduler.current()
        held = Held()
        sched.schedule(held, time.monotonic() + 3600)  # (never due: still queued when the loop ends)
        refs.extend((weakref.ref(asyncio.get_running_loop()), weakref.ref(sched), weakref.ref(held)))

    for _ in range(3):
        asyncio.run(leave_a_timer())
    left: list[asyncio.AbstractEventLoop] = []

    async def another() -> None:
        AsyncScheduler.current()
        left.extend(AsyncScheduler.by_loop)  # (a loop of another thread may be there too: the Flask bridge's)
        left.append(asyncio.get_running_loop())

    asyncio.run(another())
    gc.collect()
    assert [r() for r in refs] == [None] * 9  # loops, schedulers and their targets
    running = left.pop()
    assert running in left and not any(loop.is_closed() for loop in left if loop is not running)


def test_fire_time_is_never_early_and_late_by_at_most_a_64th_of_the_wait() -> None:
    now = 1000.0
    for wait in (0.0, 0.01, 0.064, 0.1, 0.5, 1.0, 9.99, 10.0, 30.0, 120.0, 600.0):
        for jitter in (0.0, 0.0001234, 0.3333):
            when = now + wait + jitter
            fire = fire_time(when, now)
            assert when <= fire <= when + min(MAX_SLACK, (when - now) / 64) + 1e-9, (wait, jitter, fire - when)
    assert fire_time(now + 0.05, now) == now + 0.05  # short waits are exact
    # deadlines close together (a heartbeat of connections opened a few ms apart) share one wake-up
    assert len({fire_time(now + 30 + i * 0.003, now) for i in range(50)}) <= 2


@given(st.floats(0, 1e7), st.floats(0, 1000))
def test_fire_time_is_the_largest_power_of_two_grid_within_the_slack(now: float, wait: float) -> None:
    """fire_time writes its common grids out (0.25 s for waits from 16 s, 0.125 s from 8 s): the same as
    rounding up to 2 ** floor(log2(min(MAX_SLACK, wait / 64)))."""
    when = now + wait
    wait = when - now
    if wait <= 0.064:
        expected = when
    else:
        grid = 2.0 ** math.floor(math.log2(min(MAX_SLACK, wait / 64)))
        expected = math.ceil(when / grid) * grid
    assert fire_time(when, now) == expected


async def test_async_scheduler_deadlines_close_together_share_a_wake_up() -> None:
    loop = asyncio.get_running_loop()
    sched = AsyncScheduler(loop)
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    fires = 0
    real_fire = sched._fire

    def counting_fire() -> None:
        nonlocal fires
        fires += 1
        real_fire()

    sched._fire = counting_fire  # type: ignore[method-assign]
    t0 = time.monotonic()
    n = 100
    deadlines = {f"t{i}": t0 + 0.7 + i * 0.0005 for i in range(n)}  # 100 deadlines within 50 ms, 0.7 s ahead
    for name, when in deadlines.items():
        sched.schedule(Target(name, log, on_fire=lambda: len(log) == n and done.set()), when)
    await _wait(done, 3.0)
    assert fires <= 8, fires  # exact deadlines would take about 100 wake-ups
    for name, fired_at in log:
        assert deadlines[name] <= fired_at < deadlines[name] + 0.7 / 64 + 0.05  # never early; late by the slack


async def test_async_scheduler_current_is_one_per_loop() -> None:
    a = AsyncScheduler.current()
    assert AsyncScheduler.current() is a
    assert a._loop is asyncio.get_running_loop()


def test_async_scheduler_current_differs_between_loops() -> None:
    async def get() -> AsyncScheduler:
        return AsyncScheduler.current()

    first = asyncio.run(get())
    second = asyncio.run(get())
    assert first is not second


# ============================================================================ ThreadScheduler
@pytest.fixture(scope="module")
def thread_sched() -> Iterator[ThreadScheduler]:
    before = set(threading.enumerate())
    sched = ThreadScheduler()
    new = set(threading.enumerate()) - before
    assert [t.name for t in new] == ["lowlat-mw-timers"]  # one thread, started right away
    assert all(t.daemon for t in new)  # never keeps the process alive
    yield sched


def _wait_thread(event: threading.Event, timeout: float = 2.0) -> None:
    assert event.wait(timeout), "timer did not fire in time"


def test_thread_scheduler_fires_in_deadline_order_from_one_thread(thread_sched: ThreadScheduler) -> None:
    sched = thread_sched
    threads_before = set(threading.enumerate())
    log: list[tuple[str, float]] = []
    done = threading.Event()
    n = 20
    t0 = time.monotonic()
    targets = []
    for i in range(n):
        # scheduled in scrambled order
        off = 0.005 + ((i * 7) % n) * 0.001
        target = Target(f"{off:.3f}", log, on_fire=lambda: len(log) == n and done.set())
        targets.append((target, off))
        sched.schedule(target, t0 + off)
    _wait_thread(done)
    assert [name for name, _ in log] == sorted(name for name, _ in log)
    for target, off in targets:
        assert target.fired == 1
        assert target.log and all(now >= t0 + off for name, now in target.log if name == target.name)
        assert target.threads == {"lowlat-mw-timers"}
    assert set(threading.enumerate()) - threads_before == set()  # no thread per target


def test_thread_scheduler_reschedules_and_cancels(thread_sched: ThreadScheduler) -> None:
    sched = thread_sched
    log: list[tuple[str, float]] = []
    done = threading.Event()
    again = Target("again", log, plan=lambda k, now: now + 0.003 if k < 3 else INF,
                   on_fire=lambda: sum(1 for n, _ in log if n == "again") == 3 and done.set())
    cancelled = Target("cancelled", log)
    t0 = time.monotonic()
    sched.schedule(cancelled, t0 + 0.002)
    sched.schedule(again, t0 + 0.002)
    sched.cancel(cancelled)
    _wait_thread(done)
    time.sleep(0.01)  # a 4th call would come 3 ms after the 3rd
    assert again.fired == 3
    assert cancelled.fired == 0


def test_thread_scheduler_survives_a_broken_target(thread_sched: ThreadScheduler,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    sched = thread_sched
    log: list[tuple[str, float]] = []
    done = threading.Event()
    boom = Boom()
    t0 = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="lowlat_mw"):
        sched.schedule(boom, t0 + 0.001)
        sched.schedule(Target("ok", log, on_fire=done.set), t0 + 0.004)
        _wait_thread(done)
    assert boom.fired == 1
    assert "timer callback failed" in caplog.text


def test_thread_scheduler_wakes_up_for_an_earlier_deadline(thread_sched: ThreadScheduler) -> None:
    sched = thread_sched
    log: list[tuple[str, float]] = []
    done = threading.Event()
    far = Target("far", log)
    sched.schedule(far, time.monotonic() + 60)  # the thread now sleeps for a minute ...
    t0 = time.monotonic()
    sched.schedule(Target("near", log, on_fire=done.set), t0 + 0.003)  # ... and must wake up for this
    _wait_thread(done, 10.0)  # far under the minute the thread would otherwise sleep; loose for loaded CI
    assert time.monotonic() - t0 < 10.0
    sched.cancel(far)
    assert far.fired == 0


def test_thread_scheduler_current_is_a_singleton() -> None:
    assert ThreadScheduler.current() is ThreadScheduler.current()
