"""A warning when one step of an async model holds the event loop: ``time.sleep`` in an ``async def`` model.

An async model runs on the event loop, between its awaits. A blocking call there (``time.sleep``, a blocking
HTTP client, a long computation) stops every connection of the loop for as long as it runs: another client's
Ping waited 2.5 s behind one ``time.sleep(2.5)``. Nothing fails; everything is late. This module says so, once
per model, naming it.

How, without a clock read per token. Each event loop's :class:`LoopWatch` belongs to the loop's scheduler
(``AsyncScheduler.stalls``, runtime/timers.py). The driver names each model's task (:data:`TASK_PREFIX` and the
model's name) and, for an async model of an endpoint whose ``slow_step_warning`` is on, enters the task in its
loop's watch with that endpoint's threshold while it runs (a sync model's steps run in worker threads: they cannot
hold the loop, and are not watched). While a loop's watch holds any task, the process's one watching thread
(:data:`WATCHER`) looks at the loop every quarter of the smallest threshold there: it posts the loop a ping
(``call_soon_threadsafe`` of a builtin that notes it ran) and, at the next look, sees whether the loop ran it. A
ping still waiting means the loop has run no callback since it was posted: one step holds it. If the loop's
current task is the same watched task at two looks in a row (an overloaded loop, whose current task changes, is not
taken for one), and the ping has waited longer than that task's own threshold, a WARNING names the model: once per
model, then again at most every :data:`REPEAT` seconds, with how many such steps came since. Public asyncio only:
``loop.call_soon_threadsafe`` and ``asyncio.current_task(loop)``, from the watching thread; nothing of ours runs
on the loop for it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import weakref
from typing import Any

__all__ = ["REPEAT", "TASK_PREFIX", "WATCHER", "LoopWatch", "WatchingThread"]

log = logging.getLogger("lowlat_mw")

TASK_PREFIX = "lowlat-mw model "  # a model task's name: this, then the model's name (lowlat_mw.model.model_name)
REPEAT = 600.0  # seconds before the same model is named again (with the count of slow steps since)


class LoopWatch:
    """One event loop's watch, owned by the loop's scheduler: the async model tasks running on the loop, each with
    its endpoint's threshold, and what the watching thread saw of the loop (fields written by that thread alone).

    The driver, on the loop's thread (no call of ours per request: runtime/streams.py ``ModelRunner``): before a model
    runs there, ``WATCHER.watch(w)`` unless ``w.epoch == WATCHER.epoch``; for each async model's task, from its start
    to the top of one ``finally``, an entry ``w.running[task] = threshold``, and the first entry sets ``w.wake``
    (unless set) so that the sleeping thread looks at the loop.
    """

    __slots__ = ("__weakref__", "_loop", "epoch", "pinged", "posted", "posted_at", "reported", "running",
                 "stale_seen", "suspect", "wake")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # (its scheduler holds the loop; the watching thread must not keep it)
        self.running: dict[asyncio.Task[Any], float] = {}  # watched model task -> its endpoint's slow_step_warning
        self.epoch = -1  # the WATCHER.epoch in which the watching thread was told of this watch (WatchingThread.watch)
        self.wake: threading.Event | None = None  # the watching thread's wake-up (set by WatchingThread.watch)
        self.pinged = [0]  # the last ping the loop ran (the loop sets it: pinged.__setitem__)
        self.posted = 0  # the last ping posted, and when (the watching thread's)
        self.posted_at = 0.0
        self.suspect: asyncio.Task[Any] | None = None  # the loop's current task at the last look that found it held
        self.reported = 0  # the ping whose wait was last reported (one report per held step)
        self.stale_seen = 0  # looks that found the loop held past the smallest threshold (for tests)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The watched loop (None once it is gone)."""
        return self._loop()

    # ------------------------------------------------------------------ the watching thread
    def shortest(self) -> float:
        """The smallest threshold of the tasks watched now (inf: none)."""
        try:
            return min(self.running.values(), default=math.inf)
        except RuntimeError:  # (changed meanwhile, on the loop's thread: the next look reads it again)
            return math.inf

    def look(self, now: float, watcher: WatchingThread) -> None:
        """Does a step hold the loop (the last ping still waiting past a threshold), and whose?"""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        posted = self.posted
        if not posted or self.pinged[0] == posted:  # the loop ran the last ping: free; post the next one
            self.suspect = None
            self.posted, self.posted_at = posted + 1, now
            try:
                loop.call_soon_threadsafe(self.pinged.__setitem__, 0, posted + 1)
            except RuntimeError:  # closed meanwhile
                pass
            return
        held = now - self.posted_at
        if held < self.shortest():
            return
        self.stale_seen += 1
        if self.reported == posted:  # (this held step was reported already)
            return
        try:
            task = asyncio.current_task(loop)
        except RuntimeError:  # (the loop closed meanwhile)
            return
        if task is None or task.done() or self.suspect is not task:  # seen once: the next look confirms it
            self.suspect = task
            return
        threshold = self.running.get(task)
        if threshold is None or held < threshold:  # no watched model's (or not past its own endpoint's threshold)
            return
        self.suspect = None
        self.reported = posted
        watcher.report(task.get_name().removeprefix(TASK_PREFIX), held, threshold)


