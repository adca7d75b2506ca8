"""Scale suite: many idle connections in one server process, and many clients streaming at once.

Idle (issue 7: "1,000 and 10,000 idle connections in one process"): four uvicorn servers in child
processes (benchmarks._scale_server, the same uvicorn WebSocket implementation), each fed by the
same client processes (benchmarks._scale_client, a minimal hand-rolled client that answers every
Ping at once):

bare        a bare Starlette WebSocket endpoint (accept, then wait for messages): the reference
bare-ping   the same with uvicorn's own WebSocket pings (``ws_ping_interval``) every S seconds:
            the cheapest heartbeat this server stack has, for scale
lowlat      the lowlat-mw middleware with its default heartbeat (``heartbeat_interval=30``)
lowlat-fast the middleware with ``heartbeat_interval=S``, so many heartbeats fall in the window

A round starts fresh servers and clients, warms each server up (a few connections opened and
closed), reads its memory with no connection, then for each level N opens connections up to N per
server (servers in an order rotated per round), reads the memory again (``gc.collect()`` first) and
measures every server's CPU time over the same window. Memory per connection is (USS with N open -
USS with none) / N; heartbeat + reaper CPU is the CPU time a lowlat server spent in the window minus
what the bare server spent in the same window, as % of one core.

Streaming (issue 7: "1,000 concurrent clients streaming"): a bare streaming endpoint and the
middleware (defaults) in two servers; the client processes hold one connection per client to each
and, in rounds, every client sends one request at once and reads a reply of T tokens from a model
with no delay: ``await`` awaits ``asyncio.sleep(0)`` between tokens (as a real async model awaits
its next token), ``tight`` never yields (a zero-delay generator: each stream runs to its end once
started). Time to first delta runs from each request's send to its first Delta, in the client.

Full mode also starts a bare and a lowlat server under tracemalloc to list where the bytes of a
lowlat connection go (allocation sites grouped by the innermost server-package frame).
"""

from __future__ import annotations

import asyncio
import io
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lowlat_mw.servers.cli import SERVE_GC_THRESHOLD

from ._scale_procs import Fleet
from ._scale_server import raise_nofile
from .core import SuiteResult, log, machine_facts, markdown_table, median, permuted, quantiles, rotated, suite

NAME = "scale"
HEADING = "Scale: idle connections and concurrent streams"
WS = "websockets-sansio"  # what uvicorn's ws="auto" picks when websockets is installed
DEFAULT_HEARTBEAT = 30.0
TARGET_IDLE = 10_000
TARGET_CPU_PCT = 2.0
TARGET_MEM_KIB = 8.0  # "8 KB", taken as 8 KiB = 8,192 bytes
TARGET_STREAMS = 1_000
TARGET_TTFD_MS = 200.0
# issue 15 (the fast path): 10,000 idle connections under 1% of a core, memory at most bare + 4 KiB;
# 1,000 clients x 100 tokens at 50 tokens/s: TTFD p99 at most 1.2x bare's (and under 200 ms), CPU at most 1.1x.
FAST_CPU_PCT = 1.0
FAST_MEM_KIB = 4.0
FAST_TTFD_RATIO = 1.2
FAST_CPU_RATIO = 1.1
KIB = 1024.0
TRACE_FRAMES = 10  # tracemalloc frames per allocation (enough to reach a server-package frame)


@dataclass(frozen=True)
class Size:
    levels: tuple[int, ...]  # idle connections per server, in increasing order
    window: float  # CPU window per level, seconds
    sample: float  # CPU timeline step, seconds
    fast: float  # heartbeat interval of lowlat-fast and bare-ping, seconds
    fast_max: int  # the fast configurations run at the levels up to this one (then they are stopped)
    rounds: int
    clients: int  # client processes
    streams: int  # streaming clients per server
    tokens: int
    paced_tokens: int  # tokens of the paced model (PACE s apart)
    stream_rounds: int
    warm: int  # connections opened and closed on each server before its baseline
    settle: float  # seconds after opening, before memory and CPU
    traced: int  # connections for the tracemalloc breakdown (0: skip)
    concurrency: int = 32  # handshakes in flight per client process
    timeout: float = 30.0  # per connection and per burst


SIZES = {
    "tiny": Size(levels=(24,), window=1.0, sample=0.5, fast=0.5, fast_max=24, rounds=1, clients=2, streams=12,
                 tokens=20, paced_tokens=5, stream_rounds=1, warm=4, settle=0.2, traced=12, timeout=15.0),
    "quick": Size(levels=(200,), window=2.0, sample=0.5, fast=0.5, fast_max=200, rounds=1, clients=2, streams=100,
                  tokens=30, paced_tokens=20, stream_rounds=2, warm=16, settle=0.3, traced=0),
    "full": Size(levels=(1_000, 10_000), window=30.0, sample=2.0, fast=5.0, fast_max=1_000, rounds=2, clients=4,
                 streams=1_000, tokens=30, paced_tokens=100, stream_rounds=8, warm=32, settle=2.0, traced=400),
}


@dataclass(frozen=True)
class IdleConfig:
    key: str
    kind: str  # bare | lowlat
    heartbeat: float = DEFAULT_HEARTBEAT
    ws_ping: float = 0.0
    ws: str = WS  # uvicorn's WebSocket protocol; "lowlat": lowlat-mw's (direct reads and writes)

    @property
    def fast(self) -> bool:
        """A heartbeat faster than the default, to measure the cost per heartbeat."""
        return bool(self.ws_ping) or self.heartbeat != DEFAULT_HEARTBEAT

    def label(self) -> str:
        if self.kind == "bare":
            return ("bare Starlette WebSocket, no heartbeat" if not self.ws_ping else
                    f"bare + uvicorn WebSocket pings every {self.ws_ping:g} s")
        default = " (default)" if self.heartbeat == DEFAULT_HEARTBEAT else ""
        where = ", lowlat-mw's uvicorn protocol (direct)" if self.ws == "lowlat" else ""
        return f"lowlat-mw, heartbeat every {self.heartbeat:g} s{default}{where}"


def idle_configs(size: Size) -> list[IdleConfig]:
    return [IdleConfig("bare", "bare"), IdleConfig("bare-ping", "bare", ws_ping=size.fast),
            IdleConfig("lowlat", "lowlat"), IdleConfig("lowlat-fast", "lowlat", heartbeat=size.fast),
            IdleConfig("lowlat-direct", "lowlat", ws="lowlat"),
            IdleConfig("lowlat-direct-fast", "lowlat", heartbeat=size.fast, ws="lowlat")]


