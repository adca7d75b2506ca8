"""Bare suite: lowlat-mw against a bare Starlette WebSocket served by the same uvicorn in the same run.

One uvicorn child process (benchmarks._bare_server: lowlat-mw's uvicorn WebSocket protocol, which is
websockets-sansio offering direct writes; uvloop when installed) serves a bare Starlette
``WebSocketRoute`` echo (``/echo``) and stream (``/stream``: ``"stream N"`` is answered with N token
frames and an ``"end"`` frame), lowlat-mw's Starlette middleware with its default settings at ``/ws``,
with observability off at ``/ws-lean`` and with direct writes off at ``/ws-send``; its models are
benchmarks._bare_models (``echo``: the request text as one Delta; ``tokens``: N tokens, no delay).
Clients run in this process, on one event loop, each on its own connection opened up front:

bare        the ``websockets`` client on /echo and /stream
proto/json  lowlat_mw.client.AsyncClient (proto / JSON subprotocol) on /ws
*-raw       a minimal client on the same ``websockets`` library speaking the protocol (pre-encoded
            Requests and Acks, frames classified by their first bytes, not decoded): lowlat-mw's
            server cost with as little client cost as possible
proto-lean  the raw proto client on /ws-lean (metrics, stage timings and tracing off)
proto-send  the raw proto client on /ws-send (direct_writes off: one ASGI send per frame, as on any other server)
proto-merge the AsyncClient on /ws-merge (default settings plus merge_deltas: back-to-back tokens share a Delta)

Each round runs, for every configuration in an order rotated by one per round, a block of round
trips (bare: message -> echo; lowlat-mw: Request(model "echo") -> Delta -> End, timed to the
Delta and to the End) and then one long stream per configuration (deltas/s). The server's CPU
time (its process CPU clock) and this process's are read around every block and stream. Ratios
are lowlat-mw over bare measured in the same run; per-round ratios give their spread.

In full and tiny modes a second, profiled server (cProfile on its event-loop thread) runs the
lowlat-mw and bare workloads once more, to attribute the server's time per delta and per round
trip to packages and functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import math
import pstats
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._bare_common import (
    Child,
    RawClient,
    kept_on_failure,
    listening_socket,
    log_dir,
    loop_factory,
    process_cpu,
    python_argv,
    python_env,
    wait_http_ready,
)
from ._bare_models import TOKEN, YIELD_EVERY
from .core import (
    SuiteResult,
    http_get,
    log,
    machine_facts,
    markdown_table,
    median,
    paired_ratios,
    quantiles,
    rotated,
    suite,
)

NAME = "bare"
HEADING = "Overhead vs a bare WebSocket"
RT_TARGET = 1.3  # issue 7: lowlat-mw round trip p50 at most 1.3x the bare echo
STREAM_TARGET = 0.7  # issue 7: streaming deltas/s at least 0.7x bare
PAYLOAD = "ping 0123456789"  # the round trip's message (bare) / Request text (lowlat-mw echo model)
SAMPLE_TIMEOUT = 120.0


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    client: str  # websockets | AsyncClient | raw
    path: str
    mode: str  # proto | json | "" (bare)


CONFIGS = (
    Config("bare", "bare Starlette WebSocket, `websockets` client", "websockets", "", ""),
    Config("proto", "lowlat-mw proto, AsyncClient", "AsyncClient", "/ws", "proto"),
    Config("json", "lowlat-mw JSON, AsyncClient", "AsyncClient", "/ws", "json"),
    Config("proto-raw", "lowlat-mw proto, raw client", "raw", "/ws", "proto"),
    Config("json-raw", "lowlat-mw JSON, raw client", "raw", "/ws", "json"),
    Config("proto-lean", "lowlat-mw proto, raw client, observability off", "raw", "/ws-lean", "proto"),
    Config("proto-send", "lowlat-mw proto, raw client, ASGI send path (`direct_writes` off)", "raw", "/ws-send",
           "proto"),
    Config("proto-merge", "lowlat-mw proto, AsyncClient, `merge_deltas` on", "AsyncClient", "/ws-merge", "proto"),
)
HEADLINE = ("proto", "json")  # the configurations the targets are judged on (the real client)


@dataclass(frozen=True)
class Size:
    roundtrips: int  # per configuration per round
    tokens: int  # per stream
    rounds: int
    warmup: int
    profile_streams: int  # 0: no profiled pass
    profile_roundtrips: int
    plots: bool


SIZES = {
    "tiny": Size(roundtrips=20, tokens=200, rounds=2, warmup=1, profile_streams=2, profile_roundtrips=20,
                 plots=False),
    "quick": Size(roundtrips=60, tokens=1000, rounds=4, warmup=1, profile_streams=2, profile_roundtrips=20,
                  plots=True),
    "full": Size(roundtrips=300, tokens=5000, rounds=40, warmup=2, profile_streams=12, profile_roundtrips=2000,
                 plots=True),
}


# ================================================================================ server
class BareServer:
    """benchmarks._bare_server in a child process, on a listening socket bound here."""

    def __init__(self, logdir: Path, name: str = "bare-server", profile: bool = False) -> None:
        """`profile`: run the server under cProfile, writing its dumps into `logdir`."""
        self.sock = listening_socket()
        self.port = self.sock.getsockname()[1]
        argv = python_argv("-m", "benchmarks._bare_server", "--fd", str(self.sock.fileno()))
        if profile:
            argv += ["--profile", str(logdir)]
        try:
            self.child = Child(name, argv, env=python_env(), port=self.port, logdir=logdir,
                               pass_fds=(self.sock.fileno(),))
        except BaseException:
            self.sock.close()
            raise

    async def ready(self) -> None:
        """Wait until it answers GET /cpu (raises with its output if it dies first)."""
        await wait_http_ready(self.child, "/cpu")

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def cpu(self) -> float:
        """The server process's CPU seconds so far (its CPU-time clock, read from here)."""
        return process_cpu(self.child.proc.pid)

    def stop(self) -> None:
        self.sock.close()
        self.child.stop()


