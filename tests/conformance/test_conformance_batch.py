"""Micro-batching on every server: concurrent requests for a batch-capable model go to one call per batch, and
each reply streams on its own request's stream. (The conformance servers' batches hold 4 requests and wait for
them: 8 requests sent at once make exactly two calls, on a loaded machine too.)"""

from __future__ import annotations

import asyncio

import pytest

from lowlat_mw.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.mark.parametrize("model", ["batched", "batched_sync"])  # an async call on the loop; a sync one in the pool
async def test_eight_concurrent_requests_make_two_calls_of_four(server, model):
    async with asyncio.timeout(40), connect(server.url) as client:
        replies = await asyncio.gather(*(client.complete(f"q{i}", model=model) for i in range(8)))
        assert replies == [f"q{i}|batch of 4" for i in range(8)]
        assert client.connections == 1