LOWLAT_IDLE = (("lowlat", "lowlat-fast"), ("lowlat-direct", "lowlat-direct-fast"))  # (default, fast) pairs


PACE = 0.02  # seconds between the paced model's tokens: 50 tokens/s, as issue 15's workload


@dataclass(frozen=True)
class Model:
    cooperative: bool  # awaits asyncio.sleep(delay) between tokens
    delay: float = 0.0
    paced: bool = False  # size.paced_tokens tokens instead of size.tokens

    def tokens(self, size: Size) -> int:
        return size.paced_tokens if self.paced else size.tokens


MODELS = {"await": Model(True), "tight": Model(False), "paced": Model(True, PACE, paced=True)}
MODEL_LABELS = {"await": "awaits between tokens", "tight": "tight loop, never yields",
                "paced": f"{1 / PACE:g} tokens/s"}
# streaming server key -> (app kind, uvicorn ws): the middleware on uvicorn's own WebSocket protocol
# (the ASGI path) and on lowlat-mw's (direct reads and writes, what `lowlat-mw serve` runs).
STREAM_SERVERS = {"bare": ("bare", WS), "lowlat": ("lowlat", WS), "lowlat-direct": ("lowlat", "lowlat")}


# ================================================================================ measurements
@dataclass
class IdleSample:
    """One server at one level in one round."""

    open: int  # client-side count, warm-up connections included
    server_open: int  # the server's own count
    uss_per_conn: float  # bytes
    rss_per_conn: float
    objects_per_conn: float
    cpu: float  # seconds in the window
    user: float
    sys: float
    wall: float  # window length, seconds
    pings: int  # heartbeats answered by the clients in the window
    lost: int  # connections lost so far
    open_rate: float  # connections opened per second (this server's part of the level)
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (s into window, CPU % of a core)

    @property
    def cpu_pct(self) -> float:
        return self.cpu / self.wall * 100.0


@dataclass
class Burst:
    """One streaming burst: every client of one server, one request each."""

    ttfd_ms: list[float]
    deltas: int
    errors: int
    requests: int
    span: float  # first request sent to last End received, seconds
    server_cpu: float  # seconds
    samples: list[str] = field(default_factory=list)

    @property
    def deltas_per_s(self) -> float:
        return self.deltas / self.span if self.span > 0 else 0.0


async def _cpu_all(fleet: Fleet, names: list[str]) -> dict[str, dict[str, float]]:
    got = await asyncio.gather(*(fleet.servers[n].get("/cpu") for n in names))
    return dict(zip(names, got, strict=True))


def _idle_name(r: int, key: str) -> str:
    return f"r{r} {key}"


def _add_idle_servers(fleet: Fleet, r: int, configs: list[IdleConfig]) -> None:
    for c in configs:
        fleet.add_server(_idle_name(r, c.key), c.kind, ws=c.ws, heartbeat=c.heartbeat, ws_ping=c.ws_ping)


async def _idle_round(fleet: Fleet, size: Size, r: int, configs: list[IdleConfig]) -> dict[int, dict[str, IdleSample]]:
    """One round on the fresh servers of round `r` (the client group of a server is named like it)."""
    keys = [c.key for c in configs]
    names = {k: _idle_name(r, k) for k in keys}
    out: dict[int, dict[str, IdleSample]] = {}
    # Warm-up: these connections stay open, in the baseline and in every level (lazy imports and
    # first-use allocations are in the baseline; nothing is closed, so nothing lingers).
    for key in keys:
        res = await fleet.open(names[key], size.warm, timeout=size.timeout)
        if res["failed"]:
            raise RuntimeError(f"warm-up connections to {key} failed: {res['errors']}")
    await asyncio.sleep(size.settle)
    base = {k: await fleet.servers[names[k]].get("/mem") for k in keys}
    have = size.warm
    for level in size.levels:
        if level > size.fast_max and any(c.fast for c in configs if c.key in keys):
            # The fast heartbeats have given their cost per heartbeat: stop them, so their load does not
            # disturb the bigger level (nor slow its opening down).
            gone = [names[c.key] for c in configs if c.fast and c.key in keys]
            await fleet.drop(gone, gone)
            keys = [k for k in keys if names[k] not in gone]
        rates: dict[str, float] = {}
        for key in rotated(keys, r):
            log(f"   round {r + 1}: opening {have:,} -> {level:,} connections to {key}")
            t0 = time.monotonic()
            res = await fleet.open(names[key], level - have, concurrency=size.concurrency, timeout=size.timeout)
            rates[key] = res["opened"] / max(time.monotonic() - t0, 1e-9)
            if res["failed"]:
                log(f"   {res['failed']} connections to {key} failed: {res['errors']}")
        have = level
        await asyncio.sleep(size.settle)
        mem = {k: await fleet.servers[names[k]].get("/mem", 120.0) for k in keys}
        stats0 = {k: await fleet.stats(names[k]) for k in keys}
        servers = [names[k] for k in keys]
        c0 = await _cpu_all(fleet, servers)
        timelines: dict[str, list[tuple[float, float]]] = {k: [] for k in keys}
        prev = c0
        end = time.monotonic() + size.window
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(size.sample, left))
            now = await _cpu_all(fleet, servers)
            for k in keys:
                a, b = prev[names[k]], now[names[k]]
                if b["t"] > a["t"]:
                    timelines[k].append((b["t"] - c0[names[k]]["t"], (b["cpu"] - a["cpu"]) / (b["t"] - a["t"]) * 100))
            prev = now
        c1 = prev
        stats1 = {k: await fleet.stats(names[k]) for k in keys}
        out[level] = {}
        for k in keys:
            n = stats1[k]["open"] - size.warm  # client-side count; the server's is reported alongside
            a, b = c0[names[k]], c1[names[k]]
            out[level][k] = IdleSample(
                open=stats1[k]["open"], server_open=int(mem[k]["open"]),
                uss_per_conn=(mem[k]["uss"] - base[k]["uss"]) / max(n, 1),
                rss_per_conn=(mem[k]["rss"] - base[k]["rss"]) / max(n, 1),
                objects_per_conn=(mem[k]["objects"] - base[k]["objects"]) / max(n, 1),
                cpu=b["cpu"] - a["cpu"], user=b["user"] - a["user"], sys=b["sys"] - a["sys"], wall=b["t"] - a["t"],
                pings=stats1[k]["pings"] - stats0[k]["pings"], lost=stats1[k]["lost"],
                open_rate=rates[k], timeline=timelines[k])
            if stats1[k]["lost"]:
                log(f"   {k}: {stats1[k]['lost']} connections lost: {stats1[k]['errors']}")
        log("   " + ", ".join(f"{k}: {s.uss_per_conn / KIB:.1f} KiB/conn, {s.cpu_pct:.2f}% CPU, "
                              f"{s.pings} pings" for k, s in out[level].items()))
    return out


