"""Leaving a stream early cancels it on the server (issue 38, item 11).

A new user's ``break`` out of ``async for chunk in client.stream(...)`` left the model running until the connection
closed (only ``await stream.aclose()`` cancelled it, and no doc said so). Here every way of leaving the loop early,
in the async and the sync client, must reach the model as a cancellation while the connection stays open: the
model's ``finally`` sets an event the test waits for (a handshake, not a time window).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.models import StopProbe

from lowlat_mw.client import connect, connect_sync
from lowlat_mw.errors import ClientError
from lowlat_mw.protocol.events import Delta

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WAIT = 20.0  # seconds for the model to see the Cancel (it takes a few ms; a loaded machine is slow)


@pytest.fixture
def probe() -> StopProbe:
    return StopProbe()


@pytest.fixture
def url(uvicorn_server: Callable[..., Any], starlette_app: Callable[..., Any], probe: StopProbe) -> str:
    return uvicorn_server(starlette_app(probe.ticks)).url


class Boom(Exception):
    pass


async def leave_async(client: Any, how: str, prompt: str) -> list[Any]:
    """Read two chunks of a never-ending stream, then leave it the way `how` says; returns what was read."""
    got: list[Any] = []
    if how == "break":  # the stream kept in a variable, as a user does to read stream.end afterwards
        stream = client.stream(prompt)
        async for chunk in stream:
            got.append(chunk)
            if len(got) == 2:
                break
    elif how == "break-inline":
        async for chunk in client.stream(prompt):
            got.append(chunk)
            if len(got) == 2:
                break
    elif how == "exception":
        with pytest.raises(Boom):
            async for chunk in client.stream(prompt):
                got.append(chunk)
                if len(got) == 2:
                    raise Boom
    elif how == "dropped":
        chunks = aiter(client.stream(prompt))
        got += [await anext(chunks), await anext(chunks)]
        del chunks
    elif how == "aclose":
        chunks = aiter(client.stream(prompt))
        got += [await anext(chunks), await anext(chunks)]
        await chunks.aclose()
    elif how == "task-cancelled":
        two = asyncio.Event()

        async def read() -> None:
            async for chunk in client.stream(prompt):
                got.append(chunk)
                if len(got) == 2:
                    two.set()

        task = asyncio.create_task(read())
        await two.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    elif how == "events":
        async for event in client.stream(prompt).events():
            got.append(event.text)
            if len(got) == 2:
                break
    else:
        raise AssertionError(how)
    return got


@pytest.mark.parametrize("how", ["break", "break-inline", "exception", "dropped", "aclose", "task-cancelled",
                                 "events"])
async def test_leaving_an_async_stream_early_cancels_its_model(url: str, probe: StopProbe, how: str) -> None:
    async with asyncio.timeout(WAIT * 2), connect(url) as client:
        for prompt in (f"{how} 1", f"{how} 2"):  # the connection stays usable after each
            got = await leave_async(client, how, prompt)
            assert got[:2] == ["tick0 ", "tick1 "]
            assert await asyncio.to_thread(probe.event(prompt).wait, WAIT), f"{how}: the model ran on"
            assert client.connected  # cancelled by the Cancel, not by a closing connection
        assert client.connections == 1


def leave_sync(client: Any, how: str, prompt: str) -> list[Any]:
    got: list[Any] = []
    if how == "break":
        stream = client.stream(prompt)
        for chunk in stream:
            got.append(chunk)
            if len(got) == 2:
                break
    elif how == "break-inline":
        for chunk in client.stream(prompt):
            got.append(chunk)
            if len(got) == 2:
                break
    elif how == "exception":
        with pytest.raises(Boom):
            for chunk in client.stream(prompt):
                got.append(chunk)
                if len(got) == 2:
                    raise Boom
    elif how == "next-close":
        stream = client.stream(prompt)
        got += [next(stream), next(stream)]
        stream.close()
    elif how == "events":
        for event in client.events(prompt):
            assert isinstance(event, Delta)
            got.append(event.text)
            if len(got) == 2:
                break
    else:
        raise AssertionError(how)
    return got


@pytest.mark.parametrize("how", ["break", "break-inline", "exception", "next-close", "events"])
def test_leaving_a_sync_stream_early_cancels_its_model(url: str, probe: StopProbe, how: str) -> None:
    with connect_sync(url) as client:
        for prompt in (f"{how} 1", f"{how} 2"):
            got = leave_sync(client, how, prompt)
            assert got[:2] == ["tick0 ", "tick1 "]
            assert probe.event(prompt).wait(WAIT), f"{how}: the model ran on"
            assert client.connected
        assert client.connections == 1


async def test_reading_on_after_cancel_gives_the_cancelled_end(url: str, probe: StopProbe) -> None:
    """``stream.cancel()`` (documented now) stops the model and the loop then ends with End("cancelled")."""
    async with asyncio.timeout(WAIT * 2), connect(url) as client:
        stream = client.stream("cancel")
        async for chunk in stream:
            if chunk == "tick1 ":
                await stream.cancel()
        assert stream.end is not None and stream.end.finish_reason == "cancelled"
        assert await asyncio.to_thread(probe.event("cancel").wait, WAIT)


NOISE_PROGRAM = """
import asyncio, sys
from lowlat_mw.client import connect, connect_sync
from lowlat_mw.errors import ClientError

url, kind = sys.argv[1], sys.argv[2]
if kind == "sync":
    with connect_sync(url) as client:
        stream = client.stream("noise sync")  # kept: its iterator outlives the client's loop
        for chunk in stream:
            break
        events = client.events("noise events")
        next(events)
else:
    async def main():
        async with connect(url) as client:
            stream = client.stream("noise async")
            async for chunk in stream:
                break
            events = client.stream("noise async events").events()
            await anext(events)
    asyncio.run(main())
print("done")
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_leaving_a_stream_then_the_client_prints_nothing(url: str, probe: StopProbe, kind: str) -> None:
    """The sync client printed "Event loop is closed" (a stream's iterator finalized after close() closed its loop)."""
    result = subprocess.run([sys.executable, "-c", NOISE_PROGRAM, url, kind], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert result.stderr == ""
    assert probe.event(f"noise {kind}").wait(WAIT)


def test_the_sync_client_after_close_says_so(url: str) -> None:
    client = connect_sync(url)
    stream = client.stream("late")
    assert next(stream) == "tick0 "
    client.close()
    started = time.monotonic()
    with pytest.raises(ClientError, match="client is closed"):
        stream.send("more")
    assert time.monotonic() - started < WAIT
