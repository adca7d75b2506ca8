"""Loopback helpers for tests that start servers in other processes (not for conformance subprocesses, whose
path holds tests/conformance only)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

__all__ = ["free_port", "wait_listening"]


def free_port() -> int:
    """A loopback port that was free a moment ago (bound to port 0, read, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, alive: Callable[[], bool], output: Callable[[], str], bound: float = 60.0) -> bool:
    """True once 127.0.0.1:`port` accepts a connection; False if the server exited first (`alive` false);
    AssertionError with its `output` if neither happens within `bound` seconds."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if not alive():
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listened on port {port} within {bound} s\n{output()}")