async def _burst(fleet: Fleet, name: str, group: str, size: Size, model: Model) -> Burst:
    srv = fleet.servers[name]
    c0 = await srv.get("/cpu")
    answers = await fleet.each({"cmd": "stream", "group": group, "tokens": model.tokens(size),
                                "yield": model.cooperative, "delay": model.delay, "timeout": size.timeout},
                               size.timeout + 30)
    c1 = await srv.get("/cpu")
    starts = [a["first_send"] for a in answers if a["requests"]]
    ends = [a["last_end"] for a in answers if a["requests"]]
    return Burst(ttfd_ms=[x for a in answers for x in a["ttfd_ms"]], deltas=sum(a["deltas"] for a in answers),
                 errors=sum(a["errors"] for a in answers), requests=sum(a["requests"] for a in answers),
                 span=(max(ends) - min(starts)) if starts else 0.0, server_cpu=c1["cpu"] - c0["cpu"])


async def _streaming(fleet: Fleet, size: Size) -> tuple[dict[tuple[str, str], list[Burst]], int]:
    """Bursts per (model, server), and the errors of the warm-up bursts."""
    bursts: dict[tuple[str, str], list[Burst]] = {(m, s): [] for m in MODELS for s in STREAM_SERVERS}
    warm_errors = 0
    for key in STREAM_SERVERS:
        name = f"stream {key}"
        # Warm-up: a few connections stream once per model (lazy imports, first-use allocations).
        res = await fleet.open(name, size.warm, group=f"{name} warm-up", timeout=size.timeout)
        warm_errors += res["failed"]
        for model in MODELS.values():
            warm_errors += (await _burst(fleet, name, f"{name} warm-up", size, model)).errors
        res = await fleet.open(name, size.streams, concurrency=size.concurrency, timeout=size.timeout)
        if res["failed"]:
            log(f"   {res['failed']} streaming connections to {key} failed: {res['errors']}")
    for r in range(size.stream_rounds):
        waited: list[float] = []
        for model, spec in MODELS.items():
            for key in permuted(list(STREAM_SERVERS), r):
                waited.append(await fleet.quiet())  # (what the burst before left behind is done)
                burst = await _burst(fleet, f"stream {key}", f"stream {key}", size, spec)
                burst.errors += size.streams - burst.requests  # connections that failed to open or were lost
                if burst.errors:
                    burst.samples = (await fleet.stats(f"stream {key}"))["errors"]
                    log(f"   {model}/{key}: {burst.errors} errors: {burst.samples[:3]}")
                bursts[(model, key)].append(burst)
        log(f"   streaming round {r + 1}/{size.stream_rounds}: " + ", ".join(
            f"{m}/{s} p99 {quantiles(b[-1].ttfd_ms or [0.0], [0.99])[0]:.0f} ms" for (m, s), b in bursts.items())
            + f"; waited for quiet {min(waited) * 1000:.0f}-{max(waited) * 1000:.0f} ms before a burst")
    return bursts, warm_errors


async def _traced(fleet: Fleet, size: Size) -> dict[str, dict[str, Any]]:
    """tracemalloc diff per server kind with `size.traced` idle connections: sites -> [bytes, count]."""
    out: dict[str, dict[str, Any]] = {}
    for key in ("bare", "lowlat"):
        name = f"traced {key}"
        srv = fleet.servers[name]
        await fleet.open(name, size.warm, timeout=size.timeout)  # warm-up, kept open
        await asyncio.sleep(size.settle)
        await srv.get("/tm/base", 120.0)
        res = await fleet.open(name, size.traced, concurrency=size.concurrency, timeout=size.timeout)
        await asyncio.sleep(size.settle)
        diff = await srv.get("/tm/diff", 300.0)
        out[key] = {"open": res["opened"], "sites": diff["sites"]}
        await fleet.drop([name], [name])
    return out


async def _run(size: Size, configs: list[IdleConfig]) -> tuple[
        list[dict[int, dict[str, IdleSample]]], dict[tuple[str, str], list[Burst]], int, dict[str, dict[str, Any]]]:
    rounds = []
    async with Fleet() as fleet:
        # Every server of the run that can start now does, so their start-ups overlap.
        _add_idle_servers(fleet, 0, configs)
        for key, (kind, ws) in STREAM_SERVERS.items():
            fleet.add_server(f"stream {key}", kind, ws=ws)
        if size.traced:
            for key in ("bare", "lowlat"):
                fleet.add_server(f"traced {key}", key, ws=WS, tracemalloc=TRACE_FRAMES)
        await fleet.start_clients(size.clients)
        await fleet.ready()
        for r in range(size.rounds):
            log(f"   idle round {r + 1}/{size.rounds}: {', '.join(f'{n:,}' for n in size.levels)} connections "
                f"x {len(configs)} servers")
            if r:
                _add_idle_servers(fleet, r, configs)
                await fleet.ready()
            rounds.append(await _idle_round(fleet, size, r, configs))
            names = [_idle_name(r, c.key) for c in configs if _idle_name(r, c.key) in fleet.servers]
            await fleet.drop(names, names)
        log(f"   streaming: {size.streams:,} clients x {len(STREAM_SERVERS)} servers x {size.stream_rounds} rounds")
        bursts, warm_errors = await _streaming(fleet, size)
        names = [f"stream {key}" for key in STREAM_SERVERS]
        await fleet.drop(names, [*names, *(f"{n} warm-up" for n in names)])
        traced: dict[str, dict[str, Any]] = {}
        if size.traced:
            log(f"   tracemalloc: {size.traced:,} connections x 2 servers")
            traced = await _traced(fleet, size)
    return rounds, bursts, warm_errors, traced


# ================================================================================ report
def _q(values: list[float], q: float) -> float:
    return quantiles(values, [q])[0] if values else 0.0


