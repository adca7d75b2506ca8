"""Models of the equivalence test (test_conformance_equivalence.py): the conformance models plus four whose every
step waits on something the client sent, never on a clock, so one script gives one frame sequence on any server.

* ``held``: yields "started;", then waits for input until the client cancels it.
* ``relay``: yields "r0;" "r1;", waits for one Input, then yields "r2;" "r3;" "r4;" (what a resume replays).
* ``drainer``: drains this process's endpoints on this loop (``Endpoint.drain``, the documented API: GoAway, then
  4002 once the running streams ended), then echoes the client's Inputs until it ends them: so the stream that
  started the drain ends after the GoAway, on the client's word, and the 4002 close comes after its End.
  Once the client ended its input the endpoints admit connections again (before the 4002 close), so the next
  session can run on this server.
"""

from __future__ import annotations

import asyncio

from conformance_models import MODELS as CONFORMANCE_MODELS

from lowlat_mw.endpoint import Endpoint


async def held(req):
    yield "started;"
    async for item in req.inputs:  # (none comes: the client cancels the stream)
        yield f"in:{item};"


async def relay(req):
    yield "r0;"
    yield "r1;"
    await anext(aiter(req.inputs))
    for i in range(2, 5):
        yield f"r{i};"


_DRAINS: set[asyncio.Task[None]] = set()  # (a task is only weakly held by its loop)


async def drainer(req):
    loop = asyncio.get_running_loop()
    endpoints = Endpoint.on_loop(loop)
    task = loop.create_task(Endpoint.drain_each(endpoints))
    _DRAINS.add(task)
    task.add_done_callback(_DRAINS.discard)
    async for item in req.inputs:
        yield f"in:{item};"
    for endpoint in endpoints:  # admitting again before this stream's End, so before the drain's 4002 close
        endpoint.draining = False
    yield "drained;"


MODELS = {**CONFORMANCE_MODELS, "held": held, "relay": relay, "drainer": drainer}
