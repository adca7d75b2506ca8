"""Dynamic micro-batching: concurrent requests for a batch-capable model, run as one call.

A model marked batch-capable (``generate.batch = True``) takes a list of
:class:`~lowlat_mw.model.ModelRequest` and returns one reply per request, in order: each anything a model may
return (a whole reply, an iterable or async iterable of chunks, an awaitable of one of those). Requests that
arrive within ``max_batch_wait`` seconds of the first waiting one, up to ``max_batch_size`` of them, go to
one call; a full batch goes at once. Each reply then streams on its own request's stream: Cancel, errors
(a reply's iterator that fails fails that stream only) and flow control stay per stream. A call that fails
fails every request of its batch. One batcher per model, settings and executor, per event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from ..model import ModelInterrupted, ModelRequest, _in_pool, _kind

__all__ = ["Batcher", "batcher_for", "is_batched"]


def is_batched(fn: Any) -> bool:
    """Whether model callable `fn` is marked batch-capable (its ``batch`` attribute is true)."""
    return bool(getattr(fn, "batch", False))


async def _close(reply: Any) -> None:
    """Close a reply nobody will read (an async generator, a generator, a coroutine...)."""
    close = getattr(reply, "aclose", None) or getattr(reply, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            result = close()
            if inspect.isawaitable(result):
                await result


class Batcher:
    """Groups the requests for one batch-capable model on one event loop into calls of up to `max_size`.
    (It keeps no reference to its loop: the loop's table of batchers is weak, see :func:`batcher_for`.)"""

    def __init__(self, fn: Callable[[list[ModelRequest]], Any], executor: Executor | None, max_size: int,
                 max_wait: float) -> None:
        self.fn = fn
        self.executor = executor
        self.max_size = max_size
        self.max_wait = max_wait
        self.calls = 0  # model calls made (for tests and metrics)
        self._pending: list[tuple[ModelRequest, asyncio.Future[Any]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._kind = _kind(fn)  # (as a model's: asyncgen, async, gen or sync)

    async def reply(self, request: ModelRequest) -> Any:
        """Wait for `request`'s batch to run and return its reply (cancelled: it leaves the batch, or its reply
        is closed unread)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        pending = self._pending
        pending.append((request, future))
        if len(pending) >= self.max_size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait, self._flush)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._spawn(_close(future.result()))  # (answered, then cancelled before it woke up)
            else:  # still waiting: it leaves the batch, which then waits for another
                self._pending = [p for p in self._pending if p[1] is not future]
                if not self._pending and self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            raise

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = [(r, f) for r, f in self._pending if not f.done()]  # (a cancelled request left it)
        self._pending = []
        if batch:
            self._spawn(self._call(batch))

    async def _call(self, batch: list[tuple[ModelRequest, asyncio.Future[Any]]]) -> None:
        requests = [r for r, _ in batch]
        self.calls += 1
        replies: list[Any] = []
        try:
            if self._kind == "asyncgen":
                raise TypeError("a batch model returns a list of replies: an async generator function cannot")
            if self._kind == "async":
                replies = list(await self.fn(requests))
            else:  # sync or gen: in the pool, the list made there too (a lazy iterable's work stays off the loop)
                fn = self.fn
                replies = await _in_pool(asyncio.get_running_loop(), self.executor, lambda: list(fn(requests)))
            if len(replies) != len(batch):
                raise RuntimeError(f"the batch model returned {len(replies)} replies for {len(batch)} requests")
        except BaseException as exc:  # every request of the batch fails with it; what it did return is closed
            # (the call cancelled, by the loop ending say: the server stopped it, not the model's failure)
            error = exc if isinstance(exc, Exception) else ModelInterrupted("the batch call was cancelled")
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            for reply in replies:
                await _close(reply)
            if not isinstance(exc, Exception):
                raise
            return
        unread = []
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its stream was cancelled meanwhile
                unread.append(reply)
            else:
                future.set_result(reply)
        for reply in unread:  # (after every other member has its reply)
            await _close(reply)


_BATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, int, float, int], Batcher]] = (
    weakref.WeakKeyDictionary())


def batcher_for(fn: Any, executor: Executor | None, max_size: int, max_wait: float) -> Batcher:
    """The batcher of model `fn` (with these settings and executor) on the running event loop (made on first use;
    forgotten with the loop)."""
    loop = asyncio.get_running_loop()
    mine = _BATCHERS.get(loop)
    if mine is None:
        mine = _BATCHERS[loop] = {}
    key = (id(fn), max_size, max_wait, id(executor))
    found = mine.get(key)
    if found is None or found.fn is not fn:
        found = mine[key] = Batcher(fn, executor, max_size, max_wait)
    return found
