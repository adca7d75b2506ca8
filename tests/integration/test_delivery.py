"""Delivery guarantees through a real uvicorn server and a fault-injecting proxy (issue 4).

Every streamed reply arrives exactly once and in order across dropped connections (resume), or
the stream fails with a clear ``ResumeFailed``; slow readers are held back by flow control and
closed with 4003 instead of growing the server's memory; Cancel stops a model within a chunk;
a drain lets running streams finish and moves new ones to the next connection. After each test
no session, model task or generator is left behind.

The models yield numbered tokens ("0,", "1,", ...), so a duplicate, a gap or a reordering shows
up as an inequality of token lists.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from support import wait_until
from support.raw import LIMIT, codec_of, raw_connect
from support.time import WAIT
from websockets.exceptions import ConnectionClosed

from lowlat_mw.client import AsyncClient
from lowlat_mw.client.backoff import Backoff
from lowlat_mw.errors import CloseCode, ErrorCode, ResumeFailed
from lowlat_mw.protocol import events as ev
from lowlat_mw.settings import Settings
from lowlat_mw.testing import FaultProxy

from ._delivery_support import Probe, Served, cut_schedule, rss_kib, serve, split_tokens, tokens
from ._support import record_frames

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODES = ["proto", "json"]
FAST = Backoff(base=0.01, cap=0.1, retries=20)
# These tests send many requests per connection on purpose: no per-connection rate limit.
NO_RATE_LIMIT: dict[str, Any] = {"rate_limit": 0} if "rate_limit" in Settings.names() else {}


def start(uvicorn_server: Any, probe: Probe | None = None, **settings: Any) -> Served:
    return serve(uvicorn_server, probe, **{**NO_RATE_LIMIT, **settings})


async def assert_nothing_left(served: Served, timeout: float = WAIT) -> None:
    """No stored session, no model task, every model generator ran its `finally` (`timeout`: a hang guard)."""
    await wait_until(lambda: served.live_sessions() == 0 and served.model_tasks() == 0
                     and served.probe.running == 0, timeout=timeout)


async def read_n(stream: Any, n: int) -> list[str]:
    """The first `n` chunks of `stream` (leaves the stream open)."""
    return [await stream.__anext__() for _ in range(n)]


async def drain_rest(stream: Any) -> list[str]:
    return [chunk async for chunk in stream]


# ================================================================================ acceptance
# Protobuf: the conformance suite runs this acceptance (100 x 500 deltas under random cuts) through
# the Starlette, Django and Flask examples' real servers (test_conformance_delivery.py); here, the JSON run of
# the same size, which the conformance suite runs at 10 replies, and nothing-left-behind checks on
# the server's own state.
@pytest.mark.parametrize("mode", ["json"])
async def test_acceptance_100_replies_survive_random_cuts_exactly_once_in_order(uvicorn_server, mode):
    """ACCEPTANCE: every connection is cut at a random point; 100 replies of 500 deltas each
    still arrive complete, in order, without duplicates (4 streams multiplexed at a time)."""
    served = start(uvicorn_server)
    replies, deltas, concurrency = 100, 500, 4
    with FaultProxy(("127.0.0.1", served.port), seed=4) as proxy:
        # A JSON Delta frame is ~4x a Protobuf one: twice the byte range still cuts JSON
        # connections after fewer Deltas than Protobuf ones (~600 cuts vs ~300; each costs ~35 ms).
        proxy.cut_randomly(200, 6000) if mode == "proto" else proxy.cut_randomly(400, 12000)
        started = time.monotonic()
        gate = asyncio.Semaphore(concurrency)
        async with asyncio.timeout(50), AsyncClient(proxy.url_base + "/ws", mode=mode, backoff=FAST) as client:

            async def one() -> list[str]:
                async with gate:
                    stream = client.stream("count", model="count", params={"n": deltas})
                    text = await stream.text()
                    assert stream.end is not None and stream.end.finish_reason == "stop"
                    assert stream.end.last_seq == deltas
                    return split_tokens(text)

            results = await asyncio.gather(*(one() for _ in range(replies)))
        elapsed = time.monotonic() - started
        print(f"\n[{mode}] {replies} x {deltas} deltas: {proxy.cuts} cuts, {client.resumes} resumes, "
              f"{client.connections} connections, {elapsed:.1f} s")
        expected = tokens(deltas)
        for reply in results:
            assert reply == expected
        assert proxy.cuts > 0
        assert client.resumes > 0
    await assert_nothing_left(served)


# ================================================================================ handshake cuts
@pytest.mark.parametrize("mode", MODES)
async def test_cuts_during_the_handshake_are_retried(uvicorn_server, mode):
    served = start(uvicorn_server)
    with FaultProxy(("127.0.0.1", served.port), seed=1) as proxy:
        url = proxy.url_base + "/ws"
        # Size of the HTTP 101 response, to aim cuts at the Welcome that follows it.
        async with raw_connect(url, subprotocols=None) as ws:
            response_size = len(ws.response.serialize())
        assert response_size > 100
        async with asyncio.timeout(20):
            # 1. cut inside the HTTP 101 response, then 2. cut inside the Welcome frame.
            for cut in (100, response_size + 8):
                proxy.cut_after(cut)
                cuts_before = proxy.cuts
                client = AsyncClient(url, mode=mode, backoff=FAST)
                opener = asyncio.create_task(client.open())
                await wait_until(lambda before=cuts_before: proxy.cuts >= before + 3, timeout=WAIT)
                assert not opener.done()  # still retrying
                proxy.cut_after(None)
                await opener
                assert split_tokens(await client.complete("x", model="count", params={"n": 50})) == tokens(50)
                await client.close()

            # 3. a stream is cut mid-way and the resume's handshake is cut 3 times before it succeeds.
            async with AsyncClient(url, mode=mode, backoff=FAST) as client:
                stream = client.stream("x", model="count", params={"n": 3000, "pause_at": 100, "pause": 0.3})
                head = await read_n(stream, 50)
                cut_schedule(proxy, [100, response_size + 8, 100])
                cuts_before = proxy.cuts
                proxy.cut_all()
                rest = await drain_rest(stream)
                assert split_tokens("".join(head + rest)) == tokens(3000)
                assert proxy.cuts == cuts_before + 3
                assert client.resumes == 1
    await assert_nothing_left(served)


# ================================================================================ cut during replay
@pytest.mark.parametrize("mode", MODES)
async def test_cut_during_replay_still_exactly_once_in_order(uvicorn_server, mode):
    served = start(uvicorn_server)
    n = 3000
    with FaultProxy(("127.0.0.1", served.port), seed=2) as proxy:
        url = proxy.url_base + "/ws"
        async with raw_connect(url, subprotocols=None) as ws:
            response_size = len(ws.response.serialize())
        # The resume waits 0.2 s: by then the model has finished, so the resumed connection
        # starts with a long replay; it is cut 800 bytes after the 101 response (inside it).
        backoff = Backoff(base=0.2, factor=1, cap=0.2, jitter=False, retries=5)
        cut_schedule(proxy, [response_size + 1500, response_size + 800])  # first connection: mid-stream
        client = AsyncClient(url, mode=mode, backoff=backoff)
        recorder = record_frames(client)
        async with asyncio.timeout(20), client:
            stream = client.stream("x", model="count", params={"n": n})
            got = split_tokens(await stream.text())
            assert got == tokens(n)
            assert stream.end is not None and stream.end.last_seq == n
        assert proxy.cuts == 2 and client.resumes == 2
        # Between the first resumed Welcome and the second: replayed Deltas, cut before the End.
        events = [e for _, e in recorder.received_events()]
        welcomes = [i for i, e in enumerate(events) if isinstance(e, ev.Welcome)]
        assert [events[i].resumed for i in welcomes] == [False, True, True]
        during = events[welcomes[1] + 1:welcomes[2]]
        seqs = [e.seq for e in during if isinstance(e, ev.Delta)]
        assert len(seqs) >= 2 and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert not any(isinstance(e, ev.End) for e in during)
        print(f"\n[{mode}] replay cut after {len(seqs)} replayed deltas (seq {seqs[0]}..{seqs[-1]})")
    await assert_nothing_left(served)


# ================================================================================ server restart
async def test_server_restart_fails_open_streams_with_resume_failed(uvicorn_server):
    probe = Probe()
    first = start(uvicorn_server, probe)
    backoff = Backoff(base=0.05, cap=0.2, retries=60)
    async with asyncio.timeout(30):
        client = AsyncClient(f"ws://127.0.0.1:{first.port}/ws", backoff=backoff)
        async with client:
            stream = client.stream("x", model="slow", params={"n": 400, "delay": 0.005})
            head = await read_n(stream, 10)
            await asyncio.to_thread(first.srv.stop)  # uvicorn closes with 1012: the client resumes
            second = await asyncio.to_thread(start, uvicorn_server, probe, port=first.port)
            with pytest.raises(ResumeFailed) as info:
                await drain_rest(stream)
            assert info.value.code is ErrorCode.RESUME_FAILED and not info.value.retryable
            assert "expired or unknown" in info.value.message
            assert len(head) == 10
            assert client.welcome is not None and not client.welcome.resumed
            # The same client goes on with a new session on the new server.
            assert split_tokens(await client.complete("x", model="count", params={"n": 20})) == tokens(20)
        await assert_nothing_left(second)
        # The old server's session died with its event loop; its generator was closed.
        await wait_until(lambda: probe.running == 0)


# ================================================================================ resume window
@pytest.mark.parametrize("mode", MODES)
async def test_resume_window_exceeded_fails_with_resume_failed(uvicorn_server, mode):
    served = start(uvicorn_server, resume_window=0.3)
    with FaultProxy(("127.0.0.1", served.port), seed=3) as proxy:
        async with asyncio.timeout(20), AsyncClient(proxy.url_base + "/ws", mode=mode, backoff=FAST,
                                                    open_timeout=0.25) as client:
            stream = client.stream("x", model="slow", params={"n": 500, "delay": 0.01})
            head = await read_n(stream, 5)
            proxy.stall()
            proxy.cut_all()
            # Reconnects hang (stalled link) and time out; the server gives the session up at 0.3 s.
            await wait_until(lambda: served.live_sessions() == 0, timeout=WAIT)
            proxy.resume()  # (nothing passed the stalled link: the resume comes after the session expired)
            rest: list[str] = []
            with pytest.raises(ResumeFailed) as info:
                async for chunk in stream:
                    rest.append(chunk)
            assert "expired or unknown" in info.value.message
            assert split_tokens("".join(head + rest)) == tokens(5 + len(rest))  # nothing wrong delivered
            assert client.welcome is not None and not client.welcome.resumed
            assert split_tokens(await client.complete("x", model="count", params={"n": 30})) == tokens(30)
    await assert_nothing_left(served)


# ================================================================================ replay buffer
@pytest.mark.parametrize("mode", MODES)
async def test_resume_fails_when_missed_output_exceeded_the_buffer(uvicorn_server, mode):
    """A client that sends no Acks (flow_window=0): the server keeps only resume_buffer_size of
    output; if the client missed more than that, the resume fails (no silent gap)."""
    served = start(uvicorn_server, resume_buffer_size=4096)
    n = 2000
    with FaultProxy(("127.0.0.1", served.port), seed=5) as proxy:
        async with asyncio.timeout(20), AsyncClient(proxy.url_base + "/ws", mode=mode, backoff=FAST,
                                                    flow_window=0) as client:
            stream = client.stream("x", model="count", params={"n": n, "pause_at": 10, "pause": 0.3})
            head = await read_n(stream, 10)
            proxy.stall()  # the model's remaining output queues up in front of the proxy
            await wait_until(lambda: served.probe.running == 0, timeout=WAIT)
            proxy.cut_all()
            proxy.resume()
            rest: list[str] = []
            with pytest.raises(ResumeFailed) as info:
                async for chunk in stream:
                    rest.append(chunk)
            assert "replay buffer exceeded" in info.value.message
            got = split_tokens("".join(head + rest))
            assert got == tokens(len(got)) and len(got) < n
            assert client.welcome is not None and client.welcome.resumed and client.welcome.flow_window == 0
            print(f"\n[{mode}] received {len(got)} of {n} deltas before resume_failed")
    await assert_nothing_left(served)


async def test_resume_within_the_buffer_succeeds_without_acks(uvicorn_server):
    """Control for the test above: the same client and cut, with a buffer large enough, resumes."""
    served = start(uvicorn_server, resume_buffer_size=1024 * 1024)
    n = 2000
    with FaultProxy(("127.0.0.1", served.port), seed=5) as proxy:
        async with asyncio.timeout(20), AsyncClient(proxy.url_base + "/ws", backoff=FAST, flow_window=0) as client:
            stream = client.stream("x", model="count", params={"n": n, "pause_at": 10, "pause": 0.3})
            head = await read_n(stream, 10)
            proxy.stall()
            await wait_until(lambda: served.probe.running == 0, timeout=WAIT)
            proxy.cut_all()
            proxy.resume()
            assert split_tokens("".join(head + await drain_rest(stream))) == tokens(n)
            assert client.resumes == 1
    await assert_nothing_left(served)


async def test_detached_session_without_acks_pauses_the_model_instead_of_dropping(uvicorn_server):
    """protocol.md 14.4: while no connection is attached, models pause once the replay buffer is
    full instead of dropping output, so a client without Acks that was away resumes fine."""
    buffer, size = 8192, 36  # each Delta costs 36 + 64 = 100 bytes of buffer
    served = start(uvicorn_server, resume_buffer_size=buffer)
    n = 2000
    with FaultProxy(("127.0.0.1", served.port), seed=6) as proxy:
        async with asyncio.timeout(20), AsyncClient(proxy.url_base + "/ws", backoff=FAST, flow_window=0,
                                                    open_timeout=0.25) as client:
            stream = client.stream("x", model="count", params={"n": n, "size": size, "pause_at": 10, "pause": 0.3})
            head = await read_n(stream, 10)
            await wait_until(lambda: stream.received_seq == 10, timeout=WAIT)
            proxy.stall()
            proxy.cut_all()  # cut while the model sleeps: everything it makes next is made detached
            # the server sees the cut (the session detaches), and the model fills the replay buffer and pauses
            await wait_until(lambda: served.detached() == 1 and served.paused() == 1, timeout=WAIT,
                             what="the detached model to pause")
            produced = served.probe.only_stream()
            proxy.resume()
            rest = await drain_rest(stream)
            assert [c[:c.index(",") + 1] for c in head + rest] == tokens(n)
            assert client.resumes == 1
            print(f"\ndetached, no acks: model paused after {produced} of {n} chunks (buffer {buffer} B)")
            assert produced <= buffer // (size + 64) + 1
    await assert_nothing_left(served)


# ================================================================================ backpressure
async def test_slow_reader_pauses_the_model_then_4003_and_memory_stays_bounded(uvicorn_server):
    window, size, n = 64 * 1024, 1024, 200_000  # 200 MB of output if the model were not paused
    served = start(uvicorn_server, flow_window=window, slow_consumer_timeout=0.5, resume_window=0.5)
    cost = size + 64  # what one Delta costs in the window (protocol.md 14.4)
    async with asyncio.timeout(20):
        client = AsyncClient(f"ws://127.0.0.1:{served.port}/ws", resume=False)
        async with client:
            await client.open()
            rss_before = rss_kib()
            stream = client.stream("x", model="count", params={"n": n, "size": size})
            await read_n(stream, 1)  # then stop reading (no more Acks)
            await wait_until(lambda: client.last_close is not None, timeout=WAIT)  # server closed: 4003
            produced = served.probe.only_stream()
            rss_after = rss_kib()
            assert client.last_close.code == CloseCode.SLOW_CONSUMER
            # The session detached on 4003; resume_window later it expires and its model is stopped. Until then
            # the model stays paused: nothing more is produced, however long that takes.
            await wait_until(lambda: served.probe.running == 0, timeout=WAIT, what="the model to be stopped")
            assert served.probe.only_stream() == produced  # still paused
            bound = window // cost + 2
            print(f"\nslow reader: window {window} B -> model produced {produced} of {n} chunks "
                  f"(bound {bound}); RSS {rss_before} -> {rss_after} KiB (+{rss_after - rss_before} KiB)")
            assert produced <= bound
            assert rss_after - rss_before < 32 * 1024  # < 32 MiB, against 200 MB unpaused
    # The session detached on 4003 and expired after resume_window: its model was stopped.
    await assert_nothing_left(served)


async def test_raw_client_without_acks_that_does_not_read_gets_4003(uvicorn_server):
    """No Acks (flow_window 0), no reading: uvicorn's send blocks on the full socket buffers,
    which pauses the model; after slow_consumer_timeout the server closes with 4003."""
    size, n = 4096, 100_000  # 400 MB if the model were not paused
    served = start(uvicorn_server, slow_consumer_timeout=0.5, resume_window=0.5)
    async with asyncio.timeout(20), raw_connect(f"ws://127.0.0.1:{served.port}/ws", max_queue=4) as ws:
        codec = codec_of(ws)
        await ws.send(codec.encode(ev.Hello(client="raw-no-acks", flow_window=0)))
        welcome = codec.decode(await ws.recv(), limit=LIMIT, allowed=())
        assert isinstance(welcome, ev.Welcome) and welcome.flow_window == 0
        rss_before = rss_kib()
        await ws.send(codec.encode(ev.Request(stream_id=1, model="count", text="x", params={"n": n, "size": size})))
        # The server's send blocks on the full socket buffers: the model pauses, and slow_consumer_timeout (0.5 s)
        # later the server closes with 4003 (its close frame waits behind the queued Deltas, close_timeout at most)
        await wait_until(lambda: served.closing_with() == [CloseCode.SLOW_CONSUMER], timeout=WAIT,
                         what="the server to close with 4003")
        produced = served.probe.only_stream()
        rss_after = rss_kib()
        # The model is paused behind the blocked send: a while later (the close still waits, up to close_timeout,
        # 5 s) it has produced nothing more. (The window is what is tested: nothing happens during it.)
        await asyncio.sleep(0.3)
        assert served.probe.only_stream() == produced  # paused, not producing into memory
        # Now read: the queued Deltas, then the close with 4003.
        seqs: list[int] = []
        try:
            async for frame in ws:
                event = codec.decode(frame, limit=LIMIT, allowed=())
                if isinstance(event, ev.Delta):
                    seqs.append(event.seq)
        except ConnectionClosed:
            pass
        assert ws.close_code == CloseCode.SLOW_CONSUMER
        assert seqs == list(range(1, len(seqs) + 1))
        print(f"\nraw client, no acks: model produced {produced} of {n} chunks of {size} B "
              f"({produced * size // 1024} KiB) before the send blocked; client got {len(seqs)}; "
              f"RSS +{rss_after - rss_before} KiB")
        # What the kernel socket buffers hold (up to tcp_wmem + tcp_rmem max: 36 MiB here), not 400 MB.
        assert produced * size < 40 * 1024 * 1024
        assert rss_after - rss_before < 64 * 1024
    await assert_nothing_left(served)


# ================================================================================ cancel
@pytest.mark.parametrize("model", ["slow", "count_sync"])
async def test_cancel_stops_the_model_within_one_chunk(uvicorn_server, model):
    served = start(uvicorn_server)
    async with asyncio.timeout(10), AsyncClient(f"ws://127.0.0.1:{served.port}/ws") as client:
        stream = client.stream("x", model=model, params={"n": 1000, "delay": 0.01})
        await read_n(stream, 5)
        at_cancel = served.probe.only_stream()
        await stream.cancel()
        rest = await drain_rest(stream)  # ends quietly with End("cancelled")
        assert stream.end is not None and stream.end.finish_reason == "cancelled"
        await wait_until(lambda: served.probe.running == 0, timeout=WAIT)
        after = served.probe.only_stream() - at_cancel
        print(f"\n{model}: {after} chunk(s) produced after Cancel; {len(rest)} delivered after it")
        assert after <= 1
    await assert_nothing_left(served)


# ================================================================================ drain
async def test_drain_finishes_running_stream_and_moves_new_requests(uvicorn_server):
    """GoAway; the running stream completes; a request made during the drain goes to the next
    server (the proxy plays the load balancer); the old connection closes with 4002."""
    probe = Probe()
    # If the running stream's final Ack loses the race with the 4002 close, the old server keeps
    # the session for a resume until resume_window ends.
    old = start(uvicorn_server, probe, resume_window=0.5)
    new = start(uvicorn_server, probe)
    with FaultProxy(("127.0.0.1", old.port)) as proxy:
        async with asyncio.timeout(20), AsyncClient(proxy.url_base + "/ws", backoff=FAST) as client:
            running = client.stream("x", model="slow", params={"n": 60, "delay": 0.01})
            head = await read_n(running, 5)
            [old_conn] = list(old.endpoint.connections)
            drain = asyncio.ensure_future(old.on_server_loop(old.endpoint.drain(5.0)))
            await wait_until(lambda: client.goaway is not None, timeout=WAIT)
            proxy.target = ("127.0.0.1", new.port)  # new connections reach the new server
            later = asyncio.ensure_future(client.complete("x", model="count", params={"n": 40}))
            rest = await drain_rest(running)
            assert split_tokens("".join(head + rest)) == tokens(60)
            assert running.end is not None and running.end.finish_reason == "stop"
            assert split_tokens(await later) == tokens(40)
            await drain
            assert old_conn.protocol.close_code == CloseCode.DRAINING
            assert client.connections == 2 and client.resumes == 0
            assert new.live_sessions() == 1
    await assert_nothing_left(old)
    await assert_nothing_left(new)


async def test_request_crossing_the_goaway_is_refused_then_resent(uvicorn_server):
    """The Request reaches the server after it began draining: Error draining (retryable),
    and the client sends it again on the next connection."""
    probe = Probe()
    # The running stream's final Ack may cross the 4002 close: the old server then keeps the
    # session for a resume that will not come, until resume_window ends.
    old = start(uvicorn_server, probe, resume_window=0.5)
    new = start(uvicorn_server, probe)
    with FaultProxy(("127.0.0.1", old.port)) as proxy:
        async with asyncio.timeout(20), AsyncClient(proxy.url_base + "/ws", backoff=FAST) as client:
            recorder = record_frames(client)
            running = client.stream("x", model="slow", params={"n": 60, "delay": 0.01})
            head = await read_n(running, 5)
            proxy.delay = 0.05  # the GoAway and the new Request cross on the wire
            drain = asyncio.ensure_future(old.on_server_loop(old.endpoint.drain(5.0)))
            await wait_until(lambda: old.endpoint.draining, timeout=WAIT)
            proxy.target = ("127.0.0.1", new.port)
            assert client.goaway is None
            crossing = asyncio.ensure_future(client.complete("x", model="count", params={"n": 40}))
            rest = await drain_rest(running)
            assert split_tokens("".join(head + rest)) == tokens(60)
            assert split_tokens(await crossing) == tokens(40)
            await drain
            refused = [e for _, e in recorder.received_events()
                       if isinstance(e, ev.Error) and e.code is ErrorCode.DRAINING]
            assert len(refused) == 1 and refused[0].retryable
    await assert_nothing_left(old)
    await assert_nothing_left(new)


async def test_drain_then_restart_on_the_same_port_carries_the_new_request(uvicorn_server):
    """Plain uvicorn keeps listening while the app drains: a client reconnecting after 4002 must
    be told to come back later, not refused for good, so it reaches the server that replaces it."""
    probe = Probe()
    old = start(uvicorn_server, probe)
    async with asyncio.timeout(30):
        client = AsyncClient(f"ws://127.0.0.1:{old.port}/ws", backoff=Backoff(base=0.05, cap=0.2, retries=60))
        async with client:
            running = client.stream("x", model="slow", params={"n": 30, "delay": 0.01})
            head = await read_n(running, 5)
            drain = asyncio.ensure_future(old.on_server_loop(old.endpoint.drain(5.0)))
            await wait_until(lambda: client.goaway is not None, timeout=WAIT)
            later = asyncio.ensure_future(client.complete("x", model="count", params={"n": 40}))
            assert split_tokens("".join(head + await drain_rest(running))) == tokens(30)
            await drain
            await asyncio.to_thread(old.srv.stop)
            new = await asyncio.to_thread(start, uvicorn_server, probe, port=old.port)
            assert split_tokens(await later) == tokens(40)
        await assert_nothing_left(new)
