"""Eager model start: a stream's first step runs while its Request is being handled, in its own task."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import weakref

import pytest
from driver_support import Peer, endpoint_for

from lowlat_mw.model import ModelRequest, stream_model
from lowlat_mw.protocol import events as ev
from lowlat_mw.runtime import eager

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


async def test_the_first_step_runs_before_start_returns_in_its_own_task():
    loop = asyncio.get_running_loop()
    caller = asyncio.current_task()
    seen: list[object] = []

    async def coro() -> str:
        seen.append(asyncio.current_task())
        VAR.set("inside")
        seen.append(VAR.get())
        await asyncio.sleep(0)
        seen.append(asyncio.current_task())
        return "result"

    task, finished = eager.start(loop, coro())
    assert seen == [task, "inside"]  # ran already, as the new task, in the task's own context
    assert not finished
    assert asyncio.current_task() is caller  # the caller is the current task again
    assert VAR.get() == "unset"  # the task's context variables stay in the task
    assert await task == "result"
    assert seen[2] is task


async def test_a_coroutine_that_ends_in_its_first_step_is_finished_and_its_task_returns_its_value():
    ran: list[int] = []

    async def coro() -> int:
        ran.append(1)
        return 7

    task, finished = eager.start(asyncio.get_running_loop(), coro())
    assert finished and ran == [1]
    assert await task == 7


async def test_an_error_in_the_first_step_is_raised_by_the_task():
    async def coro() -> None:
        raise KeyError("boom")

    task, finished = eager.start(asyncio.get_running_loop(), coro())
    assert finished
    with pytest.raises(KeyError, match="boom"):
        await task


async def test_cancelled_before_its_first_turn_the_coroutine_sees_the_cancel_and_its_future_is_cancelled():
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def coro() -> None:
        try:
            await fut
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finally")

    task, finished = eager.start(loop, coro())
    assert not finished
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled", "finally"]
    assert fut.cancelled()  # as Task.cancel does to the future a task waits on


async def test_cancelled_while_waiting_later_the_coroutine_sees_the_cancel():
    loop = asyncio.get_running_loop()
    waiting = asyncio.Event()
    seen: list[str] = []

    async def coro() -> None:
        await asyncio.sleep(0)
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task, _ = eager.start(loop, coro())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]


async def test_a_timeout_entered_in_the_first_step_cancels_the_new_task_not_the_caller():
    loop = asyncio.get_running_loop()

    async def coro() -> str:
        try:
            async with asyncio.timeout(0):
                await asyncio.Event().wait()
        except TimeoutError:
            return "timed out"
        return "not timed out"

    task, _ = eager.start(loop, coro())
    assert await task == "timed out"  # and this test's own task was not cancelled by it


@pytest.mark.parametrize("when", ["before its first turn", "after it"])
async def test_the_coroutines_frames_are_freed_with_the_task_without_the_garbage_collector(when):
    """No reference cycle through the hand-over: a cancelled model's locals (its generator, say) go at once."""
    loop = asyncio.get_running_loop()

    class Held:
        pass

    refs: list[weakref.ref[Held]] = []
    started = asyncio.Event()

    async def coro() -> None:
        held = Held()
        refs.append(weakref.ref(held))
        if when == "after it":
            await asyncio.sleep(0)
        started.set()
        await asyncio.Event().wait()
        del held

    gc.disable()
    try:
        task, _ = eager.start(loop, coro())
        await started.wait()
        task.cancel()
        await asyncio.wait([task])  # (awaiting it here would keep its frames in this frame's exception)
        assert task.cancelled()
        del task
        assert refs[0]() is None
    finally:
        gc.enable()


