"""Bounded waits: poll a condition, or wait for an event, and fail saying what did not happen."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from support.time import WAIT

__all__ = ["wait_for", "wait_until", "wait_until_sync"]

T = TypeVar("T")
INTERVAL = 0.005  # how often a condition is polled (only how soon a wait notices, not how long it may take)


def _timed_out(timeout: float, what: Any, last: Any) -> AssertionError:
    return AssertionError(f"timed out after {timeout} s waiting for {what}; last value {last!r}")


class _Poll(Generic[T]):
    """One bounded poll of `predicate`: `done()` says whether it is true yet (its value in `value`), and raises
    AssertionError once `timeout` has passed. The waits below differ only in how they sleep between looks."""

    def __init__(self, predicate: Callable[[], T], timeout: float, what: Any) -> None:
        self.predicate, self.timeout, self.what = predicate, timeout, what
        self.deadline = time.monotonic() + timeout
        self.value: T

    def done(self) -> bool:
        self.value = self.predicate()
        if self.value:
            return True
        if time.monotonic() > self.deadline:
            raise _timed_out(self.timeout, self.what or self.predicate, self.value)
        return False


async def wait_until(predicate: Callable[[], T], timeout: float = WAIT, *, interval: float = INTERVAL,
                     what: str = "") -> T:
    """Poll `predicate()` until it returns something truthy, and return that; AssertionError after `timeout`."""
    poll = _Poll(predicate, timeout, what)
    while not poll.done():
        await asyncio.sleep(interval)
    return poll.value


def wait_until_sync(predicate: Callable[[], T], timeout: float = WAIT, *, interval: float = INTERVAL,
                    what: str = "") -> T:
    """`wait_until` for code outside an event loop (threads, browser drivers, subprocess logs)."""
    poll = _Poll(predicate, timeout, what)
    while not poll.done():
        time.sleep(interval)
    return poll.value


async def wait_for(event: asyncio.Event | threading.Event, timeout: float = WAIT, *, what: str = "") -> None:
    """Wait until `event` is set (an asyncio.Event, or a threading.Event set from another thread); AssertionError
    after `timeout`."""
    if isinstance(event, asyncio.Event):
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            raise _timed_out(timeout, what or event, False) from None
        return
    await wait_until(event.is_set, timeout, what=what or str(event))
