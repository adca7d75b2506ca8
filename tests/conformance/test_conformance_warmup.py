"""Warm-up (protocol v1.2): a Request with ``warmup`` set runs the model's warm-up hook and nothing else, on
every server, in both wire formats."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from lowlat_mw.client import connect
from lowlat_mw.errors import ErrorCode, StreamError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_warm_up_runs_the_hook_alone_and_the_next_request_finds_the_model_warm(server, marks_dir):
    async with asyncio.timeout(40):
        for mode in ("proto", "json"):
            tag = f"{server.framework}-{mode}-{uuid.uuid4().hex[:8]}"
            async with connect(server.url, mode=mode) as client:
                assert client.welcome is not None and client.welcome.revision >= 2
                for kind in ("agen", "sync"):  # an async hook on the loop; a blocking one in the worker pool
                    params = {"tag": f"{tag}-{kind}"}
                    assert await client.complete("q", model=f"warm_{kind}", params=params) == "warm:cold"
                    end = await client.warmup("the system prompt", model=f"warm_{kind}", params=params)
                    assert end is not None and (end.finish_reason, end.last_seq) == ("warmup", 0)  # no Delta
                    assert (marks_dir / f"{tag}-{kind}.warmed").exists()
                    assert await client.complete("q", model=f"warm_{kind}", params=params) == "warm:the system prompt"
                # A model without a hook: the warm-up ends at once and the model itself never runs.
                end = await client.warmup("x", model="principal", params={"tag": f"{tag}-none"})
                assert end is not None and (end.finish_reason, end.last_seq) == ("warmup", 0)
                assert not (marks_dir / f"{tag}-none.ran").exists()
                # A failing hook fails its stream only, as a failing model does.
                with pytest.raises(StreamError) as failed:
                    await client.warmup(model="warm_broken")
                assert failed.value.code is ErrorCode.MODEL_ERROR
                assert await client.complete("after", model="sync") == "sync:after"
                assert client.warmups == 3 and client.connections == 1
