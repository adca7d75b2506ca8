"""One scheduler per process (per event loop / per thread pool) for every connection's timers.

`DeadlineQueue` is the sans-IO core: a heap of (deadline, key) with lazy invalidation, so a
connection whose deadline moves costs nothing until its old entry reaches the top.
`AsyncScheduler` drives it from one asyncio timer handle per event loop; `ThreadScheduler` from
one daemon thread. Neither creates a task or thread per connection. A loop's scheduler also owns the
loop's watch for async model steps that hold it (:class:`~lowlat_mw.runtime.stalls.LoopWatch`).
"""

from __future__ import annotations

import asyncio
import heapq
import math
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from ..protocol.heartbeat import HeartbeatFrames
from .stalls import LoopWatch

__all__ = ["AsyncScheduler", "DeadlineQueue", "ThreadScheduler", "TimerTarget", "Watcher", "cpu_clock"]


def _forget_closed(table: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]) -> None:
    """Drop the entries of closed event loops from a per-loop table. A value that refers to its loop (a scheduler
    through its timer handle) keeps its weak key alive, so the table alone would keep every finished loop, and
    what its value holds (every connection still in its timers), for the life of the process."""
    try:
        closed = [loop for loop in table if loop.is_closed()]
    except RuntimeError:  # another thread's loop added its entry meanwhile: left for the next new loop
        return
    for loop in closed:
        table.pop(loop, None)


def _cpu_clock() -> Callable[[], float]:
    """This thread's CPU time where it is fine-grained (compression is CPU work: time spent preempted by
    other load is not its cost), else the monotonic clock (Windows counts thread time in 15.6 ms ticks)."""
    try:
        if time.get_clock_info("thread_time").resolution <= 1e-6:
            return time.thread_time
    except (AttributeError, ValueError, OSError):  # pragma: no cover - platforms without a thread clock
        pass
    return time.perf_counter  # pragma: no cover


cpu_clock = _cpu_clock()
"""The clock the drivers give the protocol machines (``meter``): their compressors time their own work with it."""


_INF = math.inf
_heappush = heapq.heappush
_monotonic = time.monotonic


class DeadlineQueue:
    """Keys with deadlines; `pop_due(now)` returns the keys whose deadline has come, in deadline order
    (and in the order they were set, for one deadline).

    A timer wheel with exact slots: the keys due at one time share a slot (an insertion-ordered dict), and
    a heap holds only the slot times. The asyncio scheduler puts deadlines on a shared grid
    (:func:`fire_time`), so ten thousand idle connections' heartbeats fall into about a hundred slots:
    moving a key is two dict operations, and the heap compares floats, not (when, n, key) tuples, only
    when a new slot time appears.
    """

    def __init__(self) -> None:
        self._slots: dict[float, dict[Hashable, None]] = {}
        self._times: list[float] = []  # heap of slot times; a time whose slot emptied is skipped when it comes up
        self._when: dict[Hashable, float] = {}

    def __len__(self) -> int:
        return len(self._when)

    def set(self, key: Hashable, when: float) -> None:
        """Schedule `key` at `when` (replacing any earlier schedule; inf unschedules)."""
        known = self._when
        old = known.get(key)
        if old == when:
            return
        slots = self._slots
        if old is not None:
            slot = slots[old]
            del slot[key]
            if not slot:
                del slots[old]
        if when == _INF:
            if old is not None:
                del known[key]
            return
        known[key] = when
        slot = slots.get(when)
        if slot is None:
            slot = slots[when] = {}
            _heappush(self._times, when)
        slot[key] = None

    def discard(self, key: Hashable) -> None:
        """Forget `key`."""
        self.set(key, _INF)

    def next_deadline(self) -> float:
        """The earliest live deadline, or inf."""
        times, slots = self._times, self._slots
        while times and times[0] not in slots:
            heapq.heappop(times)
        return times[0] if times else _INF

    def pop_due(self, now: float) -> list[Hashable]:
        """Remove and return every key due at `now`."""
        due: list[Hashable] = []
        times, slots, known = self._times, self._slots, self._when
        while times and times[0] <= now:
            slot = slots.pop(heapq.heappop(times), None)
            if slot:
                for key in slot:
                    del known[key]
                due.extend(slot)
        if len(times) > 64 and len(times) > 4 * len(slots):  # drop the times of emptied slots
            self._times = sorted(slots)  # (a sorted list is a heap)
        return due


