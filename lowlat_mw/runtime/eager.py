"""Eager tasks: a coroutine's first step runs at once, in its own task, before `start` returns.

``loop.create_task`` runs nothing until the next turn of the event loop, so a model started for a
Request would begin one loop turn after the Request was read. Python 3.12 can start a task eagerly
(``asyncio.Task(..., eager_start=True)``); on 3.11 :func:`start` does the same by hand: it creates the
task, makes it the loop's current task, steps the coroutine once in the task's context, and puts the
reading task back. When the coroutine waits on something, the task takes over the very future it
waits on, so cancellation, ``asyncio.timeout`` and context
variables behave as in any task. A coroutine that finishes in its first step leaves a task that
ends on its first turn without running anything more.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import sys
from collections.abc import Coroutine
from typing import Any

__all__ = ["start"]


def start(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
          name: str | None = None) -> tuple[asyncio.Task[Any], bool]:
    """Run `coro` as a task (named `name`) whose first step runs now; returns the task and whether `coro` already
    finished.

    Call it from code running on `loop` (a task or a callback). A coroutine whose task must be kept somewhere
    registers it itself (``asyncio.current_task()`` is this task from its first step on): its first step may do its
    bookkeeping to the end and then wait (for a socket write, say), unfinished, so the caller cannot tell.
    """
    if _NATIVE:
        task = asyncio.Task(coro, loop=loop, eager_start=True, name=name)  # type: ignore[call-arg]
        return task, task.done()
    rest = _Rest()  # (no __init__: its state starts as the class's defaults)
    rest.coro = coro
    context = contextvars.copy_context()
    task = loop.create_task(rest, context=context, name=name)
    current = asyncio.current_task(loop)
    if current is not None:
        _leave_task(loop, current)
    _enter_task(loop, task)
    try:
        rest.pending = context.run(coro.send, None)
    except StopIteration as stop:
        rest.finished, rest.value = True, stop.value
    except BaseException as exc:  # the task raises it on its first turn, as a task would
        rest.finished, rest.error = True, exc
    finally:
        _leave_task(loop, task)
        if current is not None:
            _enter_task(loop, current)
    return task, rest.finished


class _Steps(collections.abc.Coroutine):  # type: ignore[type-arg]
    """A coroutine as its task sees it once the first turn picked it up: every step goes straight to it."""

    coro: Coroutine[Any, Any, Any]

    def send(self, value: Any) -> Any:
        return self.coro.send(value)

    def __next__(self) -> Any:  # what the task calls for send(None)
        return self.coro.send(None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:  # type: ignore[override]
        try:
            if val is None and tb is None:
                return self.coro.throw(typ)
            return self.coro.throw(typ, val, tb)
        finally:
            typ = val = tb = None  # no cycle exception -> traceback -> this frame -> exception

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Any:
        return self

    def __iter__(self) -> Any:
        return self


class _Rest(_Steps):
    """A coroutine stepped once already, before its task's first turn: that turn picks up where the step
    left off (the future the coroutine waits on, or how it ended), and the object becomes a plain
    :class:`_Steps` for the rest."""

    finished = False
    value: Any = None
    pending: Any = None
    error: BaseException | None = None

    def _pick_up(self) -> Any:
        finished, pending, error, value = self.finished, self.pending, self.error, self.value
        self.pending = self.error = self.value = None
        self.__class__ = _Steps  # type: ignore[assignment]
        if not finished:
            return pending  # the task waits on it as if the coroutine had just yielded it
        try:
            if error is not None:
                raise error
            raise StopIteration(value)
        finally:
            error = None  # (no cycle, as in throw)

    def send(self, value: Any) -> Any:
        return self.__next__()

    def __next__(self) -> Any:
        pending = self._pick_up()
        if pending is None:  # a bare yield (``asyncio.sleep(0)``): this first turn is the one it waited for
            return self.coro.send(None)
        return pending

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:  # type: ignore[override]
        """Cancelled (or thrown into) before its first turn (a coroutine that already ended: _pick_up raises how)."""
        pending = self._pick_up()
        if pending is not None and hasattr(pending, "cancel"):
            pending.cancel()  # what Task.cancel does to the future a task waits on
        try:
            return _Steps.throw(self, typ, val, tb)
        finally:
            typ = val = tb = None  # (no cycle, as in _Steps.throw)


_NATIVE = sys.version_info >= (3, 12)
if not _NATIVE:
    from asyncio.tasks import _enter_task, _leave_task  # type: ignore[attr-defined]
