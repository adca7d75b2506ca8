"""A warning when one step of an async model holds the event loop: ``time.sleep`` in an ``async def`` model.

An async model runs on the event loop, between its awaits. A blocking call there (``time.sleep``, a blocking
HTTP client, a long computation) stops every connection of the loop for as long as it runs: another client's
Ping waited 2.5 s behind one ``time.sleep(2.5)``. Nothing fails; everything is late. This module says so, once
per model, naming it.

How, without a clock read per token: the driver names each model's task (:data:`TASK_PREFIX` and the model's
name) and counts the model tasks running on each loop (:attr:`Watch.running`). While any runs, one daemon thread
per process looks at the loop every quarter of the threshold (the ``slow_step_warning`` setting): it posts the
loop a ping (``call_soon_threadsafe`` of a builtin that notes it ran) and, at the next look, sees whether the loop
ran it. A ping still waiting after the threshold means the loop has run no callback for that long: one step holds
it. If the loop's current task is the same model task at two looks in a row, that model's step is the one (an
overloaded loop, whose current task changes, is not taken for it), and a WARNING names the model: once per model,
then again at most every :data:`REPEAT` seconds, with how many such steps came since. Public asyncio only:
``loop.call_soon_threadsafe`` and ``asyncio.current_task(loop)``, from the watching thread; nothing of ours runs
on the loop for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from typing import Any

__all__ = ["REPEAT", "TASK_PREFIX", "WAKE", "WATCHES", "Watch", "watch"]

log = logging.getLogger("lowlat_mw")

TASK_PREFIX = "lowlat-mw model "  # a model task's name: this, then the model's name (lowlat_mw.model.model_name)
REPEAT = 600.0  # seconds before the same model is named again (with the count of slow steps since)
WAKE = threading.Event()  # set by the driver when a loop's first model task starts: the watching thread looks


class Watch:
    """One event loop's watch: how many model tasks run there (counted on the loop by the driver), and what the
    watching thread saw."""

    __slots__ = ("_loop", "pinged", "posted", "posted_at", "reported", "running", "stale_seen", "suspect",
                 "threshold")

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold: float) -> None:
        self._loop = weakref.ref(loop)  # (not the loop itself: the table of watches is weak by loop)
        self.threshold = threshold
        self.running = 0  # model tasks running on the loop (the driver's count, on the loop's thread)
        self.pinged = [0]  # the last ping the loop ran (the loop sets it: pinged.__setitem__)
        self.posted = 0  # the last ping posted, and when (the watching thread's)
        self.posted_at = 0.0
        self.suspect: asyncio.Task[Any] | None = None  # the loop's current task at the last look that found it held
        self.reported = 0  # the ping whose wait was last reported (one report per held step)
        self.stale_seen = 0  # looks that found the loop held past the threshold (for tests)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The watched loop (None once it is gone)."""
        return self._loop()

    def look(self, now: float) -> None:
        """(The watching thread) Does a step hold the loop (the last ping waiting past the threshold), and whose?"""
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
        if held < self.threshold:
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
        self.suspect = None
        self.reported = posted
        name = task.get_name()
        if name.startswith(TASK_PREFIX):
            _report(name[len(TASK_PREFIX):], held, self.threshold)


_said: dict[str, list[float]] = {}  # model -> [when it was last named, slow steps since]
_said_lock = threading.Lock()


def _report(model: str, held: float, threshold: float) -> None:
    """Log that `model`'s step has held the loop for `held` seconds: once per model per REPEAT seconds."""
    now = time.monotonic()
    with _said_lock:
        seen = _said.get(model)
        if seen is not None and now - seen[0] < REPEAT:
            seen[1] += 1
            return
        more = int(seen[1]) if seen is not None else 0
        _said[model] = [now, 0]
    since = f" ({more} more such step(s) in the last {REPEAT:.0f} s)" if more else ""
    log.warning("model %s has held the event loop for %.0f ms in one step%s: a blocking call in an async model "
                "(time.sleep, a blocking client, a long computation) stops every connection of this process; await "
                "asyncio.to_thread(...) for it, or make the model a plain def or generator (run in worker threads). "
                "(slow_step_warning: %.3g s)", model, held * 1000, since, threshold,
                extra={"model": model, "held_ms": round(held * 1000)})


WATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Watch] = weakref.WeakKeyDictionary()  # (by watch())
_lock = threading.Lock()
_thread: list[threading.Thread] = []


def _forked() -> None:
    """In a forked child: no watching thread yet, and no lock held by the parent's."""
    global _lock, _said_lock
    _lock, _said_lock = threading.Lock(), threading.Lock()
    _thread.clear()


os.register_at_fork(after_in_child=_forked)


def _watching() -> None:
    """The watching thread: looks at every loop where models run, as often as the smallest threshold asks."""
    while True:
        WAKE.clear()
        with _lock:
            active = [w for w in WATCHES.values() if w.running > 0]
        if not active:
            WAKE.wait()  # nothing runs: sleep until a model starts
            continue
        now = time.monotonic()
        for w in active:
            w.look(now)
        time.sleep(min(w.threshold for w in active) / 4)


def watch(loop: asyncio.AbstractEventLoop, threshold: float) -> Watch | None:
    """The watch of `loop` (made, and the watching thread started, on first use), warning past `threshold`
    seconds: the smallest asked for on the loop. None when `threshold` is 0 (``slow_step_warning`` off)."""
    if threshold <= 0:
        return None
    with _lock:
        found = WATCHES.get(loop)
        if found is None:
            found = WATCHES[loop] = Watch(loop, threshold)
        elif threshold < found.threshold:
            found.threshold = threshold
        if not _thread:
            _thread.append(threading.Thread(target=_watching, name="lowlat-mw-stalls", daemon=True))
            _thread[0].start()
    return found
