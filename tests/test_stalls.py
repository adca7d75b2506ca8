"""A warning naming the model when one step of an async model holds the event loop (issue 38, item 13).

A new user's ``async def`` model called ``time.sleep``: every connection froze (another client's Ping took 2.5 s),
with no warning. Each test's model blocks the loop until the warning came, or until the watching thread saw the
loop held (a handshake with that thread, bounded), so none depends on how fast a loaded machine gets there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import warnings as pywarnings
from collections.abc import Iterator
from typing import Any

import pytest
from driver_support import Peer, endpoint_for
from support import wait_until

from lowlat_mw.errors import SettingsError
from lowlat_mw.protocol import events as ev
from lowlat_mw.runtime import stalls
from lowlat_mw.runtime.timers import AsyncScheduler
from lowlat_mw.settings import Settings

THRESHOLD = 0.05  # seconds: the setting, lowered (the default is 0.1)
BOUND = 30.0  # seconds a model below may hold the loop waiting for the warning (it comes after ~2 thresholds)


class Warnings(logging.Handler):
    """The lowlat_mw logger's WARNING records, and an event set by the first one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.came = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.came.set()


@pytest.fixture
def warnings() -> Iterator[Warnings]:
    handler = Warnings()
    logger = logging.getLogger("lowlat_mw")
    logger.addHandler(handler)
    stalls.WATCHER.said.clear()  # (once per model per process: each test starts afresh)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        stalls.WATCHER.said.clear()


def loop_watch() -> stalls.LoopWatch:
    """The running loop's watch (its scheduler's)."""
    return AsyncScheduler.current().stalls


def watched() -> int:
    """How many tasks the running loop's watch holds."""
    return len(loop_watch().running)


def blocking_until(event: threading.Event) -> None:
    """What the new user's model did (time.sleep in an async def), until `event` (bounded)."""
    deadline = time.monotonic() + BOUND
    while not event.is_set() and time.monotonic() < deadline:
        time.sleep(0.005)


def make_models(warnings: Warnings) -> tuple[Any, Any]:
    async def sleepy_model(req: Any) -> Any:  # an async function: its one step blocks
        blocking_until(warnings.came)
        return "done"

    async def sleepy_tokens(req: Any) -> Any:  # an async generator: its second step blocks
        yield "a;"
        await asyncio.sleep(0)
        blocking_until(warnings.came)
        yield "b;"

    return sleepy_model, sleepy_tokens


@pytest.mark.parametrize("which", [0, 1], ids=["async-def", "async-generator"])
async def test_a_step_holding_the_loop_is_warned_about_naming_the_model(which: int, warnings: Warnings) -> None:
    model = make_models(warnings)[which]
    peer = Peer(endpoint_for(model, slow_step_warning=THRESHOLD))
    await peer.hello_and_request()
    await wait_until(lambda: any(isinstance(e, ev.End) for e in peer.events), BOUND)
    assert warnings.came.is_set(), "no warning while the model held the loop"
    [record] = warnings.records  # once
    message = record.getMessage()
    name = f"{__name__}.make_models.<locals>.{model.__name__}"
    assert f"model {name} has held the event loop for" in message, message
    assert "time.sleep" in message and "asyncio.to_thread" in message
    held = int(message.split("event loop for ")[1].split(" ms")[0])
    assert held >= THRESHOLD * 1000, message
    assert record.model == name  # type: ignore[attr-defined]  # (extra fields, for structured logs)
    await peer.gone()


async def test_the_same_model_is_named_once_and_its_later_slow_steps_counted(warnings: Warnings) -> None:
    until: list[Any] = [warnings.came.is_set]  # what the model's step blocks for

    async def sleepy(req: Any) -> Any:
        deadline = time.monotonic() + BOUND
        while not until[0]() and time.monotonic() < deadline:
            time.sleep(0.005)
        return "done"

    endpoint = endpoint_for(sleepy, slow_step_warning=THRESHOLD)
    first = Peer(endpoint)
    await first.hello_and_request()
    await wait_until(lambda: any(isinstance(e, ev.End) for e in first.events), BOUND)
    assert len(warnings.records) == 1
    watch = loop_watch()
    # the loop free again (it ran the watch's last ping)
    await wait_until(lambda: watch.pinged[0] == watch.posted, BOUND)
    seen = watch.stale_seen
    until[0] = lambda: watch.stale_seen >= seen + 3  # the second step: until the watch saw it hold the loop
    second = Peer(endpoint)
    await second.hello_and_request()
    await wait_until(lambda: any(isinstance(e, ev.End) for e in second.events), BOUND)
    assert watch.stale_seen >= seen + 3
    assert len(warnings.records) == 1  # not named again within REPEAT seconds
    [(_, more)] = stalls.WATCHER.said.values()
    assert more == 1  # counted, for the next line about it
    await first.gone()
    await second.gone()


