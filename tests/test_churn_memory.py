"""A closed connection leaves no Python allocations of lowlat-mw's behind (tracemalloc, a real uvicorn).

Connections come and go through a real server on a loopback socket (see tests/uvicorn_support.py):
a churn cycle (handshake, Hello, one Request, its Delta and End, a close handshake) and a resume
cycle (the same, the TCP connection dropped without a close, the session resumed on a new one and
closed). After a warm-up, whatever lowlat-mw allocated (in its own code, or in asyncio called from it) and
is still alive after N more cycles and a garbage collection must stay far below one
block per connection: a per-connection object kept by mistake (a registry, a cache keyed by session,
a task, a closure) fails this. The benchmarks' soak suite measures the same at the process level
(RSS slope over 100,000 connections, every server): docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import gc
import linecache
import tracemalloc

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from uvicorn_support import WAIT, InProcessServer

from benchmarks.soak import churn_cycle, resume_cycle
from lowlat_mw.runtime.connection import ConnectionDriver
from lowlat_mw.servers import uvicorn as shims

WARMUP = 60  # cycles before the baseline: pools, caches and the codec's tables fill
CYCLES = 240  # cycles measured
FRAMES = 8  # traceback depth: deep enough to reach lowlat_mw from uvicorn's and starlette's frames
KEEP = [tracemalloc.Filter(True, "*/lowlat_mw/*", all_frames=True)]
# Bounded state that may grow by some blocks whatever the number of connections (histogram bucket lists, a
# dict resized once): far below one block per connection.
BOUNDED = 64


async def _cycles(port: int, n: int) -> None:
    for i in range(n):
        await (resume_cycle if i % 4 == 3 else churn_cycle)(port)


def _ours(traceback: tracemalloc.Traceback) -> bool:
    """Made by lowlat-mw's code itself, or by asyncio on its behalf (a task, a future): not by a library it
    calls (websockets' handshake, for one, leaves a few blocks of its own that are no concern here), and not
    a timer handle (asyncio keeps cancelled ones until its own clean-up, past 100 of them)."""
    innermost = traceback[-1].filename
    if "/lowlat_mw/" not in innermost and "/asyncio/" not in innermost:
        return False
    return not any(f.filename.endswith("asyncio/base_events.py")
                   and "TimerHandle(" in linecache.getline(f.filename, f.lineno) for f in traceback)


def _alive(snapshot: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    return snapshot.filter_traces(KEEP)


async def test_closed_connections_leave_no_lowlat_allocations_behind() -> None:
    """(On uvicorn's websockets protocol: lowlat-mw's allocations are the same on wsproto, and the reference
    counting test below covers both protocols.)"""
    tracemalloc.start(FRAMES)
    try:
        async with asyncio.timeout(10 * WAIT), InProcessServer(resume_window=WAIT) as server:
            await _cycles(server.port, WARMUP)
            gc.collect()
            before = _alive(tracemalloc.take_snapshot())
            await _cycles(server.port, CYCLES)
            await asyncio.sleep(0)  # (the last close's callbacks)
            gc.collect()
            after = _alive(tracemalloc.take_snapshot())
            # Nothing of the connections stays open either.
            assert server.samples("lowlat_connections", "") == 0 and server.samples("lowlat_sessions_detached", "") == 0
    finally:
        tracemalloc.stop()
    # (Blocks of 32 bytes or less are floats and ints: the scheduler's heap keeps the times of emptied slots until
    # they come up or it compacts, DeadlineQueue.pop_due; bounded, and no object of a connection is that small.)
    grown = [s for s in after.compare_to(before, "traceback")
             if s.count_diff > 0 and s.size_diff > 32 * s.count_diff and _ours(s.traceback)]
    blocks = sum(s.count_diff for s in grown)
    size = sum(s.size_diff for s in grown)
    detail = "\n".join(f"{s.count_diff:+} blocks {s.size_diff:+} B\n" + "\n".join(s.traceback.format()[-6:])
                       for s in sorted(grown, key=lambda s: -s.size_diff)[:5])
    connections = CYCLES + CYCLES // 4  # (a resume cycle opens two)
    # A leak of one object per connection would be >= 300 blocks.
    assert blocks < BOUNDED + connections // 10, \
        f"{blocks} blocks ({size} B) still alive after {connections} connections:\n{detail}"


@pytest.mark.parametrize("ws", ["websockets", "wsproto"])
async def test_a_closed_connection_is_freed_by_reference_counting(ws: str) -> None:
    """With the garbage collector off, every connection's server objects (the HTTP protocol it was upgraded
    from, the WebSocket protocol, the transport extension, the driver) still go once it closed: no reference
    cycle keeps them for a later collection (under churn, thousands of dead connections and their buffers)."""
    kinds = (shims.HttpToolsProtocol, shims.WebSocketProtocol, shims.WSProtoProtocol, shims._Direct, ConnectionDriver)
    # Such objects of earlier tests that something still holds are not this test's: held here, so that their ids stay
    # theirs. (tests/test_direct.py's fake connections stayed in the timers of their finished loop's scheduler until
    # AsyncScheduler.current dropped the schedulers of closed loops; whatever an earlier test still holds is not
    # this test's to count.)
    gc.collect()
    earlier = [o for o in gc.get_objects() if isinstance(o, kinds)]
    theirs = {id(o) for o in earlier}

    def alive() -> int:
        return sum(isinstance(o, kinds) and id(o) not in theirs for o in gc.get_objects())

    async with asyncio.timeout(4 * WAIT), InProcessServer(ws=ws) as server:
        await _cycles(server.port, 8)
        gc.collect()
        gc.disable()
        try:
            await _cycles(server.port, 40)
            while alive():  # (the server's side of the last close may still be on its way: bounded by the timeout)
                await asyncio.sleep(0.01)
        finally:
            gc.enable()
