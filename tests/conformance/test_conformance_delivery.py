"""Delivery guarantees (issue 4) under fault injection, on every framework's real server.

A :class:`~lowlat_mw.testing.FaultProxy` on loopback sits between the Python client and the
server and breaks connections on purpose; the client reconnects (``Backoff``), resumes its
session and deduplicates by seq (docs/protocol.md section 14). The counting models of
``conformance_models.py`` report what the server really ran through marker files in
``CONFORMANCE_MARKS``: ``<tag>.starts`` (one line per run), ``<tag>.count`` (tokens produced)
and ``<tag>.closed`` (the generator's ``finally`` ran).

1. acceptance: random cuts, 100 x 500-token replies (proto) and 10 (json), exact and exactly once;
2. one ``cut_all()`` in the middle of a slow stream: resumed, completed once, in order; and a
   half-open drop (the server still holds the old connection when the client resumes);
3. a reader that stops consuming: the model pauses, the server closes with 4003 after
   ``slow_consumer_timeout``;
4. Cancel stops the model within one token;
5. no model is left running after the client goes away (after runs 1 and 3, and mid-stream).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conformance_servers import SERVERS, ServerProcess, running_server
from conformance_support import STARTUP_TIMES, measure, wait_for_file
from delivery_support import drop_client_sides
from support.time import MARGIN, WAIT
from support.waits import wait_until

from lowlat_mw import Backoff
from lowlat_mw.client import connect
from lowlat_mw.errors import CloseCode, ConnectionClosed
from lowlat_mw.testing import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
SERVER_LEVEL = True  # the `server` fixture's frameworks: conformance_servers.SERVERS (conftest)

SEED = 20240604          # the proxy's cut points and the client's backoff jitter are reproducible
TOKENS = 500             # per reply in the acceptance runs
CONCURRENCY = 4          # replies in flight at once on the one client connection
ACCEPT_BOUND = 100.0     # seconds for one acceptance run (typically well under 20)
CLEANUP_BOUND = 10.0     # seconds for every model's finally to run after the client is gone


def tokens(n: int, start: int = 0) -> list[str]:
    """What the counting models yield: "0,", "1,", ..."""
    return [f"{i}," for i in range(start, n)]


def backoff() -> Backoff:
    return Backoff(base=0.01, cap=0.1, retries=20, rng=random.Random(SEED))


def new_tag(*parts: object) -> str:
    return "-".join(map(str, (*parts, uuid.uuid4().hex[:8])))


def read_count(marks: Path, tag: str) -> int:
    """Tokens the model of `tag` had produced at its last report (0 before the first)."""
    try:
        return int((marks / f"{tag}.count").read_text())
    except FileNotFoundError:
        return 0


def starts(marks: Path, tag: str) -> int:
    """How many times the model of `tag` was started."""
    try:
        return len((marks / f"{tag}.starts").read_text().splitlines())
    except FileNotFoundError:
        return 0


async def wait_all_closed(marks: Path, tags: list[str], timeout: float) -> float:
    """Seconds until every ``<tag>.closed`` exists; AssertionError naming the missing ones."""
    def missing() -> list[str]:
        return [t for t in tags if not (marks / f"{t}.closed").exists()]

    start = time.monotonic()
    try:
        await wait_until(lambda: not missing(), timeout, interval=0.05)
    except AssertionError:
        gone = missing()
        raise AssertionError(f"{len(gone)} of {len(tags)} models still running {timeout} s after the "
                             f"client left (finally not run), e.g. {gone[:3]}") from None
    return time.monotonic() - start


async def take(stream, n: int, what: str, timeout: float = 8.0) -> list[str | bytes]:
    """The next `n` chunks of `stream`; AssertionError naming `what` if they do not come in time."""
    got: list[str | bytes] = []
    try:
        async with asyncio.timeout(timeout):
            while len(got) < n:
                got.append(await anext(stream))
    except TimeoutError:
        raise AssertionError(f"{what}: only {len(got)} of {n} tokens within {timeout} s") from None
    return got


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the framework's default server (no faults until the test sets some)."""
    with FaultProxy(("127.0.0.1", server.port), seed=SEED) as p:
        yield p


