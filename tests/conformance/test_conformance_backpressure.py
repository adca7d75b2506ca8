"""A client that sends no Acks and stops reading, on every server (docs/protocol.md 14.5, "Flow control and
backpressure").

With ``flow_window`` 0 the protocol's window does not bound what a stream sends ahead: the hosting server's own
backpressure must. Its send (or the direct transport) blocks once the socket buffers are full, the model waits, and
after ``slow_consumer_timeout`` the server closes with 4003. The serving process's memory stays bounded by its
buffers, never by the length of the output (daphne used to queue all of it: +94 MB of RSS for 48 MB of output, and
no 4003 ever came). Meanwhile the server reads on, as uvicorn does: such a client's Cancel is handled at once.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conformance_servers import SERVERS, ServerProcess, base_env, server_argv, start_ready
from conformance_support import measure, measure_max, wait_for_file
from support.raw import PROTO, codec_of, hello, raw_connect
from test_conformance_limits import PeakRSS, serving_pid
from websockets.exceptions import ConnectionClosed

from lowlat_mw.errors import CloseCode
from lowlat_mw.protocol import events as ev

SERVER_LEVEL = True
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KiB, MiB = 1024, 1024 * 1024
SLOW_CONSUMER_TIMEOUT = 2.0
CHUNK, CHUNKS = 16 * KiB, 4096  # the model's output: 64 MiB, far more than any socket buffer holds
BLOCKED_LINE = "closing slow consumer"  # the driver's warning as it sends 4003 (lowlat_mw.runtime.connection)
# Peak RSS growth of the serving process while the client does not read. Measured (2026-12-07, 3 runs each): uvicorn
# websockets-sansio +0.0-0.4 MiB, wsproto +0.0-0.3, the ASGI path +0.0-0.3, gunicorn +0.1-0.5, daphne +0.4-1.3 (it
# used to queue the whole output: +100 MiB and more for these 64 MiB). The bound leaves room for the socket buffers,
# a cork (64 KiB) and the replay buffer (resume_buffer_size, 1 MiB), several times over.
RSS_BOUND = 16 * MiB
DAPHNE_ASGI = "django-asgi"


def _server(request: pytest.FixtureRequest, conformance_dir: Path, kind: str,
            slow_consumer_timeout: float) -> Iterator[ServerProcess]:
    """A server of `request.param` with `slow_consumer_timeout`; DAPHNE_ASGI: daphne with direct writes off (every
    frame through ASGI ``send``, as the ASGI path under uvicorn)."""
    name = request.param
    fw = "django" if name == DAPHNE_ASGI else name
    extra = {"LOWLAT_SLOW_CONSUMER_TIMEOUT": str(slow_consumer_timeout)}
    if name == DAPHNE_ASGI:
        extra["LOWLAT_DIRECT_WRITES"] = "false"
    env = base_env(conformance_dir, extra)
    srv = start_ready(f"{kind}-{name}", fw, lambda p: server_argv(fw, p, env=env), env, conformance_dir / "logs")
    yield srv
    srv.stop()


@pytest.fixture(scope="module", params=(*SERVERS, DAPHNE_ASGI))
def slow(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    """A server with a 2 s slow_consumer_timeout."""
    yield from _server(request, conformance_dir, "backpressure", SLOW_CONSUMER_TIMEOUT)


PATIENT = 300.0  # slow_consumer_timeout of the `patient` servers: no 4003 within any test


@pytest.fixture(scope="module", params=(*SERVERS, DAPHNE_ASGI))
def patient(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    """A server that waits PATIENT seconds for a client that does not read before it closes it."""
    yield from _server(request, conformance_dir, "blocked", PATIENT)


def _small_receive_buffer(port: int) -> socket.socket:
    """A connected socket whose kernel receive buffer is small (no autotuning): a client that stops reading fills
    it, and then the server's send buffer, at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * KiB)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