class TimerTarget(Protocol):
    """What a scheduler drives: usually a connection driver."""

    def on_timer(self, now: float) -> float:
        """Do what is due at `now`; return the next deadline (inf for none)."""
        ...


class Watcher(Protocol):
    """What :meth:`AsyncScheduler.watch` calls back: a connection driver watching its heartbeat's Pong."""

    def on_watch(self, now: float, token: object) -> None:
        """The watch of `token` is due at `now`: act if what it watched for has not happened."""
        ...


MAX_SLACK = 0.25  # seconds a timer may fire late, at most (for deadlines >= 16 s away)
_SLACK_WAIT = 64 * MAX_SLACK  # waits from this long on get the whole slack
_HALF_SLACK = MAX_SLACK / 2


def fire_time(when: float, now: float) -> float:
    """When to wake up for deadline `when`: late by at most 1/64 of the wait (and MAX_SLACK).

    Rounded up to a power-of-two grid, so the deadlines of many connections (30 s heartbeats
    opened at different moments) share one wake-up instead of each costing its own. Waits under
    64 ms are exact.
    """
    wait = when - now
    if wait >= _SLACK_WAIT:  # (the grid is MAX_SLACK: 30 s heartbeats, most deadlines)
        return math.ceil(when / MAX_SLACK) * MAX_SLACK
    if wait >= _SLACK_WAIT / 2:  # (half of it: a 10 s Pong timeout)
        return math.ceil(when / _HALF_SLACK) * _HALF_SLACK
    if wait <= 0.064:
        return when
    grid = 2.0 ** math.floor(math.log2(min(MAX_SLACK, wait / 64)))
    return math.ceil(when / grid) * grid


