"""Graceful drain when the server is stopped (docs/protocol.md section 13), on every server we ship with.

SIGTERM (or Ctrl-C: SIGINT to the process group) goes to the real server process (uvicorn with our shims, daphne
through our runner, gunicorn with our worker, and ``lowlat-mw serve``) while a client has two streams running: one
that ends within ``drain_grace`` and one that would run far longer. The client must get GoAway,
the whole of the short stream, then close 4002 (its session resumable elsewhere) about
``drain_grace`` after the signal; a connection that arrives meanwhile is never served; and the
server must then exit by itself, well before any SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conformance_servers import SERVERS, ServerProcess, base_env, server_argv, start_ready
from conformance_support import measure
from support.raw import PROTO, codec_of, hello, raw_connect, read_until_closed, recv_event
from support.time import MARGIN
from websockets.exceptions import ConnectionClosed as WsConnectionClosed
from websockets.exceptions import InvalidMessage, InvalidStatus

from lowlat_mw.client import Backoff, connect
from lowlat_mw.errors import CloseCode, ConnectionClosed, ErrorCode, ReconnectFailed, StreamError
from lowlat_mw.protocol import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DRAIN_GRACE = 1.5
SHORT, LONG = 8, 10_000  # tokens of the two streams, DELAY apart
DELAY = 0.05
EXIT_BOUND = 10.0  # seconds after the 4002 close for the process to exit by itself


async def _late_client(url: str, after: float) -> str:
    """What a client connecting `after` s into the drain gets: never a served stream."""
    await asyncio.sleep(after)
    try:
        async with raw_connect(url, [PROTO], open_timeout=3) as ws:
            await ws.send(codec_of(ws).encode(ev.Hello(client="late")))
            out = await read_until_closed(ws, timeout=5)
    except (OSError, InvalidMessage, InvalidStatus, TimeoutError) as exc:
        return f"refused ({type(exc).__name__})"
    except WsConnectionClosed as exc:
        assert exc.rcvd is None or exc.rcvd.code == CloseCode.DRAINING, exc
        return f"closed ({exc.rcvd.code if exc.rcvd else 'no close frame'})"
    assert not any(isinstance(e, ev.Welcome) for e in out.events), out.events
    assert out.close_code in (CloseCode.DRAINING, None), out
    return f"closed with {out.close_code} before Welcome"


@contextlib.contextmanager
def _sigint_as_in_a_terminal(how: str) -> Iterator[None]:
    """A server started meanwhile gets SIGINT's default disposition, as from a terminal, even where this test
    process ignores SIGINT (a background job of a shell without job control: an ignored signal stays ignored
    across exec, and Twisted then leaves it so)."""
    previous = signal.getsignal(signal.SIGINT)
    if how == "Ctrl-C" and previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # (reset to the default by exec)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(srv, how: str) -> None:
    """SIGTERM to the server process, or Ctrl-C in its terminal: SIGINT to its whole process group (ours: the
    server runs in a session of its own), so a gunicorn master and its worker both get it, as from a terminal."""
    if how == "SIGTERM":
        srv.proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(srv.proc.pid, signal.SIGINT)


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
@pytest.mark.parametrize("framework", [*SERVERS, "serve"])
async def test_sigterm_drains_running_streams_then_closes_with_4002(framework: str, how: str,
                                                                    conformance_dir: Path) -> None:
    """Ctrl-C drains as SIGTERM does (issue 38: under gunicorn it froze the stream for the graceful timeout, 35 s,
    until SIGKILL lost the model's output)."""
    env = base_env(conformance_dir, {"LOWLAT_DRAIN_GRACE": str(DRAIN_GRACE)})
    with _sigint_as_in_a_terminal(how):
        srv = start_ready(f"shutdown-{framework}-{how}", framework, lambda p: server_argv(framework, p, env=env), env,
                          conformance_dir / "logs")
    try:
        async with raw_connect(srv.url, [PROTO]) as ws:
            await hello(ws)
            codec = codec_of(ws)
            for sid, n in ((1, SHORT), (2, LONG)):
                await ws.send(codec.encode(ev.Request(stream_id=sid, model="count",
                                                      params={"n": n, "delay": DELAY})))
            first = [await recv_event(ws), await recv_event(ws)]
            assert {e.stream_id for e in first if isinstance(e, ev.Delta)} == {1, 2}, first
            signalled = time.monotonic()
            _stop(srv, how)
            late = asyncio.ensure_future(_late_client(srv.url, after=DRAIN_GRACE / 3))
            out = await read_until_closed(ws, timeout=DRAIN_GRACE + 5, answer_pings=True)
            closed_after = time.monotonic() - signalled
        late_outcome = await late
        exit_code = await asyncio.to_thread(srv.wait_exit, EXIT_BOUND)
        exited_after = time.monotonic() - signalled

        events = first + out.events
        goaway = [i for i, e in enumerate(events) if isinstance(e, ev.GoAway)]
        assert len(goaway) == 1, events
        short = [e.text for e in events if isinstance(e, ev.Delta) and e.stream_id == 1]
        assert short == [f"{i}," for i in range(SHORT)]  # the short stream finished during the drain
        ends = {e.stream_id: e for e in events if isinstance(e, ev.End)}
        assert set(ends) == {1} and ends[1].finish_reason == "stop", ends  # the long one is left to resume
        assert out.close_code == CloseCode.DRAINING, out
        assert DRAIN_GRACE - 0.1 <= closed_after <= DRAIN_GRACE + MARGIN, closed_after
        assert exit_code is not None, f"{srv.name} still running {EXIT_BOUND} s after the drain\n{srv.output()}"
        measure(f"shutdown drain {framework}",
                f"{how}: GoAway, short stream of {SHORT} finished, 4002 after {closed_after:.2f} s "
                f"(drain_grace {DRAIN_GRACE} s); process exited (code {exit_code}) after {exited_after:.2f} s; "
                f"a client arriving then: {late_outcome}")
    finally:
        srv.stop()


# ================================================================================ forced shutdown (issue 38, item 7)
FORCED_GRACE = 60.0  # a drain that would outlast the test: only the forced exit ends these servers in time
SHORT_GRACE = 2.0  # daphne (Twisted) takes no second Ctrl-C: its drain runs this grace, then 4002; gunicorn's master
# sends its worker SIGQUIT, which drains as SIGTERM does (ThreadWorker.handle_quit), within this grace
FORCES_EXIT = frozenset({"starlette", "wsproto", "asgi", "serve"})  # uvicorn: a second Ctrl-C forces the exit
FORCE_EXIT_BOUND = 15.0  # seconds from the second Ctrl-C to the process's exit (measured: under 1 s)
COUNT = {"n": 100_000, "delay": 0.02}  # the stream: far longer than any test


def _ctrl_c(srv: ServerProcess) -> None:
    """What Ctrl-C in the server's terminal does: SIGINT to its whole process group (a gunicorn's workers too)."""
    if srv.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # (it exited meanwhile)
            os.killpg(srv.proc.pid, signal.SIGINT)


def _forced_server(framework: str, conformance_dir: Path, name: str) -> tuple[ServerProcess, float]:
    grace = FORCED_GRACE if framework in FORCES_EXIT else SHORT_GRACE
    env = base_env(conformance_dir, {"LOWLAT_DRAIN_GRACE": str(grace)})
    return start_ready(f"{name}-{framework}", framework, lambda p: server_argv(framework, p, env=env), env,
                       conformance_dir / "logs"), grace


@pytest.mark.parametrize("framework", [*SERVERS, "serve"])
async def test_double_ctrl_c_cuts_a_running_stream_as_documented(framework: str, conformance_dir: Path) -> None:
    # The frames themselves (a raw client: the Python client reads an unasked End "cancelled" as a cut stream too, so
    # it cannot tell the server's fix from the old behaviour), against docs/protocol.md 13.1. A second Ctrl-C under
    # uvicorn forces the exit while the connection is open: after the Deltas, Error{internal, retryable} for the
    # stream, whichever of its tasks uvicorn's teardown cancels first (before: End "cancelled" where the model's
    # went first, nothing but a dropped connection where the connection's did). daphne and gunicorn take no second
    # Ctrl-C: their drain runs its grace, then 4002, the stream left for a resume. No server ever sends End for it.
    srv, grace = _forced_server(framework, conformance_dir, "forced-raw")
    try:
        async with raw_connect(srv.url, [PROTO]) as ws:
            await hello(ws)
            codec = codec_of(ws)
            await ws.send(codec.encode(ev.Request(stream_id=1, model="count", params=COUNT)))
            events: list[ev.Event] = []
            async with asyncio.timeout(20):
                while sum(isinstance(e, ev.Delta) for e in events) < 5:  # the model runs
                    events.append(await recv_event(ws))
            _ctrl_c(srv)
            async with asyncio.timeout(20):  # the first Ctrl-C: a drain (GoAway)
                while not any(isinstance(e, ev.GoAway) for e in events):
                    events.append(await recv_event(ws))
                    if isinstance(events[-1], ev.Ping):
                        await ws.send(codec.encode(events[-1].response()))
            _ctrl_c(srv)  # the second: forced, where the server takes it
            forced = time.monotonic()
            out = await read_until_closed(ws, timeout=grace + 20, answer_pings=True)
        exit_code = await asyncio.to_thread(srv.wait_exit, grace + FORCE_EXIT_BOUND)
        exited_after = time.monotonic() - forced
    finally:
        srv.stop()
    events += out.events
    ends = [e for e in events if isinstance(e, ev.End | ev.Error) and e.stream_id == 1]
    assert not any(isinstance(e, ev.End) for e in ends), ends  # never End ("cancelled" least of all)
    deltas = sum(isinstance(e, ev.Delta) for e in events)
    assert exit_code is not None, f"{srv.name} still running {grace + FORCE_EXIT_BOUND} s after the second Ctrl-C"
    if framework in FORCES_EXIT:  # forced while the connection is open: the stream's Error, after its Deltas
        [error] = ends
        assert isinstance(error, ev.Error) and error.code is ErrorCode.INTERNAL and error.retryable, error
        assert isinstance(events[-1], ev.Error | ev.Ping), events[-3:]  # nothing of the stream after it
        assert exited_after < FORCE_EXIT_BOUND, exited_after
        seen = f"Error {error.code.wire_name} retryable after {deltas} Deltas, then close {out.close_code}"
    else:  # a drain: the stream is left for a resume (13)
        assert ends == [] and out.close_code == CloseCode.DRAINING, (ends, out)
        seen = f"{deltas} Deltas, no End or Error, then close {out.close_code}"
    measure(f"forced shutdown frames {framework}", f"double Ctrl-C: {seen}; the process exited after "
            f"{exited_after:.2f} s (code {exit_code})")


@pytest.mark.parametrize("framework", [*SERVERS, "serve"])
async def test_double_ctrl_c_never_ends_a_running_stream_quietly(framework: str, conformance_dir: Path) -> None:
    # What the new user did: a stream of 200 chunks running, Ctrl-C twice under `lowlat-mw serve` / uvicorn with our
    # shims. uvicorn then cancelled every task, the model's End{finish_reason: "cancelled"} went out, and the Python
    # client's `async for` ended quietly after 56 chunks: a cut stream taken for a whole one. A cut stream must
    # raise what docs/protocol.md 13.1 says: under uvicorn a retryable StreamError internal; where the drain runs on
    # (daphne, gunicorn), its 4002 and then, with no server to resume at, ReconnectFailed.
    srv, grace = _forced_server(framework, conformance_dir, "forced")
    try:
        async with connect(srv.url, backoff=Backoff(base=0.1, retries=2)) as client:
            stream = client.stream("x", model="count", params=COUNT)
            chunks: list[str] = []

            async def consume() -> None:
                async for chunk in stream:
                    chunks.append(chunk)  # type: ignore[arg-type]

            reading = asyncio.ensure_future(consume())
            async with asyncio.timeout(20):
                while len(chunks) < 5:  # the model runs
                    await asyncio.wait([reading], timeout=0.02)
                    assert not reading.done(), reading
            _ctrl_c(srv)
            async with asyncio.timeout(grace + 20):  # the first Ctrl-C: a drain (GoAway), or the connection goes
                while client.goaway is None and not reading.done() and srv.proc.poll() is None:
                    await asyncio.sleep(0.02)
            _ctrl_c(srv)  # the second: forced
            forced = time.monotonic()
            exit_code = await asyncio.to_thread(srv.wait_exit, grace + FORCE_EXIT_BOUND)
            exited_after = time.monotonic() - forced
            try:
                async with asyncio.timeout(30):  # (the client's reconnects: 2 retries of at most 0.2 s)
                    await reading
                raised: BaseException | None = None
            except (StreamError, ConnectionClosed, ReconnectFailed) as exc:
                raised = exc
    finally:
        srv.stop()
    assert exit_code is not None, f"{srv.name} still running {grace + FORCE_EXIT_BOUND} s after the second Ctrl-C"
    assert raised is not None, (len(chunks), stream.end)  # (before: End "cancelled", after 56 of 200: a quiet end)
    assert stream.end is None and 5 <= len(chunks) < COUNT["n"]
    if framework in FORCES_EXIT:  # a second Ctrl-C forces the exit, whatever drain_grace says
        assert isinstance(raised, StreamError) and raised.code is ErrorCode.INTERNAL and raised.retryable, raised
        assert exited_after < FORCE_EXIT_BOUND, exited_after
    else:
        assert isinstance(raised, ReconnectFailed), repr(raised)
    measure(f"forced shutdown {framework}", f"double Ctrl-C after {len(chunks)} chunks: the client raised "
            f"{type(raised).__name__}: {str(raised)[:140]}; the process exited after {exited_after:.2f} s "
            f"(code {exit_code})")


async def test_ctrl_c_stops_serve_without_a_traceback(conformance_dir: Path) -> None:
    # One Ctrl-C on `lowlat-mw serve` (a stream running): the drain, and an exit with code 0, not the
    # KeyboardInterrupt traceback uvicorn's re-raised SIGINT left (uvicorn.run catches it; serving.run did not).
    env = base_env(conformance_dir)
    srv = start_ready("ctrl-c-serve", "serve", lambda p: server_argv("serve", p, env=env), env,
                      conformance_dir / "logs")
    try:
        async with connect(srv.url, backoff=Backoff(base=0.1, retries=0)) as client:
            stream = client.stream("x", model="count", params={"n": 3, "delay": 0.05})
            assert await anext(stream) == "0,"  # (the model runs)
            _ctrl_c(srv)
            assert await stream.text() == "1,2,"  # the rest, within drain_grace (1 s)
        exit_code = await asyncio.to_thread(srv.wait_exit, EXIT_BOUND)
    finally:
        srv.stop()
    assert exit_code == 0, srv.output()
    assert "Traceback" not in srv.stderr_path.read_text(), srv.output()
