"""Model adapter: every kind of callable becomes one async stream of chunks, off the event loop.

Sync code really runs in worker threads here, so a few tests use short real sleeps (50 ms a
chunk) to show the loop keeps running; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import functools
import os.path
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support import seconds, wait_for

from lowlat_mw.model import (
    DONE,
    READY,
    WAIT,
    ModelRequest,
    Models,
    SessionInfo,
    load_callable,
    shared_executor,
    step_now,
    stream_model,
)
from lowlat_mw.protocol.events import ChatMessage

SESSION = SessionInfo(session_id="sess")
REQ = ModelRequest(stream_id=1, model="m", text="hi", session=SESSION)
MAIN = threading.main_thread()


async def collect(fn: Any, req: ModelRequest = REQ, executor: Any = None) -> list[Any]:
    return [c async for c in stream_model(fn, req, executor)]


# ============================================================================ callables of every kind
def sync_str(req: ModelRequest) -> str:
    assert threading.current_thread() is not MAIN  # blocking code never runs on the loop
    return req.prompt.upper()


async def async_str(req: ModelRequest) -> str:
    await asyncio.sleep(0)
    return req.prompt.upper()


def sync_gen(req: ModelRequest) -> Iterator[str]:
    for ch in req.prompt:
        assert threading.current_thread() is not MAIN
        yield ch


async def async_gen(req: ModelRequest) -> AsyncIterator[str]:
    for ch in req.prompt:
        await asyncio.sleep(0)
        yield ch


def sync_list(req: ModelRequest) -> list[str]:
    return ["a", "b", "c"]


def sync_returns_gen(req: ModelRequest) -> Iterator[str]:
    return (c for c in "xyz")


def sync_returns_coroutine(req: ModelRequest) -> Any:
    return async_str(req)


def sync_returns_async_gen(req: ModelRequest) -> Any:
    return async_gen(req)


async def async_returns_list(req: ModelRequest) -> list[str]:
    return ["p", "q"]


def sync_bytes(req: ModelRequest) -> bytes:
    return b"\x00\x01"


def gen_bytes(req: ModelRequest) -> Iterator[bytes]:
    yield b"\x00"
    yield bytearray(b"\x01")
    yield "mixed"  # type: ignore[misc]


def sync_none(req: ModelRequest) -> None:
    return None


def echo_with(req: ModelRequest, prefix: str, sep: str = "") -> str:
    return prefix + sep + req.prompt


async def async_echo_with(req: ModelRequest, prefix: str) -> str:
    return prefix + req.prompt


def gen_with(req: ModelRequest, n: int) -> Iterator[str]:
    yield from [req.prompt] * n


async def agen_with(req: ModelRequest, n: int) -> AsyncIterator[str]:
    for _ in range(n):
        yield req.prompt


class SyncCallable:
    def __call__(self, req: ModelRequest) -> str:
        assert threading.current_thread() is not MAIN
        return "sync-obj:" + req.prompt


class AsyncCallable:
    async def __call__(self, req: ModelRequest) -> str:
        return "async-obj:" + req.prompt


class GenCallable:
    def __call__(self, req: ModelRequest) -> Iterator[str]:
        yield "gen-obj"
        yield req.prompt


class AsyncGenCallable:
    async def __call__(self, req: ModelRequest) -> AsyncIterator[str]:
        yield "agen-obj"
        yield req.prompt


class Model:
    def __init__(self) -> None:
        self.prefix = "method:"

    def predict(self, req: ModelRequest) -> str:
        return self.prefix + req.prompt

    async def apredict(self, req: ModelRequest) -> AsyncIterator[str]:
        yield self.prefix
        yield req.prompt


CASES = [
    ("sync def -> str", sync_str, ["HI"]),
    ("async def -> str", async_str, ["HI"]),
    ("sync generator", sync_gen, ["h", "i"]),
    ("async generator", async_gen, ["h", "i"]),
    ("sync def -> list", sync_list, ["a", "b", "c"]),
    ("sync def -> generator", sync_returns_gen, ["x", "y", "z"]),
    ("sync def -> coroutine", sync_returns_coroutine, ["HI"]),
    ("sync def -> async generator", sync_returns_async_gen, ["h", "i"]),
    ("async def -> list", async_returns_list, ["p", "q"]),
    ("sync def -> bytes", sync_bytes, [b"\x00\x01"]),
    ("generator of bytes", gen_bytes, [b"\x00", bytearray(b"\x01"), "mixed"]),
    ("sync def -> None", sync_none, []),
    ("lambda", lambda req: "lambda:" + req.prompt, ["lambda:hi"]),
    ("callable object", SyncCallable(), ["sync-obj:hi"]),
    ("async callable object", AsyncCallable(), ["async-obj:hi"]),
    ("generator callable object", GenCallable(), ["gen-obj", "hi"]),
    ("async generator callable object", AsyncGenCallable(), ["agen-obj", "hi"]),
    ("bound method", Model().predict, ["method:hi"]),
    ("bound async generator method", Model().apredict, ["method:", "hi"]),
    ("partial of def", functools.partial(echo_with, prefix="p", sep="-"), ["p-hi"]),
    ("partial of async def", functools.partial(async_echo_with, prefix="ap:"), ["ap:hi"]),
    ("partial of generator", functools.partial(gen_with, n=3), ["hi", "hi", "hi"]),
    ("partial of async generator", functools.partial(agen_with, n=2), ["hi", "hi"]),
    ("partial of partial", functools.partial(functools.partial(echo_with, sep="+"), prefix="pp"), ["pp+hi"]),
]


@pytest.mark.parametrize(("fn", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_stream_model_accepts_every_kind_of_callable(fn: Any, expected: list[Any]) -> None:
    assert await asyncio.wait_for(collect(fn), 5) == expected


async def test_sync_code_runs_on_the_given_executor() -> None:
    seen: list[str] = []

    def fn(req: ModelRequest) -> Iterator[str]:
        seen.append(threading.current_thread().name)
        yield "a"
        seen.append(threading.current_thread().name)
        yield "b"

    def plain(req: ModelRequest) -> str:
        seen.append(threading.current_thread().name)
        return "c"

    with ThreadPoolExecutor(2, thread_name_prefix="test-model") as pool:
        assert await collect(fn, executor=pool) == ["a", "b"]
        assert await collect(plain, executor=pool) == ["c"]
    assert seen and all(name.startswith("test-model") for name in seen)


async def test_returning_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="model returned int"):
        await collect(lambda req: 42)


@pytest.mark.parametrize("reply", [{"answer": 1}, {"a", "b"}, frozenset({"a"}), {"a": 1}.keys()],
                         ids=["dict", "set", "frozenset", "dict-keys"])
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_returning_a_mapping_or_a_set_is_a_type_error_naming_the_model(reply: Any, kind: str) -> None:
    # (a dict was iterated: its keys streamed as the reply, finish "stop", nothing logged)
    def answer(req: ModelRequest) -> Any:
        return reply

    async def aanswer(req: ModelRequest) -> Any:
        return reply

    model = answer if kind == "sync" else aanswer
    named = rf"model returned {type(reply).__name__}, .*test_model\..*\.{model.__name__} must"
    with pytest.raises(TypeError, match=named):
        await collect(model)


# ============================================================================ exceptions
class Boom(Exception):
    pass


def sync_raises(req: ModelRequest) -> str:
    raise Boom("sync")


async def async_raises(req: ModelRequest) -> str:
    raise Boom("async")


def gen_raises(req: ModelRequest) -> Iterator[str]:
    yield "before"
    raise Boom("gen")


async def agen_raises(req: ModelRequest) -> AsyncIterator[str]:
    yield "before"
    raise Boom("agen")


@pytest.mark.parametrize(("fn", "before"), [
    (sync_raises, []), (async_raises, []), (gen_raises, ["before"]), (agen_raises, ["before"]),
], ids=["sync", "async", "gen", "agen"])
async def test_exceptions_propagate_after_the_chunks_before_them(fn: Any, before: list[str]) -> None:
    got: list[Any] = []
    with pytest.raises(Boom):
        async for chunk in stream_model(fn, REQ):
            got.append(chunk)
    assert got == before


# ============================================================================ never blocking the loop
# These prove it by a handshake, not by counting loop ticks in a time window (which a loaded CI
# machine can starve): the blocking code waits for something only the event loop can do. Run on
# the loop thread, it would wait out LOOP_WAIT and fail; run off it, it goes on at once.
LOOP_WAIT = 10.0


def _loop_runs_meanwhile(loop: asyncio.AbstractEventLoop) -> bool:
    """From blocking code: True once `loop` has run a callback. Never, if we block the loop's thread."""
    ran = threading.Event()
    loop.call_soon_threadsafe(ran.set)
    return ran.wait(LOOP_WAIT)


