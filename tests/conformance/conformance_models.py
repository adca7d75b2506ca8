"""Models every conformance server serves (LOWLAT_MODEL=conformance_models:MODELS).

One callable of each kind, so each framework is tested with all of them; the Request's `model`
field picks one. Params: `n` (chunks), `delay` (seconds between chunks), `size` (chunk length).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

# Models record their cleanup here so tests can see a cancelled model really stopped.
MARKS = Path(os.environ.get("CONFORMANCE_MARKS", tempfile.gettempdir()))


def _mark(req, what: str) -> None:
    tag = req.params.get("tag")
    if tag:
        (MARKS / f"{tag}.{what}").write_text(str(time.time()))


def sync_fn(req):
    return f"sync:{req.prompt}"


async def async_fn(req):
    await asyncio.sleep(0)
    return f"async:{req.prompt}"


def gen(req):
    n, delay, size = int(req.params.get("n", 5)), float(req.params.get("delay", 0)), int(req.params.get("size", 0))
    try:
        for i in range(n):
            if delay:
                time.sleep(delay)
            yield (f"g{i};" if not size else (f"g{i};" + "x" * size))
    finally:
        _mark(req, "closed")


async def agen(req):
    n, delay, size = int(req.params.get("n", 5)), float(req.params.get("delay", 0)), int(req.params.get("size", 0))
    try:
        for i in range(n):
            if delay:
                await asyncio.sleep(delay)
            yield (f"a{i};" if not size else (f"a{i};" + "x" * size))
    finally:
        _mark(req, "closed")


async def data(req):
    for i in range(int(req.params.get("n", 3))):
        yield bytes([i]) * 4


async def fail(req):
    yield "before;"
    raise RuntimeError("conformance failure on purpose")


def user(req):
    u = req.session.user
    return "user:" + (getattr(u, "username", "") or str(u) if u is not None else "none")


async def hold(req):
    """Yields "started;" at once, then stays silent for `delay` seconds, then yields "done;"."""
    try:
        yield "started;"
        await asyncio.sleep(float(req.params.get("delay", 1.0)))
        yield "done;"
    finally:
        _mark(req, "closed")


MODELS = {
    "default": agen,
    "sync": sync_fn,
    "async": async_fn,
    "gen": gen,
    "agen": agen,
    "data": data,
    "fail": fail,
    "user": user,
    "hold": hold,
}
