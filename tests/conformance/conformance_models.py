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


# ---------------------------------------------------------------- delivery (fault-injection) models
# Counting models for test_conformance_delivery.py. Params: `n` tokens "0,", "1,", ...; `delay`
# seconds before each token; `size` pads each token with "." to that length; `every`: write the
# number of tokens produced so far to `<tag>.count` every that many tokens (and in `finally`).
# Each run appends a line to `<tag>.starts` (a stream that ran twice shows two) and writes
# `<tag>.closed` in `finally`.


def _count_token(i: int, size: int) -> str:
    tok = f"{i},"
    return tok if size <= len(tok) else tok + "." * (size - len(tok))


def _write_count(req, produced: int) -> None:
    tag = req.params.get("tag")
    if tag:
        tmp = MARKS / f"{tag}.count.tmp"
        tmp.write_text(str(produced))
        os.replace(tmp, MARKS / f"{tag}.count")  # readers never see a half-written number


def _log_start(req) -> None:
    tag = req.params.get("tag")
    if tag:
        with open(MARKS / f"{tag}.starts", "a") as f:
            f.write("start\n")


def _count_params(req) -> tuple[int, float, int, int]:
    p = req.params
    return int(p.get("n", 500)), float(p.get("delay", 0)), int(p.get("size", 0)), max(1, int(p.get("every", 10)))


async def count(req):
    """Async generator counting "0,", "1,", ...; ``await asyncio.sleep(0)`` every 8 tokens."""
    n, delay, size, every = _count_params(req)
    _log_start(req)
    produced = 0
    try:
        for i in range(n):
            if delay:
                await asyncio.sleep(delay)
            produced += 1
            if produced % every == 0:
                _write_count(req, produced)
            yield _count_token(i, size)
            if not delay and i % 8 == 7:
                await asyncio.sleep(0)
    finally:
        _write_count(req, produced)
        _mark(req, "closed")


def count_sync(req):
    """The same as a sync generator (each step runs in the model thread pool)."""
    n, delay, size, every = _count_params(req)
    _log_start(req)
    produced = 0
    try:
        for i in range(n):
            if delay:
                time.sleep(delay)
            produced += 1
            if produced % every == 0:
                _write_count(req, produced)
            yield _count_token(i, size)
    finally:
        _write_count(req, produced)
        _mark(req, "closed")


MODELS.update({"count": count, "count_sync": count_sync})


# ---------------------------------------------------------------- hardening models
# For test_conformance_limits.py: `principal` shows what the authenticate hook admitted.


def principal(req):
    """Returns ``str(req.session.principal)``; writes ``<tag>.ran`` first, so a test can tell it never ran."""
    _mark(req, "ran")
    return str(req.session.principal)


MODELS.update({"principal": principal})


# ---------------------------------------------------------------- server push (protocol v1.1)
# For test_conformance_push.py: a model publishes, as a view or a worker of the app would.


async def announce(req):
    """Publishes the prompt to ``params["target"]`` (this process's store); returns how many connections it reached."""
    import lowlat_mw

    return str(await lowlat_mw.apublish(req.params["target"], req.prompt))


MODELS.update({"announce": announce})


# ---------------------------------------------------------------- warm-up (protocol v1.2)
# For test_conformance_warmup.py: models with a ``warmup`` hook. The hook keeps the warm-up's prompt per `tag`
# (in this process) and writes ``<tag>.warmed``; the model answers with what its warm-up kept.

WARMED: dict[str, str] = {}


def _warm(req) -> None:
    tag = req.params.get("tag", "")
    WARMED[tag] = req.prompt
    _mark(req, "warmed")


async def warm_agen(req):
    yield f"warm:{WARMED.get(req.params.get('tag', ''), 'cold')}"


async def _warm_async(req) -> None:
    await asyncio.sleep(0)
    _warm(req)


warm_agen.warmup = _warm_async


def warm_sync(req):
    return f"warm:{WARMED.get(req.params.get('tag', ''), 'cold')}"


def _warm_blocking(req) -> None:
    time.sleep(0.05)  # a blocking hook (loading weights) runs in the worker pool, not on the event loop
    _warm(req)


warm_sync.warmup = _warm_blocking


def warm_broken(req):
    return "never warmed"


def _warm_fails(req) -> None:
    raise RuntimeError("the weights are missing")


warm_broken.warmup = _warm_fails

MODELS.update({"warm_agen": warm_agen, "warm_sync": warm_sync, "warm_broken": warm_broken})


# ---------------------------------------------------------------- result cache (setting cache_size)
# For test_conformance_cache.py: a deterministic model; each run appends a line to ``<tag>.runs``, so a test sees
# whether a reply came from the model or from the cache.


