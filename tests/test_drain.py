"""lowlat_mw.drivers.aio's shutdown drain, driven directly (no server): what every server's shutdown hook relies on.

Each test runs on its own event loop (pytest-asyncio), so the drain state of one never leaks into another.
"""

from __future__ import annotations

import asyncio
from typing import Any

from lowlat_mw.drivers.aio import AsyncServerSession, drain_on_shutdown, drain_sessions, draining
from lowlat_mw.errors import CloseCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.codec import JsonCodec
from lowlat_mw.settings import SUBPROTOCOL_JSON, Settings

JSON = JsonCodec()


class Peer:
    """One connection's AsyncServerSession with what it sent, decoded, and how it was closed."""

    def __init__(self, model: Any, **settings: Any) -> None:
        self.events: list[ev.Event] = []
        self.closed: int | None = None

        async def send(data: bytes | str) -> None:
            self.events.append(JSON.decode(data, limit=1 << 20))

        async def close(code: int, reason: str) -> None:
            self.closed = code

        self.session = AsyncServerSession(model=model, settings=Settings(**settings), send=send, close=close,
                                          subprotocol=SUBPROTOCOL_JSON)
        self.session.start()

    async def hello_and_request(self, **params: Any) -> None:
        await self.session.receive(JSON.encode(ev.Hello()))
        await self.session.receive(JSON.encode(ev.Request(stream_id=1, text="x", params=params)))

    def texts(self) -> list[str]:
        return [e.text for e in self.events if isinstance(e, ev.Delta)]


async def ticks(req: Any) -> Any:
    for i in range(int(req.params.get("n", 3))):
        await asyncio.sleep(float(req.params.get("delay", 0.01)))
        yield f"{i};"


async def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


async def test_drain_lets_short_streams_finish_and_closes_everything_with_4002() -> None:
    short, long_, idle = Peer(ticks, drain_grace=0.5), Peer(ticks, drain_grace=0.5), Peer(ticks, drain_grace=0.5)
    await short.hello_and_request(n=3, delay=0.02)
    await long_.hello_and_request(n=10_000, delay=0.02)
    await idle.session.receive(JSON.encode(ev.Hello()))
    assert not draining()
    await wait_for(lambda: short.texts() and long_.texts())
    started = asyncio.get_running_loop().time()
    await drain_sessions()  # each session's own drain_grace (0.5 s)
    took = asyncio.get_running_loop().time() - started
    assert draining()
    for peer in (short, long_, idle):
        assert sum(isinstance(e, ev.GoAway) for e in peer.events) == 1, peer.events
        assert peer.closed == CloseCode.DRAINING
    assert short.texts() == ["0;", "1;", "2;"] and isinstance(short.events[-1], ev.End)
    assert not any(isinstance(e, ev.End) for e in long_.events)  # cut at the grace, left for a resume
    assert 0.45 <= took < 3.0, took
    late = Peer(ticks)  # a connection that starts on a draining loop is closed at once
    await wait_for(lambda: late.closed is not None)
    assert late.closed == CloseCode.DRAINING and late.events == []
    for peer in (short, long_, idle, late):
        await peer.session.disconnected(peer.closed)


async def test_drain_on_shutdown_calls_back_after_the_drain_or_says_there_is_nothing() -> None:
    called: list[str] = []
    assert drain_on_shutdown(lambda: called.append("nothing")) is False  # no connection of ours here
    assert called == [] and not draining()
    peer = Peer(ticks, drain_grace=5.0)
    await peer.hello_and_request(n=4, delay=0.02)
    assert drain_on_shutdown(lambda: called.append("first")) is True
    assert drain_on_shutdown(lambda: called.append("second")) is True  # joins the same drain
    await wait_for(lambda: len(called) == 2)
    assert called == ["first", "second"]
    assert peer.texts() == ["0;", "1;", "2;", "3;"] and peer.closed == CloseCode.DRAINING  # finished, not cut
    await peer.session.disconnected(peer.closed)
