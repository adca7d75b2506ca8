"""Server shutdown: drain every lowlat-mw connection of a loop (GoAway, grace, close 4002)."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..endpoint import Endpoint
from .streams import ModelRunner

__all__ = ["drain_all", "drain_on_shutdown"]

log = logging.getLogger("lowlat_mw")

# ================================================================================ server shutdown
# The drain in progress on a loop. Servers call drain_all() (or drain_on_shutdown()) when they shut
# down: uvicorn through our protocol shims, daphne through our runner, gunicorn through our worker
# (lowlat_mw.runtime.threads.drain_all_sync); an app can drain one endpoint with Endpoint.drain().
_DRAINS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = weakref.WeakKeyDictionary()


async def drain_all(grace: float | None = None, reconnect_after_ms: int = 0) -> None:
    """Drain every lowlat-mw connection of the running loop at once, for a server shutting down.

    Each endpoint with connections on this loop stops admitting (new connections are closed with
    4002) and drains them: GoAway, running streams finish for up to `grace` seconds (default: its
    ``drain_grace`` setting), close 4002, and clients resume elsewhere. A second call waits for the first.
    """
    await asyncio.shield(_drain_task(asyncio.get_running_loop(), grace, reconnect_after_ms))


def _drain_task(loop: asyncio.AbstractEventLoop, grace: float | None, reconnect_after_ms: int) -> asyncio.Task[None]:
    task = _DRAINS.get(loop)
    if task is None:
        endpoints = Endpoint.on_loop(loop)
        if endpoints:
            log.info("draining %d connection(s) for shutdown", sum(len(e.open_connections(loop)) for e in endpoints))
        task = _DRAINS[loop] = loop.create_task(_drain_endpoints(endpoints, grace, reconnect_after_ms, loop))
    return task


async def _drain_endpoints(endpoints: list[Endpoint], grace: float | None, reconnect_after_ms: int,
                           loop: asyncio.AbstractEventLoop) -> None:
    """Drain the endpoints' connections on `loop`; then, with shared sessions, let the models of sessions whose
    client already left this process run on until the grace is over (their client may follow them from another
    process), end what still runs in the store, and write the last of it before the process goes."""
    started = time.monotonic()
    await Endpoint.drain_each(endpoints, grace, reconnect_after_ms, loop=loop)
    runners = [runner for endpoint in endpoints for runner in getattr(endpoint.store, "values", list)()
               if isinstance(runner, ModelRunner) and runner.shared is not None and not runner.destroyed
               and runner.driver is None and any(t.get_loop() is loop for t in runner.tasks.values())]
    if not runners:
        return
    deadline = started + (grace if grace is not None else max(r.settings.drain_grace for r in runners))
    while any(r.models_running() for r in runners) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stores = {id(r.shared): r.shared for r in runners}
    for runner in runners:
        if runner.driver is None:  # (unless a resume took it meanwhile)
            runner.destroy()
    for shared in stores.values():
        await shared.flushed()  # type: ignore[union-attr]


def drain_on_shutdown(then: Callable[[], Any]) -> asyncio.Task[None] | None:
    """For a server's synchronous per-connection shutdown hook, on the loop: start (or join) the drain
    of this loop's connections and call `then` once it is over; the drain's task (which the server should
    wait for before it exits: with shared sessions, streams go on after their connections closed). None
    (and `then` not called) when there is nothing of ours to drain on this loop."""
    loop = asyncio.get_running_loop()
    if loop not in _DRAINS and not any(e.open_connections(loop) for e in Endpoint.on_loop(loop)):
        return None
    task = _drain_task(loop, None, 0)
    task.add_done_callback(lambda _task: then())
    return task
