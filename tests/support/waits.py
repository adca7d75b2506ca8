"""Bounded waits: poll a condition, or wait for an event, and fail saying what did not happen."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from support.time import WAIT

__all__ = ["wait_for", "wait_until", "wait_until_sync"]

T = TypeVar("T")
INTERVAL = 0.005  # how often a condition is polled (only how soon a wait notices, not how long it may take)


def _timed_out(timeout: float, what: Any, last: Any) -> AssertionError:
    return AssertionError(f"timed out after {timeout} s waiting for {what}; last value {last!r}")


async def wait_until(predicate: Callable[[], T], timeout: float = WAIT, *, interval: float = INTERVAL,
                     what: str = "") -> T:
    """Poll `predicate()` until it returns something truthy, and return that; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what or predicate, last)
        await asyncio.sleep(interval)


def wait_until_sync(predicate: Callable[[], T], timeout: float = WAIT, *, interval: float = INTERVAL,
                    what: str = "") -> T:
    """`wait_until` for code outside an event loop (threads, browser drivers, subprocess logs)."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what or predicate, last)
        time.sleep(interval)


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
