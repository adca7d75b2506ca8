"""Soak suite: server memory under connection churn and resumes, on every server lowlat-mw ships with.

Each server runs in a child process, started as its guide says (``lowlat-mw serve``; the Starlette
example on uvicorn with lowlat-mw's hardened websockets protocol and with its wsproto one; the Django
example on lowlat-mw's daphne runner; the Flask example on gunicorn with lowlat-mw's thread worker), the
benchmark's models (``benchmarks._bare_models``) and no rate limit. A client in this process keeps
CONCURRENCY connections busy, each running cycles one after another on a fresh TCP connection:

churn   WebSocket handshake, Hello, Welcome, one Request (``echo``), its Delta and End, a close
        handshake (1000): a short-lived client that comes, asks and goes.
resume  the same up to the End, then the TCP connection dropped without a close frame (the server keeps
        the session for ``resume_window``); a new connection resumes it (Hello with the resume token and
        the last seq), gets a Welcome with ``resumed`` and closes with 1000.

After a warm-up (the first WARMUP share of the churn cycles: caches, pools and allocator arenas fill),
the server's resident set size (RSS of the process tree: gunicorn's master and worker) is read every
``step`` cycles, and its slope fitted by least squares: bytes per connection (or per resume) that stay.
The slope of the second half alone says whether the growth levels off. Open file descriptors are read
at the start and the end. A raw client (hand-written frames on asyncio streams) keeps the client's own
cost low, so the server sees many connections per second.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.runtime.direct import apply_mask
from lowlat_mw.servers.serving import daphne_args, gunicorn_args, uvicorn_args
from lowlat_mw.settings import SUBPROTOCOL_PROTO

from ._bare_common import Child, free_port, kept_on_failure, log_dir, loop_factory, wait_http_ready
from ._frameworks_servers import MODEL, VENV_BIN, server_env
from .core import SuiteResult, log, machine_facts, markdown_table, suite

NAME = "soak"
HEADING = "Soak: memory under connection churn and resumes"
SLOPE_TARGET = 100.0  # issue 16: RSS slope after warm-up at most 100 B per connection
CONCURRENCY = 50
WARMUP = 0.2
CODEC = codec_for(SUBPROTOCOL_PROTO)
LIMIT = 1 << 20
TIMEOUT = 60.0  # one cycle, at most (a loaded machine)
SERVERS = ("serve", "starlette", "wsproto", "django", "flask")
LABELS = {
    "serve": "`lowlat-mw serve` (uvicorn, lowlat-mw's websockets protocol: direct reads and writes)",
    "starlette": "Starlette example, uvicorn with lowlat-mw's websockets protocol",
    "wsproto": "Starlette example, uvicorn with lowlat-mw's wsproto protocol",
    "django": "Django example, lowlat-mw's daphne runner",
    "flask": "Flask example, gunicorn with lowlat-mw's thread worker",
}


@dataclass(frozen=True)
class Size:
    cycles: int  # churn cycles per server
    resumes: int  # resume cycles per server
    step: int  # churn cycles between two RSS readings
    resume_step: int


SIZES = {
    "tiny": Size(cycles=300, resumes=60, step=50, resume_step=20),
    "quick": Size(cycles=1_000, resumes=200, step=100, resume_step=40),
    "full": Size(cycles=100_000, resumes=10_000, step=2_500, resume_step=500),
}


def server_argv(server: str, port: int) -> list[str]:
    """`server`'s command line on 127.0.0.1:`port`, with the options its guide gives."""
    host = ["--host", "127.0.0.1", "--port", str(port)]
    if server == "serve":
        return [str(VENV_BIN / "lowlat-mw"), "serve", MODEL, *host, "--log-level", "warning"]
    if server in ("starlette", "wsproto"):
        ws = "wsproto" if server == "wsproto" else "websockets-sansio"
        return [str(VENV_BIN / "uvicorn"), "examples.starlette_app:app", *host, *uvicorn_args(None, ws),
                "--log-level", "warning"]
    if server == "django":
        return [str(VENV_BIN / "python"), "-m", "lowlat_mw.servers.daphne", "-b", "127.0.0.1", "-p", str(port),
                *daphne_args(None), "examples.django_project.asgi:application"]
    if server == "flask":
        return [str(VENV_BIN / "gunicorn"), *gunicorn_args(None), "--threads", "300", "-b", f"127.0.0.1:{port}",
                "examples.flask_app:app"]
    raise ValueError(server)


# ================================================================================ raw client
def client_frame(payload: bytes, opcode: int = 0x2, fin: bool = True) -> bytes:
    """One client frame, masked with a random key (as every client must, RFC 6455 5.3)."""
    key = os.urandom(4)
    n = len(payload)
    head = bytes(((0x80 if fin else 0) | opcode,))
    head += bytes((0x80 | n,)) if n < 126 else struct.pack("!BH", 0x80 | 126, n)
    if n:
        payload = apply_mask(payload, key)
    return head + key + payload


_CLOSE_1000 = struct.pack("!H", 1000)


