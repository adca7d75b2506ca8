"""Log lines a client can cause, bounded per client address and in all: a flood of bad input is not a flood of lines.

A client that sends a thousand bad frames on a thousand connections (or is refused a thousand times)
would otherwise write a thousand lines. :class:`LogBudget` lets the first few lines per client address
(never per connection: its port is not part of the key) per window through at their level, and a few
more in all (an attacker with many addresses gets no more), sends the rest to DEBUG, and adds to the
next line let through how many were held back ("... (37 more from 10.0.0.1 held back at DEBUG)").
The process-wide budget is :data:`CLIENT_LOGS`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["CLIENT_LOGS", "LogBudget"]


class LogBudget:
    """At most `burst` lines per client address, and `total` lines in all, in each `window` seconds at their own
    level; the rest at DEBUG, counted on the next line let through.

    Thread-safe (Flask's and Django's threads log through it too). At most `max_keys` addresses are
    remembered (the oldest window goes first): an address scan cannot grow it without bound.
    """

    def __init__(self, burst: int = 10, window: float = 60.0, *, total: int = 100, max_keys: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.window, self.total, self.max_keys, self.clock = burst, window, total, max_keys, clock
        # address (None: a server that gives none) -> [window start, lines let through, lines held back not yet told]
        self._keys: dict[str | None, list[float]] = {}
        self._all: list[float] = [-float("inf"), 0, 0]  # the same, for every address together
        self._lock = threading.Lock()
        self._said: set[str] = set()  # messages logged once (:meth:`once`)

    def reset(self) -> None:
        """Forget every address and count, and what was said once (a test's fresh start)."""
        with self._lock:
            self._keys.clear()
            self._all = [-float("inf"), 0, 0]
            self._said.clear()

    def once(self, logger: logging.Logger, level: int, msg: str, *args: object) -> None:
        """``logger.log(level, msg, *args)`` the first time `msg` comes here, never again (a fact about the process,
        such as what its server cannot do, said once however many connections run into it)."""
        with self._lock:
            if msg in self._said:
                return
            self._said.add(msg)
        logger.log(level, msg, *args)

    def log(self, logger: logging.Logger, level: int, address: str | None, msg: str, *args: object,
            **kwargs: object) -> None:
        """``logger.log(level, msg, *args)`` within the budgets of `address` (the client's address, without its
        port: all of its connections share one budget) and of every address (past either at DEBUG)."""
        now = self.clock()
        held = held_all = 0
        with self._lock:
            entry = self._keys.get(address)
            if entry is None or now - entry[0] >= self.window:  # a new window (what was held back is still to tell)
                if entry is None and len(self._keys) >= self.max_keys:
                    del self._keys[next(iter(self._keys))]
                self._keys.pop(address, None)
                entry = self._keys[address] = [now, 0, entry[2] if entry is not None else 0]
            every = self._all
            if now - every[0] >= self.window:
                every[0], every[1] = now, 0
            if entry[1] >= self.burst:
                entry[2] += 1
                level = logging.DEBUG
            elif every[1] >= self.total:
                every[2] += 1
                level = logging.DEBUG
            else:
                entry[1] += 1
                every[1] += 1
                held, held_all = int(entry[2]), int(every[2])
                entry[2] = every[2] = 0
        if held or held_all:  # (as arguments: an address may hold a "%", as an IPv6 zone does)
            if not args:
                msg = msg.replace("%", "%%")
            if held:
                msg += " (%d more from %s held back at DEBUG)"
                args = (*args, held, address)
            if held_all:
                msg += " (%d more from all clients held back at DEBUG: over %d lines in %.0f s)"
                args = (*args, held_all, self.total, self.window)
        logger.log(level, msg, *args, **kwargs)  # type: ignore[arg-type]


CLIENT_LOGS = LogBudget()
"""The budget of the lines about clients (bad frames, refusals, Error frames sent, slow consumers closed)."""