async def test_blocking_sync_generator_does_not_block_the_loop_and_streams_each_chunk() -> None:
    loop = asyncio.get_running_loop()
    received = [threading.Event() for _ in range(4)]

    def slow(req: ModelRequest) -> Iterator[str]:
        for i in range(4):
            time.sleep(0.01)  # blocking work, as a real model would do
            if not _loop_runs_meanwhile(loop):
                raise AssertionError("the event loop did not run while the generator blocked")
            yield f"chunk{i}"
            # the next chunk is made only once the consumer has this one: streamed one by one,
            # not joined at the end
            if not received[i].wait(LOOP_WAIT):
                raise AssertionError(f"chunk{i} did not reach the consumer before the next was made")

    got: list[Any] = []
    async for chunk in stream_model(slow, REQ):
        got.append(chunk)
        received[len(got) - 1].set()
    assert got == ["chunk0", "chunk1", "chunk2", "chunk3"]


async def test_blocking_sync_function_does_not_block_the_loop() -> None:
    loop = asyncio.get_running_loop()

    def slow(req: ModelRequest) -> str:
        time.sleep(0.01)
        if not _loop_runs_meanwhile(loop):
            raise AssertionError("the event loop did not run while the sync model blocked")
        return "done"

    assert await collect(slow) == ["done"]


