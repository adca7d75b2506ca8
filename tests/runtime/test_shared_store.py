"""The shared session store's pure parts (lowlat_mw/runtime/shared.py): the journal records a session produces,
their packing, and a session rebuilt from them, with no gap and no repeat (tests/integration/test_shared_sessions.py
runs it across real processes and a real Redis)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from support.waits import wait_until

from lowlat_mw.errors import ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.session import Session
from lowlat_mw.runtime.shared import RemoteSession, pack, principal_key, unpack
from lowlat_mw.settings import Settings


def _session() -> Session:
    session = Session(Settings(), now=0.0, session_id="s1", secret="secret")
    session.start_journal()
    return session


def test_a_journaled_session_notes_starts_deltas_and_ends_and_packs_them_losslessly() -> None:
    session = _session()
    session.start(ev.Request(stream_id=1, model="m", text="hi"), 0.0)
    session.record(1, "héllo", 0.1)
    session.record(1, b"\x00\xff", 0.2)
    session.record(1, "\ud800x", 0.25)  # (an unpaired surrogate survives the trip: the frame is what refuses it)
    end = session.finish(1, 0.3, reason="stop")
    error = ev.Error(stream_id=2, code=ErrorCode.MODEL_ERROR, message="boom", retryable=True)
    journal = [*session.journal, 2, 0, None, 2, -1, error]
    assert journal[:12] == [1, 0, None, 1, 1, "héllo", 1, 2, b"\x00\xff", 1, 3, "\ud800x"]
    assert unpack(pack(journal)) == [(1, 0, None), (1, 1, "héllo"), (1, 2, b"\x00\xff"), (1, 3, "\ud800x"),
                                     (1, -1, end), (2, 0, None), (2, -1, error)]


def test_followed_streams_are_not_journaled_again() -> None:
    session = _session()
    session.restore(3, 1, ["a", "b"], None, 0.0, followed=True)
    session.journal.clear()
    session.record(3, "c", 0.1)
    session.finish(3, 0.2, error=ev.End(stream_id=3, last_seq=3))
    assert session.journal == []
    assert session.streams[3].terminal == ev.End(stream_id=3, last_seq=3)


def test_a_rebuilt_session_replays_exactly_and_fails_below_what_was_kept() -> None:
    remote = RemoteSession("s1", "digest", "", "owner", {}, b"0-0")
    remote.apply("A", [(1, 0, None), (1, 1, "a"), (1, 2, "b")])
    remote.apply("A", [(1, 2, "b"), (1, 3, "c"), (1, -1, ev.End(stream_id=1, last_seq=3))])  # a repeat: skipped
    remote.apply("A", [(2, 5, "x"), (2, 6, "y")])  # its start and first Deltas trimmed away: begins at 5
    remote.apply("B", [(4, 0, None), (4, 1, "p"), (4, 3, "r")])  # seq 2 never saved: broken
    session, follow = remote.to_session(Settings(), "s1.secret", 0.0)
    assert follow == {2: "A"}  # running elsewhere: followed
    events, _ = session.replay({1: 1, 2: 5, 4: 0})
    assert events[:3] == [ev.Delta.of(1, 2, "b"), ev.Delta.of(1, 3, "c"), ev.End(stream_id=1, last_seq=3)]
    assert events[3] == ev.Delta.of(2, 6, "y")
    assert events[4] == ev.Delta.of(4, 1, "p")  # what came before the gap, then the stream's Error
    assert isinstance(events[5], ev.Error) and events[5].code is ErrorCode.RESUME_FAILED and events[5].retryable
    events, _ = session.replay({2: 3})  # below the first kept Delta
    assert events[0].code is ErrorCode.RESUME_FAILED  # type: ignore[union-attr]


def test_principals_compare_across_processes_by_identity_not_by_object() -> None:
    assert principal_key(None) == ""
    assert principal_key("alice") == principal_key("alice") != principal_key("bob")
    assert principal_key(7) != principal_key("7")
    user = type("User", (), {})
    a, b = user(), user()
    a.pk = b.pk = 42
    assert principal_key(a) == principal_key(b)
    login = SimpleNamespace(get_id=lambda: "u1")
    assert principal_key(login).endswith(":u1")
    opaque = object()
    assert principal_key(opaque) != principal_key(object())  # unknown kinds resume only in their own process


def test_a_gap_is_never_replayed_even_when_the_stream_ended() -> None:
    remote = RemoteSession("s1", "digest", "", "owner", {}, b"0-0")
    remote.apply("A", [(1, 0, None), (1, 1, "a"), (1, 3, "c"), (1, -1, ev.End(stream_id=1, last_seq=3))])
    remote.apply("A", [(2, -1, ev.End(stream_id=2, last_seq=9))])  # its start and Deltas trimmed away
    session, follow = remote.to_session(Settings(), "s1.secret", 0.0)
    assert follow == {}
    events, _ = session.replay({1: 0, 2: 2})
    assert events[0] == ev.Delta.of(1, 1, "a")
    assert events[1].code is ErrorCode.RESUME_FAILED  # type: ignore[union-attr]  # not End(3) after a gap
    assert events[2].code is ErrorCode.RESUME_FAILED  # type: ignore[union-attr]  # seqs 3..9 are gone
    session, _ = remote.to_session(Settings(), "s1.secret", 0.0)
    events, _ = session.replay({2: 9})  # a client that had everything gets the End
    assert events == [ev.End(stream_id=2, last_seq=9)]


def test_a_stream_id_reused_after_its_relay_ended_gets_only_its_new_runs_output() -> None:
    """B relayed A's stream and ended it for its client (a Cancel: not passed on to A, whose model runs on); the
    client then reused the id on B: the records of A's older run, End included, are ignored."""
    remote = RemoteSession("s1", "digest", "", "owner", {}, b"0-0")
    remote.apply("A", [(1, 0, None), (1, 1, "old1"), (1, 2, "old2")])
    remote.apply("B", [(1, 0, None), (1, 1, "new1")])
    remote.apply("A", [(1, 3, "old3"), (1, -1, ev.End(stream_id=1, last_seq=40))])
    remote.apply("B", [(1, 2, "new2")])
    assert remote.streams[1].pieces == ["new1", "new2"] and remote.streams[1].terminal is None