# ================================================================================ 1 + 5: acceptance
@pytest.mark.timeout(150)
@pytest.mark.parametrize(("mode", "replies"), [("proto", 100), ("json", 10)])
async def test_random_cuts_every_reply_arrives_complete_in_order_exactly_once(server, proxy, marks_dir, mode,
                                                                               replies):
    """Issue 4's acceptance test: each connection is cut after 200-6000 bytes from the server."""
    proxy.cut_randomly(200, 6000)
    run = new_tag("accept", server.framework, mode)
    tags = [f"{run}-{i}" for i in range(replies)]
    client = connect(proxy.url_base + "/ws", mode=mode, backoff=backoff())
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(tag: str) -> tuple[list[str | bytes], object]:
        async with limit:
            # (`every`: the count is written once, at the end, not every 10 tokens: the checks below read it only after
            # the model's finally, and 5,000 write-and-rename per run, ~0.7 ms each here, slowed the server under test)
            stream = client.stream("count", model="count", params={"n": TOKENS, "tag": tag, "every": TOKENS})
            return [c async for c in stream], stream.end

    t0 = time.monotonic()
    try:
        async with asyncio.timeout(ACCEPT_BOUND):
            results = await asyncio.gather(*(one(t) for t in tags))
    finally:
        await client.close()
    wall = time.monotonic() - t0

    for chunks, end in results:
        assert chunks == tokens(TOKENS)  # complete, in order, no duplicates
        assert end is not None and (end.finish_reason, end.last_seq) == ("stop", TOKENS)
    measure(f"delivery acceptance {server.framework}-{mode}",
            f"{replies} x {TOKENS} tokens in {wall:.2f} s; proxy cuts {proxy.cuts}, client resumes "
            f"{client.resumes}, connections {client.connections} (proxy saw {proxy.connections})")
    assert proxy.cuts > 0 and client.resumes > 0
    assert client.connections >= client.resumes + 1

    # 5. no leaks: every model ran its finally, each ran once (a resume never restarts a model)
    took = await wait_all_closed(marks_dir, tags, CLEANUP_BOUND)
    assert [starts(marks_dir, t) for t in tags] == [1] * replies
    assert [read_count(marks_dir, t) for t in tags] == [TOKENS] * replies
    measure(f"delivery acceptance {server.framework}-{mode} cleanup", f"all {replies} finally ran ({took:.2f} s)")


@pytest.mark.timeout(60)
async def test_no_model_left_running_when_the_client_leaves_after_many_resumes(server, proxy, marks_dir):
    """Four endless streams survive many random cuts; when the client then closes normally the
    server stops all four models (a resume must not leave a model behind, e.g. on a stale session)."""
    proxy.cut_randomly(200, 6000)
    run = new_tag("leave", server.framework)
    tags = [f"{run}-{i}" for i in range(4)]
    total = 1_000_000
    client = connect(proxy.url_base + "/ws", backoff=backoff())
    received = [0] * len(tags)

    async def consume(i: int, tag: str) -> None:
        stream = client.stream("endless", model="count", params={"n": total, "delay": 0.002, "tag": tag})
        async for chunk in stream:
            assert chunk == f"{received[i]},"
            received[i] += 1

    tasks = [asyncio.create_task(consume(i, t)) for i, t in enumerate(tags)]
    try:
        async with asyncio.timeout(40):
            await wait_until(lambda: client.resumes >= 10 or any(t.done() for t in tasks), 40)
            assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            proxy.cut_after(None)  # the next connection stays up: the client can close it normally

            def on_a_link_never_cut() -> bool:
                """Connected, and every link the proxy holds was made after the switch (no cut ahead): the one that
                was cut comes within 6 KB while four streams flow, and the client resumes on a new one."""
                try:
                    links = list(proxy._links)
                except RuntimeError:  # (the proxy's thread changed the set meanwhile: look again)
                    return False
                return client.connected and bool(links) and all(link.cut_at is None for link in links)

            await wait_until(on_a_link_never_cut, WAIT, what="the client on a connection that is not cut")
            resumes = client.resumes
            await client.close()
    finally:
        await client.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    took = await wait_all_closed(marks_dir, tags, CLEANUP_BOUND)
    counts = [read_count(marks_dir, t) for t in tags]
    await asyncio.sleep(0.3)
    assert [read_count(marks_dir, t) for t in tags] == counts  # nothing runs on
    assert all(0 < c < total for c in counts), counts
    assert [starts(marks_dir, t) for t in tags] == [1] * len(tags)
    assert all(r > 0 for r in received), received
    measure(f"delivery leave {server.framework}",
            f"{resumes} resumes, {sum(received)} tokens received; all 4 models stopped {took:.2f} s after close")


