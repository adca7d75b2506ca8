"""Streaming with the Python client, and stream-level errors, on every framework."""

from __future__ import annotations

import asyncio

import pytest
from conformance_servers import wait_for_line
from conformance_support import MODES

from lowlat_mw import ErrorCode, StreamError
from lowlat_mw.client import connect, connect_sync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# model -> (params, expected chunks in order)
KINDS = {
    "sync": ({}, ["sync:hi there"]),
    "async": ({}, ["async:hi there"]),
    "gen": ({"n": 7}, [f"g{i};" for i in range(7)]),
    "agen": ({"n": 7}, [f"a{i};" for i in range(7)]),
    "data": ({"n": 4}, [bytes([i]) * 4 for i in range(4)]),
}


async def collect(stream) -> tuple[list, list[int]]:
    """Chunks of a stream and the seq of each Delta as the client saw it."""
    chunks, seqs = [], []
    async for chunk in stream:
        chunks.append(chunk)
        seqs.append(stream.last_seq)
    return chunks, seqs


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(KINDS))
async def test_every_model_kind_streams_exact_chunks(server, kind, mode):
    params, expected = KINDS[kind]
    async with asyncio.timeout(20), connect(server.url, mode=mode) as client:
        for _ in range(2):  # twice on one connection: stream ids advance, state is per stream
            stream = client.stream("hi there", model=kind, params=params)
            chunks, seqs = await collect(stream)
            assert chunks == expected
            assert all(type(c) is type(expected[0]) for c in chunks)
            assert seqs == list(range(1, len(expected) + 1))
            end = stream.end
            assert end is not None and end.finish_reason == "stop"
            assert end.last_seq == len(expected)
            assert end.usage["deltas"] == len(expected)
            assert end.usage["output_bytes"] == sum(len(c if isinstance(c, bytes) else c.encode()) for c in expected)
            assert end.timings_ms["total"] >= end.timings_ms["first_delta"] >= 0
        assert client.connections == 1


@pytest.mark.parametrize("mode", MODES)
async def test_input_kinds_and_params_reach_the_model(server, mode):
    """messages and data inputs both become req.prompt; params reach the model."""
    async with asyncio.timeout(20), connect(server.url, mode=mode) as client:
        assert await client.complete(messages=[{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": "last turn"}], model="sync") \
            == "sync:last turn"
        assert await client.complete(data="dätä".encode(), model="async") == "async:dätä"
        assert await client.complete("", model="gen", params={"n": 3.0}) == "g0;g1;g2;"
        # the empty model name picks the "default" entry (agen)
        assert await client.complete("x", params={"n": 2}) == "a0;a1;"


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_streams_on_one_connection(server, mode):
    async with asyncio.timeout(20), connect(server.url, mode=mode) as client:
        streams = [client.stream("x", model=kind, params={"n": 20, "delay": 0.002})
                   for kind in ("gen", "agen") * 4]
        results = await asyncio.gather(*(collect(s) for s in streams))
        for stream, (chunks, seqs) in zip(streams, results, strict=True):
            prefix = "g" if stream.request.model == "gen" else "a"
            assert chunks == [f"{prefix}{i};" for i in range(20)]
            assert seqs == list(range(1, 21))
        assert len({s.stream_id for s in streams}) == 8


@pytest.mark.timeout(60)
def test_sync_client(server):
    with connect_sync(server.url, mode="json") as client:
        assert [c for c in client.stream("x", model="gen", params={"n": 4})] == ["g0;", "g1;", "g2;", "g3;"]
        assert client.last_stream.end.last_seq == 4
        assert client.complete("sync please", model="sync") == "sync:sync please"
        assert list(client.stream("x", model="data", params={"n": 2})) == [b"\0" * 4, b"\1" * 4]


# ---------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("mode", MODES)
async def test_model_error_after_first_chunk_keeps_connection(server, mode):
    async with asyncio.timeout(20), connect(server.url, mode=mode) as client:
        stream = client.stream("x", model="fail")
        chunks = []
        with pytest.raises(StreamError) as info:
            async for chunk in stream:
                chunks.append(chunk)
        assert chunks == ["before;"]
        assert info.value.code is ErrorCode.MODEL_ERROR
        assert info.value.retryable is False
        assert info.value.stream_id == stream.stream_id
        # expose_model_errors is off: the type name only, never the exception's text
        assert info.value.message == "model failed (RuntimeError)"
        assert await client.complete("after", model="sync") == "sync:after"
        assert client.connections == 1


@pytest.mark.parametrize("model", ["returns_dict", "returns_int"])
async def test_a_reply_no_delta_carries_is_a_type_error_logged_once_naming_the_model(server, model):
    # issue 38 (a new user): `return {"answer": 1}` streamed the text "answer" and ended with "stop", nothing
    # logged; `return 42` got model_error (TypeError). A mapping now gets the same Error, and one log line.
    async with asyncio.timeout(20), connect(server.url) as client:
        stream = client.stream("x", model=model)
        with pytest.raises(StreamError) as info:
            _ = [c async for c in stream]
        assert info.value.code is ErrorCode.MODEL_ERROR and info.value.message == "model failed (TypeError)"
        assert stream.last_seq == 0
        session = client.welcome.session_id
    line = f"model conformance_models.{model} failed on stream {stream.stream_id} of {session}"
    logs = wait_for_line(server, line)
    assert logs.count(line) == 1, logs[-3000:]
    kind = "dict" if model == "returns_dict" else "int"
    assert f"TypeError: model returned {kind}, which no Delta carries: conformance_models.{model} must" in logs


@pytest.mark.parametrize("mode", MODES)
async def test_unknown_model(server, mode):
    async with asyncio.timeout(20), connect(server.url, mode=mode) as client:
        stream = client.stream("x", model="no-such-model")
        with pytest.raises(StreamError) as info:
            _ = [c async for c in stream]
        assert info.value.code is ErrorCode.UNKNOWN_MODEL
        assert info.value.stream_id == stream.stream_id
        assert "no-such-model" in info.value.message and "agen" in info.value.message  # lists what is served
        assert await client.complete("after", model="sync") == "sync:after"
        assert client.connections == 1


@pytest.mark.parametrize("mode", MODES)
async def test_too_many_streams(server, mode):
    async with asyncio.timeout(30), connect(server.url, mode=mode) as client:
        await client.open()
        limit = client.welcome.max_streams
        assert limit == 16
        running = [client.stream("x", model="hold", params={"delay": 30}) for _ in range(limit)]
        for stream in running:  # the first chunk proves the stream runs on the server
            assert await anext(stream) == "started;"
        extra = client.stream("x", model="sync")
        with pytest.raises(StreamError) as info:
            await anext(extra)
        assert info.value.code is ErrorCode.TOO_MANY_STREAMS
        assert info.value.retryable is True
        assert info.value.stream_id == extra.stream_id
        # cancel the held streams; each ends with End(cancelled) and frees its slot
        for stream in running:
            await stream.cancel()
        for stream in running:
            assert [c async for c in stream] == []
            assert stream.end.finish_reason == "cancelled" and stream.end.last_seq == 1
        assert await client.complete("after", model="sync") == "sync:after"
        assert client.connections == 1