async def test_a_task_that_is_no_model_holding_the_loop_is_not_blamed_on_a_model(warnings: Warnings) -> None:
    waiting = asyncio.Event()

    async def patient(req: Any) -> Any:  # awaits: never holds the loop
        waiting.set()
        await asyncio.sleep(3600)
        yield "never"

    peer = Peer(endpoint_for(patient, slow_step_warning=THRESHOLD))
    await peer.hello_and_request()
    await asyncio.wait_for(waiting.wait(), BOUND)
    watch = loop_watch()
    assert watched() == 1
    seen = watch.stale_seen
    deadline = time.monotonic() + BOUND
    while watch.stale_seen < seen + 3 and time.monotonic() < deadline:  # this test's own task holds the loop
        time.sleep(0.005)
    assert watch.stale_seen >= seen + 3  # the watch saw the loop held (three looks: more than a report needs)
    assert warnings.records == []  # by no model: nothing said
    peer.driver.runner.tasks[1].cancel()
    await wait_until(lambda: not peer.driver.runner.tasks, BOUND)
    await peer.gone()


async def test_the_watch_counts_the_model_tasks_of_its_loop(warnings: Warnings) -> None:
    # (the watching thread looks at a loop only while its count is above 0, and sleeps when no loop has one)
    release = asyncio.Event()

    async def waits(req: Any) -> Any:
        await release.wait()
        return "x"

    async def quick(req: Any) -> Any:
        return "y"

    endpoint = endpoint_for({"waits": waits, "quick": quick}, slow_step_warning=THRESHOLD)
    peer = Peer(endpoint)
    await peer.receive(ev.Hello())
    assert watched() == 0
    await peer.receive(ev.Request(stream_id=1, model="waits"))
    await peer.receive(ev.Request(stream_id=2, model="quick"))  # (ends in its first step)
    assert watched() == 1
    release.set()
    await wait_until(lambda: sum(isinstance(e, ev.End) for e in peer.events) == 2, BOUND)
    assert watched() == 0
    await peer.gone()


def test_the_setting_is_checked() -> None:
    assert Settings().slow_step_warning == 0.1
    with pytest.raises(SettingsError, match="slow_step_warning"):
        Settings(slow_step_warning=-1)


async def test_a_sync_model_is_not_watched(warnings: Warnings) -> None:
    # Its steps run in worker threads: they cannot hold the loop, and the watching thread has nothing to look at.
    running = threading.Event()
    release = threading.Event()

    def in_a_thread(req: Any) -> Any:
        running.set()
        release.wait(BOUND)
        return "x"

    def tokens_in_a_thread(req: Any) -> Any:
        yield "a"
        running.set()
        release.wait(BOUND)
        yield "b"

    endpoint = endpoint_for({"sync": in_a_thread, "gen": tokens_in_a_thread}, slow_step_warning=THRESHOLD)
    peer = Peer(endpoint)
    await peer.receive(ev.Hello())
    for sid, model in ((1, "sync"), (2, "gen")):
        running.clear()
        release.clear()
        await peer.receive(ev.Request(stream_id=sid, model=model))
        await asyncio.wait_for(asyncio.to_thread(running.wait, BOUND), BOUND)
        assert watched() == 0, model  # (and the thread, with nothing to look at, sleeps)
        release.set()
        await wait_until(lambda n=sid: sum(isinstance(e, ev.End) for e in peer.events) == n, BOUND)  # type: ignore[misc]
    await peer.gone()