# ================================================================================ 2: one cut mid-stream
@pytest.mark.parametrize("kind", ["count", "count_sync"])  # async generator / sync generator in a thread
async def test_cut_mid_stream_resumes_and_completes_once_in_order(server, proxy, marks_dir, kind):
    n, cut_at = 60, 20
    tag = new_tag("cut", server.framework, kind)
    async with asyncio.timeout(30):
        client = connect(proxy.url_base + "/ws", backoff=backoff())
        try:
            stream = client.stream("slow", model=kind, params={"n": n, "delay": 0.02, "tag": tag})
            got = [await anext(stream) for _ in range(cut_at)]
            assert (client.connections, client.resumes, proxy.open_links()) == (1, 0, 1)
            proxy.cut_all()  # the network drops while the model keeps producing
            got += [c async for c in stream]
            end = stream.end
            assert await client.complete("after", model="sync") == "sync:after"  # the connection works
        finally:
            await client.close()
    assert got == tokens(n)
    assert end is not None and (end.finish_reason, end.last_seq) == ("stop", n)
    assert (client.resumes, client.connections, proxy.connections) == (1, 2, 2)
    await wait_for_file(marks_dir / f"{tag}.closed", 5)
    assert starts(marks_dir, tag) == 1  # resumed, not run again
    assert read_count(marks_dir, tag) == n


async def test_a_first_request_lost_in_a_drop_is_sent_again_on_the_resumed_session(server, proxy, marks_dir):
    """The drop takes the connection's first Request with it (the server never saw it, and had no stream): the
    session is kept a little all the same, so the resume says "send it again" (retryable resume_failed,
    protocol.md 14.2) rather than "expired", and the stream completes, run once."""
    tag = new_tag("lostfirst", server.framework)
    async with asyncio.timeout(30):
        client = connect(proxy.url_base + "/ws", backoff=backoff())
        try:
            await client.open()
            proxy.stall()  # what the client sends now does not reach the server
            stream = client.stream("x", model="count", params={"n": 5, "tag": tag})
            first = asyncio.ensure_future(anext(stream))  # (sends the Request)
            while not stream._sent:
                await asyncio.sleep(0.01)
            proxy.cut_all()  # and the drop loses it
            proxy.resume()
            got = [await first] + [c async for c in stream]
        finally:
            await client.close()
    assert got == tokens(5)
    assert client.resumes == 1 and client.connections == 2
    assert starts(marks_dir, tag) == 1


async def test_resume_while_the_server_still_holds_the_old_connection(server, proxy, marks_dir):
    """A half-open drop: the client's side of the link dies, the server's socket stays open and
    silent, so the resume takes the session over from a connection the server thinks is alive.
    Then an ordinary drop and resume. The stream goes on live after each (100 tokens at 5 ms
    each is far more than the replay holds), and when the client closes the model stops."""
    tag = new_tag("halfopen", server.framework)
    client = connect(proxy.url_base + "/ws", backoff=backoff())
    release = None
    try:
        async with asyncio.timeout(30):
            stream = client.stream("x", model="count", params={"n": 100_000, "delay": 0.005, "tag": tag})
            got = await take(stream, 20, "before any drop")
            release = drop_client_sides(proxy)
            got += await take(stream, 100, "after the half-open drop")
            assert (client.resumes, client.connections) == (1, 2)
            proxy.cut_all()
            got += await take(stream, 100, "after the second (ordinary) drop")
            assert (client.resumes, client.connections) == (2, 3)
            assert got == tokens(220)
            await client.close()
            took = await wait_for_file(marks_dir / f"{tag}.closed", CLEANUP_BOUND)
    finally:
        await client.close()
        if release is not None:
            release()
    produced = read_count(marks_dir, tag)
    await asyncio.sleep(0.2)
    assert read_count(marks_dir, tag) == produced  # nothing runs on
    assert starts(marks_dir, tag) == 1
    measure(f"delivery half-open {server.framework}", f"model stopped {took:.2f} s after close, {produced} produced")


