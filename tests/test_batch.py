"""Micro-batching in process: batch sizes, the wait for a partial batch, and what fails alone or together
(every server: tests/conformance/test_conformance_batch.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.applications import Starlette

from lowlat_mw.adapters.starlette import LowLatMiddleware
from lowlat_mw.errors import ErrorCode, SettingsError, StreamError
from lowlat_mw.model import ModelRequest
from lowlat_mw.runtime.batch import is_batched
from lowlat_mw.settings import Settings
from lowlat_mw.testing.inprocess import AppClient

pytestmark = pytest.mark.timeout(30)


class Batched:
    """A batch-capable model: records each call's prompts; a prompt "fail" fails its own reply after one chunk,
    "break" fails the whole call, "hold" waits for `release` before its second chunk (and records its close)."""

    batch = True

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = asyncio.Event()
        self.closed: list[str] = []

    async def __call__(self, reqs: list[ModelRequest]) -> list[Any]:
        prompts = [r.prompt for r in reqs]
        self.calls.append(prompts)
        if "break" in prompts:
            raise RuntimeError("the batch failed")
        return [self.reply(p) for p in prompts]

    async def reply(self, prompt: str) -> Any:
        try:
            yield f"{prompt}:a "
            if prompt == "fail":
                raise RuntimeError("this reply failed")
            if prompt == "hold":
                await self.release.wait()
            yield f"{prompt}:b"
        finally:
            self.closed.append(prompt)


def app_of(model: Any, **settings: Any) -> Starlette:
    app = Starlette()
    app.add_middleware(LowLatMiddleware, model=model, path="/ws", rate_limit=0, max_streams=32, **settings)
    return app


async def test_requests_are_grouped_up_to_the_batch_size_and_a_partial_batch_goes_after_the_wait() -> None:
    model = Batched()
    assert is_batched(model)
    async with AppClient(app_of(model, max_batch_size=4, max_batch_wait=0.05), "/ws") as client:
        replies = await asyncio.gather(*(client.complete(f"q{i}") for i in range(10)))
    assert replies == [f"q{i}:a q{i}:b" for i in range(10)]
    assert sorted(len(c) for c in model.calls) == [2, 4, 4]  # two full batches at once, the rest after the wait


async def test_one_reply_failing_or_cancelled_leaves_the_others_and_a_failed_call_fails_its_batch() -> None:
    model = Batched()
    async with AppClient(app_of(model, max_batch_size=3, max_batch_wait=5.0), "/ws") as client:
        held = client.stream("hold")
        first, fine, failed = await asyncio.gather(anext(held), client.complete("ok"), client.complete("fail"),
                                                   return_exceptions=True)  # (sent together: one batch, full)
        assert (first, fine) == ("hold:a ", "ok:a ok:b")
        assert isinstance(failed, StreamError) and failed.code is ErrorCode.MODEL_ERROR
        await held.cancel()
        assert [c async for c in held] == [] and held.end is not None and held.end.finish_reason == "cancelled"
        broken = [client.complete(p) for p in ("x", "break", "y")]
        for outcome in await asyncio.gather(*broken, return_exceptions=True):
            assert isinstance(outcome, StreamError) and outcome.code is ErrorCode.MODEL_ERROR
    assert model.calls == [["hold", "ok", "fail"], ["x", "break", "y"]]
    assert sorted(model.closed) == ["fail", "hold", "ok"]  # every reply of the first call closed


async def test_a_sync_batch_model_runs_in_the_pool_and_a_wrong_reply_count_fails_the_batch() -> None:
    def upper(reqs: list[ModelRequest]) -> list[str]:
        return [r.prompt.upper() for r in reqs] if reqs[0].prompt != "short" else ["only one"]

    upper.batch = True  # type: ignore[attr-defined]
    app = app_of(upper, max_batch_size=2, max_batch_wait=5.0, expose_model_errors=True)
    async with AppClient(app, "/ws") as client:
        assert await asyncio.gather(client.complete("a"), client.complete("b")) == ["A", "B"]
        for outcome in await asyncio.gather(client.complete("short"), client.complete("c"), return_exceptions=True):
            assert isinstance(outcome, StreamError) and outcome.code is ErrorCode.MODEL_ERROR
            assert "returned 1 replies for 2 requests" in outcome.message


def test_the_batch_settings_are_checked() -> None:
    with pytest.raises(SettingsError, match="max_batch_size"):
        Settings(max_batch_size=0)
    with pytest.raises(SettingsError, match="max_batch_wait"):
        Settings(max_batch_wait=-1)


async def until(condition: Any, timeout: float = 10.0) -> None:
    """Wait (bounded) until `condition()` holds: what the server did, seen in process."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def test_a_request_cancelled_while_it_waits_leaves_its_batch() -> None:
    from lowlat_mw.runtime import batch

    model = Batched()
    async with AppClient(app_of(model, max_batch_size=2, max_batch_wait=5.0), "/ws") as client:
        gone = client.stream("gone")
        first = asyncio.ensure_future(anext(gone))
        pending = lambda: [p for b in batch._BATCHERS.get(asyncio.get_running_loop(), {}).values()  # noqa: E731
                           for p in b._pending if b.fn is model]
        await until(lambda: len(pending()) == 1)  # its Request waits in the batch
        await gone.cancel()
        await until(lambda: not pending())  # (it left the batch)
        assert await asyncio.gather(client.complete("b"), client.complete("c")) == ["b:a b:b", "c:a c:b"]
        with pytest.raises(StopAsyncIteration):
            await first  # (the stream ended with End("cancelled"), before any Delta)
        assert gone.end is not None and gone.end.finish_reason == "cancelled"
    assert model.calls == [["b", "c"]]


