"""Log lines a client can cause, bounded per client: a flood of bad input is not a flood of log lines.

A client that sends a thousand bad frames on a thousand connections (or is refused a thousand times)
would otherwise write a thousand lines. :class:`LogBudget` lets the first few lines per key (the client
address) per window through at their level, sends the rest to DEBUG, and adds to the next line let
through how many were held back ("... (37 similar held back in the last 60 s)"). The process-wide budget
is :data:`CLIENT_LOGS`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["CLIENT_LOGS", "LogBudget"]


class LogBudget:
    """At most `burst` lines per key in each `window` seconds at their own level; the rest at DEBUG.

    Thread-safe (Flask's and Django's threads log through it too). At most `max_keys` keys are
    remembered (the oldest window goes first): an address scan cannot grow it without bound.
    """

    def __init__(self, burst: int = 10, window: float = 60.0, *, max_keys: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.window, self.max_keys, self.clock = burst, window, max_keys, clock
        self._keys: dict[object, list[float | int]] = {}  # key -> [window start, lines let through, held back]
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget every key (a test's fresh start)."""
        with self._lock:
            self._keys.clear()

    def log(self, logger: logging.Logger, level: int, key: object, msg: str, *args: object,
            **kwargs: object) -> None:
        """``logger.log(level, msg, *args)`` within the key's budget (past it at DEBUG)."""
        now = self.clock()
        with self._lock:
            entry = self._keys.get(key)
            if entry is None or now - entry[0] >= self.window:
                held = int(entry[2]) if entry is not None else 0
                if entry is None and len(self._keys) >= self.max_keys:
                    del self._keys[next(iter(self._keys))]
                self._keys.pop(key, None)
                entry = self._keys[key] = [now, 0, 0]
            else:
                held = 0
            if entry[1] < self.burst:
                entry[1] += 1
            else:
                entry[2] += 1
                level = logging.DEBUG
        if held:
            msg += f" ({held} similar from {key} held back in the last {self.window:.0f} s)"
        logger.log(level, msg, *args, **kwargs)  # type: ignore[arg-type]


CLIENT_LOGS = LogBudget()
"""The budget of the lines about one client address (bad frames, refusals, Error frames sent)."""