# ================================================================================ 4: cancel
@pytest.mark.parametrize("kind", ["count", "count_sync"])
async def test_cancel_stops_the_model_within_one_token(server, marks_dir, kind):
    tag = new_tag("cancel", server.framework, kind)
    async with asyncio.timeout(30):
        client = connect(server.url, backoff=backoff())
        try:
            # 0.1 s before each token, and the count is written just before each yield
            stream = client.stream("x", model=kind, params={"n": 1000, "delay": 0.1, "every": 1, "tag": tag})
            got = [await anext(stream) for _ in range(3)]
            await stream.cancel()  # right after a token: the model is at the start of its next 0.1 s
            at_cancel = read_count(marks_dir, tag)
            rest = [c async for c in stream]
            end = stream.end
            await wait_for_file(marks_dir / f"{tag}.closed", 5)
        finally:
            await client.close()
    final = read_count(marks_dir, tag)
    assert got + rest == tokens(3 + len(rest))
    assert end is not None and end.finish_reason == "cancelled" and end.last_seq == 3 + len(rest)
    assert at_cancel >= 3
    assert final - at_cancel <= 1, (at_cancel, final)  # at most the token being made when Cancel arrived
    assert final <= end.last_seq + 1, (final, end)      # at most one produced token was never sent
    measure(f"cancel {server.framework}-{kind}",
            f"{at_cancel} produced at Cancel, {final} in all, {end.last_seq} sent")


# ================================================================================ 3: slow reader
SLOW_TIMEOUT = 1.0
SLOW_WINDOW = 16384
SLOW_RESUME_WINDOW = 1.0
SLOW_ENV = {
    "LOWLAT_SLOW_CONSUMER_TIMEOUT": str(SLOW_TIMEOUT),
    "LOWLAT_FLOW_WINDOW": str(SLOW_WINDOW),
    "LOWLAT_RESUME_WINDOW": str(SLOW_RESUME_WINDOW),  # the abandoned session (and its model) ends soon
}
SLOW_TOTAL, SLOW_SIZE = 100_000, 100  # 10 MB if nothing paused the model


