"""A warning naming the model when one step of an async model holds the event loop (issue 38, item 13).

A new user's ``async def`` model called ``time.sleep``: every connection froze (another client's Ping took 2.5 s),
with no warning. Each test's model blocks the loop until the warning came (a handshake with the watching thread,
bounded), so none depends on how fast a loaded machine gets there.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from driver_support import Peer, endpoint_for

from lowlat_mw.drivers import stalls
from lowlat_mw.errors import SettingsError
from lowlat_mw.protocol import events as ev
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
    stalls._said.clear()  # (once per model per process: each test starts afresh)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        stalls._said.clear()


def blocking_until(event: threading.Event) -> None:
    """What the new user's model did (time.sleep in an async def), until `event` (bounded)."""
    deadline = time.monotonic() + BOUND
    while not event.is_set() and time.monotonic() < deadline:
        time.sleep(0.005)


async def wait_for(predicate: Any, timeout: float = BOUND) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


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
    await wait_for(lambda: any(isinstance(e, ev.End) for e in peer.events))
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
    await wait_for(lambda: any(isinstance(e, ev.End) for e in first.events))
    assert len(warnings.records) == 1
    watch = stalls.watch(asyncio.get_running_loop(), THRESHOLD)
    assert watch is not None
    await wait_for(lambda: watch.pinged[0] == watch.posted)  # the loop free again (it ran the watch's last ping)
    seen = watch.stale_seen
    until[0] = lambda: watch.stale_seen >= seen + 3  # the second step: until the watch saw it hold the loop
    second = Peer(endpoint)
    await second.hello_and_request()
    await wait_for(lambda: any(isinstance(e, ev.End) for e in second.events))
    assert watch.stale_seen >= seen + 3
    assert len(warnings.records) == 1  # not named again within REPEAT seconds
    [(_, more)] = stalls._said.values()
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
    watch = stalls.watch(asyncio.get_running_loop(), THRESHOLD)
    assert watch is not None and watch.running == 1
    seen = watch.stale_seen
    deadline = time.monotonic() + BOUND
    while watch.stale_seen < seen + 3 and time.monotonic() < deadline:  # this test's own task holds the loop
        time.sleep(0.005)
    assert watch.stale_seen >= seen + 3  # the watch saw the loop held (three looks: more than a report needs)
    assert warnings.records == []  # by no model: nothing said
    peer.driver.runner.tasks[1].cancel()
    await wait_for(lambda: not peer.driver.runner.tasks)
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
    watch = stalls.watch(asyncio.get_running_loop(), THRESHOLD)
    assert watch is not None and watch.running == 0
    await peer.receive(ev.Request(stream_id=1, model="waits"))
    await peer.receive(ev.Request(stream_id=2, model="quick"))  # (ends in its first step)
    assert watch.running == 1
    release.set()
    await wait_for(lambda: sum(isinstance(e, ev.End) for e in peer.events) == 2)
    assert watch.running == 0
    await peer.gone()


def test_the_setting_turns_the_watch_off_and_is_checked() -> None:
    assert Settings().slow_step_warning == 0.1
    loop = asyncio.new_event_loop()
    try:
        assert stalls.watch(loop, 0.0) is None
    finally:
        loop.close()
    with pytest.raises(SettingsError, match="slow_step_warning"):
        Settings(slow_step_warning=-1)