def _log_run(req) -> None:
    tag = req.params.get("tag")
    if tag:
        with open(MARKS / f"{tag}.runs", "a") as f:
            f.write("run\n")


async def det(req):
    _log_run(req)
    for word in req.prompt.split():
        yield f"{word};"
    if req.params.get("fail"):
        raise RuntimeError("a failed reply is not kept")


det.deterministic = True


def det_sync(req):
    _log_run(req)
    return f"sync:{req.prompt}"


det_sync.deterministic = True

MODELS.update({"det": det, "det_sync": det_sync})


# ---------------------------------------------------------------- micro-batching (setting max_batch_size)
# For test_conformance_batch.py: a batch-capable model; each reply says how many requests its call had.


async def batched(reqs):
    async def reply(req, n):
        yield f"{req.prompt}|"
        yield f"batch of {n}"
    return [reply(req, len(reqs)) for req in reqs]


batched.batch = True


def batched_sync(reqs):
    return [f"{req.prompt}|batch of {len(reqs)}" for req in reqs]


batched_sync.batch = True

MODELS.update({"batched": batched, "batched_sync": batched_sync})


# For test_conformance_duplex.py (protocol v1.3): a model that asks the client to run a tool, waits for the
# answer on the same stream, then echoes every further input until the client ends it; the same as a sync
# generator in a worker thread (the sync ways to wait).
async def agent(req):
    yield "asking;"
    call = req.tool_call("lookup", {"q": req.prompt})
    yield call
    result = await req.inputs.result(call)
    yield f"got:{result.content}:{int(result.is_error)};"
    async for item in req.inputs:
        yield f"in:{item if isinstance(item, str) else item.decode()};"
    yield "done;"


def agent_sync(req):
    from lowlat_mw import InputEnded

    yield "asking;"
    call = req.tool_call("lookup", {"q": req.prompt})
    yield call
    result = req.inputs.result_sync(call, timeout=60)
    yield f"got:{result.content}:{int(result.is_error)};"
    while True:
        try:
            item = req.inputs.get_sync(timeout=60)
        except InputEnded:
            break
        yield f"in:{item if isinstance(item, str) else item.decode()};"
    yield "done;"


MODELS.update({"agent": agent, "agent_sync": agent_sync})
# ---------------------------------------------------------------- incremental context (protocol v1.3)
# For test_conformance_context.py: answers with the SHA-256 of each context document the request named, as the
# server holds it ("<name>=<hex>;"), then each turn it continues ("[<prompt>><output>]").
def context_echo(req):
    import hashlib

    out = [f"{name}={hashlib.sha256(doc.text.encode()).hexdigest()};" for name, doc in sorted(req.context.items())]
    out += [f"[{turn.prompt}>{turn.output}]" for turn in req.history]
    return "".join(out) or "none"


MODELS.update({"context_echo": context_echo})


# ---------------------------------------------------------------- client log budget
# For test_conformance_bad_frames.py: CONFORMANCE_LOG_LEVEL=INFO shows lowlat-mw's INFO lines on stderr (once: its
# own handler, not the server's), as an operator following docs/observability.md would; the model
# "next_log_window" moves the client log budget's clock past its window, so the next budgeted line carries the
# count of lines held back, without a test waiting a minute.
if os.environ.get("CONFORMANCE_LOG_LEVEL"):
    import logging

    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    _lowlat_log = logging.getLogger("lowlat_mw")
    _lowlat_log.addHandler(_handler)
    _lowlat_log.setLevel(os.environ["CONFORMANCE_LOG_LEVEL"])
    _lowlat_log.propagate = False


def next_log_window(req):
    from lowlat_mw.observability.logs import CLIENT_LOGS

    skip = CLIENT_LOGS.window
    clock = CLIENT_LOGS.clock
    CLIENT_LOGS.clock = lambda: clock() + skip
    return "moved"


MODELS.update({"next_log_window": next_log_window})


# "log_mark" writes "log mark <prompt>" to the server's stdout and stderr (flushed): a test that finds it in both
# log files has every line the server wrote to them before it.
def log_mark(req):
    import sys

    line = f"log mark {req.prompt}"
    print(line, flush=True)
    print(line, file=sys.stderr, flush=True)
    return "marked"


MODELS.update({"log_mark": log_mark})


# ---------------------------------------------------------------- replies no Delta carries (issue 38, item 8)
# For test_conformance_streaming.py: a mapping's keys were streamed as the reply; a number got a TypeError.
async def returns_dict(req):
    return {"answer": 1}


async def returns_int(req):
    return 42


MODELS.update({"returns_dict": returns_dict, "returns_int": returns_int})
