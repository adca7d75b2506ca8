"""Loopback ports: a free port, a socket bound to one, and a wait until a server listens on one.

Tests start their own servers on free loopback ports; nothing here touches anything but 127.0.0.1.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable

from support.time import seconds

__all__ = ["bind_loopback", "free_port", "wait_listening"]


def free_port() -> int:
    """A loopback port that was free a moment ago (bound to port 0, read, closed).

    For a server in another process, which binds it itself; in this process prefer `bind_loopback()`, which
    leaves no pick-a-port-then-bind race.
    """
    for _ in range(20):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
        except OSError as exc:  # pragma: no cover - only under port exhaustion
            if exc.errno != errno.EADDRINUSE:
                raise
        finally:
            sock.close()
    raise RuntimeError("no free loopback port")


def bind_loopback(port: int = 0) -> socket.socket:
    """A listening-ready TCP socket bound to 127.0.0.1:`port` (0: a free port).

    Made with ``proto=IPPROTO_TCP``, as asyncio's and uvicorn's own listening sockets are: asyncio turns Nagle's
    algorithm off (TCP_NODELAY) only on connections of such a socket. With ``proto=0`` every small write that
    followed another (a reply's End after its Delta) waited for the client's delayed ACK, ~40 ms.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # Lets a restarted server bind the port of a stopped one despite TIME_WAIT connections.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


def wait_listening(port: int, alive: Callable[[], bool], output: Callable[[], str], bound: float = 60.0) -> bool:
    """True once 127.0.0.1:`port` accepts a connection; False if the server exited first (`alive` false);
    AssertionError with its `output` if neither happens within `bound` seconds (in the suite's time unit)."""
    bound = seconds(bound)
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if not alive():
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)  # polling a port: nothing to wait on but the port itself
    raise AssertionError(f"nothing listened on port {port} within {bound} s\n{output()}")
