"""Test helpers for lowlat-mw users and our own suites: an in-process client for an ASGI app (``AppClient``,
:mod:`lowlat_mw.testing.inprocess`), pytest fixtures that serve a user's app on a loopback port
(:mod:`lowlat_mw.testing.pytest_plugin`), a fault-injecting TCP proxy, a logged subprocess, and the two protocol
machines joined in memory (``ConnectionPair``, :mod:`lowlat_mw.testing.pair`).

    async with AppClient(app) as client:         # no socket: ASGI messages in this event loop
        assert await client.complete("hello") == "..."

    with FaultProxy(("127.0.0.1", server_port)) as proxy:
        url = f"ws://127.0.0.1:{proxy.port}/ws"
        proxy.cut_after(4096)        # cut every connection after 4 KiB from the server
        proxy.delay = 0.025          # 25 ms one way, both directions
        proxy.stall()                # stop forwarding (a stuck link); proxy.resume() to go on
        proxy.cut_all()              # drop every open connection now

Loopback only: it refuses to forward anywhere but 127.0.0.0/8 or ::1.

``LoggedProcess`` runs a server for a test in its own process group, output in files, and stops it
(SIGTERM, then SIGKILL to the group) with bounded waits; :mod:`lowlat_mw.testing.nginx` runs nginx with
docs/scaling.md's block in front of such servers. Test tooling: imports the protocol layer, the base and
the standard library.
"""

from __future__ import annotations

from .inprocess import AppClient, LifespanFailed
from .pair import ConnectionPair
from .process import LoggedProcess
from .proxy import FaultProxy

__all__ = ["AppClient", "ConnectionPair", "FaultProxy", "LifespanFailed", "LoggedProcess"]
