"""merge_deltas (setting): text a model yields back to back goes out in fewer Deltas, on every framework.

What must hold: the output is exactly the model's text in order; the first chunk still leaves alone
(time to first delta is not traded away); chunks the model waits between, sync generators' chunks
(each waits for a worker thread) and binary chunks keep one Delta each; cancel, model errors and
End still work through the merging path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from conformance_servers import FRAMEWORKS, ServerProcess, base_env, server_argv, start_ready
from conformance_support import MODES

from lowlat_mw import ErrorCode, StreamError
from lowlat_mw.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module", params=FRAMEWORKS)
def merging(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    """The framework's example with merge_deltas on (set the way a deployment would: environment)."""
    fw = request.param
    env = base_env(conformance_dir, {"LOWLAT_MERGE_DELTAS": "1"})
    srv = start_ready(f"merge-{fw}", fw, lambda p: server_argv(fw, p, env=env), env, conformance_dir / "logs")
    yield srv
    alive = srv.alive()
    srv.stop()
    if not alive:
        pytest.fail(f"{srv.name} died (exit code {srv.proc.returncode})\n{srv.output()}")


async def chunks_of(stream) -> list:
    return [c async for c in stream]


@pytest.mark.parametrize("mode", MODES)
async def test_back_to_back_text_is_merged_exactly_and_the_first_chunk_leaves_alone(merging, mode):
    n = 3000
    async with asyncio.timeout(30), connect(merging.url, mode=mode) as client:
        stream = client.stream("x", model="agen", params={"n": n})
        chunks = await chunks_of(stream)
        assert "".join(chunks) == "".join(f"a{i};" for i in range(n))
        assert chunks[0] == "a0;"  # the first chunk is not held back to merge
        assert len(chunks) < n / 10, len(chunks)  # merged: a fast model's 3000 chunks in few Deltas
        assert stream.end.finish_reason == "stop"
        assert stream.end.usage["deltas"] == len(chunks)  # seq counts Deltas, not model chunks
        print(f"merge {merging.framework} {mode}: {n} chunks in {len(chunks)} Deltas")


@pytest.mark.parametrize("model, params, expected", [
    ("agen", {"n": 6, "delay": 0.01}, [f"a{i};" for i in range(6)]),  # waits between chunks
    ("gen", {"n": 20}, [f"g{i};" for i in range(20)]),  # a sync generator: each chunk waits for a thread
    ("data", {"n": 4}, [bytes([i]) * 4 for i in range(4)]),  # binary chunks are never merged
])
async def test_chunks_the_model_waits_between_keep_one_delta_each(merging, model, params, expected):
    async with asyncio.timeout(20), connect(merging.url) as client:
        assert await chunks_of(client.stream("x", model=model, params=params)) == expected


async def test_cancel_and_model_errors_through_the_merging_path(merging):
    async with asyncio.timeout(20), connect(merging.url) as client:
        held = client.stream("x", model="hold", params={"delay": 30})
        assert await anext(held) == "started;"
        await held.cancel()  # the model is suspended inside the merging step: the cancel reaches it
        assert await chunks_of(held) == []
        assert held.end.finish_reason == "cancelled"
        failing = client.stream("x", model="fail")
        got = []
        with pytest.raises(StreamError) as info:
            async for c in failing:
                got.append(c)
        assert got == ["before;"] and info.value.code is ErrorCode.MODEL_ERROR
        # and the connection carries on
        assert "".join(await chunks_of(client.stream("x", model="agen", params={"n": 3}))) == "a0;a1;a2;"