def _fmt_pct(x: float) -> str:
    return f"{x:.2f}%"


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def _idle_tables(size: Size, configs: list[IdleConfig], rounds: list[dict[int, dict[str, IdleSample]]],
                 rows: dict[str, dict[str, float]]) -> tuple[str, str]:
    mem_rows: list[list[str]] = []
    cpu_rows: list[list[str]] = []
    fast_cost: dict[str, float] = {}  # fast server -> µs of server CPU per heartbeat, at the largest level measured
    for level in size.levels:
        active = [c for c in configs if c.key in rounds[0][level]]
        per = {c.key: [rd[level][c.key] for rd in rounds] for c in active}
        bare = per["bare"]
        for c in active:
            ss = per[c.key]
            row = {
                "open": float(min(s.open for s in ss)),
                "server_open": float(min(s.server_open for s in ss)),
                "uss_kib_per_conn": median(s.uss_per_conn for s in ss) / KIB,
                "rss_kib_per_conn": median(s.rss_per_conn for s in ss) / KIB,
                "objects_per_conn": median(s.objects_per_conn for s in ss),
                "cpu_pct": median(s.cpu_pct for s in ss),
                "user_pct": median(s.user / s.wall * 100 for s in ss),
                "sys_pct": median(s.sys / s.wall * 100 for s in ss),
                "pings_per_s": median(s.pings / s.wall for s in ss),
                "lost": float(max(s.lost for s in ss)),
                "opened_per_s": median(s.open_rate for s in ss),
            }
            if c.key != "bare":  # per-round differences to the bare server, median over rounds
                pairs = list(zip(ss, bare, strict=True))
                row["uss_kib_extra"] = median((s.uss_per_conn - b.uss_per_conn) / KIB for s, b in pairs)
                row["rss_kib_extra"] = median((s.rss_per_conn - b.rss_per_conn) / KIB for s, b in pairs)
                row["cpu_pct_extra"] = median(s.cpu_pct - b.cpu_pct for s, b in pairs)
            # The bare server's CPU in the same window, scaled to this server's window length, is the base.
            per_ping = [(s.cpu - b.cpu * s.wall / b.wall) / s.pings * 1e6
                        for s, b in zip(ss, bare, strict=True) if s.pings and c.key != "bare"]
            if per_ping:
                row["us_per_ping"] = median(per_ping)
            rows[f"idle {level} {c.key}"] = row
            mem_rows.append([f"{level:,}", f"{c.key}: {c.label()}", f"{row['open']:,.0f} / {row['server_open']:,.0f}",
                             f"{row['uss_kib_per_conn']:.1f}", f"{row['rss_kib_per_conn']:.1f}",
                             "reference" if c.key == "bare" else f"{row['uss_kib_extra']:+.1f}",
                             f"{row['objects_per_conn']:.0f}", f"{row['opened_per_s']:,.0f}"])
            cpu_rows.append([f"{level:,}", c.key, f"{row['pings_per_s']:,.0f}", _fmt_pct(row["cpu_pct"]),
                             f"{row['user_pct']:.2f}% / {row['sys_pct']:.2f}%",
                             "reference" if c.key == "bare" else f"{row['cpu_pct_extra']:+.2f} pp",
                             f"{row['us_per_ping']:.0f}" if "us_per_ping" in row else "",
                             f"{row['lost']:.0f}"])
        for default_key, fast_key in LOWLAT_IDLE:
            fast, ping = rows.get(f"idle {level} {fast_key}", {}), rows.get(f"idle {level} bare-ping", {})
            if "us_per_ping" in fast and ping.get("us_per_ping", 0) > 0:
                ratio = fast["us_per_ping"] / ping["us_per_ping"]
                rows[f"idle {level} {fast_key} vs bare-ping"] = {"per_ping_ratio": ratio}
            if "us_per_ping" in fast:
                fast_cost[fast_key] = fast["us_per_ping"]
            lo = rows.get(f"idle {level} {default_key}")
            if fast_key in fast_cost and lo is not None:
                # CPU is linear in the heartbeat rate: the default heartbeat's cost from the cost per heartbeat.
                lo["cpu_pct_projected"] = fast_cost[fast_key] * 1e-6 * lo["open"] / DEFAULT_HEARTBEAT * 100
    mem_table = markdown_table(["Connections", "Server", "open: clients / server", "USS KiB/conn", "RSS KiB/conn",
                                "USS KiB/conn vs bare", "gc objects/conn", "opened/s"], mem_rows)
    cpu_table = markdown_table(["Connections", "Server", "heartbeats/s", "CPU, % of one core", "user / sys",
                                "vs bare", "CPU µs per heartbeat", "lost"], cpu_rows)
    return mem_table, cpu_table


def _stream_table(size: Size, bursts: dict[tuple[str, str], list[Burst]], rows: dict[str, dict[str, float]]) -> str:
    table: list[list[str]] = []
    ratios: list[list[str]] = []
    for model in MODELS:
        for key in STREAM_SERVERS:
            bs = bursts[(model, key)]
            ttfd = [x for b in bs for x in b.ttfd_ms]
            deltas = sum(b.deltas for b in bs)
            row = {
                "ttfd_p50_ms": _q(ttfd, 0.5), "ttfd_p99_ms": _q(ttfd, 0.99), "ttfd_max_ms": max(ttfd, default=0.0),
                "deltas_per_s": median(b.deltas_per_s for b in bs),
                "server_cpu_us_per_delta": sum(b.server_cpu for b in bs) / max(deltas, 1) * 1e6,
                "errors": float(sum(b.errors for b in bs)), "requests": float(sum(b.requests for b in bs)),
                "burst_s": median(b.span for b in bs),
            }
            rows[f"stream {model} {key}"] = row
            table.append([MODEL_LABELS[model], key, f"{row['requests']:,.0f}", f"{row['ttfd_p50_ms']:.1f}",
                          f"{row['ttfd_p99_ms']:.1f}", f"{row['ttfd_max_ms']:.1f}", f"{row['burst_s'] * 1000:.0f}",
                          f"{row['deltas_per_s']:,.0f}", f"{row['server_cpu_us_per_delta']:.1f}",
                          f"{row['errors']:.0f}"])
        ba = rows[f"stream {model} bare"]
        for key in STREAM_SERVERS:
            if key == "bare":
                continue
            lo = rows[f"stream {model} {key}"]
            # Per round: the bursts of one round ran back to back, so their ratio shares that round's load.
            p99_ratio = [_q(a.ttfd_ms, 0.99) / _q(b.ttfd_ms, 0.99)
                         for a, b in zip(bursts[(model, key)], bursts[(model, "bare")], strict=True)
                         if a.ttfd_ms and b.ttfd_ms and _q(b.ttfd_ms, 0.99) > 0]
            rows[f"stream {model} {key} vs bare"] = vs = {
                "ttfd_p99_ratio": median(p99_ratio) if p99_ratio else 0.0,
                "deltas_per_s_ratio": lo["deltas_per_s"] / ba["deltas_per_s"] if ba["deltas_per_s"] else 0.0,
                "cpu_per_delta_ratio": (lo["server_cpu_us_per_delta"] / ba["server_cpu_us_per_delta"]
                                        if ba["server_cpu_us_per_delta"] else 0.0),
            }
            ratios.append([MODEL_LABELS[model], key, f"{vs['ttfd_p99_ratio']:.2f}x",
                           f"{vs['cpu_per_delta_ratio']:.2f}x", f"{vs['deltas_per_s_ratio']:.2f}x"])
    return (markdown_table(["Model", "Server", "requests", "TTFD p50 ms", "TTFD p99 ms", "TTFD max ms",
                            "burst ms (median)", "deltas/s (median)", "server CPU µs/delta", "errors"], table)
            + "\n\n" + markdown_table(["Model", "Server", "TTFD p99 vs bare (median of rounds)",
                                         "server CPU/delta vs bare", "deltas/s vs bare"], ratios))