# ============================================================================ cancellation
async def _cancel_after_first_chunk(fn: Any, busy: asyncio.Event | threading.Event) -> list[Any]:
    """The chunks `fn` yielded before it was cancelled while busy on its second (it sets `busy` then)."""
    got: list[Any] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for chunk in stream_model(fn, REQ):
            got.append(chunk)
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 2)
    await wait_for(busy, seconds(2.0), what="the generator to start on its next chunk")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return got


async def test_cancelling_a_sync_generator_stops_it_within_one_chunk_and_runs_finally() -> None:
    produced: list[int] = []
    closed, busy = threading.Event(), threading.Event()

    def slow(req: ModelRequest) -> Iterator[str]:
        try:
            for i in range(100):
                if i:
                    busy.set()
                time.sleep(0.05)
                produced.append(i)
                yield f"c{i}"
        finally:
            closed.set()

    got = await _cancel_after_first_chunk(slow, busy)
    assert got == ["c0"]
    await wait_for(closed, seconds(1.0), what="the generator's finally block to run")
    assert len(produced) <= 2  # the chunk in flight when cancelled, and nothing after it
    await asyncio.sleep(0.12)  # two more chunk periods: nothing else is produced
    assert len(produced) <= 2


def _one_two_then(closed: threading.Event) -> Callable[[ModelRequest], Iterator[str]]:
    """A sync generator model yielding "one", "two" that sets `closed` in its finally."""

    def gen(req: ModelRequest) -> Iterator[str]:
        try:
            yield "one"
            yield "two"
        finally:
            closed.set()

    return gen


async def test_cancelling_an_idle_sync_generator_closes_it() -> None:
    closed = threading.Event()

    gen = _one_two_then(closed)

    agen = stream_model(gen, REQ)
    assert await agen.__anext__() == "one"
    await agen.aclose()  # consumer stops between chunks
    await wait_for(closed, seconds(1.0), what="the generator's finally block to run")


