"""Stopping a stream stops the model: its ``finally`` runs (the model writes a marker file)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from conformance_support import measure_max, wait_for_file
from support.time import seconds

from lowlat_mw.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CLOSE_BOUND = seconds(5.0)  # for the model's cleanup to run after the client stops the stream (measured under
# load: 117 ms at most over 300 gen-disconnect streams, two busy loops and four other streams beside them)
PARAMS = {"n": 10_000, "delay": 0.05}  # ~8 minutes if nobody stopped it


@pytest.mark.parametrize("how", ["aclose", "cancel", "disconnect"])
@pytest.mark.parametrize("kind", ["gen", "agen"])  # sync generator in a worker thread / async generator
async def test_stopping_a_stream_closes_the_model(server, marks_dir, kind, how):
    tag = f"{server.framework}-{kind}-{how}-{uuid.uuid4().hex[:8]}"
    marker = marks_dir / f"{tag}.closed"
    prefix = kind[0]
    async with asyncio.timeout(30):
        client = connect(server.url)
        try:
            stream = client.stream("x", model=kind, params={**PARAMS, "tag": tag})
            assert [await anext(stream) for _ in range(3)] == [f"{prefix}{i};" for i in range(3)]
            assert not marker.exists()  # still running
            if how == "aclose":
                await stream.aclose()  # what breaking out of iteration should do: Cancel on the wire
            elif how == "cancel":
                await stream.cancel()
                rest = [c async for c in stream]  # Deltas in flight, then End("cancelled")
                assert rest == [f"{prefix}{i};" for i in range(3, 3 + len(rest))]
                assert stream.end.finish_reason == "cancelled"
                assert stream.end.last_seq == 3 + len(rest)
            else:
                await client.close()  # the connection goes away mid-stream
            took = await wait_for_file(marker, CLOSE_BOUND)
            measure_max(f"stop -> model finally ran, {server.framework} (max of 6)", took)
            if how != "disconnect":
                # the connection is fine and the stream id's slot is free again
                assert await client.complete("after", model="sync") == "sync:after"
                assert client.connections == 1
        finally:
            await client.close()