def _traced_table(traced: dict[str, dict[str, Any]], rows: dict[str, dict[str, float]]) -> str:
    lines: list[list[str]] = []
    totals: dict[str, dict[str, float]] = {}
    for key, info in traced.items():
        n = max(info["open"], 1)
        pkgs: dict[str, float] = {}
        for site, (size, _count) in info["sites"].items():
            pkg = site.split("/", 1)[0] if "/" in site.split(":", 1)[0] else "other"
            pkgs[pkg] = pkgs.get(pkg, 0.0) + size / n
        totals[key] = pkgs
        rows[f"traced {key}"] = {"kib_per_conn": sum(pkgs.values()) / KIB,
                                 "lowlat_mw_kib_per_conn": pkgs.get("lowlat_mw", 0.0) / KIB}
    pkg_names = sorted({p for t in totals.values() for p in t}, key=lambda p: -abs(totals.get("lowlat", {}).get(p, 0)))
    for pkg in pkg_names:
        lines.append([f"`{pkg}`", *(f"{totals[k].get(pkg, 0.0):,.0f}" for k in traced)])
    lines.append(["**total traced**", *(f"**{sum(totals[k].values()):,.0f}**" for k in traced)])
    pkg_table = markdown_table(["Allocated in (innermost server-package frame)", *(f"{k} B/conn" for k in traced)],
                               lines)
    info = traced.get("lowlat")
    if not info:
        return pkg_table
    n = max(info["open"], 1)
    top = sorted(((s, v[0] / n, v[1] / n) for s, v in info["sites"].items() if s.startswith("lowlat_mw")),
                 key=lambda t: -t[1])[:15]
    site_table = markdown_table(["lowlat-mw allocation site", "B/conn", "blocks/conn"],
                                [[f"`{s}`", f"{b:,.0f}", f"{c:.1f}"] for s, b, c in top])
    return pkg_table + "\n\n" + site_table


def _fast_verdicts(size: Size, rows: dict[str, dict[str, float]],
                   judged: Callable[[bool, bool, str], str]) -> list[str]:
    """Issue 15's targets for the idle and streaming measurements, per lowlat server."""
    top = size.levels[-1]
    idle_what = f"{top:,} connections per server, not {TARGET_IDLE:,}"
    out = []
    for key, _fast in LOWLAT_IDLE:
        lo = rows.get(f"idle {top} {key}")
        if lo is None:
            continue
        if lo["pings_per_s"] > 0 and "us_per_ping" in lo:
            # A 30 s window of 30 s heartbeats holds about one per connection, more or fewer as the grid falls: the
            # verdict takes the higher of the window's CPU and its cost per heartbeat at one per connection per
            # interval (what the process spends over time).
            steady = lo["us_per_ping"] * 1e-6 * lo["open"] / DEFAULT_HEARTBEAT * 100
            cpu = max(lo["cpu_pct_extra"], steady)
            how = (f"{lo['cpu_pct_extra']:+.2f} percentage points over bare in the window, {lo['pings_per_s']:,.0f} "
                   f"heartbeats/s; {lo['us_per_ping']:.1f} µs per heartbeat at one per connection every "
                   f"{DEFAULT_HEARTBEAT:g} s: {steady:+.2f}")
        else:
            cpu = lo.get("cpu_pct_projected", math.inf)
            how = f"projected from the fast heartbeat: {cpu:+.2f} percentage points over bare"
        out.append(f"- **{TARGET_IDLE:,} idle connections under {FAST_CPU_PCT:g}% of one core, memory at most bare + "
                   f"{FAST_MEM_KIB:g} KiB** (`{key}`): CPU {judged(cpu < FAST_CPU_PCT, top >= TARGET_IDLE, idle_what)} "
                   f"({how}); memory "
                   f"{judged(lo['uss_kib_extra'] <= FAST_MEM_KIB, top >= TARGET_IDLE, idle_what)} "
                   f"({lo['uss_kib_extra']:+.1f} KiB of USS).")
    what = f"{size.streams:,} clients x {size.paced_tokens} tokens, not {TARGET_STREAMS:,} x 100"
    at_size = size.streams >= TARGET_STREAMS and size.paced_tokens >= 100
    bare = rows["stream paced bare"]
    for key in STREAM_SERVERS:
        if key == "bare":
            continue
        row, vs = rows[f"stream paced {key}"], rows[f"stream paced {key} vs bare"]
        ttfd_ok = vs["ttfd_p99_ratio"] <= FAST_TTFD_RATIO and row["ttfd_p99_ms"] < TARGET_TTFD_MS
        pooled = row["ttfd_p99_ms"] / bare["ttfd_p99_ms"] if bare["ttfd_p99_ms"] else math.nan  # (no bare sample: 0)
        out.append(f"- **{TARGET_STREAMS:,} clients x 100 tokens at {1 / PACE:g} tokens/s, TTFD p99 at most "
                   f"{FAST_TTFD_RATIO:g}x bare and under {TARGET_TTFD_MS:g} ms, zero errors, server CPU at most "
                   f"{FAST_CPU_RATIO:g}x** (`{key}`): TTFD {judged(ttfd_ok, at_size, what)} (p99 "
                   f"{row['ttfd_p99_ms']:.0f} ms, {vs['ttfd_p99_ratio']:.2f}x bare's {bare['ttfd_p99_ms']:.0f} ms, "
                   f"median of the rounds' ratios; over every request of every round "
                   f"{pooled:.2f}x, which this verdict does not use: one slow round "
                   f"of either server sets it); errors {judged(row['errors'] == 0, at_size, what)} "
                   f"({row['errors']:.0f}); CPU {judged(vs['cpu_per_delta_ratio'] <= FAST_CPU_RATIO, at_size, what)} "
                   f"({row['server_cpu_us_per_delta']:.1f} vs {bare['server_cpu_us_per_delta']:.1f} µs per delta, "
                   f"{vs['cpu_per_delta_ratio']:.2f}x).")
    return out