class Held:
    """A reply holding a resource: records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True

    def __aiter__(self) -> Held:
        return self

    async def __anext__(self) -> str:
        raise StopAsyncIteration


async def test_a_reply_answered_then_cancelled_before_it_is_read_is_closed() -> None:
    from lowlat_mw.runtime.batch import Batcher

    replies: list[Held] = []
    task: asyncio.Task[Any]

    async def model(reqs: list[Any]) -> list[Held]:
        asyncio.get_running_loop().call_soon(task.cancel)  # (a Cancel handled in the same loop turn as the answer)
        replies[:] = [Held() for _ in reqs]
        return replies

    batcher = Batcher(model, None, 1, 0.0)
    task = asyncio.ensure_future(batcher.reply(object()))  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: replies and replies[0].closed)


async def test_replies_of_a_failed_batch_are_closed_and_the_loop_is_not_held() -> None:
    import gc

    from lowlat_mw.runtime import batch

    made: list[Held] = []

    async def short(reqs: list[Any]) -> list[Held]:
        made.append(Held())
        return made[-1:]  # one reply for two requests

    b = batch.Batcher(short, None, 2, 5.0)
    outcomes = await asyncio.gather(b.reply(object()), b.reply(object()), return_exceptions=True)  # type: ignore[arg-type]
    assert all(isinstance(o, RuntimeError) and "1 replies for 2 requests" in str(o) for o in outcomes)
    assert made[0].closed

    def run_on_a_loop_of_its_own() -> None:
        async def go() -> None:
            batch.batcher_for(short, None, 2, 5.0)

        loop = asyncio.new_event_loop()
        loop.run_until_complete(go())
        loop.close()

    gc.collect()  # (earlier tests' finished loops that only a cycle still held: not this test's to count)
    before = len(batch._BATCHERS)
    await asyncio.to_thread(run_on_a_loop_of_its_own)  # (another thread: this one's loop is running)
    gc.collect()
    assert len(batch._BATCHERS) == before  # (the closed loop and its batchers are gone)


async def test_an_async_generator_batch_model_fails_with_a_clear_error() -> None:
    async def wrong(reqs: list[Any]) -> Any:
        yield "x"

    wrong.batch = True  # type: ignore[attr-defined]
    async with AppClient(app_of(wrong, max_batch_size=1, expose_model_errors=True), "/ws") as client:
        with pytest.raises(StreamError, match="an async generator function cannot"):
            await client.complete("q")