@pytest.fixture(scope="module", params=SERVERS)
def slow_server(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    """A server with a 16 KiB flow-control window, 1 s slow-consumer timeout and 1 s resume window."""
    framework = request.param
    yield from running_server(f"slow-{framework}", framework, conformance_dir, SLOW_ENV, STARTUP_TIMES)


@pytest.mark.parametrize("kind", ["count", "count_sync"])
async def test_reader_that_stops_consuming_pauses_the_model_and_is_closed_with_4003(slow_server, marks_dir, kind):
    srv = slow_server
    assert srv.alive(), srv.output()
    tag = new_tag("slow", srv.framework, kind)
    per_token = SLOW_SIZE + 64  # what a buffered Delta costs against the window (session.DELTA_OVERHEAD)
    async with asyncio.timeout(30):
        # resume=False: the 4003 ends the client's connection for good, so the test can read it
        client = connect(srv.url, resume=False, backoff=Backoff(retries=0))
        try:
            stream = client.stream("fast", model=kind,
                                   params={"n": SLOW_TOTAL, "size": SLOW_SIZE, "every": 1, "tag": tag})
            first = await anext(stream)
            t_first = time.monotonic()
            assert first == "0," + "." * (SLOW_SIZE - 2)
            assert client.welcome is not None and client.welcome.flow_window == SLOW_WINDOW
            # ... and never consume (so never Ack) again
            while client.last_close is None:
                await asyncio.sleep(0.01)
            closed_after = time.monotonic() - t_first
            close_code = client.last_close.code
            produced_at_close = read_count(marks_dir, tag)
            # the session is kept for resume (4003 is resumable) with its model paused; when the
            # resume window ends the server stops the model: its finally runs, no more tokens
            gone_after = await wait_for_file(marks_dir / f"{tag}.closed", SLOW_RESUME_WINDOW + 5)
            final = read_count(marks_dir, tag)
            # what had arrived is still readable, then the stream reports the close
            with pytest.raises(ConnectionClosed) as closed:
                async for _ in stream:
                    pass
        finally:
            await client.close()
    measure(f"slow reader {srv.framework}-{kind}",
            f"close {close_code} {closed_after:.2f} s after the first token; produced {produced_at_close} "
            f"(final {final}) of {SLOW_TOTAL}, window {SLOW_WINDOW} B = {SLOW_WINDOW // per_token} tokens; "
            f"model stopped {gone_after:.2f} s after the close")
    assert close_code == CloseCode.SLOW_CONSUMER
    assert closed.value.code == CloseCode.SLOW_CONSUMER
    assert SLOW_TIMEOUT - 0.2 <= closed_after <= SLOW_TIMEOUT + MARGIN, closed_after
    # paused at the window: a few window's worth (in flight + the one being made), never the 10 MB
    assert SLOW_WINDOW // per_token <= produced_at_close <= 3 * SLOW_WINDOW // per_token + 20, produced_at_close
    assert final == produced_at_close  # nothing more was produced while paused and detached
    assert starts(marks_dir, tag) == 1


# ================================================================================ 6: replay buffer
BUFFER = 8192  # resume_buffer_size
BUFFER_ENV = {"LOWLAT_RESUME_BUFFER_SIZE": str(BUFFER), "LOWLAT_RESUME_WINDOW": "10"}
BUFFER_SIZE_OF_TOKEN = 36  # each Delta costs 36 + 64 = 100 bytes of the buffer (session.DELTA_OVERHEAD)


@pytest.fixture(scope="module", params=SERVERS)
def buffer_server(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    """A server with an 8 KiB replay buffer (resume_buffer_size)."""
    framework = request.param
    yield from running_server(f"buffer-{framework}", framework, conformance_dir, BUFFER_ENV, STARTUP_TIMES)


async def test_detached_session_pauses_its_model_at_resume_buffer_size(buffer_server, marks_dir):
    """protocol.md 14.4: a client that sends no Acks (flow_window=0) drops off; while no connection is
    attached the model pauses once resume_buffer_size is full (instead of dropping output or growing),
    and the client that comes back resumes and gets every token, in order, once."""
    srv = buffer_server
    n, delay, detached = 200, 0.01, 1.5  # unpaused, the model would make ~150 tokens while detached
    fits = BUFFER // (BUFFER_SIZE_OF_TOKEN + 64)
    tag = new_tag("buffer", srv.framework)
    with FaultProxy(("127.0.0.1", srv.port), seed=SEED) as proxy:
        async with asyncio.timeout(30):
            client = connect(proxy.url_base + "/ws", backoff=backoff(), flow_window=0, open_timeout=0.25)
            try:
                stream = client.stream("x", model="count",
                                       params={"n": n, "delay": delay, "size": BUFFER_SIZE_OF_TOKEN, "every": 1,
                                               "tag": tag})
                head = await take(stream, 10, "before the cut")
                assert client.welcome is not None and client.welcome.flow_window == 0
                proxy.stall()  # reconnects hang in the proxy: the session stays detached
                proxy.cut_all()
                await asyncio.sleep(detached)
                produced = read_count(marks_dir, tag)
                proxy.resume()
                rest = [c async for c in stream]
                end = stream.end
            finally:
                await client.close()
    got = [c[:c.index(",") + 1] for c in [*head, *rest]]
    measure(f"resume buffer {srv.framework}",
            f"detached {detached} s: model paused after {produced} of {n} tokens (buffer {BUFFER} B = {fits} "
            f"Deltas); resumed {client.resumes}x, {len(got)} tokens in order")
    assert produced <= fits + 2, produced  # paused at the buffer (+ the token being made), not ~160
    assert got == tokens(n)
    assert end is not None and end.last_seq == n
    assert client.resumes >= 1 and starts(marks_dir, tag) == 1
