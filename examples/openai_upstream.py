"""lowlat-mw in front of an OpenAI-compatible streaming HTTP API (OpenAI, vLLM, llama.cpp's server, Ollama...).

Clients keep one WebSocket to lowlat-mw and get its multiplexing, resume, heartbeats and compression; each
request becomes one streamed ``POST {OPENAI_BASE_URL}/chat/completions`` upstream (httpx, keep-alive connections
pooled per event loop), whose ``choices[0].delta.content`` pieces go out as Deltas as they arrive. A Cancel, or
a dropped client that does not resume, closes the upstream response, so the upstream stops generating.

Run:  OPENAI_BASE_URL=http://127.0.0.1:8001/v1 OPENAI_API_KEY=sk-... OPENAI_MODEL=my-model \\
          lowlat-mw serve examples.openai_upstream:generate --port 8000
Then: lowlat-mw chat ws://127.0.0.1:8000/ws "hello"

Needs httpx and the server (``pip install "lowlat-mw[openai]"``). The request's ``model`` (or OPENAI_MODEL) names
the upstream model; ``messages`` (or the prompt, as one user message) become the chat; the params in PASSED go
upstream as they are (temperature, max_tokens...). An upstream error is this stream's model error (its message with
the setting ``expose_model_errors``).

Tools the client runs (function calling; protocol v1.3): a request whose params carry OpenAI ``tools``
definitions passes them upstream; when the upstream asks for tool calls, each goes to the client as a
``ToolCall`` on the same stream (``client.stream(..., params={"tools": [...]}, tools={"name": fn})`` answers them),
the answers go back upstream as ``tool`` messages, and the completion goes on, for at most MAX_TOOL_ROUNDS rounds.
"""

from __future__ import annotations

import asyncio
import json
import os
import weakref
from collections.abc import AsyncIterator
from typing import Any

import httpx

PASSED = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "presence_penalty",
          "frequency_penalty", "logit_bias", "user", "response_format", "tools",
          "tool_choice")  # (not n: one stream carries one choice)
MAX_TOOL_ROUNDS = 8  # upstream calls one request may make while the model keeps asking for tools

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


class UpstreamError(RuntimeError):
    """The upstream API refused the request or broke off."""


def _client() -> httpx.AsyncClient:
    """This event loop's pooled client (an httpx client belongs to the loop that made it)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        timeout = httpx.Timeout(connect=10.0, read=float(os.environ.get("OPENAI_READ_TIMEOUT", "120")), write=30.0,
                                pool=10.0)
        client = _clients[loop] = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_keepalive_connections=64))
    return client


def chat_body(req: Any) -> dict[str, Any]:
    """The upstream request for `req` (a lowlat_mw.ModelRequest)."""
    if req.messages:
        messages = [{"role": m.role, "content": m.content} for m in req.messages]
    else:
        messages = [{"role": "user", "content": req.prompt}]
    body: dict[str, Any] = {"model": req.model or os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
                            "messages": messages, "stream": True}
    body.update({k: v for k, v in req.params.items() if k in PASSED})
    return body


async def generate(req: Any) -> AsyncIterator[Any]:
    """Stream the upstream chat completion's text as it arrives; its tool calls go to the client and back."""
    body = chat_body(req)
    for _ in range(MAX_TOOL_ROUNDS):
        calls: dict[int, dict[str, str]] = {}  # the upstream's tool calls, by index, as their pieces arrive
        async for piece in _completion(body, calls):
            yield piece
        if not calls:
            return
        asked = [req.tool_call(c["name"], c["arguments"] or "{}") for _, c in sorted(calls.items())]
        body["messages"].append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in asked]})
        for call in asked:
            yield call  # the client runs it (a Delta with the call), then answers on this stream
        for call in asked:
            result = await req.inputs.result(call)
            content = f"error: {result.content}" if result.is_error else result.content
            body["messages"].append({"role": "tool", "tool_call_id": call.id, "content": content})
    raise UpstreamError(f"the model still asked for tools after {MAX_TOOL_ROUNDS} rounds")


async def _completion(body: dict[str, Any], calls: dict[int, dict[str, str]]) -> AsyncIterator[str]:
    """One streamed upstream completion: its text pieces; its tool calls are gathered into `calls`."""
    base = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/")
    headers = {"Accept": "text/event-stream"}
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    async with _client().stream("POST", f"{base}/chat/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            detail = (await resp.aread())[:300].decode("utf-8", "replace")
            raise UpstreamError(f"upstream answered HTTP {resp.status_code}: {detail}")
        async for line in resp.aiter_lines():  # server-sent events: "data: {...}" lines, then "data: [DONE]"
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                raise UpstreamError(f"upstream error: {event['error']}")
            for choice in event.get("choices") or ():
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                piece = delta.get("content")
                if piece:
                    yield piece
                for part in delta.get("tool_calls") or ():  # (streamed in pieces: the name, then the arguments)
                    call = calls.setdefault(part.get("index", 0), {"name": "", "arguments": ""})
                    function = part.get("function") or {}
                    call["name"] += function.get("name") or ""
                    call["arguments"] += function.get("arguments") or ""
    # (an upstream that ends its stream without "data: [DONE]" ends here: some OpenAI-compatible servers do,
    # and their replies end at the close; a cut connection raises in aiter_lines above.)
