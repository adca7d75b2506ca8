"""The runtime: the only code that owns sockets' send and close callables, clocks, tasks and threads.

:mod:`~lowlat_mw.runtime.connection` runs one WebSocket's protocol machine on an asyncio loop and
:mod:`~lowlat_mw.runtime.streams` one session's models; :mod:`~lowlat_mw.runtime.asgi` serves them on any
ASGI server, :mod:`~lowlat_mw.runtime.threads` bridges thread-per-connection servers to the same driver,
:mod:`~lowlat_mw.runtime.timers` wakes every connection's timers from one scheduler per loop, and
:mod:`~lowlat_mw.runtime.drain` drains a loop's connections when its server shuts down
(:func:`drain_all`; from another thread :func:`~lowlat_mw.runtime.threads.drain_all_sync`).
"""

from __future__ import annotations

from .drain import drain_all, drain_on_shutdown

__all__ = ["drain_all", "drain_on_shutdown"]