async def _logged(path: Path, needle: str, since: int, bound: float) -> bool:
    """Whether `needle` appears in the file at `path` (a server's stderr) after byte `since` within `bound` seconds."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        with open(path, "rb") as f:
            f.seek(since)
            if needle.encode() in f.read():
                return True
        await asyncio.sleep(0.05)
    return False


async def no_ack_client_gets_4003(name: str, url: str, port: int, pid: int, stderr: Path, request: ev.Request) -> None:
    """A client that sends no Acks asks for `request` (far more output than any socket buffer holds) and stops reading:
    the server (process `pid`, logging to `stderr`) logs that it closes a slow consumer within its slow_consumer_timeout
    (SLOW_CONSUMER_TIMEOUT, plus slack), its peak RSS stays within RSS_BOUND, and the client, reading again, gets what
    the buffers held, then close 4003."""
    since = stderr.stat().st_size
    sock = _small_receive_buffer(port)
    # max_queue=1: the client library stops reading its socket once one message waits for the application
    async with raw_connect(url, [PROTO], sock=sock, max_queue=1) as ws:
        welcome = await hello(ws)  # (Hello.flow_window 0: this client sends no Acks)
        assert welcome.flow_window == 0
        with PeakRSS(pid) as rss:
            await ws.send(codec_of(ws).encode(request))
            # The client reads nothing from here on. The server's send stays blocked: slow_consumer_timeout later it
            # logs that it closes the connection (bounded wait: the timeout, plus generous scheduling slack).
            blocked = await _logged(stderr, BLOCKED_LINE, since, SLOW_CONSUMER_TIMEOUT + 30)
        assert blocked, f"no {BLOCKED_LINE!r} within {SLOW_CONSUMER_TIMEOUT + 30:.0f} s; peak RSS " \
                        f"+{rss.growth / MiB:.1f} MiB\n{stderr.read_text(errors='replace')[-3000:]}"
        # Reading again, the client gets what the buffers held, then the close: 4003, the session resumable.
        deltas = 0
        try:
            async with asyncio.timeout(30):
                while True:
                    event = codec_of(ws).decode(await ws.recv(), limit=64 * MiB, allowed=())
                    deltas += isinstance(event, ev.Delta)
        except ConnectionClosed:
            pass
        code = ws.close_code
    measure(f"no-ack slow consumer {name}",
            f"{CHUNKS * CHUNK // MiB} MiB of output, the client not reading: peak RSS +{rss.growth / MiB:.1f} MiB "
            f"({rss.method}), then {deltas} Deltas ({deltas * CHUNK / MiB:.1f} MiB) buffered and close {code}")
    assert code == CloseCode.SLOW_CONSUMER, (code, deltas)
    assert deltas < CHUNKS  # the model was held back, not run to its end
    assert rss.growth < RSS_BOUND, f"server peak RSS grew {rss.growth / MiB:.1f} MiB while the client did not read"


async def test_a_client_that_sends_no_acks_and_stops_reading_gets_4003_with_bounded_server_memory(slow):
    request = ev.Request(stream_id=1, model="agen", text="much", params={"n": str(CHUNKS), "size": str(CHUNK)})
    await no_ack_client_gets_4003(slow.name.removeprefix("backpressure-"), slow.url, slow.port, serving_pid(slow),
                                  slow.stderr_path, request)


STILL = 1.0  # seconds the model's count stays put: its output is blocked (it makes hundreds of chunks a second else)
CANCEL_BOUND = 10.0  # seconds from the Cancel to the model's `finally` (measured well under a second)


async def _stalled(count_file: Path, bound: float) -> int:
    """What the model had produced once its count (`count_file`) stayed put for STILL seconds: its output is blocked
    (within `bound` seconds, or AssertionError)."""
    deadline = time.monotonic() + bound
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            produced = int(count_file.read_text() or "-1")
        except (OSError, ValueError):
            produced = -1
        if produced != last:
            last, since = produced, time.monotonic()
        elif produced > 0 and time.monotonic() - since >= STILL:
            return produced
        await asyncio.sleep(0.05)
    raise AssertionError(f"the model's output never blocked within {bound} s (count {last})")


async def test_a_client_whose_socket_is_full_still_gets_its_cancel_handled(patient, marks_dir):
    """The server reads on while its writes are held, as uvicorn does: a client that stopped reading (its socket
    buffer full, the server's output blocked) still has its Cancel handled: the model sees the cancellation (its
    `finally` runs) within CANCEL_BOUND, long before the slow-consumer close (PATIENT). daphne used to stop reading its
    socket until Twisted had written all it held, which such a client never lets happen: the Cancel (an Ack, a Pong,
    the close) waited for the 4003."""
    name = patient.name.removeprefix("blocked-")
    tag = f"blocked-cancel-{name}-{uuid.uuid4().hex[:8]}"
    sock = _small_receive_buffer(patient.port)
    async with raw_connect(patient.url, [PROTO], sock=sock, max_queue=1) as ws:
        await hello(ws)  # (Hello.flow_window 0: this client sends no Acks; only the sockets hold the output back)
        params = {"n": str(CHUNKS), "size": str(CHUNK), "every": "1", "tag": tag}
        await ws.send(codec_of(ws).encode(ev.Request(stream_id=1, model="count", text="much", params=params)))
        produced = await _stalled(marks_dir / f"{tag}.count", 60)  # the client reads nothing: the output blocks
        assert produced < CHUNKS
        await ws.send(codec_of(ws).encode(ev.Cancel(stream_id=1)))
        took = await wait_for_file(marks_dir / f"{tag}.closed", CANCEL_BOUND)
        ws.transport.abort()  # (no close handshake: the client still reads nothing)
    measure_max(f"blocked output, Cancel -> model finally ran, {name} (max)", took)
    assert int((marks_dir / f"{tag}.count").read_text()) < CHUNKS  # cancelled, not run to its end