async def test_a_sync_generator_cancelled_mid_step_is_closed_when_the_step_returns():
    """Its cleanup runs right after the chunk it was producing, in the worker thread, not at garbage collection."""
    in_step = threading.Event()
    release = threading.Event()
    closed = threading.Event()

    def gen(req):
        try:
            yield "first"
            in_step.set()
            release.wait(30)
            yield "second"
        finally:
            closed.set()

    gc.disable()
    try:
        agen = stream_model(gen, ModelRequest(stream_id=1, model="", text="", session=None))  # type: ignore[arg-type]

        async def consume() -> None:
            async for _ in agen:
                pass

        task = asyncio.get_running_loop().create_task(consume())
        assert await asyncio.to_thread(in_step.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await agen.aclose()
        assert not closed.is_set()  # next() is still running in its thread
        release.set()
        assert await asyncio.to_thread(closed.wait, 30)
    finally:
        gc.enable()


async def test_the_first_delta_is_written_while_the_request_is_handled():
    """No loop turn between the Request and the model's first step: the Delta is out when receive returns."""

    async def model(req):
        yield "at once"
        await asyncio.sleep(0)
        yield "later"

    peer = Peer(endpoint_for(model))
    await peer.receive(ev.Hello())
    await peer.receive(ev.Request(stream_id=1, text="x"))
    assert peer.texts() == ["at once"]
    assert set(peer.driver.tasks) == {1}  # the rest of the stream runs in its task
    await asyncio.wait_for(peer.driver.tasks[1], 30)
    assert peer.texts() == ["at once", "later"]
    assert type(peer.events[-1]) is ev.End


async def test_a_stream_that_ends_in_its_first_step_leaves_no_task_behind():
    async def model(req):
        yield req.text

    peer = Peer(endpoint_for(model))
    await peer.receive(ev.Hello())
    await peer.receive(ev.Request(stream_id=1, text="echo"))
    assert peer.texts() == ["echo"]
    assert type(peer.events[-1]) is ev.End
    assert peer.driver.tasks == {}


async def _until_it_ends(peer: Peer, last: type) -> None:
    """Wait (bounded) until the stream's last message, an End or an Error, went out."""
    async with asyncio.timeout(30):
        while not peer.events or type(peer.events[-1]) is not last:
            await asyncio.sleep(0)


@pytest.mark.parametrize(("result", "texts"), [
    ("whole reply", ["whole reply"]),
    (["a", "b"], ["a", "b"]),  # an iterable of chunks
    (None, []),
])
async def test_an_async_function_model_is_awaited_directly(result, texts):
    """No wrapper generators for `async def model(req) -> str`: its reply is one Delta, then the End."""

    async def model(req):
        return result

    peer = Peer(endpoint_for(model))
    await peer.receive(ev.Hello())
    await peer.receive(ev.Request(stream_id=1, text="x"))
    await _until_it_ends(peer, ev.End)
    assert peer.texts() == texts
    assert peer.events[-1].finish_reason == "stop"


async def test_an_async_function_model_that_raises_ends_with_model_error():
    async def model(req):
        raise ValueError("no")

    peer = Peer(endpoint_for(model))
    await peer.receive(ev.Hello())
    await peer.receive(ev.Request(stream_id=1, text="x"))
    await _until_it_ends(peer, ev.Error)
    assert peer.events[-1].code.name == "MODEL_ERROR"


async def test_a_first_step_that_ends_in_a_bare_yield_resumes_in_the_next_turn_as_a_task_would():
    """``await asyncio.sleep(0)`` in the first step: the coroutine goes on in the loop's very next turn (the task's
    first turn), not a turn later, and as a task made by create_task would."""
    loop = asyncio.get_running_loop()
    log: list[str] = []

    async def step_aside(name: str) -> None:
        await asyncio.sleep(0)
        log.append(name)
        await asyncio.sleep(0)
        log.append(f"{name} again")

    task, finished = eager.start(loop, step_aside("eager"))
    assert not finished and log == []
    loop.call_soon(log.append, "turn 1")  # (a callback of the next turn, after the task's step)
    loop.call_soon(loop.call_soon, log.append, "turn 2")
    await task
    assert log == ["eager", "turn 1", "eager again", "turn 2"]


def test_the_runtime_starts_eagerly_by_the_public_api_or_the_servers_starter() -> None:
    """The seam (lowlat_mw.runtime.eager): Python 3.12's public eager start, else the hand-made one that
    lowlat_mw.servers.eager installs as the package is imported (private asyncio calls live in servers/ only)."""
    import sys

    from lowlat_mw.servers import eager as by_hand

    assert eager.start is (eager.native if sys.version_info >= (3, 12) else by_hand.start)