class FailingTracer:
    """A tracer whose spans cannot start (a broken tracer provider)."""

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the tracer failed")


async def test_a_failing_tracer_leaves_no_task_watched_and_the_stream_ends(warnings: Warnings) -> None:
    async def model(req: Any) -> Any:
        return "x"

    peer = Peer(endpoint_for(model, slow_step_warning=THRESHOLD))
    assert peer.driver is not None
    peer.driver.tracer = FailingTracer()
    await peer.receive(ev.Hello())
    await peer.receive(ev.Request(stream_id=1, text="x"))  # (its first step runs in here: the tracer fails now)
    assert watched() == 0  # not left counted: the watching thread would look at this loop for ever
    await wait_until(lambda: any(isinstance(e, ev.End | ev.Error) for e in peer.events), BOUND)
    [end] = [e for e in peer.events if isinstance(e, ev.End | ev.Error)]
    assert isinstance(end, ev.Error), end  # a stream the tracer broke is not quietly complete
    await peer.gone()


def blocking_until_seen_held(watch: stalls.LoopWatch) -> None:
    """Hold the loop until the watching thread saw it held at three looks (more than a report needs)."""
    seen = watch.stale_seen
    deadline = time.monotonic() + BOUND
    while watch.stale_seen < seen + 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert watch.stale_seen >= seen + 3, "the watching thread never saw the loop held"


@pytest.mark.parametrize("setting", [0.0, 3600.0], ids=["off", "larger"])
async def test_each_endpoint_s_setting_applies_to_its_own_models(setting: float, warnings: Warnings) -> None:
    # Another endpoint on the same loop warns past THRESHOLD (and keeps the watching thread looking); this one's
    # model holds the loop past THRESHOLD but not past its own setting (off, or an hour): nothing is said of it.
    waiting = asyncio.Event()
    release = asyncio.Event()

    async def patient(req: Any) -> Any:
        waiting.set()
        await release.wait()
        return "x"

    async def sleepy(req: Any) -> Any:
        blocking_until_seen_held(loop_watch())
        return "y"

    other = Peer(endpoint_for(patient, slow_step_warning=THRESHOLD))
    await other.hello_and_request()
    await asyncio.wait_for(waiting.wait(), BOUND)
    peer = Peer(endpoint_for(sleepy, slow_step_warning=setting))
    await peer.hello_and_request()
    await wait_until(lambda: any(isinstance(e, ev.End) for e in peer.events), BOUND)
    assert warnings.records == [], [r.getMessage() for r in warnings.records]
    release.set()
    await wait_until(lambda: any(isinstance(e, ev.End) for e in other.events), BOUND)
    await peer.gone()
    await other.gone()


def test_a_forked_worker_watches_with_its_own_thread_and_locks() -> None:
    # gunicorn and `serve --workers` fork: whatever lock one of the parent's threads held at the fork (here the
    # watcher's wake-up event's, held by this thread) stays held in the child. The child's model must still be
    # warned about, and nothing may hang.
    wake = stalls.WATCHER._wake
    held = wake._cond  # type: ignore[attr-defined]  # (threading.Event's lock: held across the fork)
    held.acquire()
    pid = -1
    try:
        with pywarnings.catch_warnings():
            pywarnings.simplefilter("ignore", DeprecationWarning)  # (3.12: fork() of a process with threads)
            pid = os.fork()
    finally:
        if pid != 0:  # (the child's stays held, as another thread's would)
            held.release()
    if pid == 0:  # the child: exit code 0 when the warning came
        code = 3
        try:
            code = _forked_child()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 2 * BOUND
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung (a lock it inherited held)")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0, "no warning in the forked child"


def _forked_child() -> int:
    handler = Warnings()
    logging.getLogger("lowlat_mw").addHandler(handler)

    async def sleepy(req: Any) -> Any:
        blocking_until(handler.came)
        return "done"

    async def main() -> None:
        peer = Peer(endpoint_for(sleepy, slow_step_warning=THRESHOLD))
        await peer.hello_and_request()
        await wait_until(lambda: any(isinstance(e, ev.End) for e in peer.events), BOUND)
        await peer.gone()

    asyncio.run(main())
    return 0 if handler.came.is_set() else 1