class Conn:
    """One raw WebSocket connection speaking the protocol (proto subprotocol)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, hello: ev.Hello) -> tuple[Conn, ev.Welcome]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = cls(reader, writer)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write((f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                      f"Sec-WebSocket-Protocol: {SUBPROTOCOL_PROTO}\r\n\r\n").encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            writer.close()
            raise RuntimeError(f"handshake refused: {head[:80]!r}")
        writer.write(client_frame(CODEC.encode(hello)))  # (not before the 101: RFC 6455 4.1)
        welcome = await conn.event()
        if not isinstance(welcome, ev.Welcome):
            raise RuntimeError(f"expected Welcome, got {welcome!r}")
        return conn, welcome

    async def frame(self) -> tuple[int, bytes]:
        """(opcode, payload) of the next server frame."""
        b0, b1 = await self.reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
        return b0 & 0x0F, await self.reader.readexactly(n)

    async def event(self) -> ev.Event:
        """The next protocol message (a server's WebSocket ping is answered; a close is an error)."""
        while True:
            opcode, payload = await self.frame()
            if opcode == 0x9:
                self.writer.write(client_frame(payload, 0xA))
                continue
            if opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                raise RuntimeError(f"closed by the server: {code} {payload[2:]!r}")
            if opcode in (0x1, 0x2):
                return CODEC.decode(payload, limit=LIMIT)  # type: ignore[no-any-return]

    async def echo(self, text: str) -> None:
        """One Request to the echo model: its Delta, then its End."""
        self.writer.write(client_frame(CODEC.encode(ev.Request(stream_id=1, model="echo", text=text))))
        while True:
            event = await self.event()
            if isinstance(event, ev.End):
                return
            if isinstance(event, ev.Error):
                raise RuntimeError(f"error: {event!r}")

    async def close(self) -> None:
        """The close handshake (1000), then the socket."""
        self.writer.write(client_frame(_CLOSE_1000, 0x8))
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while (await self.frame())[0] != 0x8:
                pass
        self.drop()

    def drop(self) -> None:
        """Drop the TCP connection without a close frame (the server sees 1006)."""
        self.writer.close()


async def churn_cycle(port: int) -> None:
    conn, _ = await Conn.open(port, ev.Hello(client="soak"))
    await conn.echo("soak")
    await conn.close()


async def resume_cycle(port: int) -> None:
    conn, welcome = await Conn.open(port, ev.Hello(client="soak"))
    await conn.echo("soak")
    conn.drop()
    again, resumed = await Conn.open(port, ev.Hello(client="soak", resume_token=welcome.resume_token,
                                                    last_seq={1: 1}))
    if not resumed.resumed:
        again.drop()
        raise RuntimeError("the session was not resumed")
    await again.close()


# ================================================================================ measurement
@dataclass
class Series:
    """RSS readings of one server: (cycles done, bytes)."""

    churn: list[tuple[int, int]] = field(default_factory=list)
    resume: list[tuple[int, int]] = field(default_factory=list)
    fds: tuple[int, int] = (0, 0)
    seconds: float = 0.0
    errors: int = 0


def _rss(child: Child) -> int:
    import psutil

    total = 0
    for pid in child.pids():
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total


def _fds(child: Child) -> int:
    import psutil

    total = 0
    for pid in child.pids():
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).num_fds()
    return total


async def _run_cycles(cycle: object, port: int, count: int, step: int, read: object, errors: list[str]) -> list[
        tuple[int, int]]:
    """`count` cycles, CONCURRENCY at a time; after every `step` cycles (all finished) `read()` is recorded."""
    readings: list[tuple[int, int]] = []
    done = 0
    while done < count:
        batch = min(step, count - done)
        left = iter(range(batch))

        async def worker(left: Iterator[int]) -> None:
            for _ in left:
                try:
                    async with asyncio.timeout(TIMEOUT):
                        await cycle(port)  # type: ignore[operator]
                except Exception as exc:  # counted and reported; the soak goes on
                    errors.append(repr(exc))

        await asyncio.gather(*(worker(left) for _ in range(min(CONCURRENCY, batch))))
        done += batch
        readings.append((done, read()))  # type: ignore[operator]
    return readings


async def _soak(server: str, size: Size, logdir: Path) -> Series:
    port = free_port()
    child = Child(server, server_argv(server, port), env=server_env(logdir), port=port, logdir=logdir)
    try:
        await wait_http_ready(child, "/" if server == "serve" else "/health")
        series = Series()
        errors: list[str] = []
        start = time.monotonic()
        fds0 = _fds(child)
        series.churn = await _run_cycles(churn_cycle, port, size.cycles, size.step, lambda: _rss(child), errors)
        series.resume = await _run_cycles(resume_cycle, port, size.resumes, size.resume_step,
                                          lambda: _rss(child), errors)
        series.fds = (fds0, _fds(child))
        series.seconds = time.monotonic() - start
        series.errors = len(errors)
        if errors:
            log(f"   {server}: {len(errors)} failed cycles, first: {errors[0]}")
        return series
    finally:
        child.stop()


