"""Eager tasks: a coroutine's first step runs at once, in its own task, before `start` returns.

``loop.create_task`` runs nothing until the next turn of the event loop, so a model started for a
Request would begin one loop turn after the Request was read. Python 3.12 starts a task eagerly with a
public API (``asyncio.Task(..., eager_start=True)``), and :func:`start` uses it. Python 3.11 has no public
way: there the eager start is a named seam, a task starter that :mod:`lowlat_mw.servers.eager` installs
(:func:`install`) as the package is imported, since stepping a coroutine in a task of its own takes
asyncio's private ``_enter_task``/``_leave_task``, which only lowlat_mw/servers/ may use. Without it
(:func:`plain`), the first step runs in the next loop turn.

The seam's invariant, what every starter does: the task runs `coro` as ``loop.create_task`` would
(cancellation, ``asyncio.timeout``, context variables, the current task), and `finished` says whether
`coro` ended in its first step (its task then ends on its first turn without running anything more).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["TaskStarter", "install", "native", "plain", "start"]

TaskStarter = Callable[[asyncio.AbstractEventLoop, Coroutine[Any, Any, Any], "str | None"],
                       "tuple[asyncio.Task[Any], bool]"]


def native(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
           name: str | None = None) -> tuple[asyncio.Task[Any], bool]:
    """Python 3.12's eager start (public API): the first step runs before this returns."""
    task = asyncio.Task(coro, loop=loop, eager_start=True, name=name)  # type: ignore[call-arg]
    return task, task.done()


def plain(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
          name: str | None = None) -> tuple[asyncio.Task[Any], bool]:
    """A task as ``loop.create_task`` makes it: the first step in the next loop turn (never finished yet)."""
    return loop.create_task(coro, name=name), False


start: TaskStarter = native if sys.version_info >= (3, 12) else plain
"""``start(loop, coro, name=None) -> (task, finished)``: run `coro` as a task (named `name`) whose first step runs
now where the Python or an installed starter can. Call it from code running on `loop` (a task or a callback). A
coroutine whose task must be kept somewhere registers it itself (``asyncio.current_task()`` is this task from its
first step on): its first step may do its bookkeeping to the end and then wait (for a socket write, say),
unfinished, so the caller cannot tell."""


def install(starter: TaskStarter) -> None:
    """Make `starter` this process's :func:`start` (lowlat_mw.servers.eager does on Python 3.11)."""
    global start
    start = starter
