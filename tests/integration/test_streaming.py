"""Streaming through a real uvicorn server and the Python client (Starlette middleware).

Covers the four kinds of model callable in both wire modes, bytes chunks, one Delta per
yielded chunk (never concatenated), model errors, many streams per connection, the stream
limit, the sync client, End metadata, and cancellation when the client stops early.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lowlat_mw.client import connect, connect_sync
from lowlat_mw.errors import ConnectionClosed, ErrorCode, StreamError
from lowlat_mw.protocol import events as ev

from ._support import record_frames

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

MODES = ("proto", "json")


# ------------------------------------------------------------------------------ models
def sync_fn(req):
    return f"sync says {req.prompt}"


async def async_fn(req):
    await asyncio.sleep(0)
    return f"async says {req.prompt}"


def sync_gen(req):
    for i in range(5):
        yield f"<{req.prompt}:{i}>"


async def async_gen(req):
    for i in range(5):
        await asyncio.sleep(0)
        yield f"<{req.prompt}:{i}>"


def sync_bytes_gen(req):
    for i in range(4):
        yield bytes([i]) * (i + 1) + (req.data or b"")


async def async_bytes_gen(req):
    for i in range(4):
        yield bytes([255 - i]) * (i + 1) + (req.data or b"")


KINDS = {
    "sync-def": (sync_fn, "hi", ["sync says hi"]),
    "async-def": (async_fn, "hi", ["async says hi"]),
    "sync-generator": (sync_gen, "hi", [f"<hi:{i}>" for i in range(5)]),
    "async-generator": (async_gen, "hi", [f"<hi:{i}>" for i in range(5)]),
}


async def _stream_all(url, mode, text=None, **kwargs):
    client = connect(url, mode=mode)
    rec = record_frames(client)
    async with asyncio.timeout(10):
        async with client:
            stream = client.stream(text, **kwargs)
            chunks = [c async for c in stream]
    return chunks, stream, rec, client


# ------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(KINDS))
async def test_each_model_kind_streams_each_chunk_as_a_delta(uvicorn_server, starlette_app, kind, mode):
    model, prompt, expected = KINDS[kind]
    srv = uvicorn_server(starlette_app(model))
    chunks, stream, rec, _ = await _stream_all(srv.url, mode, prompt)
    assert chunks == expected
    assert stream.end is not None and stream.end.finish_reason == "stop"
    assert stream.end.usage["deltas"] == len(expected)
    assert stream.end.last_seq == len(expected)
    deltas = [e for _, e in rec.received_events() if isinstance(e, ev.Delta)]
    assert [d.seq for d in deltas] == list(range(1, len(expected) + 1))
    # the wire mode really is the one asked for
    assert all(isinstance(f, bytes if mode == "proto" else str) for f in rec.received)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", [sync_bytes_gen, async_bytes_gen], ids=["sync", "async"])
async def test_bytes_chunks(uvicorn_server, starlette_app, model, mode):
    srv = uvicorn_server(starlette_app(model))
    chunks, stream, _, _ = await _stream_all(srv.url, mode, data=b"\x00\xffZ")
    base = 0 if model is sync_bytes_gen else 255
    expected = [bytes([abs(base - i)]) * (i + 1) + b"\x00\xffZ" for i in range(4)]
    assert chunks == expected
    assert all(isinstance(c, bytes) for c in chunks)
    assert stream.end.usage["output_bytes"] == sum(len(c) for c in expected)


@pytest.mark.parametrize("mode", MODES)
async def test_sync_generator_chunk_arrives_before_generator_finishes(uvicorn_server, starlette_app, mode):
    """A blocking sync generator: its first chunk reaches the client while it is still blocked."""
    release = threading.Event()
    released_in_time: list[bool] = []

    def blocking_gen(req):
        yield "first"
        released_in_time.append(release.wait(5))  # blocks until the client saw "first"
        yield "second"
        yield "third"

    srv = uvicorn_server(starlette_app(blocking_gen))
    async with asyncio.timeout(10), connect(srv.url, mode=mode) as client:
        stream = client.stream("go")
        first = await stream.__anext__()
        assert first == "first"  # its own delta, not "firstsecondthird"
        assert not released_in_time, "generator finished before the client got its first chunk"
        release.set()
        rest = [c async for c in stream]
    assert rest == ["second", "third"]
    assert released_in_time == [True]


@pytest.mark.parametrize("mode", MODES)
async def test_model_error_becomes_stream_error_and_connection_lives_on(uvicorn_server, starlette_app, mode):
    def model(req):
        if req.prompt == "boom":
            yield "partial"
            raise RuntimeError("kaputt")
        yield "fine"

    srv = uvicorn_server(starlette_app(model))
    async with asyncio.timeout(10), connect(srv.url, mode=mode) as client:
        got = []
        with pytest.raises(StreamError) as info:
            async for chunk in client.stream("boom"):
                got.append(chunk)
        assert got == ["partial"]
        assert info.value.code is ErrorCode.MODEL_ERROR
        assert "RuntimeError" in info.value.message
        assert "kaputt" not in info.value.message  # expose_model_errors is off by default
        assert await client.complete("again") == "fine"
        assert client.connections == 1


async def test_model_error_message_exposed_when_configured(uvicorn_server, starlette_app):
    async def model(req):
        raise ValueError("detail for the client")

    srv = uvicorn_server(starlette_app(model, expose_model_errors=True))
    async with asyncio.timeout(10), connect(srv.url) as client:
        with pytest.raises(StreamError) as info:
            await client.complete("x")
    assert info.value.code is ErrorCode.MODEL_ERROR
    assert "detail for the client" in info.value.message


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_streams_interleave_on_one_connection(uvicorn_server, starlette_app, mode):
    n = 4
    barrier = threading.Barrier(n)

    def model(req):
        yield f"{req.prompt}:0"
        barrier.wait(5)  # every stream has sent its first chunk before any sends its second
        for i in range(1, 5):
            yield f"{req.prompt}:{i}"

    srv = uvicorn_server(starlette_app(model, max_streams=n))

    async def run(client, name):
        return [chunk async for chunk in client.stream(name)]

    client = connect(srv.url, mode=mode)
    rec = record_frames(client)
    async with asyncio.timeout(10), client:
        names = [f"s{i}" for i in range(n)]
        results = await asyncio.gather(*(run(client, name) for name in names))
        assert client.connections == 1
    for name, chunks in zip(names, results, strict=True):
        assert chunks == [f"{name}:{i}" for i in range(5)]
    # wire order (not the order the consumer tasks happened to run in)
    arrivals = [e.text for _, e in rec.received_events() if isinstance(e, ev.Delta)]
    assert len({e.stream_id for _, e in rec.received_events() if isinstance(e, ev.Delta)}) == n
    firsts = [i for i, c in enumerate(arrivals) if c.endswith(":0")]
    seconds = [i for i, c in enumerate(arrivals) if c.endswith(":1")]
    assert max(firsts) < min(seconds), f"streams did not interleave: {arrivals}"


async def test_too_many_streams(uvicorn_server, starlette_app):
    release = threading.Event()

    def model(req):
        yield "started"
        release.wait(5)
        yield "done"

    srv = uvicorn_server(starlette_app(model, max_streams=2))
    async with asyncio.timeout(10), connect(srv.url) as client:
        try:
            running = [client.stream(f"s{i}") for i in range(2)]
            for s in running:
                assert await s.__anext__() == "started"
            with pytest.raises(StreamError) as info:
                await client.complete("third")
            assert info.value.code is ErrorCode.TOO_MANY_STREAMS
            assert info.value.retryable
        finally:
            release.set()
        for s in running:
            assert [c async for c in s] == ["done"]
        # the slots are free again
        assert await client.complete("fourth") == "starteddone"
        assert client.connections == 1


@pytest.mark.parametrize("mode", MODES)
def test_sync_client_streams_with_end_metadata(uvicorn_server, starlette_app, mode):
    srv = uvicorn_server(starlette_app(sync_gen))
    with connect_sync(srv.url, mode=mode) as client:
        chunks = list(client.stream("sync"))
        stream = client.last_stream
        assert chunks == [f"<sync:{i}>" for i in range(5)]
        assert client.complete("again") == "".join(f"<again:{i}>" for i in range(5))
        assert client.client.connections == 1
    assert stream is not None and stream.end is not None
    assert stream.end.usage == {"deltas": 5, "output_bytes": sum(len(c) for c in chunks)}
    assert set(stream.end.timings_ms) >= {"total", "first_delta"}
    assert 0 <= stream.end.timings_ms["first_delta"] <= stream.end.timings_ms["total"]
    assert stream.time_to_first_delta is not None and stream.time_to_first_delta > 0
    assert stream.total_time is not None and stream.total_time >= stream.time_to_first_delta


async def test_async_stream_end_metadata(uvicorn_server, starlette_app):
    async def model(req):
        await asyncio.sleep(0.05)
        yield "a"
        yield "bc"

    srv = uvicorn_server(starlette_app(model))
    async with asyncio.timeout(10), connect(srv.url) as client:
        stream = client.stream("x")
        assert stream.end is None and stream.time_to_first_delta is None
        assert [c async for c in stream] == ["a", "bc"]
    assert stream.end.usage == {"deltas": 2, "output_bytes": 3}
    assert stream.end.timings_ms["first_delta"] >= 40  # the model slept 50 ms before its first chunk
    assert stream.end.timings_ms["total"] >= stream.end.timings_ms["first_delta"]
    assert stream.time_to_first_delta >= 0.04


def _forever_models(finished: list[str], lock: threading.Lock):
    async def agen_model(req):
        try:
            i = 0
            while True:
                yield f"tick{i} "
                i += 1
                await asyncio.sleep(0.005)
        finally:
            with lock:
                finished.append(req.prompt)

    def gen_model(req):
        try:
            i = 0
            while True:
                yield f"tick{i} "
                i += 1
                time.sleep(0.005)
        finally:
            with lock:
                finished.append(req.prompt)

    return {"async-generator": agen_model, "sync-generator": gen_model}


@pytest.mark.parametrize("kind", ["async-generator", "sync-generator"])
async def test_leaving_iteration_early_cancels_the_model(uvicorn_server, starlette_app, kind):
    finished: list[str] = []
    lock = threading.Lock()
    srv = uvicorn_server(starlette_app(_forever_models(finished, lock)[kind]))

    def done(name):
        with lock:
            return name in finished

    async with asyncio.timeout(10), connect(srv.url) as client:
        for name in ("first", "second"):  # the connection stays usable after a cancel
            stream = client.stream(name)
            got = []
            async for chunk in stream:
                got.append(chunk)
                if len(got) == 3:
                    break
            assert got == ["tick0 ", "tick1 ", "tick2 "]
            assert not done(name)
            await stream.aclose()
            for _ in range(500):
                if done(name):
                    break
                await asyncio.sleep(0.01)
            assert done(name), "the model's finally did not run after the client left the stream"
        assert client.connections == 1


def test_sync_client_leaving_early_cancels_the_model(uvicorn_server, starlette_app):
    finished: list[str] = []
    lock = threading.Lock()
    srv = uvicorn_server(starlette_app(_forever_models(finished, lock)["async-generator"]))
    with connect_sync(srv.url) as client:
        gen = client.stream("sync")
        assert next(gen) == "tick0 "
        gen.close()
        deadline = time.monotonic() + 5
        while "sync" not in finished and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "sync" in finished


@pytest.mark.parametrize("mode", MODES)
async def test_client_vanishing_mid_stream_cancels_the_model(uvicorn_server, starlette_app, mode):
    # The session is kept for resume_window seconds after a drop; then its models are stopped.
    finished: list[str] = []
    lock = threading.Lock()
    srv = uvicorn_server(starlette_app(_forever_models(finished, lock)["async-generator"], resume_window=0.5))
    async with asyncio.timeout(10):
        client = connect(srv.url, mode=mode, resume=False)  # it never comes back
        stream = client.stream("gone")
        assert await stream.__anext__() == "tick0 "
        client._ws.transport.abort()  # drop the TCP connection: no close handshake
        dropped = time.monotonic()
        for _ in range(500):
            with lock:
                if "gone" in finished:
                    break
            await asyncio.sleep(0.01)
        assert "gone" in finished, "the model kept running after its client vanished"
        waited = time.monotonic() - dropped
        assert waited >= 0.4, f"the model stopped after {waited:.2f} s, before the resume window ended"
        await client.close()


@pytest.mark.parametrize("mode", MODES)
async def test_non_ascii_text_chunks(uvicorn_server, starlette_app, mode):
    pieces = ["héllo ", "wörld ", "🌍", " ✓", "日本語"]

    async def model(req):
        for p in pieces:
            yield p

    srv = uvicorn_server(starlette_app(model))
    chunks, stream, _, _ = await _stream_all(srv.url, mode, "x")
    assert chunks == pieces
    assert stream.end.usage["output_bytes"] == sum(len(p.encode()) for p in pieces)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["text", "bytes"])
async def test_chunk_larger_than_max_frame_size_is_split(uvicorn_server, starlette_app, mode, kind):
    max_frame = 4096
    big = ("0123456789abcdé" * 1000) if kind == "text" else bytes(range(256)) * 60

    async def model(req):
        yield "head"
        yield big
        yield "tail" if kind == "text" else b"tail"

    srv = uvicorn_server(starlette_app(model, max_frame_size=max_frame))
    client = connect(srv.url, mode=mode, compression=[])
    rec = record_frames(client)
    async with asyncio.timeout(10), client:
        chunks = [c async for c in client.stream("x")]
    assert chunks[0] == "head" and chunks[-1] in ("tail", b"tail")
    middle = chunks[1:-1]
    assert len(middle) > 1
    assert (b"" if kind == "bytes" else "").join(middle) == big
    sizes = [len(f.encode()) if isinstance(f, str) else len(f) for f in rec.received]
    assert max(sizes) <= max_frame, sizes


@pytest.mark.parametrize("mode", MODES)
async def test_stream_cancel_ends_iteration_with_cancelled_end(uvicorn_server, starlette_app, mode):
    finished: list[str] = []
    lock = threading.Lock()
    srv = uvicorn_server(starlette_app(_forever_models(finished, lock)["async-generator"]))
    async with asyncio.timeout(10), connect(srv.url, mode=mode) as client:
        stream = client.stream("cancel me")
        assert await stream.__anext__() == "tick0 "
        await stream.cancel()
        rest = [c async for c in stream]  # deltas already in flight, then the End
        assert all(c.startswith("tick") for c in rest)
        assert stream.end is not None and stream.end.finish_reason == "cancelled"
        assert stream.end.last_seq == 1 + len(rest)
        with lock:
            assert "cancel me" in finished
        assert client.connections == 1


async def test_client_close_ends_running_stream_with_connection_closed(uvicorn_server, starlette_app):
    finished: list[str] = []
    lock = threading.Lock()
    srv = uvicorn_server(starlette_app(_forever_models(finished, lock)["sync-generator"]))
    async with asyncio.timeout(10):
        client = connect(srv.url)
        stream = client.stream("closing")
        assert await stream.__anext__() == "tick0 "
        await client.close()
        with pytest.raises(ConnectionClosed) as info:
            async for _ in stream:
                pass
        assert info.value.code == 1000
        for _ in range(500):
            with lock:
                if "closing" in finished:
                    break
            await asyncio.sleep(0.01)
        assert "closing" in finished