async def test_cancelling_a_sync_generator_whose_next_step_waits_for_a_worker_closes_it() -> None:
    # A step handed to a busy pool and cancelled before a worker took it never runs (the cancel withdraws it), so
    # it cannot do the close. The generator is closed anyway, by a pool job of its own, not left to the garbage
    # collector: a task that ends cancelled keeps its CancelledError, whose traceback holds the generator's
    # frames and so the generator (a runner's task is in a reference cycle: its frame holds it), so its finally
    # ran only when the collector got to them (conformance gen-disconnect, a fastapi server with two busy loops
    # and four other streams: 9 of 200 streams' finally 2-13 s late before this fix, none over 117 ms after).
    closed, blocking, free, second = threading.Event(), threading.Event(), threading.Event(), asyncio.Event()

    gen = _one_two_then(closed)

    async def consume() -> None:
        async for chunk in agen:
            if chunk == "one":
                pool.submit(lambda: (blocking.set(), free.wait(seconds(30))))  # the one worker is busy now
                await asyncio.to_thread(blocking.wait, seconds(10))
                second.set()  # the next step goes to the pool's queue, behind the busy worker

    pool = ThreadPoolExecutor(max_workers=1)
    agen = stream_model(gen, REQ, pool)
    try:
        task = asyncio.create_task(consume())
        await wait_for(second, seconds(10), what="the first chunk")
        task.cancel()  # (it handed the next step to the pool in the turn it set `second`, and waits for it)
        await asyncio.wait([task])  # (not awaited: its CancelledError stays in it, as in a destroyed runner's)
        assert task.cancelled()
        free.set()  # the worker is free again: the withdrawn step is dropped, the close job runs
        await wait_for(closed, seconds(5.0), what="the generator's finally block to run")
    finally:
        free.set()
        pool.shutdown(wait=False)


async def test_cancelling_an_async_generator_closes_it() -> None:
    closed, busy = asyncio.Event(), asyncio.Event()
    produced: list[int] = []

    async def agen(req: ModelRequest) -> AsyncIterator[str]:
        try:
            for i in range(100):
                if i:
                    busy.set()
                await asyncio.sleep(0.02)
                produced.append(i)
                yield f"c{i}"
        finally:
            closed.set()

    got = await _cancel_after_first_chunk(agen, busy)
    assert got == ["c0"]
    assert closed.is_set()  # closed right away, on the loop
    assert len(produced) == 1