class AsyncScheduler:
    """Drives every registered target of one event loop from a single timer handle.

    Targets fire in deadline order, never early, and late by at most 1/64 of the time they were
    scheduled ahead (:func:`fire_time`), so that timers due close together share a wake-up.
    """

    by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncScheduler] = (
        weakref.WeakKeyDictionary()
    )
    """The scheduler of each loop (see :meth:`current`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue = DeadlineQueue()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = math.inf
        # Watches (see watch): on the fire_time grid, the watchers and tokens due at each time in a list.
        self._watches: dict[float, list[tuple[Watcher, object]]] = {}
        self._watch_times: list[float] = []  # heap of the times in _watches
        # The last watch's deadline, `now` and list: the Pings of one wake-up share their Pong's timeout.
        self._watch_memo: tuple[float, float, list[tuple[Watcher, object]]] | None = None
        # Stop driving a target: forget its deadline (a stale wake-up finds nothing due).
        self.cancel: Callable[[TimerTarget], None] = self._queue.discard
        self.stalls = LoopWatch(loop)
        self.heartbeats = HeartbeatFrames()  # the Pings of this loop's connections, made once
        """The async model steps of this loop watched for holding it (runtime/stalls.py)."""

    @classmethod
    def current(cls) -> AsyncScheduler:
        """The scheduler of the running event loop (created on first use)."""
        loop = asyncio.get_running_loop()
        sched = cls.by_loop.get(loop)
        if sched is None:
            _forget_closed(cls.by_loop)  # (a new loop: the schedulers of finished ones go)
            sched = cls.by_loop[loop] = cls(loop)
        return sched

    def __len__(self) -> int:
        return len(self._queue)

    def schedule(self, target: TimerTarget, when: float) -> None:
        """Call ``target.on_timer`` at monotonic time `when` (replaces an earlier schedule)."""
        if when != _INF:
            when = fire_time(when, _monotonic())  # the queue holds wake-up times, on a shared grid
        self._queue.set(target, when)
        if when < self._armed_at:
            self._arm(when)

    def watch(self, watcher: Watcher, when: float, token: object, now: float) -> None:
        """Call ``watcher.on_watch(now, token)`` at `when` (late by at most :func:`fire_time`'s slack from `now`,
        the caller's clock reading); never cancelled. For a deadline that almost always turns out unneeded, a
        heartbeat Pong's timeout (the Pong comes first): a target's own timer would move there at the Ping and back
        at the Pong, twice per heartbeat of every idle connection, where a watch is an entry in the list of its grid
        time, and one call that finds nothing to do. The entry keeps `watcher` referenced until then (a closed
        connection's driver: up to heartbeat_timeout longer); its ``on_watch`` knows that the connection ended."""
        memo = self._watch_memo
        if memo is not None and memo[0] == when and memo[1] == now:  # (the same wake-up's Pings: same timeout)
            memo[2].append((watcher, token))
            return
        at = fire_time(when, now)
        slot = self._watches.get(at)
        if slot is None:
            slot = self._watches[at] = []
            _heappush(self._watch_times, at)
            if at < self._armed_at:
                self._arm(at)
        self._watch_memo = (when, now, slot)
        slot.append((watcher, token))

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = when
        if when == math.inf:
            self._handle = None
            return
        self._handle = self._loop.call_later(max(0.0, when - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed_at = math.inf
        now = time.monotonic()
        times = self._watch_times
        while times and times[0] <= now:  # (first: an overdue Pong's target then fires with the others below)
            fired = self._watches.pop(heapq.heappop(times))
            self._watch_memo = None  # (it may be this list: a watch made by a watcher, due at once, came up here)
            for watcher, token in fired:
                try:
                    watcher.on_watch(now, token)
                except Exception:
                    _failed()
        queue = self._queue
        last, at = math.nan, math.nan  # (the idle connections of one wake-up mostly return one next deadline)
        for target in queue.pop_due(now):
            try:
                nxt = target.on_timer(now)  # type: ignore[attr-defined]
            except Exception:  # a broken target must not stop the timers of all others
                _failed()
                continue
            if nxt != last:
                last = nxt
                at = fire_time(nxt, now) if nxt != _INF else nxt
            queue.set(target, at)
        when = queue.next_deadline()
        self._arm(min(when, times[0]) if times else when)


def _failed() -> None:
    import logging

    logging.getLogger("lowlat_mw").exception("timer callback failed")


class ThreadScheduler:
    """Drives every registered target from one daemon thread (for thread-per-connection servers)."""

    _instance: ThreadScheduler | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._queue = DeadlineQueue()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="lowlat-mw-timers", daemon=True)
        self._thread.start()

    @classmethod
    def current(cls) -> ThreadScheduler:
        """The process-wide scheduler (started on first use)."""
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __len__(self) -> int:
        return len(self._queue)

    def schedule(self, target: TimerTarget, when: float) -> None:
        """Call ``target.on_timer`` at monotonic time `when` from the scheduler thread."""
        with self._cond:
            self._queue.set(target, when)
            self._cond.notify()

    def cancel(self, target: TimerTarget) -> None:
        """Stop driving `target`."""
        with self._cond:
            self._queue.discard(target)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    nxt = self._queue.next_deadline()
                    if nxt <= now:
                        due = self._queue.pop_due(now)
                        break
                    self._cond.wait(None if nxt == math.inf else nxt - now)
            for target in due:
                try:
                    when = target.on_timer(now)  # type: ignore[attr-defined]
                except Exception:
                    import logging

                    logging.getLogger("lowlat_mw").exception("timer callback failed")
                    continue
                with self._cond:
                    self._queue.set(target, when)
