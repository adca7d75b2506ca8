"""Dynamic micro-batching: concurrent requests for a batch-capable model, run as one call.

A model marked batch-capable (``generate.batch = True``) takes a list of
:class:`~lowlat_mw.model.ModelRequest` and returns one reply per request, in order: each anything a model may
return (a whole reply, an iterable or async iterable of chunks, an awaitable of one of those). Requests that
arrive within ``max_batch_wait`` seconds of the first waiting one, up to ``max_batch_size`` of them, go to
one call; a full batch goes at once. Each reply then streams on its own request's stream: Cancel, errors
(a reply's iterator that fails fails that stream only) and flow control stay per stream. A call that fails
fails every request of its batch. One batcher per model and event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from ..model import ModelRequest

__all__ = ["Batcher", "batcher_for", "is_batched"]


def is_batched(fn: Any) -> bool:
    """Whether model callable `fn` is marked batch-capable (its ``batch`` attribute is true)."""
    return bool(getattr(fn, "batch", False))


class Batcher:
    """Groups the requests for one batch-capable model on one event loop into calls of up to `max_size`."""

    def __init__(self, fn: Callable[[list[ModelRequest]], Any], loop: asyncio.AbstractEventLoop,
                 executor: Executor | None, max_size: int, max_wait: float) -> None:
        self.fn = fn
        self.loop = loop
        self.executor = executor
        self.max_size = max_size
        self.max_wait = max_wait
        self.calls = 0  # model calls made (for tests and metrics)
        self._pending: list[tuple[ModelRequest, asyncio.Future[Any]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(type(fn), "__call__", None))  # noqa: B004

    async def reply(self, request: ModelRequest) -> Any:
        """Wait for `request`'s batch to run and return its reply (cancelled: it leaves the batch, or its reply
        is closed unread)."""
        future = self.loop.create_future()
        pending = self._pending
        pending.append((request, future))
        if len(pending) >= self.max_size:
            self._flush()
        elif self._timer is None:
            self._timer = self.loop.call_later(self.max_wait, self._flush)
        try:
            return await future
        except asyncio.CancelledError:  # (cancelled while it waits: it leaves the batch, which then waits for another)
            self._pending = [p for p in self._pending if p[1] is not future]
            if not self._pending and self._timer is not None:
                self._timer.cancel()
                self._timer = None
            raise

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = [(r, f) for r, f in self._pending if not f.done()]  # (a cancelled request left it)
        self._pending = []
        if batch:
            task = self.loop.create_task(self._call(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, batch: list[tuple[ModelRequest, asyncio.Future[Any]]]) -> None:
        requests = [r for r, _ in batch]
        self.calls += 1
        try:
            if self._is_async:
                replies = await self.fn(requests)
            else:
                replies = await self.loop.run_in_executor(self.executor, self.fn, requests)
                if inspect.isawaitable(replies):
                    replies = await replies
            replies = list(replies)
            if len(replies) != len(batch):
                raise RuntimeError(f"the batch model returned {len(replies)} replies for {len(batch)} requests")
        except BaseException as exc:  # every request of the batch fails with it
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), reply in zip(batch, replies, strict=True):
            if not future.done():
                future.set_result(reply)
            else:  # its stream was cancelled meanwhile: close what it would have read
                close = getattr(reply, "aclose", None) or getattr(reply, "close", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        result = close()
                        if inspect.isawaitable(result):
                            await result


_BATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, int, float], Batcher]] = (
    weakref.WeakKeyDictionary())


def batcher_for(fn: Any, executor: Executor | None, max_size: int, max_wait: float) -> Batcher:
    """The batcher of model `fn` on the running event loop (made on first use)."""
    loop = asyncio.get_running_loop()
    mine = _BATCHERS.get(loop)
    if mine is None:
        mine = _BATCHERS[loop] = {}
    key = (id(fn), max_size, max_wait)  # (two endpoints may serve one model with different settings)
    found = mine.get(key)
    if found is None or found.fn is not fn:
        found = mine[key] = Batcher(fn, loop, executor, max_size, max_wait)
    return found
