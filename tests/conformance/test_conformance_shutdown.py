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
from conformance_servers import SERVERS, base_env, server_argv, start_ready
from conformance_support import PROTO, codec_of, hello, measure, raw_connect, read_until_closed, recv_event
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus

from lowlat_mw.errors import CloseCode
from lowlat_mw.protocol import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DRAIN_GRACE = 1.5
SHORT, LONG = 8, 10_000  # tokens of the two streams, DELAY apart
DELAY = 0.05
MARGIN = 1.0  # scheduling slack on a loaded 2-core machine
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
    except ConnectionClosed as exc:
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
