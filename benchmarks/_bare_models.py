"""Models the bare and frameworks benchmarks serve (``LOWLAT_MODEL=benchmarks._bare_models:MODELS``).

``tokens`` streams ``params["n"]`` copies of :data:`TOKEN` with no delay (it yields to the event
loop every 64 tokens, as the bare stream endpoint does, so other connections are served);
``echo`` returns the request's text as one chunk (one Delta, then the End); ``count`` streams numbered
tokens at a pace (the shared suite's failover part checks each reply for gaps and repeats); ``cached`` is
``echo`` marked deterministic, after 20 ms of work, its reply numbered by its runs in the process: served where
the result cache is on (the bare server's ``/ws``), a repeated request gets the first reply from the cache (the
warmup suite's cache-hit round trip; the number shows that the model did not run again).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["MODELS", "TOKEN", "YIELD_EVERY", "cached", "count", "echo", "tokens"]

TOKEN = " token"  # one small model token: what the bare stream endpoint sends per frame too
YIELD_EVERY = 64


async def tokens(req: Any) -> AsyncIterator[str]:
    """`params["n"]` tokens, no delay."""
    n = int(req.params.get("n", 1))
    for i in range(n):
        yield TOKEN
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)


async def echo(req: Any) -> str:
    """The request's text, as one delta."""
    return req.text or ""


async def count(req: Any) -> AsyncIterator[str]:
    """`params["n"]` numbered tokens ("0 ", "1 ", ...), `params["gap"]` seconds apart: a reply whose every
    Delta is known, to check one for gaps and repeats."""
    gap = float(req.params.get("gap", 0.0))
    for i in range(int(req.params.get("n", 1))):
        yield f"{i} "
        await asyncio.sleep(gap)


_runs = [0]


async def cached(req: Any) -> str:
    """The request's text and ``#<run>`` as one delta, after 20 ms of work; marked deterministic, so the result
    cache may keep it (and a kept reply keeps its run number)."""
    await asyncio.sleep(0.02)
    _runs[0] += 1
    return f"{req.text or ''}#{_runs[0]}"


cached.deterministic = True  # type: ignore[attr-defined]

MODELS = {"tokens": tokens, "echo": echo, "count": count, "cached": cached}
