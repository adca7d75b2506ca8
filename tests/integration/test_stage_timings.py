"""End.timings_ms through a real uvicorn server: the stages add up to the server's total (within
1 ms) for every kind of model callable, for cancelled streams, streams paused by flow control and
compressed output, and each stage holds the time it names (a sleeping model's time is `model`,
a client that does not acknowledge shows up as `flow`, a busy worker pool as `queue`)."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from lowlat_mw.client import connect
from lowlat_mw.observability.timing import STAGES, stage_sum

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TOLERANCE_MS = 1.0  # issue 6: stages add up to the total within 1 ms


def sync_fn(req):
    time.sleep(0.02)
    return "sync reply"


async def async_fn(req):
    await asyncio.sleep(0.02)
    return "async reply"


def sync_gen(req):
    for i in range(10):
        time.sleep(0.002)
        yield f"s{i} "


async def async_gen(req):
    for i in range(10):
        await asyncio.sleep(0.002)
        yield f"a{i} "


async def big_text(req):
    for _ in range(20):
        yield "the same compressible sentence, again and again. " * 200


async def slow(req):
    for i in range(1000):
        await asyncio.sleep(0.01)
        yield f"{i} "


async def many(req):
    for i in range(int(req.params.get("n", 200))):
        yield f"token-{i:05d} " * 4
        await asyncio.sleep(0)


MODELS = {"sync_fn": sync_fn, "async_fn": async_fn, "sync_gen": sync_gen, "async_gen": async_gen,
          "big": big_text, "slow": slow, "many": many}


def check_adds_up(timings: dict[str, float]) -> None:
    assert set(STAGES) <= set(timings), timings
    assert all(timings[s] >= 0 for s in STAGES), timings
    assert abs(stage_sum(timings) - timings["total"]) <= TOLERANCE_MS, timings


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_stages_add_up_for_every_kind_of_model(uvicorn_server, starlette_app, mode: str) -> None:
    srv = uvicorn_server(starlette_app(MODELS, registry=CollectorRegistry()))
    async with connect(srv.url, mode=mode) as client:
        for name, sleep_ms in (("sync_fn", 20), ("async_fn", 20), ("sync_gen", 20), ("async_gen", 20)):
            for _ in range(3):
                stream = client.stream("hi", model=name)
                async for _chunk in stream:
                    pass
                timings = dict(stream.end.timings_ms)
                check_adds_up(timings)
                assert timings["model"] >= sleep_ms * 0.9, (name, timings)
                assert timings["model_first_chunk"] <= timings["model"] + 1e-6
                assert timings["first_delta"] <= timings["total"]
                client_side = stream.timings
                assert client_side.server_total == timings["total"] / 1000.0  # seconds, as ping() and the rest
                assert client_side.total >= client_side.server_total  # the client's interval contains it
                assert client_side.first_delta >= timings["first_delta"] / 1000.0
                assert set(client_side.server_stages) == set(STAGES)


async def test_compression_time_is_its_own_stage(uvicorn_server, starlette_app) -> None:
    srv = uvicorn_server(starlette_app(MODELS, registry=CollectorRegistry(), compression_min_size=64))
    async with connect(srv.url, compression=["zstd"]) as client:
        stream = client.stream("x", model="big")
        async for _ in stream:
            pass
        timings = dict(stream.end.timings_ms)
        check_adds_up(timings)
        assert timings["compress"] > 0 and timings["encode"] > 0


async def test_cancelled_stream_adds_up_and_counts_the_wait_as_model(uvicorn_server, starlette_app) -> None:
    srv = uvicorn_server(starlette_app(MODELS, registry=CollectorRegistry()))
    async with connect(srv.url) as client:
        stream = client.stream("x", model="slow")
        got = [await stream.__anext__() for _ in range(3)]
        assert got
        await asyncio.sleep(0.1)  # the model sleeps: time in `model`
        await stream.cancel()
        async for _ in stream:
            pass
        assert stream.end is not None and stream.end.finish_reason == "cancelled"
        timings = dict(stream.end.timings_ms)
        check_adds_up(timings)
        assert timings["model"] >= 100


async def test_flow_control_pause_is_the_flow_stage(uvicorn_server, starlette_app) -> None:
    srv = uvicorn_server(starlette_app(MODELS, registry=CollectorRegistry(), flow_window=4096))
    async with connect(srv.url, flow_window=4096) as client:
        stream = client.stream("x", model="many", params={"n": 300})
        count = 0
        async for _ in stream:
            count += 1
            if count % 50 == 0:
                await asyncio.sleep(0.05)  # a slow reader: no Acks, the window fills, the model waits
        timings = dict(stream.end.timings_ms)
        check_adds_up(timings)
        assert timings["flow"] >= 50, timings


async def test_busy_worker_pool_shows_as_queue(uvicorn_server, starlette_app) -> None:
    srv = uvicorn_server(starlette_app(MODELS, registry=CollectorRegistry(), model_threads=1, max_streams=8))
    async with connect(srv.url) as client:
        streams = [client.stream("x", model="sync_fn") for _ in range(4)]

        async def drain(s):
            async for _ in s:
                pass
            return dict(s.end.timings_ms)

        results = await asyncio.gather(*(drain(s) for s in streams))
    for timings in results:
        check_adds_up(timings)
    # One worker thread, four 20 ms calls: the last one waited for three others.
    assert max(t["queue"] for t in results) >= 40, results


async def test_stage_timings_off_leaves_total_and_first_delta(uvicorn_server, starlette_app) -> None:
    srv = uvicorn_server(starlette_app(MODELS, stage_timings=False, metrics=False, tracing=False))
    async with connect(srv.url) as client:
        stream = client.stream("x", model="async_gen")
        async for _ in stream:
            pass
        assert set(stream.end.timings_ms) == {"total", "first_delta"}


async def test_many_concurrent_streams_each_add_up(uvicorn_server, starlette_app) -> None:
    srv = uvicorn_server(starlette_app(MODELS, registry=CollectorRegistry(), max_streams=16, rate_burst=100))
    async with connect(srv.url) as client:

        async def one(i: int) -> dict[str, float]:
            stream = client.stream("x", model="many", params={"n": 100})
            async for _ in stream:
                pass
            return dict(stream.end.timings_ms)

        results = await asyncio.gather(*(one(i) for i in range(16)))
    for timings in results:
        check_adds_up(timings)