def _bottlenecks(size: Size, rows: dict[str, dict[str, float]], top: int, fast_level: int) -> str:
    """Where the heartbeat's and the streams' server time goes, with this run's numbers (how it was cut, with the
    numbers of each day: benchmarks/results/history.md)."""
    lo, lof = rows[f"idle {top} lowlat"], rows[f"idle {fast_level} lowlat-fast"]
    ldf = rows.get(f"idle {fast_level} lowlat-direct-fast", {})
    ping = rows[f"idle {fast_level} bare-ping"]
    per_hb = f"{lo['us_per_ping']:.0f} µs" if "us_per_ping" in lo else "not measurable in this run's window"
    budget = 1.0 / 100 * DEFAULT_HEARTBEAT / TARGET_IDLE * 1e6  # issue 15: 1% of a core
    paced = {k: rows[f"stream paced {k}"] for k in STREAM_SERVERS}
    direct_vs = rows["stream paced lowlat-direct vs bare"]
    lod = rows.get(f"idle {top} lowlat-direct", {})
    per_hb_direct = f"{lod['us_per_ping']:.0f} µs" if "us_per_ping" in lod else "not measurable in this run's window"
    return f"""**Where the time goes.** *Heartbeat:* with the default heartbeat and {top:,} connections a heartbeat
(one Ping sent, one Pong received) cost {per_hb} of server CPU on the ASGI path and {per_hb_direct} on lowlat-mw's
protocol; with {size.fast:g} s heartbeats on {fast_level:,} connections {lof.get('us_per_ping', 0):.0f} µs and
{ldf.get('us_per_ping', 0):.0f} µs, where uvicorn's own WebSocket ping cost {ping.get('us_per_ping', 0):.0f} µs. CPU % =
connections x cost per heartbeat / interval, so 1% of a core for {TARGET_IDLE:,} connections every
{DEFAULT_HEARTBEAT:g} s leaves {budget:.0f} µs per heartbeat. What lowlat-mw adds to the socket's round trip is
Python: the timer wheel's step (`lowlat_mw.runtime.timers`: connections due at one grid time share a slot), the
protocol's rules (is a Ping due, is the peer dead, is the connection idle), the Ping written from the timer
callback as a frame made once, the Pong the transport was told to await recognised in `data_received`, its RTT
observed (docs/architecture.md, "Where each rule lives").

*Streams, {1 / PACE:g} tokens/s:* {size.streams:,} streams of {size.paced_tokens} tokens want
{size.streams / PACE:,.0f} deltas/s; the bare endpoint spent {paced['bare']['server_cpu_us_per_delta']:.1f} µs of
server CPU per delta, lowlat-mw {paced['lowlat']['server_cpu_us_per_delta']:.1f} µs on the ASGI path and
{paced['lowlat-direct']['server_cpu_us_per_delta']:.1f} µs on its own protocol ({direct_vs['cpu_per_delta_ratio']:.2f}x,
per-request work included), so on this machine, shared with the client processes, a burst can take longer
than the model's {size.paced_tokens * PACE:g} s. TTFD p99 is then set by how long the server takes to go through
the burst of requests: the loop reads the whole burst in one turn, so the last request waits for the work of
every request before it (docs/architecture.md, "Fair scheduling"). The `lowlat-direct` server runs with
`lowlat-mw serve`'s garbage-collector settings, `gc_freeze` (the startup heap out of the collector's reach) and
`gc_threshold` {SERVE_GC_THRESHOLD} (a stream's objects die before they are promoted), so that full collections
stay out of the bursts (docs/architecture.md). A tight-loop model makes each stream run to its End before the next one
starts: TTFD then grows with whole replies, for the bare endpoint too. How each of these costs was measured, cut
or tried and dropped, with the numbers of each day: benchmarks/results/history.md."""


