"""Server push (protocol v1.1) on every framework in its real server: a client joins a group, a model publishes to
the group and to one session (lowlat_mw.apublish, the in-process store), and exactly the right connections get
each Push, in order, in both encodings. Across processes through Redis: tests/integration/test_shared_sessions.py.
"""

from __future__ import annotations

import asyncio

import pytest

from lowlat_mw import StreamError
from lowlat_mw.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WAIT = 30.0


async def _until_end(client) -> list[tuple[str, str | bytes]]:
    """What `client` was pushed up to the "end" sent to its own session (nothing else can hide behind it)."""
    got: list[tuple[str, str | bytes]] = []
    while not got or got[-1] != ("session", "end"):
        push = await client.next_push(WAIT)
        got.append((push.topic.partition(":")[0], push.body))
    return got


async def test_push_reaches_the_group_and_the_session_and_no_one_else(server) -> None:
    async with (asyncio.timeout(WAIT), connect(server.url) as a, connect(server.url, mode="json") as b,
                connect(server.url) as c):
        assert a.welcome.revision == 3  # v1.3: push (v1.1), warm-up (v1.2), full-duplex streams and context (v1.3)
        await a.subscribe("room")
        await b.subscribe("room")
        with pytest.raises(StreamError, match="bad_request"):
            await c.subscribe("")
        assert await c.complete("to the room", model="announce", params={"target": "group:room"}) == "2"
        target = f"session:{b.welcome.session_id}"
        assert await a.complete("to b", model="announce", params={"target": target}) == "1"
        await a.unsubscribe("room")
        assert await c.complete("room again", model="announce", params={"target": "group:room"}) == "1"
        for client in (a, b, c):
            sid = client.welcome.session_id
            assert await c.complete("end", model="announce", params={"target": f"session:{sid}"}) == "1"
        assert await _until_end(a) == [("group", "to the room"), ("session", "end")]
        assert await _until_end(b) == [("group", "to the room"), ("session", "to b"), ("group", "room again"),
                                       ("session", "end")]
        assert await _until_end(c) == [("session", "end")]
