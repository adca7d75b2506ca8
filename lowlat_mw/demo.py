"""The built-in demo model: streams a canned reply word by word, with a configurable delay.

It stands in for a real model in demos, tests and benchmarks. Params understood:
``delay`` (seconds between tokens, default from ``LOWLAT_DEMO_DELAY`` or 0.02), ``tokens``
(how many tokens to stream; default: the whole reply) and ``fail_after`` (raise after N tokens).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from .model import ModelRequest

__all__ = ["demo_model"]

_REPLY = (
    "Hello! This is the lowlat-mw demo model. You said: {prompt!r}. Each word you read arrived as "
    "its own delta over one persistent WebSocket, multiplexed with any other streams on the same "
    "connection. Swap in your own model callable to serve real replies."
)


def _default_delay() -> float:
    try:
        return float(os.environ.get("LOWLAT_DEMO_DELAY", "0.02"))
    except ValueError:
        return 0.02


async def demo_model(req: ModelRequest) -> AsyncIterator[str]:
    """Yield the demo reply token by token (async generator)."""
    delay = float(req.params.get("delay", _default_delay()))
    fail_after = req.params.get("fail_after")
    limit = req.params.get("tokens")
    words = _REPLY.format(prompt=req.prompt[:200]).split(" ")
    count = 0
    total = len(words) if limit is None else int(limit)
    while count < total:
        word = words[count % len(words)]
        if fail_after is not None and count >= int(fail_after):
            raise RuntimeError("demo model failed on purpose (fail_after)")
        yield word if count == 0 else " " + word
        count += 1
        if delay > 0:
            await asyncio.sleep(delay)
        elif count % 64 == 0:
            await asyncio.sleep(0)
