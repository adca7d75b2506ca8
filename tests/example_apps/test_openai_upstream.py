"""examples/openai_upstream.py: lowlat-mw in front of an OpenAI-compatible streaming API, against a local upstream
that this test serves (Starlette, server-sent events, on a loopback port): text, chat messages, params, the
upstream's errors, and a Cancel that stops the upstream's generation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from support import seconds, wait_until

from examples import openai_upstream
from lowlat_mw import connect
from lowlat_mw.errors import ErrorCode, StreamError
from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.testing.pytest_plugin import RunningServer

pytestmark = pytest.mark.timeout(60)


class Upstream:
    """What the fake upstream saw: the request bodies and headers, and whether each stream ran to its end."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.ended: list[str] = []  # "done" or "closed early", per stream

    def app(self) -> Starlette:
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.bodies.append(body)
            self.auth.append(request.headers.get("authorization"))
            if body["model"] == "broken":
                return JSONResponse({"error": {"message": "no such model", "type": "invalid_request_error"}},
                                    status_code=404)
            if body.get("tools") and body["messages"][-1]["role"] == "user":  # ask for a tool, in streamed pieces
                parts = [{"index": 0, "id": "up-1", "type": "function", "function": {"name": "weather",
                                                                                     "arguments": ""}},
                         {"index": 0, "function": {"arguments": '{"city": '}},
                         {"index": 0, "function": {"arguments": '"Paris"}'}}]

                async def calls() -> Any:
                    for part in parts:
                        yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'tool_calls': [part]}}]})}\n\n"
                    yield "data: [DONE]\n\n"

                return StreamingResponse(calls(), media_type="text/event-stream")
            last = body["messages"][-1]
            words = (f"it is {last['content']}" if last["role"] == "tool" else last["content"]).split()
            slow = body["model"] == "slow"

            async def events() -> Any:
                done = False
                try:
                    for i in range(10_000 if slow else len(words)):
                        word = words[i % len(words)]
                        yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': word + ' '}}]})}\n\n"
                        await asyncio.sleep(0.01 if slow else 0)
                    yield "data: [DONE]\n\n"
                    done = True
                finally:
                    self.ended.append("done" if done else "closed early")

            return StreamingResponse(events(), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Upstream, RunningServer]]:
    upstream = Upstream()
    up = RunningServer(upstream.app(), path="/").start()
    monkeypatch.setenv("OPENAI_BASE_URL", f"{up.http_url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    front = RunningServer(LowLatASGI(openai_upstream.generate, registry=CollectorRegistry(),
                                     expose_model_errors=True), path="/").start()
    try:
        yield upstream, front
    finally:
        front.stop()
        up.stop()


async def test_streams_the_upstream_completion_through_lowlat(servers: tuple[Upstream, RunningServer]) -> None:
    upstream, front = servers
    async with asyncio.timeout(30), connect(front.url) as client:
        chunks = [c async for c in client.stream("hello there world", model="m1", params={"temperature": 0.2,
                                                                                           "other": 1})]
        assert chunks == ["hello ", "there ", "world "]
        chat = await client.complete(messages=[{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": "a b"}], model="m2")
        assert chat == "a b "
        with pytest.raises(StreamError) as failed:
            await client.complete("x", model="broken")
        assert failed.value.code is ErrorCode.MODEL_ERROR and "HTTP 404" in failed.value.message
    assert upstream.bodies[0] == {"model": "m1", "stream": True, "temperature": 0.2,
                                  "messages": [{"role": "user", "content": "hello there world"}]}  # (not "other")
    assert upstream.bodies[1]["messages"][0] == {"role": "system", "content": "be brief"}
    assert upstream.auth == ["Bearer sk-test"] * 3 and upstream.ended == ["done", "done"]


async def test_a_cancel_stops_the_upstream_generation(servers: tuple[Upstream, RunningServer]) -> None:
    upstream, front = servers
    async with asyncio.timeout(30), connect(front.url) as client:
        stream = client.stream("one two three", model="slow")
        assert [await anext(stream) for _ in range(3)] == ["one ", "two ", "three "]
        await stream.cancel()
        rest = [c async for c in stream]  # (what was in flight, then the End)
        assert set(rest) <= {"one ", "two ", "three "}
        assert stream.end is not None and stream.end.finish_reason == "cancelled"
        # the upstream sees its client go
        await wait_until(lambda: upstream.ended, seconds(30), interval=0.01, what="the upstream to see its client go")
    assert upstream.ended == ["closed early"]


async def test_the_upstreams_tool_calls_go_to_the_client_and_its_answers_back(
        servers: tuple[Upstream, RunningServer]) -> None:
    upstream, front = servers
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    async with asyncio.timeout(30), connect(front.url) as client:
        reply = await client.complete("weather in Paris?", params={"tools": tools},
                                      tools={"weather": lambda city: f"sunny in {city}"})
        assert reply == "it is sunny in Paris "
    first, second = upstream.bodies
    assert first["tools"] == tools and len(first["messages"]) == 1
    asked = second["messages"][1]
    assert asked["role"] == "assistant" and asked["tool_calls"][0]["function"] == {"name": "weather",
                                                                                   "arguments": '{"city": "Paris"}'}
    assert second["messages"][2] == {"role": "tool", "tool_call_id": asked["tool_calls"][0]["id"],
                                     "content": "sunny in Paris"}