def slope(points: Sequence[tuple[int, int]]) -> float:
    """Least-squares slope of bytes over cycles (0 for fewer than two points)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def fit(points: Sequence[tuple[int, int]], skip: float) -> tuple[float, float]:
    """(slope after the first `skip` share of the cycles, slope of the second half alone)."""
    if not points:
        return 0.0, 0.0
    last = points[-1][0]
    kept = [p for p in points if p[0] > skip * last]
    second = [p for p in points if p[0] > last / 2]
    return slope(kept), slope(second)


def _method(size: Size) -> str:
    return f"""Each server runs in a child process, started as its guide says, with the benchmark's models
(`benchmarks._bare_models`) and no rate limit. A client in this process (hand-written frames on asyncio
streams: little client cost, many connections per second) keeps {CONCURRENCY} connections busy, each running
cycles one after another on a fresh TCP connection:

- *churn*: WebSocket handshake, Hello, Welcome, one Request (`echo`), its Delta and End, a close handshake
  (1000): a short-lived client that comes, asks and goes;
- *resume*: the same up to the End, then the TCP connection dropped without a close frame (the server keeps
  the session for `resume_window`); a new connection resumes it (Hello with the resume token and the last
  seq), gets a Welcome with `resumed` and closes with 1000.

After a warm-up (the first {WARMUP:.0%} of the churn cycles: caches, pools and allocator arenas fill), the
server's resident set size (RSS of the process tree: gunicorn's master and worker) is read every
{size.step:,} churn cycles ({size.resume_step:,} resumes), and its slope fitted by least squares: bytes per
connection (or per resume) that stay. The slope of the second half alone says whether the growth levels
off. Open file descriptors are read at the start and the end."""


def report(mode: str, size: Size, results: dict[str, Series], loop_name: str) -> SuiteResult:
    rows: dict[str, dict[str, float]] = {}
    table: list[list[str]] = []
    for server in SERVERS:
        s = results[server]
        churn, churn_late = fit(s.churn, WARMUP)
        resume, resume_late = fit(s.resume, 0.0)
        warm = next((rss for done, rss in s.churn if done > WARMUP * size.cycles), s.churn[0][1])
        end = s.resume[-1][1] if s.resume else s.churn[-1][1]
        cycles = size.cycles + 2 * size.resumes  # (a resume cycle opens two connections)
        rows[server] = {"churn_slope_b": churn, "churn_late_slope_b": churn_late, "resume_slope_b": resume,
                        "resume_late_slope_b": resume_late, "rss_warm_mib": warm / 2**20, "rss_end_mib": end / 2**20,
                        "fds_start": float(s.fds[0]), "fds_end": float(s.fds[1]),
                        "connections_per_s": cycles / s.seconds if s.seconds else 0.0, "errors": float(s.errors)}
        table.append([server, f"{size.cycles:,}", f"{warm / 2**20:.1f} / {end / 2**20:.1f}", f"{churn:+.1f}",
                      f"{churn_late:+.1f}", f"{size.resumes:,}", f"{resume:+.1f}", f"{resume_late:+.1f}",
                      f"{s.fds[0]} / {s.fds[1]}", f"{rows[server]['connections_per_s']:,.0f}", str(s.errors)])
    worst = max(max(r["churn_slope_b"], r["churn_late_slope_b"]) for r in rows.values())
    verdict = "met" if worst <= SLOPE_TARGET else "**missed**"
    servers = "\n".join(f"- `{k}`: {LABELS[k]}" for k in SERVERS)
    body = f"""{machine_facts(mode, extra=[f"event loop {loop_name}"])}

{_method(size)}

Servers:

{servers}

{markdown_table(["Server", "churn cycles", "RSS MiB after warm-up / at the end", "churn B/conn",
                 "churn B/conn, 2nd half", "resumes", "B/resume", "B/resume, 2nd half", "fds start / end",
                 "connections/s", "failed cycles"], table)}

Target (issue 16): RSS slope after warm-up at most {SLOPE_TARGET:.0f} B per connection on every server:
{verdict} (worst {worst:+.1f} B/conn, either fit). The resume column counts what a resumed session and its
two connections leave.
"""
    text = "\n".join(f"{k}: churn {r['churn_slope_b']:+.1f} B/conn (2nd half {r['churn_late_slope_b']:+.1f}), "
                     f"resume {r['resume_slope_b']:+.1f} B, fds {r['fds_start']:.0f}->{r['fds_end']:.0f}, "
                     f"{r['connections_per_s']:.0f} conn/s, {r['errors']:.0f} failed" for k, r in rows.items())
    return SuiteResult(NAME, HEADING, body, text, rows)


@suite(NAME, HEADING)
def run(mode: str) -> SuiteResult:
    size = SIZES[mode]
    factory, loop_name = loop_factory()
    logdir = log_dir(NAME)

    async def main() -> dict[str, Series]:
        results: dict[str, Series] = {}
        for server in SERVERS:  # one at a time: each has the machine to itself
            log(f"   {server}: {size.cycles:,} churn cycles, {size.resumes:,} resumes, {CONCURRENCY} at a time")
            results[server] = await _soak(server, size, logdir)
        return results

    with kept_on_failure(logdir), asyncio.Runner(loop_factory=factory) as runner:
        results = runner.run(main())
    return report(mode, size, results, loop_name)
