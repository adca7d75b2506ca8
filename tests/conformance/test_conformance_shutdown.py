"""Graceful drain when the server is stopped (docs/protocol.md section 13), on every server we ship with.

SIGTERM goes to the real server process (uvicorn with our shims, daphne through our runner,
gunicorn with our worker, and ``lowlat-mw serve``) while a client has two streams running: one
that ends within ``drain_grace`` and one that would run far longer. The client must get GoAway,
the whole of the short stream, then close 4002 (its session resumable elsewhere) about
``drain_grace`` after the signal; a connection that arrives meanwhile is never served; and the
server must then exit by itself, well before any SIGKILL.
"""

from __future__ import annotations

import asyncio
import signal
import time
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


@pytest.mark.parametrize("framework", [*SERVERS, "serve"])
async def test_sigterm_drains_running_streams_then_closes_with_4002(framework: str, conformance_dir: Path) -> None:
    env = base_env(conformance_dir, {"LOWLAT_DRAIN_GRACE": str(DRAIN_GRACE)})
    srv = start_ready(f"shutdown-{framework}", framework, lambda p: server_argv(framework, p, env=env), env,
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
            srv.proc.send_signal(signal.SIGTERM)
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
                f"SIGTERM: GoAway, short stream of {SHORT} finished, 4002 after {closed_after:.2f} s "
                f"(drain_grace {DRAIN_GRACE} s); process exited (code {exit_code}) after {exited_after:.2f} s; "
                f"a client arriving then: {late_outcome}")
    finally:
        srv.stop()