class WatchingThread:
    """The process's one watching thread (started when the first model of a loop is about to run), the loops'
    watches it looks at, and which models it has named. A forked child starts afresh (:meth:`_forked`): its own
    thread, new locks, nothing inherited that the parent's threads may have held at the fork."""

    def __init__(self) -> None:
        self.epoch = 0  # (one more in each forked child: its loops' watches are told of its own thread)
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()  # set when a loop's first watched task starts: the thread looks
        self._watches: list[weakref.ref[LoopWatch]] = []  # every loop's watch told of the thread, while it lives
        self._thread: threading.Thread | None = None
        self.said: dict[str, list[float]] = {}  # model -> [when it was last named, slow steps since] (the thread's)

    def _forked(self) -> None:
        """(In a forked child) No watching thread yet, and nothing of the parent's threads held: new locks, a new
        wake-up for the watches the parent knew (their models, if any run on here, are watched again once the next
        runner of their loop tells this thread of them: see :meth:`watch`)."""
        inherited = [w for ref in self._watches if (w := ref()) is not None]
        self.epoch += 1
        self._reset()
        for w in inherited:
            w.wake = self._wake

    def watch(self, watch: LoopWatch) -> None:
        """(The loop's thread, before its models run) Look at `watch`'s loop whenever it has watched tasks."""
        with self._lock:
            if watch.epoch != self.epoch:
                self._watches.append(weakref.ref(watch))
                watch.epoch, watch.wake = self.epoch, self._wake
            if self._thread is None:
                self._thread = threading.Thread(target=self._watching, name="lowlat-mw-stalls", daemon=True)
                self._thread.start()

    def _watching(self) -> None:
        """The thread: looks at every loop with watched tasks, as often as the smallest threshold there asks."""
        while True:
            wake = self._wake
            wake.clear()  # (before looking: a task entered after the look sets it again)
            with self._lock:
                watches = [w for ref in self._watches if (w := ref()) is not None]
                if len(watches) < len(self._watches):  # (the watches of loops gone)
                    self._watches = [weakref.ref(w) for w in watches]
            active = [w for w in watches if w.running and (loop := w.loop) is not None and not loop.is_closed()]
            del watches
            if not active:
                wake.wait()  # no model runs: sleep until one starts
                continue
            now = time.monotonic()
            for w in active:
                w.look(now, self)
            shortest = min(w.shortest() for w in active)
            time.sleep(shortest / 4 if shortest != math.inf else 0.001)

    def report(self, model: str, held: float, threshold: float) -> None:
        """(The thread) Log that `model`'s step has held the loop for `held` seconds: once per model per REPEAT s."""
        now = time.monotonic()
        seen = self.said.get(model)
        if seen is not None and now - seen[0] < REPEAT:
            seen[1] += 1
            return
        more = int(seen[1]) if seen is not None else 0
        self.said[model] = [now, 0]
        since = f" ({more} more such step(s) in the last {REPEAT:.0f} s)" if more else ""
        log.warning("model %s has held the event loop for %.0f ms in one step%s: a blocking call in an async model "
                    "(time.sleep, a blocking client, a long computation) stops every connection of this process; "
                    "await asyncio.to_thread(...) for it, or make the model a plain def or generator (run in worker "
                    "threads). (slow_step_warning: %.3g s)", model, held * 1000, since, threshold,
                    extra={"model": model, "held_ms": round(held * 1000)})


WATCHER = WatchingThread()
"""The process's watching thread and what it knows (one per process: a forked child resets it)."""

os.register_at_fork(after_in_child=WATCHER._forked)
