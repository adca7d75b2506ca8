"""The result cache: its bounds (bytes, least recently used first out, per-entry limit, TTL on a passed-in
clock), its key, and the runner's use of it in process (every server: tests/conformance/test_conformance_cache.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from lowlat_mw.adapters.starlette import LowLatMiddleware
from lowlat_mw.cache import (
    CHUNK_OVERHEAD,
    ENTRY_OVERHEAD,
    MERGE_TEXT,
    ResultCache,
    is_deterministic,
    merged,
    request_key,
)
from lowlat_mw.errors import SettingsError
from lowlat_mw.model import ModelRequest
from lowlat_mw.protocol import events as ev
from lowlat_mw.settings import Settings
from lowlat_mw.testing.inprocess import AppClient

pytestmark = pytest.mark.timeout(30)


def key(text: str, **params: Any) -> bytes:
    return request_key(ev.Request(stream_id=1, text=text, params=params))


def test_the_key_is_the_request_by_value() -> None:
    same = ev.Request(stream_id=9, text="a", params={"y": [1, {"z": 2}], "x": 1})  # (key order aside)
    assert key("a", x=1, y=[1, {"z": 2}]) == request_key(same)
    assert key("a", x=1) != key("a", x=1.0)  # a JSON frame's 1.0 stays a float: the model may tell them apart
    others = [ev.Request(stream_id=1, data=b"a"), ev.Request(stream_id=1, model="m", text="a"),
              ev.Request(stream_id=1, messages=(ev.ChatMessage(role="user", content="a"),))]
    assert len({key("a"), key("b"), key("a", x=1), key("a", x=True), key("a", x="1"), *map(request_key, others)}) == 8
    assert request_key(ev.Request(stream_id=1, model="a:", text="b")) != request_key(ev.Request(stream_id=1, model="a",
                                                                                                text=":b"))


def test_bounded_by_bytes_least_recently_used_out_first() -> None:
    entry = ENTRY_OVERHEAD + CHUNK_OVERHEAD + 10
    cache = ResultCache(capacity=4 * entry, ttl=60)  # four of these entries (each a quarter)
    for name in "abcd":
        assert cache.put(key(name), ["0123456789"], now=0)
    assert cache.get(key("a"), now=1) == ("0123456789",)  # a is now the most recent
    assert cache.put(key("e"), ["0123456789"], now=2)  # b goes
    assert cache.get(key("b"), now=3) is None and cache.get(key("c"), now=3) is not None
    assert len(cache) == 4 and cache.bytes == 4 * entry
    assert not cache.put(key("big"), [b"x" * cache.max_entry], now=4)  # over a quarter of the cache: not kept
    assert cache.put(key("é"), ["é"], now=5) and cache.bytes <= cache.capacity  # UTF-8 bytes are counted


def test_an_entry_expires_after_the_ttl_and_leaves_at_the_next_put() -> None:
    cache = ResultCache(capacity=1 << 20, ttl=10)
    cache.put(key("a"), ["x", b"y"], now=100)
    assert cache.get(key("a"), now=109.9) == ("x", b"y")
    assert cache.get(key("a"), now=110) is None and cache.bytes == 0 and len(cache) == 0
    cache.put(key("b"), ["x"], now=200)
    cache.put(key("c"), ["x"], now=215)  # b expired at 210: gone now, not when next looked up
    assert len(cache) == 1


def test_text_runs_are_kept_joined_and_binary_chunks_apart() -> None:
    assert merged(["a", "b", b"\x00", b"\x01", "c", "d"]) == ["ab", b"\x00", b"\x01", "cd"]
    assert merged(["x" * MERGE_TEXT, "y"]) == ["x" * MERGE_TEXT, "y"]


def test_the_settings_are_checked() -> None:
    with pytest.raises(SettingsError, match="cache_size"):
        Settings(cache_size=-1)
    with pytest.raises(SettingsError, match="at least 4096"):
        Settings(cache_size=100)
    with pytest.raises(SettingsError, match="cache_ttl"):
        Settings(cache_ttl=0)


class Counting:
    """A deterministic model that counts its runs; `hold` makes it wait (to cancel it) before its second chunk."""

    deterministic = True

    def __init__(self) -> None:
        self.runs = 0
        self.hold: asyncio.Event | None = None

    async def __call__(self, req: ModelRequest) -> Any:
        self.runs += 1
        yield "one "
        if self.hold is not None:
            await self.hold.wait()
        yield bytearray(b"two")  # (a mutable chunk: the cache keeps a copy)


def app_of(model: Any, registry: CollectorRegistry, **settings: Any) -> Starlette:
    app = Starlette()
    app.add_middleware(LowLatMiddleware, model=model, path="/ws", registry=registry, **settings)
    return app


async def test_a_hit_sends_the_kept_reply_and_counts_it() -> None:
    model, registry = Counting(), CollectorRegistry()
    async with AppClient(app_of(model, registry, cache_size=1 << 20), "/ws") as client:
        first = [c async for c in client.stream("q", params={"t": 1})]
        again = client.stream("q", params={"t": 1})
        assert [c async for c in again] == first == ["one ", b"two"]
        assert again.end is not None and (again.end.finish_reason, again.end.last_seq) == ("stop", 2)
        assert model.runs == 1
    assert is_deterministic(model)
    lookups = {s.labels["outcome"]: s.value for m in registry.collect() if m.name == "lowlat_cache_lookups"
               for s in m.samples if s.name.endswith("_total")}
    assert lookups == {"hit": 1.0, "miss": 1.0}


async def test_a_cancelled_reply_is_not_kept_and_without_the_setting_nothing_is() -> None:
    model = Counting()
    async with AppClient(app_of(model, CollectorRegistry(), cache_size=1 << 20), "/ws") as client:
        model.hold = asyncio.Event()
        stream = client.stream("q")
        assert await anext(stream) == "one "
        await stream.cancel()
        assert [c async for c in stream] == [] and stream.end is not None and stream.end.finish_reason == "cancelled"
        model.hold = None
        assert await client.complete("q") == "one two" and model.runs == 2  # ran again, then kept
        assert await client.complete("q") == "one two" and model.runs == 2
    off = Counting()
    async with AppClient(app_of(off, CollectorRegistry()), "/ws") as client:  # cache_size 0 (the default)
        for _ in range(2):
            assert await client.complete("q") == "one two"
    assert off.runs == 2


async def test_a_reply_too_big_to_keep_is_not_recorded_and_a_cancel_the_model_swallows_is_not_kept() -> None:
    class Big:
        deterministic = True
        runs = 0

        async def __call__(self, req: ModelRequest) -> Any:
            self.runs += 1
            for _ in range(100):
                yield "x" * 1000  # 100 KB: more than a quarter of a 64 KiB cache

    class Swallows:
        deterministic = True
        runs = 0
        started = asyncio.Event()

        async def __call__(self, req: ModelRequest) -> Any:
            self.runs += 1
            yield "one "
            try:
                if self.runs == 1:  # (the first run waits to be cancelled)
                    self.started.set()
                    await asyncio.sleep(30)
                yield "two"
            except asyncio.CancelledError:
                return  # (cleans up and returns: the loop ends as if the reply were whole)

    big, swallows = Big(), Swallows()
    async with AppClient(app_of({"big": big, "swallows": swallows}, CollectorRegistry(), cache_size=64 * 1024),
                         "/ws") as client:
        for _ in range(2):
            assert len(await client.complete("q", model="big")) == 100_000
        assert big.runs == 2
        stream = client.stream("q", model="swallows")
        assert await anext(stream) == "one "
        await swallows.started.wait()
        await stream.cancel()
        assert [c async for c in stream] == [] and stream.end is not None and stream.end.finish_reason == "cancelled"
        assert await client.complete("q", model="swallows") == "one two"  # not the cut reply: the model ran again
        assert swallows.runs == 2
