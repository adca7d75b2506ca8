"""The eager model start on Python 3.11: a coroutine's first step runs in its own task before `start` returns.

Python 3.12 does this with a public API (``Task(..., eager_start=True)``, :func:`lowlat_mw.runtime.eager.native`);
3.11 has none, so :func:`start` does it by hand with asyncio's private ``_enter_task``/``_leave_task``, here in
servers/, the one place that may touch another project's internals, behind the runtime's public seam
(:func:`lowlat_mw.runtime.eager.install`; :func:`install` is called as the package is imported). It creates the
task, makes it the loop's current task, steps the coroutine once in the task's context, and puts the reading
task back. When the coroutine waits on something, the task takes over the very future it waits on, so
cancellation, ``asyncio.timeout`` and context variables behave as in any task. A coroutine that finishes in its
first step leaves a task that ends on its first turn without running anything more.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import sys
from collections.abc import Coroutine
from typing import Any

from lowlat_mw.runtime import eager

__all__ = ["install", "start"]


def install() -> None:
    """Install :func:`start` as the runtime's eager start where the Python has no public one (3.11)."""
    if not _NATIVE:
        eager.install(start)


def start(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
          name: str | None = None) -> tuple[asyncio.Task[Any], bool]:
    """Run `coro` as a task (named `name`) whose first step runs now; returns the task and whether `coro` already
    finished (:data:`lowlat_mw.runtime.eager.start`)."""
    rest = _Steps()
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
    """A coroutine as its task sees it, stepped once already before the task's first turn: that turn picks up
    where the step left off (the future the coroutine waits on, or how it ended); every later step goes straight
    to the coroutine."""

    # (no __init__: its state starts as the class's defaults; one call less for each model started)
    coro: Coroutine[Any, Any, Any]
    picked = False  # the task's first turn came
    finished = False
    value: Any = None
    pending: Any = None
    error: BaseException | None = None

    def _pick_up(self) -> Any:
        finished, pending, error, value = self.finished, self.pending, self.error, self.value
        self.pending = self.error = self.value = None
        self.picked = True
        if not finished:
            return pending  # the task waits on it as if the coroutine had just yielded it
        try:
            if error is not None:
                raise error
            raise StopIteration(value)
        finally:
            error = None  # (no cycle exception -> traceback -> this frame -> exception)

    def send(self, value: Any) -> Any:
        if self.picked:
            return self.coro.send(value)
        return self.__next__()

    def __next__(self) -> Any:  # what the task calls for send(None)
        if self.picked:
            return self.coro.send(None)
        pending = self._pick_up()
        if pending is None:  # a bare yield (``asyncio.sleep(0)``): this first turn is the one it waited for
            return self.coro.send(None)
        return pending

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:  # type: ignore[override]
        """Thrown into (cancelled); before the first turn, the future the step waits on is cancelled first, as
        Task.cancel does (a coroutine that already ended: _pick_up raises how)."""
        try:
            if not self.picked:
                pending = self._pick_up()
                if pending is not None and hasattr(pending, "cancel"):
                    pending.cancel()
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


_NATIVE = sys.version_info >= (3, 12)
if not _NATIVE:
    from asyncio.tasks import _enter_task, _leave_task  # type: ignore[attr-defined]