def test_an_end_right_after_lost_deltas_is_not_taken_for_a_whole_stream() -> None:
    """A failed write keeps a stream's start and End but drops its Deltas: the End's last_seq shows the gap."""
    remote = RemoteSession("s1", "digest", "", "owner", {}, b"0-0")
    remote.apply("A", [(1, 0, None), (1, 1, "a")])
    remote.apply("A", [(1, -1, ev.End(stream_id=1, last_seq=3))])  # Deltas 2 and 3 were in the failed write
    session, _ = remote.to_session(Settings(), "s1.secret", 0.0)
    events, _ = session.replay({1: 0})
    assert events[0] == ev.Delta.of(1, 1, "a")
    assert events[1].code is ErrorCode.RESUME_FAILED  # type: ignore[union-attr]


async def test_a_sessions_output_in_redis_is_bounded_by_bytes_and_resumes_from_what_is_kept(redis_url: str) -> None:
    """800 KB of one stream's output, 64 KiB replay buffer: Redis keeps about twice that (not all of it, nor 100,000
    entries), and a resume from it starts where what is kept starts, with no gap up to the last Delta."""
    import redis.asyncio as aioredis

    from lowlat_mw.runtime.shared import MIN_ENTRIES, SharedSessions

    settings = Settings(resume_buffer_size=64 * 1024, session_store=redis_url)
    shared = SharedSessions.for_loop(redis_url, settings)
    session = Session(settings, now=0.0, session_id="big", secret="secret")
    shared.share(session, None)
    session.start(ev.Request(stream_id=1, text="x"), 0.0)
    for i in range(800):
        session.record(1, f"{i:06d}" + "y" * 994, 0.0)  # 1,000 characters each
        if i % 10 == 9:  # (an entry of 10 Deltas, as 10 ms of a fast model's output)
            shared.touch(session)
            await shared.flushed()
    client = aioredis.Redis.from_url(redis_url)
    try:
        entries = await client.xrange("lowlat:d:big")
    finally:
        await client.aclose()
    kept = sum(len(fields[b"b"]) for _, fields in entries)
    assert len(entries) <= max(MIN_ENTRIES, 2 * settings.resume_buffer_size // 10_000 + 1)
    assert kept <= 4 * settings.resume_buffer_size  # about 2x the buffer, never the 800 KB written
    remote = await shared.load("big", session.resume_token)
    stream = remote.streams[1]
    assert stream.first_seq > 1 and stream.first_seq - 1 + len(stream.pieces) == 800
    assert [int(piece[:6]) for piece in stream.pieces] == list(range(stream.first_seq - 1, 800))


async def test_many_followed_streams_share_one_redis_connection_and_each_arrives_whole(redis_url: str) -> None:
    """150 streams of 150 sessions followed at once by one process (a failover moves that many), while 300 resume
    reads run at once: each stream gets exactly its own output and End, through one tail read, not a Redis
    connection each, and no read fails for want of a connection."""
    import asyncio

    import redis.asyncio as aioredis

    from lowlat_mw.runtime.shared import SharedSessions, process_id

    settings = Settings(session_store=redis_url)
    loop = asyncio.get_running_loop()
    writer, reader = SharedSessions(redis_url, settings, loop), SharedSessions(redis_url, settings, loop)
    sessions = [Session(settings, now=0.0, session_id=f"s{i}", secret="secret") for i in range(150)]
    for session in sessions:
        writer.share(session, None)
        session.start(ev.Request(stream_id=1, text="x"), 0.0)
    await writer.flushed()
    client = aioredis.Redis.from_url(redis_url)
    after = [(await client.xrevrange(f"lowlat:d:s{i}", count=1))[0][0] for i in range(150)]  # (as a resume reads)

    async def follow(i: int) -> list:
        return [item async for item in reader.follow(f"s{i}", 1, after[i], 0, process_id())]

    reads = [0]  # the tail's XREADs that returned
    xread = reader.redis.xread

    async def counted_xread(*args: Any, **kwargs: Any) -> Any:
        try:
            return await xread(*args, **kwargs)
        finally:
            reads[0] += 1

    reader.redis.xread = counted_xread  # type: ignore[method-assign]
    followers = [asyncio.create_task(follow(i)) for i in range(150)]
    # The tail reads them all, nothing new yet: every follower joined, then two of its reads returned (the second
    # began after the last join, so it read for all 150).
    tail = reader._tail
    await wait_until(lambda: sum(map(len, tail.followers.values())) == 150, what="150 followers to join")
    joined = reads[0]
    await wait_until(lambda: reads[0] >= joined + 2, what="the tail to read for every follower")
    try:
        connections = len(await client.client_list())
        # A resume storm on the same process meanwhile: 150 loads and owner reads at once wait for the pool's
        # connections, none fails for want of one ("Too many connections" read as Redis being down).
        loads = await asyncio.gather(*(reader.load(f"s{i}", sessions[i].resume_token) for i in range(150)),
                                     *(reader.owner(f"s{i}") for i in range(150)))
        assert all(found is not None for found in loads) and not reader.down
        for n in range(3):
            for i, session in enumerate(sessions):
                session.record(1, f"{i}.{n}", 0.0)
                writer.touch(session)
            await writer.flushed()
        for session in sessions:
            session.finish(1, 0.0, reason="stop")
            writer.touch(session)
        await writer.flushed()
        async with asyncio.timeout(30):
            got = await asyncio.gather(*followers)
    finally:
        await client.aclose()
        await writer.aclose()
        await reader.aclose()
    assert connections < 10  # both stores, this client and the tail: not 150 blocked readers
    for i, items in enumerate(got):
        assert items[:3] == [f"{i}.0", f"{i}.1", f"{i}.2"] and isinstance(items[3], ev.End) and len(items) == 4


def test_a_kept_reply_packs_losslessly_and_foreign_bytes_are_no_reply() -> None:
    from lowlat_mw.cache import pack_reply, unpack_reply

    chunks = ("héllo ", b"\x00\xff", "", "\ud83d\ude00 end")
    assert unpack_reply(pack_reply(chunks)) == chunks
    assert unpack_reply(b"") == ()
    assert unpack_reply(pack_reply(chunks)[:-1]) is None  # cut short
    assert unpack_reply(b"x\x00\x00\x00\x01a") is None  # an unknown kind


async def test_the_caches_redis_tier_keeps_replies_within_its_bytes_least_recently_used_first(redis_url: str) -> None:
    """cache_size bounds the tier in Redis as in memory: a reply looked up recently stays, the oldest unused goes."""
    import redis.asyncio as aioredis

    from lowlat_mw.cache import pack_reply
    from lowlat_mw.runtime.shared import SharedSessions

    capacity = 16 * 1024
    settings = Settings(session_store=redis_url, cache_size=capacity, cache_ttl=60)
    shared = SharedSessions.for_loop(redis_url, settings)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.delete("lowlat:c:lru", "lowlat:c:sizes", "lowlat:c:bytes")
        reply = ("x" * 3000,)
        keys = [bytes([i]) * 32 for i in range(8)]
        for i, key in enumerate(keys):
            shared.cache_put(key, reply)
            await asyncio.gather(*shared._background)  # (written behind, in a task)
            if i == 3:
                assert await shared.cache_get(keys[0]) == reply  # used: newer than keys[1] to keys[3] now
        total = int(await client.get("lowlat:c:bytes"))
        assert total <= capacity and total == 5 * len(pack_reply(reply))  # 5 of 8 fit in 16 KiB
        kept = [await shared.cache_get(key) is not None for key in keys]
        assert kept == [True, False, False, False, True, True, True, True]  # keys[0] was used: 1, 2, 3 went
        assert await client.ttl(f"lowlat:c:{keys[7].hex()}") > 50
        shared.cache_put(b"big" * 11, ("y" * (capacity // 4 + 1),))  # over a quarter of the tier: not kept
        await asyncio.gather(*shared._background)
        assert await shared.cache_get(b"big" * 11) is None
    finally:
        await client.aclose()


async def test_a_cache_lookup_in_a_store_that_does_not_answer_is_a_quick_miss() -> None:
    """A hung Redis (it accepts and never answers): a lookup gives up after CACHE_TIMEOUT, not the pool's 5 s, and
    the next ones for a second do not ask at all; the request path never waits out the store's own timeouts."""
    from lowlat_mw.runtime.shared import SharedSessions

    received: list[bytes] = []
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # and says nothing
        while data := await reader.read(65536):
            received.append(data)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    try:
        shared = SharedSessions.for_loop(url, Settings(session_store=url, cache_size=1 << 20))
        async with asyncio.timeout(4.5):  # (the pool's own socket timeout is 5 s: waiting it out fails here)
            assert await shared.cache_get(b"k" * 32) is None
        async with asyncio.timeout(30):
            while not received:  # it did ask (and gave up)
                await asyncio.sleep(0.01)
        asked = len(b"".join(received))
        for _ in range(2):
            assert await shared.cache_get(b"k" * 32) is None
        await asyncio.sleep(0.05)  # (anything sent would have arrived)
        assert len(b"".join(received)) == asked  # not asked again within the second
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
