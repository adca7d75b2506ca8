"""The result cache (setting cache_size, on in the conformance servers): a deterministic model's reply is kept
and sent again, at once, for the same request, on every server; the model does not run again."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from lowlat_mw.client import connect
from lowlat_mw.errors import ErrorCode, StreamError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def runs(marks_dir, tag: str) -> int:
    path = marks_dir / f"{tag}.runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_the_same_request_gets_the_kept_reply_without_the_model(server, marks_dir):
    async with asyncio.timeout(40):
        for mode in ("proto", "json"):
            tag = f"{server.framework}-{mode}-{uuid.uuid4().hex[:8]}"
            async with connect(server.url, mode=mode) as client:
                for model, first in (("det", "a;b;c;"), ("det_sync", "sync:a b c")):
                    params = {"tag": f"{tag}-{model}", "n": 1}
                    assert await client.complete("a b c", model=model, params=params) == first
                    again = client.stream("a b c", model=model, params={"n": 1, "tag": f"{tag}-{model}"})
                    assert await again.text() == first  # (params in another order: the same request)
                    assert again.end is not None and again.end.finish_reason == "stop"
                    assert runs(marks_dir, f"{tag}-{model}") == 1  # the model ran once
                    # Another input, or another params value, is another request.
                    assert await client.complete("a b d", model=model, params=params) != first
                    assert await client.complete("a b c", model=model, params={**params, "n": 2}) == first
                    assert runs(marks_dir, f"{tag}-{model}") == 3
                # A reply that failed is not kept: the next identical request runs the model again.
                failing = {"tag": f"{tag}-fail", "fail": True}
                for _ in range(2):
                    with pytest.raises(StreamError) as failed:
                        await client.complete("x y", model="det", params=failing)
                    assert failed.value.code is ErrorCode.MODEL_ERROR
                assert runs(marks_dir, f"{tag}-fail") == 2
                # A model not marked deterministic is never cached.
                assert await client.complete("q", model="sync") == "sync:q"
