"""The shutdown drain, driven directly (no server): what every server's shutdown hook relies on.

:func:`lowlat_mw.runtime.drain.drain_all` drains every endpoint with connections on the running loop;
:meth:`Endpoint.drain` one endpoint. Each test runs on its own event loop (pytest-asyncio), so the
drain of one never reaches another's connections.
"""

from __future__ import annotations

import asyncio
from typing import Any

from driver_support import Peer, endpoint_for
from support import wait_until

from lowlat_mw.errors import CloseCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.runtime.drain import drain_all, drain_on_shutdown


async def ticks(req: Any) -> Any:
    for i in range(int(req.params.get("n", 3))):
        await asyncio.sleep(float(req.params.get("delay", 0.01)))
        yield f"{i};"


async def test_drain_lets_short_streams_finish_and_closes_everything_with_4002() -> None:
    endpoint = endpoint_for(ticks, drain_grace=0.5)
    short, long_, idle = Peer.admitted(endpoint), Peer.admitted(endpoint), Peer.admitted(endpoint)
    await short.hello_and_request(n=3, delay=0.02)
    await long_.hello_and_request(n=10_000, delay=0.02)
    await idle.receive(ev.Hello())
    assert not endpoint.draining
    await wait_until(lambda: short.texts() and long_.texts())
    started = asyncio.get_running_loop().time()
    await drain_all()  # each connection's own drain_grace (0.5 s)
    took = asyncio.get_running_loop().time() - started
    assert endpoint.draining
    for peer in (short, long_, idle):
        assert sum(isinstance(e, ev.GoAway) for e in peer.events) == 1, peer.events
        assert peer.closed == CloseCode.DRAINING
    assert short.texts() == ["0;", "1;", "2;"] and isinstance(short.events[-1], ev.End)
    assert not any(isinstance(e, ev.End) for e in long_.events)  # cut at the grace, left for a resume
    assert 0.45 <= took < 3.0, took
    late = Peer.admitted(endpoint)  # a connection that starts while draining is closed at once
    await wait_until(lambda: late.closed is not None)
    assert late.closed == CloseCode.DRAINING and late.events == []
    for peer in (short, long_, idle, late):
        await peer.gone()


async def test_drain_on_shutdown_calls_back_after_the_drain_or_says_there_is_nothing() -> None:
    called: list[str] = []
    assert drain_on_shutdown(lambda: called.append("nothing")) is None  # no connection of ours here
    endpoint = endpoint_for(ticks, drain_grace=5.0)
    assert called == [] and not endpoint.draining
    peer = Peer.admitted(endpoint)
    await peer.hello_and_request(n=4, delay=0.02)
    first = drain_on_shutdown(lambda: called.append("first"))
    assert first is not None
    assert drain_on_shutdown(lambda: called.append("second")) is first  # joins the same drain
    await wait_until(lambda: len(called) == 2)
    assert called == ["first", "second"]
    assert peer.texts() == ["0;", "1;", "2;", "3;"] and peer.closed == CloseCode.DRAINING  # finished, not cut
    await peer.gone()