async def test_cancelling_an_async_function_cancels_it() -> None:
    cancelled = asyncio.Event()
    started = asyncio.Event()

    async def slow(req: ModelRequest) -> str:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    task = asyncio.create_task(collect(slow))
    await asyncio.wait_for(started.wait(), 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


async def test_breaking_out_of_an_async_generator_closes_it() -> None:
    closed = asyncio.Event()

    async def agen(req: ModelRequest) -> AsyncIterator[str]:
        try:
            yield "a"
            yield "b"
        finally:
            closed.set()

    stream = stream_model(agen, REQ)
    async for _ in stream:
        break
    await stream.aclose()
    # The inner generators are finalized by the loop's async-generator hook: soon, not synchronously.
    await asyncio.wait_for(closed.wait(), 1)


# ============================================================================ ModelRequest.prompt
@pytest.mark.parametrize(("kw", "prompt"), [
    ({"text": "t"}, "t"),
    ({"text": ""}, ""),
    ({"messages": (ChatMessage(role="user", content="first"), ChatMessage(role="user", content="last"))}, "last"),
    ({"messages": ()}, ""),
    ({"data": "héllo".encode()}, "héllo"),
    ({"data": b"\xffok"}, "\ufffdok"),
    ({}, ""),
])
def test_prompt(kw: dict[str, Any], prompt: str) -> None:
    assert ModelRequest(stream_id=1, session=SESSION, **kw).prompt == prompt


def test_model_request_is_frozen() -> None:
    with pytest.raises(AttributeError):
        REQ.text = "x"  # type: ignore[misc]


# ============================================================================ load_callable
@pytest.mark.parametrize(("spec", "expected"), [
    ("os.path:join", os.path.join),
    ("os.path.join", os.path.join),
    ("json:decoder.JSONDecoder", __import__("json").decoder.JSONDecoder),
    ("functools:partial", functools.partial),
])
def test_load_callable_resolves_paths(spec: str, expected: Any) -> None:
    assert load_callable(spec) is expected


def test_load_callable_passes_callables_through() -> None:
    assert load_callable(sync_str) is sync_str
    obj = SyncCallable()
    assert load_callable(obj) is obj


@pytest.mark.parametrize(("spec", "exc", "match"), [
    ("", ValueError, "empty"),
    ("os", ValueError, "must look like 'package.module:callable'"),
    (":join", ValueError, "must look like"),
    ("os.path:", ValueError, "must look like"),
    ("no_such_module_xyz:f", ImportError, "cannot import model module 'no_such_module_xyz'"),
    ("no_such_module_xyz.f", ImportError, "cannot import model module 'no_such_module_xyz'"),
    ("os.path:no_such_attr", ImportError, "module 'os.path' has no attribute 'no_such_attr'"),
    ("json:decoder.nope", ImportError, "has no attribute 'decoder.nope'"),
    ("os:sep", TypeError, "is not callable"),
    (42, TypeError, "callable or a dotted path"),
    (None, TypeError, "callable or a dotted path"),
])
def test_load_callable_bad_paths_have_readable_errors(spec: Any, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        load_callable(spec)


# ============================================================================ Models registry
def test_models_single_callable_serves_every_name() -> None:
    models = Models(sync_str)
    assert models.get("") is sync_str and models.get("anything") is sync_str
    assert models.names() == ()


def test_models_mapping() -> None:
    models = Models({"echo": sync_str, "upper": "os.path:join"})
    assert models.get("echo") is sync_str
    assert models.get("upper") is os.path.join
    assert models.get("") is sync_str  # no "default": the first entry
    assert models.get("missing") is None
    assert models.names() == ("echo", "upper")
    assert Models({"a": sync_str, "default": async_str}).get("") is async_str
    again = Models(models)
    assert again.get("echo") is sync_str and again.names() == models.names()


def test_models_from_path_and_errors() -> None:
    assert Models("os.path:join").get("x") is os.path.join
    with pytest.raises(ValueError, match="empty"):
        Models({})
    with pytest.raises(ImportError):
        Models({"x": "no_such_module_xyz:f"})


def test_a_callable_that_cannot_take_one_request_is_refused_when_the_app_starts() -> None:
    """Issue 38: an ASGI app given as the model started, then failed every request with a model error."""

    class AsgiApp:
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None: ...

    def two(req: Any, extra: Any) -> str:
        return ""

    with pytest.raises(TypeError, match=r"AsgiApp' is an ASGI application, not a model callable"):
        Models(AsgiApp())
    with pytest.raises(TypeError, match=r"two' is a callable of 2 required arguments \(req, extra\)"):
        Models({"x": two})
    assert Models(lambda req, n=1: "").single is not None  # optional parameters are fine
    assert Models(functools.partial(two, extra=1)).single is not None


def test_shared_executor_is_one_pool_per_size() -> None:
    assert shared_executor(3) is shared_executor(3)
    assert shared_executor(3) is not shared_executor(4)


# ------------------------------------------------------------------ step_now (merge_deltas)
async def test_step_now_tells_ready_chunks_from_waiting_ones_and_the_end() -> None:
    async def model() -> AsyncIterator[str]:
        yield "a"
        yield "b"
        await asyncio.sleep(0.001)
        yield "c"
        await asyncio.sleep(0)  # a bare yield to the loop is a wait too
        yield "d"

    agen = model()
    seen = []
    while True:
        kind, value = step_now(agen)
        if kind == WAIT:
            try:
                value = await value
            except StopAsyncIteration:
                break
        elif kind == DONE:
            break
        seen.append(("ready" if kind == READY else "waited", value))
    assert seen == [("ready", "a"), ("ready", "b"), ("waited", "c"), ("waited", "d")]
    assert step_now(agen) == (DONE, None)


async def test_step_now_passes_model_errors_and_cancellation_through() -> None:
    closed = []

    async def failing() -> AsyncIterator[str]:
        yield "a"
        raise ValueError("boom")

    agen = failing()
    assert step_now(agen) == (READY, "a")
    with pytest.raises(ValueError, match="boom"):
        step_now(agen)

    async def slow() -> AsyncIterator[str]:
        try:
            yield "a"
            await asyncio.sleep(30)
            yield "never"
        finally:
            closed.append(True)

    agen = slow()
    assert step_now(agen) == (READY, "a")
    kind, rest = step_now(agen)
    assert kind == WAIT

    waiting = asyncio.Event()

    async def consume() -> Any:
        waiting.set()  # (then, in the same step, into the model: it waits in its sleep before this test goes on)
        return await rest

    task = asyncio.get_running_loop().create_task(consume())
    await wait_for(waiting, what="the consumer to wait on the model")
    task.cancel()  # thrown into the model, which runs its finally
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == [True]


async def test_step_now_a_waiting_step_ends_with_stop_async_iteration() -> None:
    async def model() -> AsyncIterator[str]:
        await asyncio.sleep(0)
        if False:
            yield ""

    kind, rest = step_now(model())
    assert kind == WAIT
    with pytest.raises(StopAsyncIteration):
        await rest
