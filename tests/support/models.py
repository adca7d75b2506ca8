"""Models the tests share."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["StopProbe"]


class StopProbe:
    """A model that streams ticks until it is stopped, and tells when it was: its ``finally`` sets the event of
    the request's prompt (``event(prompt)``), which a test waits on to see a cancel reach the model."""

    def __init__(self) -> None:
        self.stopped: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def event(self, prompt: str) -> threading.Event:
        with self.lock:
            return self.stopped.setdefault(prompt, threading.Event())

    async def ticks(self, req: Any) -> AsyncIterator[str]:
        try:
            i = 0
            while True:
                yield f"tick{i} "
                i += 1
                await asyncio.sleep(0.005)  # (the model's pace: a token every 5 ms)
        finally:
            self.event(req.prompt).set()
