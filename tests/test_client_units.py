"""One time unit in the Python API: seconds (ping(), rtt, time_to_first_delta, StreamTimings, the settings);
milliseconds only on the wire (End.timings_ms). The 0.1.0 millisecond names still work, with a warning."""

from __future__ import annotations

import asyncio
import warnings

import pytest
from uvicorn_support import WAIT, InProcessServer

from lowlat_mw import StreamTimings, connect


async def test_stream_timings_ping_and_rtt_are_all_seconds() -> None:
    async with InProcessServer() as server, asyncio.timeout(WAIT):
        async with connect(f"ws://127.0.0.1:{server.port}/ws") as client:
            stream = client.stream("hello")
            assert [c async for c in stream] == ["hello"]
            rtt = await client.ping()
            t = stream.timings
    assert isinstance(t, StreamTimings)
    assert t.total == stream.total_time and t.first_delta == stream.time_to_first_delta
    assert t.server_total == stream.end.timings_ms["total"] / 1000
    assert t.server_first_delta == stream.end.timings_ms["first_delta"] / 1000
    assert t.network == t.total - t.server_total
    # the same scale: a loopback round trip and a one-token stream are both well under a second here
    assert 0 < rtt < WAIT and 0 < t.total < WAIT and 0 <= t.server_total <= t.total


def test_the_millisecond_names_still_work_and_warn() -> None:
    t = StreamTimings(first_delta=0.25, total=1.5, server_first_delta=0.125, server_total=1.0,
                      server_stages={"model": 0.5}, model_first_chunk=None)
    with pytest.warns(DeprecationWarning, match=r"StreamTimings.total_ms is deprecated: use .total \(seconds\)"):
        assert t.total_ms == 1500.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert (t.first_delta_ms, t.server_first_delta_ms, t.server_total_ms) == (250.0, 125.0, 1000.0)
        assert t.model_first_chunk_ms is None and t.network_ms == 500.0
        assert t.server_stages_ms == {"model": 500.0}
    with pytest.warns(DeprecationWarning) as record:
        t.server_stages_ms  # noqa: B018
        t.network_ms  # noqa: B018
    assert all(w.filename == __file__ for w in record)  # the warnings point at the caller
