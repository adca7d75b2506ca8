"""Full-duplex streams (protocol v1.3): a model asks the client for a tool call inside its stream, waits for the
answer and goes on, then reads more input, on every server, in both wire formats; and all of it survives dropped
connections (the resume sends again the input the server lacks, and the model gets each input exactly once)."""

from __future__ import annotations

import asyncio
import random

import pytest

from lowlat_mw import ToolCall
from lowlat_mw.client import Backoff, connect
from lowlat_mw.testing import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.mark.parametrize("kind", ["agent", "agent_sync"])  # an async generator / a sync one in a worker thread
async def test_a_tool_call_round_trip_inside_one_stream(server, kind):
    async with asyncio.timeout(40):
        for mode in ("proto", "json"):
            async with connect(server.url, mode=mode) as client:
                assert client.welcome is not None and client.welcome.revision >= 3
                stream = client.stream("paris", model=kind)
                got: list[object] = []
                async for chunk in stream:
                    got.append(chunk)
                    if isinstance(chunk, ToolCall):
                        assert (chunk.name, chunk.args) == ("lookup", {"q": "paris"}) and chunk.id
                        await stream.send_result(chunk, {"temp": 21})
                        await stream.send("more")
                        await stream.send(b"bytes", end=True)
                assert got[0] == "asking;" and isinstance(got[1], ToolCall)
                assert got[2:] == ['got:{"temp": 21}:0;', "in:more;", "in:bytes;", "done;"], (mode, got)
                assert stream.end is not None and stream.end.finish_reason == "stop"
                # The client's own tool answers the call: the caller never sees it; a failing tool is an error.
                def lookup(q: str) -> str:
                    if q == "boom":
                        raise ValueError("no such city")
                    return f"sunny in {q}"

                for prompt, expect in (("rome", "got:sunny in rome:0;"), ("boom", "got:ValueError: no such city:1;")):
                    stream = client.stream(prompt, model=kind, tools={"lookup": lookup})
                    got = []
                    async for chunk in stream:
                        got.append(chunk)
                        if chunk == expect:
                            await stream.end_input()
                    assert got == ["asking;", expect, "done;"], (mode, got)
                assert client.connections == 1


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_tool_calls_and_input_survive_dropped_connections_exactly_once(server, mode):
    with FaultProxy(("127.0.0.1", server.port), seed=7) as proxy:
        client = connect(proxy.url_base + "/ws", mode=mode,
                         backoff=Backoff(base=0.01, cap=0.1, retries=20, rng=random.Random(7)))
        try:
            async with asyncio.timeout(40):
                stream = client.stream("oslo", model="agent")
                assert await anext(stream) == "asking;"
                call = await anext(stream)
                assert isinstance(call, ToolCall)
                proxy.cut_all()  # the answer is sent into a dropped connection (or queued while it reconnects)
                await stream.send_result(call, "cold")
                assert await anext(stream) == "got:cold:0;"
                await stream.send("one")
                assert await anext(stream) == "in:one;"  # the server has input 2: a resume must not send it again
                proxy.cut_all()
                await stream.send("two")
                await stream.send("three", end=True)
                rest = [chunk async for chunk in stream]
                assert rest == ["in:two;", "in:three;", "done;"]
                assert stream.end is not None and stream.end.finish_reason == "stop"
                assert client.resumes == 2 and client.connections == 3
        finally:
            await client.close()