# ================================================================================ drivers
class Driver:
    """One configuration's client connection(s): round trips and streams."""

    async def open(self) -> None: ...

    async def roundtrip(self) -> tuple[float, float]:
        """Seconds (to the reply / first Delta, to the End)."""
        raise NotImplementedError

    async def stream(self, n: int) -> int:
        """Stream `n` tokens; returns how many arrived."""
        raise NotImplementedError

    async def close(self) -> None: ...


class BareDriver(Driver):
    def __init__(self, server: BareServer) -> None:
        self.server = server
        self.echo: Any = None
        self.streamer: Any = None

    async def open(self) -> None:
        from websockets.asyncio.client import connect

        opts: dict[str, Any] = {"compression": None, "ping_interval": None, "open_timeout": 30.0, "proxy": None,
                                "max_size": 16 * 1024 * 1024}
        self.echo = await connect(self.server.url("/echo"), **opts)
        self.streamer = await connect(self.server.url("/stream"), **opts)

    async def roundtrip(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        await self.echo.send(PAYLOAD)
        reply = await self.echo.recv()
        t = time.perf_counter() - t0
        if reply != PAYLOAD:
            raise RuntimeError(f"bare echo answered {reply!r}")
        return t, t

    async def stream(self, n: int) -> int:
        await self.streamer.send(f"stream {n}")
        count = 0
        while True:
            frame = await self.streamer.recv()
            if frame == "end":
                return count
            count += 1

    async def close(self) -> None:
        for ws in (self.echo, self.streamer):
            if ws is not None:
                await ws.close()


class LowLatDriver(Driver):
    def __init__(self, url: str, mode: str) -> None:
        from lowlat_mw.client import AsyncClient

        self.client = AsyncClient(url, mode=mode, open_timeout=30.0)

    async def open(self) -> None:
        await self.client.open()

    async def roundtrip(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        stream = self.client.stream(PAYLOAD, model="echo")
        chunk = await anext(stream)
        t1 = time.perf_counter()
        async for extra in stream:
            raise RuntimeError(f"echo model sent a second delta {extra!r}")
        t2 = time.perf_counter()
        if chunk != PAYLOAD:
            raise RuntimeError(f"lowlat-mw echo answered {chunk!r}")
        return t1 - t0, t2 - t0

    async def stream(self, n: int) -> int:
        count = 0
        async for chunk in self.client.stream(model="tokens", params={"n": n}):
            count += len(chunk) // len(TOKEN)  # tokens: with merge_deltas one Delta carries several
        return count

    async def close(self) -> None:
        await self.client.close()


class RawDriver(Driver):
    def __init__(self, url: str, mode: str) -> None:
        self.raw = RawClient(url, mode)
        self.echo_request = self.raw.request("echo", text=PAYLOAD)
        self.stream_requests: dict[int, bytes | str] = {}

    async def open(self) -> None:
        await self.raw.open()

    async def roundtrip(self) -> tuple[float, float]:
        raw = self.raw
        t0 = time.perf_counter()
        await raw.send_request(self.echo_request)
        if await raw.next_kind() != "delta":
            raise RuntimeError("raw client: the echo's End came before its Delta")
        t1 = time.perf_counter()
        if await raw.next_kind() != "end":
            raise RuntimeError("raw client: the echo model sent a second Delta")
        await raw.ack(done=True)  # as the AsyncClient does before its stream ends
        return t1 - t0, time.perf_counter() - t0

    async def stream(self, n: int) -> int:
        raw = self.raw
        request = self.stream_requests.get(n)
        if request is None:
            request = self.stream_requests[n] = raw.request("tokens", params={"n": n})
        await raw.send_request(request)
        count = 0
        while await raw.next_kind() == "delta":
            count += 1
        await raw.ack(done=True)
        return count

    async def close(self) -> None:
        await self.raw.close()


def make_driver(cfg: Config, server: BareServer) -> Driver:
    if cfg.client == "websockets":
        return BareDriver(server)
    if cfg.client == "AsyncClient":
        return LowLatDriver(server.url(cfg.path), cfg.mode)
    return RawDriver(server.url(cfg.path), cfg.mode)


# ================================================================================ measurement
@dataclass
class Samples:
    first: list[float]  # every round trip, seconds to the reply / first Delta
    end: list[float]  # every round trip, seconds to the End
    round_first_p50: list[float]  # per round
    round_end_p50: list[float]
    rt_server_cpu: list[float]  # per round: server CPU seconds per round trip
    rt_client_cpu: list[float]
    stream_rate: list[float]  # per round: deltas/s
    stream_server_cpu: list[float]  # per round: server CPU seconds per delta
    stream_client_cpu: list[float]


async def _measure(size: Size, server: BareServer, configs: Sequence[Config]) -> dict[str, Samples]:
    drivers = {c.key: make_driver(c, server) for c in configs}
    samples = {c.key: Samples([], [], [], [], [], [], [], [], []) for c in configs}
    try:
        await server.ready()
        for key, drv in drivers.items():
            try:
                async with asyncio.timeout(60.0):
                    await drv.open()
            except Exception as exc:
                raise RuntimeError(f"{key}: could not connect ({exc!r}); server alive: {server.child.alive()}\n"
                                   f"{server.child.output()}") from exc
        gc.collect()
        gc.freeze()  # what exists now (imports, connections) is never garbage: each sample's collect skips it
        keys = list(drivers)
        for r in range(size.warmup + size.rounds):
            keep = r >= size.warmup
            for key in rotated(keys, r):  # round trips
                drv, s = drivers[key], samples[key]
                gc.collect()
                cpu0, c0 = server.cpu(), time.process_time()
                firsts: list[float] = []
                ends: list[float] = []
                async with asyncio.timeout(SAMPLE_TIMEOUT):
                    for _ in range(size.roundtrips):
                        first, end = await drv.roundtrip()
                        firsts.append(first)
                        ends.append(end)
                c1, cpu1 = time.process_time(), server.cpu()
                if keep:
                    s.first += firsts
                    s.end += ends
                    s.round_first_p50.append(median(firsts))
                    s.round_end_p50.append(median(ends))
                    s.rt_server_cpu.append((cpu1 - cpu0) / size.roundtrips)
                    s.rt_client_cpu.append((c1 - c0) / size.roundtrips)
            for key in rotated(keys, r):  # one long stream each
                drv, s = drivers[key], samples[key]
                gc.collect()
                cpu0, c0 = server.cpu(), time.process_time()
                t0 = time.perf_counter()
                async with asyncio.timeout(SAMPLE_TIMEOUT):
                    count = await drv.stream(size.tokens)
                wall = time.perf_counter() - t0
                c1, cpu1 = time.process_time(), server.cpu()
                if count != size.tokens:
                    raise RuntimeError(f"{key}: expected {size.tokens} deltas, got {count}")
                if keep:
                    s.stream_rate.append(size.tokens / wall)
                    s.stream_server_cpu.append((cpu1 - cpu0) / size.tokens)
                    s.stream_client_cpu.append((c1 - c0) / size.tokens)
            if keep and (r - size.warmup) % 10 == 9:
                log(f"   round {r - size.warmup + 1}/{size.rounds}")
    finally:
        gc.unfreeze()
        for drv in drivers.values():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10.0):
                    await drv.close()
    return samples


# ================================================================================ profile
_CATEGORIES = (
    (re.compile(r"[/\\]lowlat_mw[/\\]adapters[/\\](\w+)\.py$"), "lowlat_mw.adapters.{}"),
    (re.compile(r"[/\\]adapters[/\\](\w+)\.py$"), "lowlat_mw.adapters.{}"),
    (re.compile(r"[/\\]lowlat_mw[/\\](?:proto[/\\])?(\w+)\.py$"), "lowlat_mw.{}"),
    (re.compile(r"[/\\]lowlat_mw[/\\](\w+)[/\\](\w+)\.py$"), "lowlat_mw.{}.{}"),
    (re.compile(r"[/\\]benchmarks[/\\](\w+)\.py$"), "benchmark model / endpoints"),
    (re.compile(r"[/\\]site-packages[/\\](uvicorn|websockets|starlette|prometheus_client|opentelemetry|google)[/\\]"),
     "{}"),
    (re.compile(r"[/\\]python3\.\d+[/\\]asyncio[/\\]"), "asyncio"),
)


def _category(filename: str) -> str:
    if filename == "~":
        return "C builtins"
    if "site-packages/google/" in filename.replace("\\", "/"):
        return "protobuf"
    for pattern, label in _CATEGORIES:
        m = pattern.search(filename)
        if m:
            return label.format(*m.groups()) if m.groups() else label
    return "other Python"


@dataclass
class Profile:
    """A cProfile dump, summarised: self time by category and by function."""

    units: int  # deltas or round trips profiled
    total: float  # seconds of profiled self time
    calls: int  # function calls profiled
    by_category: dict[str, float]
    top: list[tuple[str, float, int]]  # (function, self seconds, calls)


def _summarise(path: Path, units: int) -> Profile:
    stats = pstats.Stats(str(path), stream=io.StringIO())
    by_category: dict[str, float] = {}
    funcs: list[tuple[str, float, int]] = []
    total = 0.0
    ncalls = 0
    for (filename, line, name), (_cc, calls, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += tottime
        ncalls += calls
        cat = _category(filename)
        by_category[cat] = by_category.get(cat, 0.0) + tottime
        short = name if filename == "~" else f"{Path(filename).name}:{line}({name})"
        funcs.append((short, tottime, calls))
    funcs.sort(key=lambda f: f[1], reverse=True)
    return Profile(units=units, total=total, calls=ncalls, by_category=by_category, top=funcs[:15])


async def _profile(size: Size, logdir: Path) -> dict[str, Profile]:
    """Profile the server on lowlat-mw (raw proto client: server cost only) and bare workloads."""
    server = BareServer(logdir, name="bare-server-profiled", profile=True)
    out: dict[str, Profile] = {}
    drivers: dict[str, Driver] = {}
    try:
        await server.ready()
        drivers = {"lowlat": RawDriver(server.url("/ws"), "proto"), "bare": BareDriver(server)}
        for drv in drivers.values():
            async with asyncio.timeout(60.0):
                await drv.open()

        async def save(label: str, units: int) -> None:
            name = label.replace(" ", "-")
            status, body = await http_get(server.port, f"/profile?save={name}", timeout=30.0)
            path = logdir / f"{name}.prof"
            if status != 200:
                raise RuntimeError(f"GET /profile answered {status}: {body!r}\n{server.child.output()}")
            if units:
                out[label] = _summarise(path, units)

        for key in ("lowlat", "bare"):
            drv = drivers[key]
            async with asyncio.timeout(SAMPLE_TIMEOUT):
                await drv.stream(size.tokens)  # warm-up, not counted
                await drv.roundtrip()
                await save("discard", 0)
                for _ in range(size.profile_streams):
                    await drv.stream(size.tokens)
                await save(f"{key} stream", size.profile_streams * size.tokens)
                for _ in range(size.profile_roundtrips):
                    await drv.roundtrip()
                await save(f"{key} roundtrip", size.profile_roundtrips)
    finally:
        for drv in drivers.values():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10.0):
                    await drv.close()
        server.stop()
    return out


# ================================================================================ report
def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def _spread(ratios: Sequence[float]) -> str:
    q1, q3 = quantiles(ratios, (0.25, 0.75))
    return f"[{q1:.2f}, {q3:.2f}]"


def _check(rows: dict[str, dict[str, float]]) -> None:
    for label, cols in rows.items():
        for col, v in cols.items():
            if not (isinstance(v, float) and math.isfinite(v)):
                raise RuntimeError(f"bare row {label!r} column {col!r} is {v!r}")


def _plot(configs: Sequence[Config], samples: dict[str, Samples]) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for c in configs:
        data = sorted(x * 1e6 for x in samples[c.key].first)
        ys = [(i + 1) / len(data) for i in range(len(data))]
        ax1.plot(data, ys, label=c.key, linewidth=1.2)
    ax1.set_xscale("log")
    ax1.set_xlabel("round trip to the reply / first Delta (µs, log scale)")
    ax1.set_ylabel("fraction of round trips")
    ax1.set_title("Round-trip latency CDF")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    keys = [c.key for c in configs]
    mids, lo, hi = [], [], []
    for k in keys:
        q1, mid, q3 = quantiles(samples[k].stream_rate, (0.25, 0.5, 0.75))
        mids.append(mid / 1000)
        lo.append((mid - q1) / 1000)
        hi.append((q3 - mid) / 1000)
    ax2.bar(keys, mids, yerr=[lo, hi], capsize=4, color=["#888888"] + ["#3a7dc9"] * (len(keys) - 1))
    ax2.set_ylabel("thousand deltas/s (median, IQR over rounds)")
    ax2.set_title("One long stream")
    ax2.tick_params(axis="x", labelrotation=20)
    ax2.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return {"bare.png": buf.getvalue()}


def _profile_tables(profiles: dict[str, Profile]) -> tuple[str, str, dict[str, dict[str, float]]]:
    """(category table, top-functions table, rows) from the profiled pass."""
    rows: dict[str, dict[str, float]] = {}
    labels = ("lowlat stream", "bare stream", "lowlat roundtrip", "bare roundtrip")
    cats = sorted({c for p in profiles.values() for c in p.by_category},
                  key=lambda c: -profiles["lowlat stream"].by_category.get(c, 0.0))
    body = []
    for cat in cats:
        vals = [profiles[k].by_category.get(cat, 0.0) / profiles[k].units for k in labels]
        if max(vals) * 1e6 < 0.05:
            continue
        body.append([cat, *(_us(v) for v in vals)])
    body.append(["**total**", *(f"**{_us(profiles[k].total / profiles[k].units)}**" for k in labels)])
    body.append(["function calls (count, not µs)", *(f"{profiles[k].calls / profiles[k].units:.0f}" for k in labels)])
    for k in labels:
        rows[f"profile {k}"] = {"us_per_unit": profiles[k].total / profiles[k].units * 1e6,
                                "calls_per_unit": profiles[k].calls / profiles[k].units}
    cat_table = markdown_table(["Self time by package (cProfile)", "lowlat-mw µs/delta", "bare µs/delta",
                                "lowlat-mw µs/round trip", "bare µs/round trip"], body)
    p = profiles["lowlat stream"]
    top = markdown_table(["lowlat-mw stream: function (self time)", "µs/delta", "share", "calls/delta"],
                         [[f"`{name}`", _us(t / p.units), f"{t / p.total:.1%}", f"{calls / p.units:.2f}"]
                          for name, t, calls in p.top])
    return cat_table, top, rows


def _analysis(rows: dict[str, dict[str, float]], profiles: dict[str, Profile]) -> str:
    """Where the server's time goes, with this run's numbers (the code paths named were read off the profile of
    this suite's server; what was tried, with the numbers of its day, is in benchmarks/results/history.md)."""
    srv = rows["stream proto-raw"]["server_cpu_us_per_delta"]
    bare_srv = rows["stream bare"]["server_cpu_us_per_delta"]
    cli = rows["stream proto"]["client_cpu_us_per_delta"]
    bare_cli = rows["stream bare"]["client_cpu_us_per_delta"]
    rt_srv = rows["roundtrip proto-raw"]["server_cpu_us"]
    rt_bare = rows["roundtrip bare"]["server_cpu_us"]
    calls = ""
    if profiles:
        lp, bp = profiles["lowlat stream"], profiles["bare stream"]
        lr, br = profiles["lowlat roundtrip"], profiles["bare roundtrip"]
        calls = (f"\nThe profile counts {lp.calls / lp.units:.0f} function calls per delta against "
                 f"{bp.calls / bp.units:.0f} for the bare stream, and {lr.calls / lr.units:.0f} per round trip "
                 f"against {br.calls / br.units:.0f}.")
    merged = rows["stream proto-merge"]
    send_srv = rows["stream proto-send"]["server_cpu_us_per_delta"]
    rt_send = rows["roundtrip proto-send"]["server_cpu_us"]
    rt_raw = rows["roundtrip proto-raw"]["first_p50_ratio"]
    rt_client = rows["roundtrip proto"]["first_p50_ratio"]
    than = "less" if srv < bare_srv else "more"
    return f"""**Where lowlat-mw stands, and why a target is missed.** Per delta the server costs {than} than
the bare endpoint: {srv:.1f} µs of CPU with the raw client against {bare_srv:.1f} µs for the bare stream. The
bare stream's cost is almost all uvicorn's per-frame send (a message dict, a frame object in
`websockets`, one socket write per frame); under lowlat-mw's uvicorn protocol the driver builds each
frame's header itself and writes a loop turn's frames in one socket write (docs/architecture.md,
"Direct writes"). Through ASGI `send` (`direct_writes` off, as under any other server) the same delta
costs {send_srv:.1f} µs. Per delta lowlat-mw still does the protocol's own work: `ConnectionDriver.chunk`,
`ServerProtocol.send_chunk` numbers the chunk and encodes the Delta, `Session.record` keeps it for
resume and flow control, and one `StreamTimer.delta` call records the stage timings.

Per round trip the server spends {rt_srv:.0f} µs against {rt_bare:.0f} µs for the echo ({rt_send:.0f} µs
through ASGI `send`).{calls} That is the per-request work a bare echo does not do: decode the Request, set
up the stream (session state, a stage timer, metrics, a `ModelRequest`, the model's task), send the
Delta, then the End with its stage timings (a second socket write: the first frame of a loop turn goes
out at once), observe the stream's histograms, and read and handle the client's `Ack{{done}}`, a second
message per round trip that the echo does not have. Under lowlat-mw's uvicorn protocol the Request
and the Ack skip uvicorn's ASGI queue (direct reads) and the model's first step runs while the Request
is read (eager start), so the first Delta is written inside the server's `data_received`. With the raw
client the round trip is {rt_raw:.2f}x the bare echo to the first Delta; with the AsyncClient
{rt_client:.2f}x: the client sends the Request and the `Ack`, and hands each message from websockets'
`data_received` to the stream's deque ({cli:.1f} µs of client CPU per streamed delta against
{bare_cli:.1f} µs for the bare client).

The opt-in setting `merge_deltas` sends the tokens a model yields back to back as one Delta: the AsyncClient
then receives {merged["deltas_per_s"]:,.0f} tokens/s, {merged["ratio"]:.2f}x the bare stream, at
{merged["server_cpu_us_per_delta"]:.1f} µs of server CPU per token (off by default: docs/models.md promises
one Delta per yielded chunk). What was done to get here, and what was tried and dropped, with the numbers of
each day: benchmarks/results/history.md.
"""


def report(mode: str, size: Size, configs: Sequence[Config], samples: dict[str, Samples],
           profiles: dict[str, Profile], loop_name: str, plots: dict[str, bytes]) -> SuiteResult:
    bare = samples["bare"]
    rows: dict[str, dict[str, float]] = {}
    rt_rows: list[list[str]] = []
    st_rows: list[list[str]] = []
    bare_first50 = quantiles(bare.first, (0.5,))[0]
    bare_srv_rt = median(bare.rt_server_cpu)
    bare_rate = median(bare.stream_rate)
    bare_srv = median(bare.stream_server_cpu)
    for c in configs:
        s = samples[c.key]
        f50, f99 = quantiles(s.first, (0.5, 0.99))
        e50, e99 = quantiles(s.end, (0.5, 0.99))
        rf = paired_ratios(s.round_first_p50, bare.round_first_p50)
        re_ = paired_ratios(s.round_end_p50, bare.round_end_p50)
        srv, cli = median(s.rt_server_cpu), median(s.rt_client_cpu)
        rows[f"roundtrip {c.key}"] = {
            "first_p50_us": f50 * 1e6, "first_p99_us": f99 * 1e6, "end_p50_us": e50 * 1e6, "end_p99_us": e99 * 1e6,
            "first_p50_ratio": f50 / bare_first50, "end_p50_ratio": e50 / bare_first50,
            "server_cpu_us": srv * 1e6, "server_cpu_ratio": srv / bare_srv_rt, "client_cpu_us": cli * 1e6,
        }
        is_bare = c.key == "bare"
        rt_rows.append([
            c.label, _us(f50), _us(f99),
            "1 (reference)" if is_bare else f"**{f50 / bare_first50:.2f}** {_spread(rf)}",
            "= echo" if is_bare else _us(e50), "= echo" if is_bare else _us(e99),
            "1 (reference)" if is_bare else f"**{e50 / bare_first50:.2f}** {_spread(re_)}",
            _us(srv), "1" if is_bare else f"{srv / bare_srv_rt:.2f}", _us(cli),
        ])
        rate, srv_d, cli_d = median(s.stream_rate), median(s.stream_server_cpu), median(s.stream_client_cpu)
        rr = paired_ratios(s.stream_rate, bare.stream_rate)
        rows[f"stream {c.key}"] = {
            "deltas_per_s": rate, "ratio": rate / bare_rate, "server_cpu_us_per_delta": srv_d * 1e6,
            "server_cpu_ratio": srv_d / bare_srv, "client_cpu_us_per_delta": cli_d * 1e6,
        }
        st_rows.append([
            c.label, f"{rate:,.0f}", "1 (reference)" if is_bare else f"**{rate / bare_rate:.2f}** {_spread(rr)}",
            _us(srv_d), "1" if is_bare else f"{srv_d / bare_srv:.2f}", _us(cli_d),
        ])
    rt_table = markdown_table(
        ["Configuration", "reply / first Delta p50 µs", "p99 µs", "p50 ratio vs bare [per-round IQR]",
         "to End p50 µs", "p99 µs", "to End p50 ratio vs bare", "server CPU µs/round trip", "ratio",
         "client CPU µs/round trip"], rt_rows)
    st_table = markdown_table(
        ["Configuration", "deltas/s", "ratio vs bare [per-round IQR]", "server CPU µs/delta", "ratio",
         "client CPU µs/delta"], st_rows)

    prof_text = ""
    if profiles:
        cat_table, top_table, prof_rows = _profile_tables(profiles)
        rows.update(prof_rows)
        profiled_us = prof_rows["profile lowlat stream"]["us_per_unit"]
        inflation = profiled_us / rows["stream proto-raw"]["server_cpu_us_per_delta"]
        prof_text = f"""
**Where the server's time goes.** A separate server process runs cProfile on its event-loop thread,
timed by that thread's CPU clock (time spent descheduled while the clients run is not charged). The
lowlat-mw workload is the raw proto client on `/ws`, so only server work is profiled:
{size.profile_streams} streams of {size.tokens} tokens, then {size.profile_roundtrips} echo round trips; the
bare workload is the same on `/stream` and `/echo`. Profiling inflates every call (here
{inflation:.1f}x the unprofiled server CPU per delta of the raw proto client above), so read the
columns as shares and the call counts as the real work; C functions are listed on their own
("C builtins") when Python calls them directly, and uvloop's socket writes (system calls included) are
charged to their caller: uvicorn's `send` for the bare endpoint and the ASGI path, "C builtins" for
lowlat-mw's direct writes.

{cat_table}

{top_table}
"""
    _check(rows)

    def met(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    rt_parts, st_parts = [], []
    for key in HEADLINE:
        r = rows[f"roundtrip {key}"]
        rt_parts.append(f"{key} {r['first_p50_ratio']:.2f}x to the first Delta / {r['end_p50_ratio']:.2f}x to the End")
        st_parts.append(f"{key} {rows[f'stream {key}']['ratio']:.2f}x")
    rt_first_ok = all(rows[f"roundtrip {k}"]["first_p50_ratio"] <= RT_TARGET for k in HEADLINE)
    rt_end_ok = all(rows[f"roundtrip {k}"]["end_p50_ratio"] <= RT_TARGET for k in HEADLINE)
    st_ok = all(rows[f"stream {k}"]["ratio"] >= STREAM_TARGET for k in HEADLINE)
    raw_rt = rows["roundtrip proto-raw"]["first_p50_ratio"]
    raw_st = rows["stream proto-raw"]["ratio"]
    verdicts = (
        f"**Verdict, round trip** (issue 7: lowlat-mw round trip p50 at most {RT_TARGET}x the bare echo, with "
        f"the AsyncClient): {'; '.join(rt_parts)}. Request -> first Delta (the exchange equivalent to message -> "
        f"echo): {met(rt_first_ok)}; Request -> End (what `client.complete()` waits for): {met(rt_end_ok)}. "
        f"With the raw client (server cost only) proto is {raw_rt:.2f}x to the first Delta.\n\n"
        f"**Verdict, streaming** (issue 7: deltas/s at least {STREAM_TARGET}x bare, with the AsyncClient): "
        f"{'; '.join(st_parts)}: {met(st_ok)}. With the raw client proto streams at {raw_st:.2f}x bare; "
        f"server CPU per delta is {rows['stream proto']['server_cpu_ratio']:.2f}x bare (proto) and "
        f"{rows['stream json']['server_cpu_ratio']:.2f}x (JSON). With `merge_deltas` on (opt-in) the "
        f"AsyncClient receives tokens at {rows['stream proto-merge']['ratio']:.2f}x the bare stream's rate "
        f"({met(rows['stream proto-merge']['ratio'] >= STREAM_TARGET)} as tokens/s; it sends fewer, larger Deltas)."
    )
    raw_cpu = rows["stream proto-raw"]["server_cpu_ratio"]
    send_cpu = rows["stream proto-send"]["server_cpu_ratio"]
    client_rt = rows["roundtrip proto"]["first_p50_ratio"]
    client_cpu = rows["stream proto"]["client_cpu_us_per_delta"] / rows["stream bare"]["client_cpu_us_per_delta"]
    verdicts += (
        f"\n\n**Verdict, issue 15** (the fast path): server CPU per streamed token with the raw client "
        f"{raw_cpu:.2f}x the bare endpoint on lowlat-mw's uvicorn protocol (target at most 1.0x: "
        f"{met(raw_cpu <= 1.0)}; "
        f"stretch 0.8x: {met(raw_cpu <= 0.8)}), {send_cpu:.2f}x through ASGI `send` (at most 1.5x: "
        f"{met(send_cpu <= 1.5)}); round trip to the first Delta {raw_rt:.2f}x the bare echo with the raw client "
        f"(at most 1.2x: {met(raw_rt <= 1.2)}), {client_rt:.2f}x with the AsyncClient (at most 1.3x: "
        f"{met(client_rt <= 1.3)}); AsyncClient CPU per received delta {client_cpu:.2f}x the bare websockets "
        f"client's (at most 1.2x: {met(client_cpu <= 1.2)}). These streams are 5000 tokens each (the issue "
        f"names 2,000: the per-token cost does not depend on it past the first few)."
    )
    if not (rt_first_ok and rt_end_ok and st_ok) or raw_rt > 1.2 or client_rt > 1.3:
        verdicts += "\n\n" + _analysis(rows, profiles)
    facts = machine_facts(mode, extra=[loop_name])
    kept = size.rounds * size.roundtrips
    plot_md = "\n![Round-trip CDF and deltas/s](benchmarks/bare.png)\n" if "bare.png" in plots else ""
    body = f"""{facts}

Reproduce: `.venv/bin/python -m benchmarks --suite bare` (this section comes from one such run;
`--quick` is the CI-sized run).

**Method.** One uvicorn child process (`benchmarks/_bare_server.py`: lowlat-mw's WebSocket protocol
`lowlat_mw.servers.uvicorn:WebSocketProtocol`, which `lowlat-mw serve` runs: uvicorn's websockets-sansio
protocol that also offers the driver direct writes to the socket; no permessage-deflate, uvloop)
serves a bare Starlette `WebSocketRoute` echo and stream, and lowlat-mw's `LowLatMiddleware` with its
default settings (metrics into a private registry, End stage timings, tracing through
opentelemetry-api; rate limit off) at `/ws`, with metrics, stage timings and tracing off at
`/ws-lean`, and with `direct_writes` off at `/ws-send` (every frame through ASGI `send`, as under a
server that offers no direct writes). Clients run in the benchmark process on one event loop, one connection
each, opened before the first round:

- **bare**: the `websockets` client; round trip = send a {len(PAYLOAD)}-character text message, receive
  its echo; stream = send `"stream N"`, receive N text frames `{TOKEN!r}` and an `"end"` frame.
- **proto / json**: `lowlat_mw.client.AsyncClient` (the same `websockets` library underneath); round
  trip = a Request for the `echo` model (the same text), timed to its one Delta and to its End (the End
  is a second frame, and the client then sends an Ack); stream = a Request for the `tokens` model, N
  Deltas of `{TOKEN!r}` then the End.
- **\\*-raw**: a minimal client on the same `websockets` library speaking the protocol
  (`benchmarks/_bare_common.py`: Requests and Acks encoded once, frames classified by their first bytes
  and not decoded; on the wire it acts like the AsyncClient, with the same flow window and Acks):
  lowlat-mw's server cost with a client about as cheap as the bare one.
- **proto-lean**: the raw proto client on `/ws-lean` (observability off).
- **proto-send**: the raw proto client on `/ws-send` (direct writes off: the ASGI send path).
- **proto-merge**: the AsyncClient on `/ws-merge`: default settings plus `merge_deltas`, which merges
  the tokens a model yields back to back into one Delta (the stream's first token still leaves alone).
  The `tokens` model yields to the event loop every {YIELD_EVERY} tokens, as the bare stream does, so a
  Delta carries up to {YIELD_EVERY - 1} tokens; its "deltas/s" counts tokens delivered per second, like
  every other row (for the others one token is one Delta).

{size.rounds} rounds after {size.warmup} warm-up; each round runs, in an order rotated by one per round,
{size.roundtrips} sequential round trips per configuration, then one {size.tokens}-token stream per
configuration. Latency percentiles pool every round trip ({kept} per configuration); ratios of p50s are
pooled p50 over bare's pooled p50, with the [25th, 75th percentile] of the per-round ratios. Deltas/s is
the median over rounds of N / (wall time from sending the request to the end marker / End). Server CPU is
the server process's CPU time (its CPU-time clock, read before and after each block and stream), client
CPU this process's; both are per round trip or per delta, median over rounds.
Other load on the machine (see the load average above) hits every configuration alike through the
interleaved rounds.

**Round trip** (µs; lower is better)

{rt_table}

**Streaming** ({size.tokens} tokens per stream, one stream at a time; higher deltas/s is better)

{st_table}
{plot_md}{prof_text}
{verdicts}
"""
    text = (f"{facts}\n\nRound trip ({kept} per configuration):\n{rt_table}\n\nStreaming ({size.tokens} tokens):\n"
            f"{st_table}\n{prof_text}\n{verdicts}")
    return SuiteResult(name=NAME, heading=HEADING, body=body, text=text, rows=rows, plots=plots)


@suite(NAME, HEADING)
def run(mode: str) -> SuiteResult:
    size = SIZES[mode]
    configs = list(CONFIGS)
    factory, loop_name = loop_factory()
    logdir = log_dir(NAME)

    async def main() -> tuple[dict[str, Samples], dict[str, Profile]]:
        server = BareServer(logdir)
        try:
            log(f"   {len(configs)} configurations x {size.rounds} rounds ({size.roundtrips} round trips "
                f"+ one {size.tokens}-token stream each)")
            samples = await _measure(size, server, configs)
        finally:
            server.stop()
        profiles: dict[str, Profile] = {}
        if size.profile_streams:
            log("   profiled pass")
            profiles = await _profile(size, logdir)
        return samples, profiles

    with kept_on_failure(logdir), asyncio.Runner(loop_factory=factory) as runner:
        samples, profiles = runner.run(main())
    plots = _plot(configs, samples) if size.plots else {}
    return report(mode, size, configs, samples, profiles, loop_name, plots)