def _plots(size: Size, configs: list[IdleConfig], rounds: list[dict[int, dict[str, IdleSample]]],
           bursts: dict[tuple[str, str], list[Burst]]) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def png(fig: Any) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        return buf.getvalue()

    out: dict[str, bytes] = {}
    top = size.levels[-1]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for c in configs:
        if c.key not in rounds[-1][top]:
            continue  # the fast configurations stop before the largest level
        tl = rounds[-1][top][c.key].timeline
        ax.plot([t for t, _ in tl], [v for _, v in tl], marker=".", label=c.label())
    ax.axhline(TARGET_CPU_PCT, color="grey", linestyle="--", linewidth=0.8, label=f"target {TARGET_CPU_PCT:g}%")
    ax.set_xlabel("seconds into the window")
    ax.set_ylabel("server CPU, % of one core")
    ax.set_title(f"{top:,} idle connections per server (last round)")
    ax.legend(fontsize=7)
    out["scale-idle-cpu.png"] = png(fig)

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for model in MODELS:
        for key in STREAM_SERVERS:
            ttfd = sorted(x for b in bursts[(model, key)] for x in b.ttfd_ms)
            if ttfd:
                ax.plot(ttfd, [(i + 1) / len(ttfd) for i in range(len(ttfd))],
                        label=f"{key}, {MODEL_LABELS[model]}")
    ax.axvline(TARGET_TTFD_MS, color="grey", linestyle="--", linewidth=0.8, label=f"target p99 {TARGET_TTFD_MS:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel("time to first delta, ms (log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{size.streams:,} clients, one request each at once")
    ax.legend(fontsize=7)
    out["scale-ttfd.png"] = png(fig)
    return out


def report(mode: str, size: Size, configs: list[IdleConfig], rounds: list[dict[int, dict[str, IdleSample]]],
           bursts: dict[tuple[str, str], list[Burst]], warm_errors: int, traced: dict[str, dict[str, Any]],
           fd_limit: int) -> SuiteResult:
    rows: dict[str, dict[str, float]] = {}
    mem_table, cpu_table = _idle_tables(size, configs, rounds, rows)
    stream_table = _stream_table(size, bursts, rows)
    traced_section = _traced_table(traced, rows) if traced else ""
    for label, cols in rows.items():
        for col, v in cols.items():
            if not math.isfinite(v):
                raise RuntimeError(f"scale row {label!r} column {col!r} is {v!r}")

    top = size.levels[-1]
    lo, bare = rows[f"idle {top} lowlat"], rows[f"idle {top} bare"]
    fast_level = max(n for n in size.levels if f"idle {n} lowlat-fast" in rows)
    lof = rows[f"idle {fast_level} lowlat-fast"]

    def judged(ok: bool, at_size: bool, what: str) -> str:
        if at_size:
            return _verdict(ok)
        return (f"**not judged** by this {mode} run ({what}; the full run judges it), "
                f"{'within' if ok else 'over'} the target at this size")

    idle_what = f"{top:,} connections per server, not {TARGET_IDLE:,}"
    at_target = top >= TARGET_IDLE
    held = min(lo["open"], lo["server_open"]) >= top and lo["lost"] == 0
    projected = lo.get("cpu_pct_projected")
    ping_ratio = rows.get(f"idle {fast_level} lowlat-fast vs bare-ping", {}).get("per_ping_ratio")
    s_await, s_tight = rows["stream await lowlat"], rows["stream tight lowlat"]
    errors = s_await["errors"] + s_tight["errors"] + warm_errors
    streams_at = size.streams >= TARGET_STREAMS
    streams_what = f"{size.streams:,} clients, not {TARGET_STREAMS:,}"
    cpu_ok = lo["cpu_pct_extra"] < TARGET_CPU_PCT
    if lo["pings_per_s"] > 0:
        cpu_line = (f"measured {lo['cpu_pct_extra']:+.2f} percentage points of one core over bare in the "
                    f"{size.window:g} s window ({lo['pings_per_s']:,.0f} heartbeats/s)")
    else:  # a short window holds no default heartbeat: judge the size by the cost per heartbeat instead
        cpu_line = f"no default heartbeat falls in this run's {size.window:g} s window"
        cpu_ok = projected is not None and projected < TARGET_CPU_PCT
    if projected is not None and "us_per_ping" in lof:
        cpu_line += (f"; with {size.fast:g} s heartbeats ({fast_level:,} connections) a heartbeat costs "
                     f"{lof['us_per_ping']:.0f} µs of server CPU, which puts {DEFAULT_HEARTBEAT:g} s heartbeats on "
                     f"{top:,} connections at {projected:.2f}% at least (a heartbeat costs more at lower rates)")
    if ping_ratio:
        cpu_line += (f"; that is {ping_ratio:.1f}x what uvicorn's own WebSocket ping costs "
                     f"({rows[f'idle {fast_level} bare-ping']['us_per_ping']:.0f} µs)")
    verdicts = [
        f"- **{TARGET_IDLE:,} idle connections in one process**: {judged(held, at_target, idle_what)}: the "
        f"lowlat server (default settings) held {lo['server_open']:,.0f} of {top:,} connections through the "
        f"window, {lo['lost']:.0f} lost.",
        f"- **heartbeat + reaper CPU under {TARGET_CPU_PCT:g}% of one core** (default heartbeat, {top:,} "
        f"connections): {judged(cpu_ok, at_target, idle_what)}: {cpu_line}.",
        f"- **memory per connection at most {TARGET_MEM_KIB:g} KB above bare** (KiB, {top:,} connections): "
        f"{judged(lo['uss_kib_extra'] <= TARGET_MEM_KIB, at_target, idle_what)}: {lo['uss_kib_extra']:+.1f} KiB "
        f"of USS ({lo['uss_kib_per_conn']:.1f} vs {bare['uss_kib_per_conn']:.1f} KiB per connection; RSS "
        f"{lo['rss_kib_extra']:+.1f} KiB).",
        f"- **{TARGET_STREAMS:,} streaming clients, time to first delta p99 under {TARGET_TTFD_MS:g} ms**: model "
        f"that awaits between tokens {judged(s_await['ttfd_p99_ms'] < TARGET_TTFD_MS, streams_at, streams_what)} "
        f"(p99 {s_await['ttfd_p99_ms']:.0f} ms, bare endpoint {rows['stream await bare']['ttfd_p99_ms']:.0f} ms); "
        f"tight-loop model {judged(s_tight['ttfd_p99_ms'] < TARGET_TTFD_MS, streams_at, streams_what)} (p99 "
        f"{s_tight['ttfd_p99_ms']:.0f} ms, bare endpoint {rows['stream tight bare']['ttfd_p99_ms']:.0f} ms).",
        f"- **zero errors**: {judged(errors == 0, streams_at, streams_what)}: {errors:.0f} errors in "
        f"{s_await['requests'] + s_tight['requests']:,.0f} requests" + (" (warm-up included)" if warm_errors else "")
        + ".",
    ]
    verdict_text = ("**Verdicts** (issue 7):\n\n" + "\n".join(verdicts) + "\n\n**Verdicts** (issue 15, the fast "
                    "path; `lowlat` runs on uvicorn's own WebSocket protocol, the ASGI path, `lowlat-direct` on "
                    "lowlat-mw's, which `lowlat-mw serve` runs):\n\n" + "\n".join(_fast_verdicts(size, rows, judged)))
    bottlenecks = _bottlenecks(size, rows, top, fast_level)

    import uvicorn

    facts = machine_facts(mode, extra=[f"uvicorn {uvicorn.__version__} (`ws={WS}`, uvloop, httptools)",
                                       f"{size.clients} client processes on the same machine",
                                       f"RLIMIT_NOFILE {fd_limit:,}"])
    levels = " and ".join(f"{n:,}" for n in size.levels)
    body = f"""{facts}

Reproduce: `.venv/bin/python -m benchmarks --suite scale` (this section comes from one such run;
`--quick` is the CI-sized run). The machine has {os.cpu_count()} CPUs shared by the server processes and the
client processes (and, for this run, whatever else ran on it): CPU times below are each server
process's own (`getrusage`, user + system), which other load does not inflate much; latencies and
rates are wall-clock and do include that sharing.

**Idle connections.** {size.rounds} round(s); each starts {len(configs)} fresh uvicorn servers (Starlette apps on
`{WS}`, or on lowlat-mw's protocol with serve's garbage-collector settings for the `lowlat-direct` ones,
uvicorn's WebSocket pings off unless
stated, permessage-deflate off), fed by {size.clients}
client processes holding the client ends (the file-descriptor limit is raised to the hard limit in
every process; the lowlat servers run with `max_connections=0, max_connections_per_client=0`,
because every benchmark client comes from 127.0.0.1: the defaults, 10,000 per process and 256 per
client address, would refuse them). A lowlat client sends Hello, gets Welcome and answers each Ping
at once; a bare client only opens the WebSocket. Each server first gets {size.warm} warm-up connections
that stay open (first-use imports and allocations land in the baseline, and nothing is closed, so no
closed connection lingers in the measurement); its memory then is the baseline. For each level
({levels} connections per server, warm-up included), the connections are opened (servers in an order
rotated per round), then after {size.settle:g} s every server runs `gc.collect()` and reports USS and RSS
(psutil), and every server's CPU time is read over the same {size.window:g} s window. The fast
servers run up to {size.fast_max:,} connections only: they measure the cost per heartbeat, and are
stopped before bigger levels so that their load neither disturbs those windows nor slows the opening.
Per-connection memory = (USS at the level - USS at the baseline) / connections added, median over
rounds; "vs bare" is the per-round difference to the bare server, median over rounds. Heartbeat +
reaper CPU = the lowlat server's CPU in the window minus the bare server's in the same window; "CPU
µs per heartbeat" divides that by the Pings the clients answered in the window (one Ping and one
Pong each). With the default 30 s heartbeat a {size.window:g} s window holds
{size.window / DEFAULT_HEARTBEAT:.2g} heartbeat per connection; the {size.fast:g} s servers put many more in it
and give the cost of a heartbeat at that rate (CPU % = connections x cost per heartbeat / interval;
the cost is a lower bound for slower heartbeats, which wake the process more often per heartbeat,
see below). The idle reaper (`idle_timeout` 600 s) closes nothing in the window: its cost is the
deadline bookkeeping of every timer tick, included.

{mem_table}

{cpu_table}

![server CPU during the window](benchmarks/scale-idle-cpu.png)

**Streaming.** A bare streaming endpoint (sends pre-encoded Deltas and an End for each message it
gets) and the middleware (default settings, a model streaming the same tokens), each in its own
uvicorn server: `lowlat` on uvicorn's own WebSocket protocol (the ASGI path), `lowlat-direct` on
lowlat-mw's (`lowlat_mw.servers.uvicorn:WebSocketProtocol`, what `lowlat-mw serve` runs; direct reads
and writes; with serve's garbage-collector settings, `gc_freeze` on and `gc_threshold`
{SERVE_GC_THRESHOLD}). Each server is warmed up ({size.warm} connections stream once
per model), then gets {size.streams:,} client connections (spread over the client processes); in each
of {size.stream_rounds} rounds, for each model and each server (round r takes the r-th permutation of the
servers, so over 3! rounds each runs after every other equally often; 8 rounds run the first two orders twice;
each burst waits for a quiet machine: servers and clients under 10% of a core for 50 ms), every client
sends one request at once and reads its reply. TTFD runs from each request's send to its first Delta
as the client process sees it, so it includes the client processes' own queueing on the shared CPUs;
p50/p99/max are over every request of every round; deltas/s = a burst's deltas / (first request
sent to last End received), median over rounds; server CPU µs/delta = the server process's CPU time
over the bursts / their deltas (per-request work included); errors = Error frames, closes, timeouts,
short or wrong replies, connections that failed to open. The `await` model streams {size.tokens} tokens and
awaits `asyncio.sleep(0)` between them, as a real async model awaits its next token; the `tight` model
streams {size.tokens} and never yields, so once a stream starts it runs to its End before any other stream
gets the event loop; the `paced` model is issue 15's workload: {size.paced_tokens} tokens, {PACE * 1000:g} ms
apart ({1 / PACE:g} tokens/s; the bare endpoint sleeps as long). The second table gives each lowlat
server's ratios to the bare endpoint (TTFD p99: the median of the rounds' ratios, each round's bursts
run back to back).

{stream_table}

![time to first delta](benchmarks/scale-ttfd.png)
"""
    if traced_section:
        body += f"""
**Where a connection's bytes go**: two more servers (bare, lowlat) trace allocations (tracemalloc,
{TRACE_FRAMES} frames); after warm-up their traces are cleared, {size.traced:,} idle connections are opened, and
what was allocated since and is still alive after `gc.collect()` is divided by the connections. Only
the Python heap is traced (C allocations such as uvloop's transports and socket buffers are not, so
these totals are below USS). Each allocation is charged to its innermost frame in a server package
(asyncio frames skipped, so a Task or Lock counts for the code that made it).

{traced_section}
"""
    body += f"\n{bottlenecks}\n\n{verdict_text}\n"
    text = (f"{facts}\n\nIdle memory:\n{mem_table}\n\nIdle CPU ({size.window:g} s window):\n{cpu_table}\n\n"
            f"Streaming ({size.streams:,} clients, {size.stream_rounds} rounds):\n{stream_table}\n\n"
            + (f"tracemalloc:\n{traced_section}\n\n" if traced_section else "") + verdict_text)
    plots: dict[str, bytes] = {}
    if mode != "tiny":
        try:
            plots = _plots(size, configs, rounds, bursts)
        except Exception as exc:  # a plot must not cost the run its numbers
            log(f"   plots failed: {exc!r}")
    return SuiteResult(name=NAME, heading=HEADING, body=body, text=text, rows=rows, plots=plots)


@suite(NAME, HEADING)
def run(mode: str) -> SuiteResult:
    fd_limit = raise_nofile()
    try:
        import uvloop
    except ImportError:
        factory = None
    else:
        factory = uvloop.new_event_loop
    size = SIZES[mode]
    configs = idle_configs(size)
    with asyncio.Runner(loop_factory=factory) as runner:
        rounds, bursts, warm_errors, traced = runner.run(_run(size, configs))
    return report(mode, size, configs, rounds, bursts, warm_errors, traced, fd_limit)
