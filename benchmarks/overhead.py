"""Overhead suite: what metrics, End stage timings and tracing cost per delta.

In process, one ConnectionDriver per sample is driven directly: a Hello, then S Requests for the
demo model streaming T small tokens each with no delay (it yields to the loop every 64 tokens, so
the S streams interleave), and a send that only counts frames. The sample's wall time divided by
S*T is the server's whole per-delta cost (model step, framing, session bookkeeping, send path),
without any socket, so the observability share of it is as large as it can get. Configurations:

A  baseline: metrics, stage timings and tracing off
B  End stage timings only (``stage_timings=True``)
C  metrics + stage timings: the default without OpenTelemetry
D  C + tracing through the OpenTelemetry SDK (SimpleSpanProcessor into an in-memory exporter)
E  C + tracing with opentelemetry-api only (no SDK: non-recording spans)

D needs opentelemetry-sdk, E opentelemetry-api; rows whose package is missing are left out.
Each round measures every configuration once, in an order rotated by one per round, for each
subprotocol; ratios are the median over rounds of the ratio within the round.

End to end, two uvicorn servers in child processes on 127.0.0.1 (same app, observability on vs
off) serve the Python client in this process, again interleaved in rounds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lowlat_mw.observability.tracing
from lowlat_mw.demo import demo_model
from lowlat_mw.endpoint import Endpoint
from lowlat_mw.observability.metrics import Metrics
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.runtime.connection import ConnectionDriver
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings

from .core import (
    ChildServer,
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

NAME = "overhead"
HEADING = "Overhead: metrics and stage timings"
TARGET = 0.05  # issue 6: metrics on must cost under 5% of the per-delta cost
SUBPROTOCOLS = {"proto": SUBPROTOCOL_PROTO, "json": SUBPROTOCOL_JSON}
CODECS = ("zstd", "lz4", "snappy")  # what the Python client offers (tokens stay under compression_min_size)
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    metrics: bool
    stage_timings: bool
    tracing: str  # off | sdk | api


CONFIGS = (
    Config("A", "baseline: metrics, stage timings, tracing off", False, False, "off"),
    Config("B", "End stage timings only", False, True, "off"),
    Config("C", "metrics + stage timings (default without OpenTelemetry)", True, True, "off"),
    Config("D", "C + tracing, OpenTelemetry SDK (in-memory exporter)", True, True, "sdk"),
    Config("E", "C + tracing, opentelemetry-api only (non-recording spans)", True, True, "api"),
)


@dataclass(frozen=True)
class Size:
    streams: int
    tokens: int
    rounds: int
    warmup: int
    e2e_streams: int
    e2e_tokens: int
    e2e_rounds: int


SIZES = {
    "tiny": Size(streams=2, tokens=20, rounds=2, warmup=1, e2e_streams=2, e2e_tokens=20, e2e_rounds=1),
    "quick": Size(streams=8, tokens=200, rounds=10, warmup=1, e2e_streams=8, e2e_tokens=200, e2e_rounds=4),
    "full": Size(streams=8, tokens=200, rounds=60, warmup=2, e2e_streams=8, e2e_tokens=200, e2e_rounds=20),
}


# ================================================================================ tracing
def _available(kind: str) -> bool:
    """Whether the package a tracing kind needs is installed."""
    if kind == "off":
        return True
    module = "opentelemetry.sdk.trace" if kind == "sdk" else "opentelemetry.trace"
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


class _Tracers:
    """The tracer each configuration's sessions get; the process's global provider is never touched."""

    def __init__(self) -> None:
        self.exporter: Any = None
        self.provider: Any = None
        self.by_kind: dict[str, Any] = {"off": None}

    def get(self, kind: str) -> Any:
        if kind not in self.by_kind:
            if kind == "sdk":
                from opentelemetry.sdk.trace import TracerProvider
                from opentelemetry.sdk.trace.export import SimpleSpanProcessor
                from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

                self.exporter = InMemorySpanExporter()
                self.provider = TracerProvider(shutdown_on_exit=False)
                self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
                self.by_kind[kind] = self.provider.get_tracer("lowlat_mw", lowlat_mw.__version__)
            else:  # what opentelemetry-api gives when no SDK is configured
                from opentelemetry import trace

                self.by_kind[kind] = trace.NoOpTracer()
        return self.by_kind[kind]

    def close(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


@contextlib.contextmanager
def _use_tracer(tracer: Any) -> Iterator[None]:
    """Make lowlat_mw.observability.tracing.tracer() (read when a session is built) return `tracer`."""
    if tracer is None:
        yield
        return
    original = lowlat_mw.observability.tracing.tracer
    lowlat_mw.observability.tracing.tracer = lambda: tracer
    try:
        yield
    finally:
        lowlat_mw.observability.tracing.tracer = original


# ================================================================================ in process
class InProcess:
    """Drives a ConnectionDriver directly, one fresh connection per sample."""

    def __init__(self, size: Size, configs: list[Config]) -> None:
        self.size = size
        self.configs = configs
        self.tracers = _Tracers()
        self.settings = {c.key: Settings(metrics=c.metrics, stage_timings=c.stage_timings,
                                         tracing=c.tracing != "off", rate_limit=0) for c in configs}
        # One Metrics per configuration, as a server has one per registry (None: not registered anywhere).
        self.metrics = {c.key: Metrics() if c.metrics else None for c in configs}
        self.endpoints = {}
        for c in configs:
            endpoint = self.endpoints[c.key] = Endpoint(demo_model, self.settings[c.key])
            endpoint.metrics = self.metrics[c.key]
        params = {"delay": 0, "tokens": size.tokens}
        self.frames: dict[str, list[bytes | str]] = {}
        for name, sp in SUBPROTOCOLS.items():
            codec = codec_for(sp)
            hello = ev.Hello(client="lowlat-bench", compression=CODECS if name == "proto" else ())
            self.frames[name] = [codec.encode(hello)] + [
                codec.encode(ev.Request(stream_id=i + 1, text="benchmark", params=params))
                for i in range(size.streams)]

    async def sample(self, cfg: Config, sp_name: str, *, collect: bool = True) -> float:
        """One session: µs of this thread's CPU time per delta (all of the session runs on it)."""
        size = self.size
        sent = 0

        async def send(message: Any) -> None:
            nonlocal sent
            sent += message["type"] == "websocket.send"

        tracer = self.tracers.get(cfg.tracing)
        if collect:
            gc.collect()
        start = time.thread_time()
        with _use_tracer(tracer):
            driver = ConnectionDriver(self.endpoints[cfg.key], send=send, subprotocol=SUBPROTOCOLS[sp_name])
        for frame in self.frames[sp_name]:
            await driver.receive(frame)
        while driver.tasks:
            await asyncio.gather(*list(driver.tasks.values()))
        await driver.disconnected(1000)
        elapsed = time.thread_time() - start
        deltas = size.streams * size.tokens
        expected = 1 + deltas + size.streams  # Welcome, the Deltas, one End per stream
        if sent != expected:
            raise RuntimeError(f"config {cfg.key} {sp_name}: expected {expected} frames, the server sent {sent}")
        if cfg.tracing == "sdk":
            spans = self.tracers.exporter.get_finished_spans()
            self.tracers.exporter.clear()
            if len(spans) != 1 + size.streams:  # the handshake and one per stream
                raise RuntimeError(f"config D recorded {len(spans)} spans, expected {1 + size.streams}")
        return elapsed / deltas * 1e6

    async def run(self) -> dict[tuple[str, str], list[float]]:
        """µs/delta samples per (config key, subprotocol name), interleaved in rounds."""
        keys = [c.key for c in self.configs]
        by_key = {c.key: c for c in self.configs}
        samples: dict[tuple[str, str], list[float]] = {(k, sp): [] for k in keys for sp in SUBPROTOCOLS}
        total = self.size.warmup + self.size.rounds
        for r in range(total):
            for sp in SUBPROTOCOLS:
                for key in rotated(keys, r):
                    value = await self.sample(by_key[key], sp)
                    if r >= self.size.warmup:
                        samples[(key, sp)].append(value)
            if r >= self.size.warmup and (r - self.size.warmup) % 10 == 9:
                log(f"   in-process round {r - self.size.warmup + 1}/{self.size.rounds}")
        self.tracers.close()
        return samples


# ================================================================================ instruction counts
INSTR_CONFIGS = ("A", "B", "C")
INSTR_RUNS = (1, 3)  # samples per valgrind run; the difference cancels start-up and imports


def instructions_child(key: str, sp_name: str, samples: int) -> None:
    """Run under valgrind: `samples` in-process samples of configuration `key` (full-mode sizes)."""
    size = SIZES["full"]
    cfg = next(c for c in CONFIGS if c.key == key)
    gc.disable()  # a full collection's cost depends on the heap, not on the configuration

    async def main() -> None:
        runner = InProcess(size, [cfg])
        for _ in range(samples):
            await runner.sample(cfg, sp_name, collect=False)

    factory, _ = _loop_factory()
    with asyncio.Runner(loop_factory=factory) as r:
        r.run(main())


def _irefs(key: str, sp_name: str, samples: int) -> int:
    code = f"from benchmarks.overhead import instructions_child; instructions_child({key!r}, {sp_name!r}, {samples})"
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", sys.executable,
         "-c", code],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
        env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)})
    match = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode or not match:
        raise RuntimeError(f"valgrind run failed ({out.returncode}): {out.stderr[-1500:]}")
    return int(match.group(1).replace(",", ""))


def instructions_per_delta() -> dict[tuple[str, str], float] | None:
    """Instructions per delta per (config, subprotocol), counted by cachegrind (None without valgrind).

    Deterministic where CPU time is not: the ratio of two counts does not move with machine load.
    """
    if shutil.which("valgrind") is None:
        return None
    size = SIZES["full"]
    deltas = size.streams * size.tokens
    jobs = [(k, sp, n) for k in INSTR_CONFIGS for sp in SUBPROTOCOLS for n in INSTR_RUNS]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(2, os.cpu_count() or 1))) as pool:
        counts = dict(zip(jobs, pool.map(lambda job: _irefs(*job), jobs), strict=True))
    lo, hi = INSTR_RUNS
    return {(k, sp): (counts[(k, sp, hi)] - counts[(k, sp, lo)]) / ((hi - lo) * deltas)
            for k in INSTR_CONFIGS for sp in SUBPROTOCOLS}


# ================================================================================ end to end
def _Server(observability: str) -> ChildServer:
    """A benchmark server (benchmarks._server) in a child process."""
    return ChildServer("benchmarks._server", observability)


async def _server_cpu(port: int) -> float:
    """The server process's CPU seconds so far (its GET /cpu)."""
    status, body = await http_get(port, "/cpu", timeout=30.0)
    if status != 200:
        raise RuntimeError(f"GET /cpu on port {port} answered {status}: {body[:40]!r}")
    return float(body)


async def _e2e(size: Size) -> dict[tuple[str, str, str], list[float]]:
    """µs per delta per (server "off"/"on", subprotocol name, "wall" | "cpu"), interleaved in rounds.

    wall: client-observed wall time for the whole sample; cpu: the server process's CPU time.
    """
    from lowlat_mw.client import AsyncClient

    servers = {name: _Server(name) for name in ("off", "on")}
    clients: dict[tuple[str, str], AsyncClient] = {}
    params = {"delay": 0, "tokens": size.e2e_tokens}

    async def one(client: AsyncClient) -> int:
        n = 0
        async for _ in client.stream("benchmark", params=params):
            n += 1
        return n

    async def sample(client: AsyncClient, port: int) -> tuple[float, float]:
        gc.collect()
        cpu0 = await _server_cpu(port)
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(client) for _ in range(size.e2e_streams)))
        elapsed = time.perf_counter() - start
        cpu = await _server_cpu(port) - cpu0
        deltas = size.e2e_streams * size.e2e_tokens
        if sum(counts) != deltas:
            raise RuntimeError(f"end to end: expected {deltas} deltas, got {sum(counts)}")
        return elapsed / deltas * 1e6, cpu / deltas * 1e6

    samples: dict[tuple[str, str, str], list[float]] = {
        (s, sp, m): [] for s in servers for sp in SUBPROTOCOLS for m in ("wall", "cpu")}
    try:
        for name, srv in servers.items():
            for sp in SUBPROTOCOLS:
                client = clients[(name, sp)] = AsyncClient(srv.url, mode=sp, open_timeout=30.0)
                try:
                    await client.open()
                except Exception as exc:
                    raise RuntimeError(f"end-to-end server {name!r} did not serve (exit code "
                                       f"{srv.proc.poll()}): {exc!r}") from exc
        for r in range(size.warmup + size.e2e_rounds):
            for sp in SUBPROTOCOLS:
                for name in rotated(list(servers), r):
                    wall, cpu = await sample(clients[(name, sp)], servers[name].port)
                    if r >= size.warmup:
                        samples[(name, sp, "wall")].append(wall)
                        samples[(name, sp, "cpu")].append(cpu)
    finally:
        for client in clients.values():
            with contextlib.suppress(Exception):
                await client.close()
        for srv in servers.values():
            srv.stop()
    return samples


# ================================================================================ report
def _loop_factory() -> tuple[Any, str]:
    """uvloop when installed (as uvicorn[standard] runs), else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return None, "asyncio event loop"
    return uvloop.new_event_loop, f"uvloop {uvloop.__version__}"


def _ratio_cell(ratios: list[float]) -> str:
    q1, mid, q3 = quantiles(ratios, (0.25, 0.5, 0.75))
    return f"{mid:.3f} ({(mid - 1) * 100:+.1f}%) [{q1:.3f}, {q3:.3f}]"


def _check(rows: dict[str, dict[str, float]]) -> None:
    for label, cols in rows.items():
        for col, v in cols.items():
            if not (math.isfinite(v) and v > 0):
                raise RuntimeError(f"overhead row {label!r} column {col!r} is {v!r}")


def _instructions_section(instr: dict[tuple[str, str], float] | None, rows: dict[str, dict[str, float]]) -> str:
    """The cachegrind table (and its rows), or a note that valgrind was not there."""
    if instr is None:
        return ("**Instructions per delta**: not measured in this run (needs `valgrind`, full mode only); "
                "CPU-time ratios above are the only measure.")
    labels = {"A": "A: everything off", "B": "B: End stage timings only", "C": "C: metrics + stage timings"}
    table = []
    for key in INSTR_CONFIGS:
        cells = [labels[key]]
        for sp in SUBPROTOCOLS:
            n, ratio = instr[(key, sp)], instr[(key, sp)] / instr[("A", sp)]
            rows.setdefault(f"instr {key}", {})[f"{sp}_per_delta"] = n
            rows[f"instr {key}"][f"{sp}_ratio_vs_A"] = ratio
            cells += [f"{n:,.0f}", "1 (reference)" if key == "A" else f"{ratio:.3f} ({(ratio - 1) * 100:+.1f}%)"]
        table.append(cells)
    cb = {sp: instr[("C", sp)] / instr[("B", sp)] for sp in SUBPROTOCOLS}
    rows["instr C vs B"] = {f"{sp}_ratio": v for sp, v in cb.items()}
    table.append(["C vs B: metrics alone"] + [x for sp in SUBPROTOCOLS
                                              for x in ("", f"{cb[sp]:.3f} ({(cb[sp] - 1) * 100:+.1f}%)")])
    size = SIZES["full"]
    return f"""**Instructions per delta** (cachegrind, `valgrind --tool=cachegrind`): the same in-process
sample ({size.streams} streams x {size.tokens} tokens), run {INSTR_RUNS[0]} and {INSTR_RUNS[1]} times in one
process each, the difference divided by the extra deltas (start-up and imports cancel out), with the
garbage collector off. Instruction counts do not move with machine load, so these ratios are the
noise-free version of the CPU-time ratios above (they do not see cache misses or instruction costs).

{markdown_table(["Configuration", "proto instr/delta", "proto ratio vs A", "json instr/delta", "json ratio vs A"],
                table)}"""


def report(mode: str, size: Size, configs: list[Config], samples: dict[tuple[str, str], list[float]],
           e2e: dict[tuple[str, str, str], list[float]], loop_name: str,
           instr: dict[tuple[str, str], float] | None = None) -> SuiteResult:
    sps = list(SUBPROTOCOLS)
    rows: dict[str, dict[str, float]] = {}
    table: list[list[str]] = []

    def vs(num: str, den: str, sp: str) -> list[float]:
        return paired_ratios(samples[(num, sp)], samples[(den, sp)])

    for c in configs:
        cells = [f"{c.key}: {c.label}"]
        row: dict[str, float] = {}
        for sp in sps:
            us = median(samples[(c.key, sp)])
            rs = vs(c.key, "A", sp)
            row[f"{sp}_us"], row[f"{sp}_ratio_vs_A"] = us, median(rs)
            cells += [f"{us:.2f}", "1 (reference)" if c.key == "A" else _ratio_cell(rs)]
        rows[c.key] = row
        table.append(cells)
    rows["C vs B"] = {f"{sp}_ratio": median(vs("C", "B", sp)) for sp in sps}
    table.append(["C vs B: metrics alone (stage timings on in both)"]
                 + [x for sp in sps for x in ("", _ratio_cell(vs("C", "B", sp)))])
    in_proc = markdown_table(
        ["Configuration", "proto CPU µs/delta", "proto ratio vs A", "json CPU µs/delta", "json ratio vs A"], table)

    e2e_rows: list[list[str]] = []
    for sp in sps:
        row = {}
        cells = [sp]
        for metric in ("wall", "cpu"):
            off, on = e2e[("off", sp, metric)], e2e[("on", sp, metric)]
            rs = paired_ratios(on, off)
            row[f"{metric}_off_us"], row[f"{metric}_on_us"] = median(off), median(on)
            row[f"{metric}_ratio"] = median(rs)
            cells += [f"{median(off):.2f}", f"{median(on):.2f}", _ratio_cell(rs)]
        rows[f"e2e {sp}"] = row
        e2e_rows.append(cells)
    e2e_table = markdown_table(["Subprotocol", "wall µs/delta, off", "wall µs/delta, on", "wall ratio on/off",
                                "server CPU µs/delta, off", "server CPU µs/delta, on", "server CPU ratio on/off"],
                               e2e_rows)
    instr_text = _instructions_section(instr, rows)
    _check(rows)

    worst_ca = max(rows["C"][f"{sp}_ratio_vs_A"] for sp in sps) - 1
    worst_cb = max(rows["C vs B"].values()) - 1
    worst_e2e = max(rows[f"e2e {sp}"]["cpu_ratio"] for sp in sps) - 1

    def verdict(x: float) -> str:
        return "under" if x < TARGET else "**over**"

    line = (f"**Verdict** (issue 6: metrics on must cost under {TARGET:.0%} of the per-delta cost): in process, "
            f"metrics + stage timings vs everything off (C vs A) cost {worst_ca:+.1%} per delta (worse "
            f"subprotocol), {verdict(worst_ca)} the target; metrics alone (C vs B) {worst_cb:+.1%}, "
            f"{verdict(worst_cb)}; end to end, server CPU per delta with the default observability vs off "
            f"{worst_e2e:+.1%}, {verdict(worst_e2e)}.")
    if instr is not None:
        i_ca = max(rows["instr C"][f"{sp}_ratio_vs_A"] for sp in sps) - 1
        i_cb = max(rows["instr C vs B"].values()) - 1
        line += (f" Counted in instructions (no noise): metrics alone (C vs B) {i_cb:+.1%}, {verdict(i_cb)} the "
                 f"target; metrics + End stage timings (C vs A) {i_ca:+.1%}, {verdict(i_ca)}.")
    facts = machine_facts(mode, extra=[loop_name])
    deltas = size.streams * size.tokens
    body = f"""{facts}

Reproduce: `.venv/bin/python -m benchmarks --suite overhead` (this section comes from one such run;
`--quick` is the CI-sized run). Ratio cells: the median over rounds of the ratio measured within each
round (+% = extra cost per delta), then [25th, 75th percentile] of those per-round ratios.

**In process**: {size.rounds} rounds after {size.warmup} warm-up. A sample is one ConnectionDriver fed a
Hello and {size.streams} concurrent Requests for the demo model, each streaming {size.tokens} small tokens with
no delay ({deltas} deltas per sample), with a send callable that only counts frames. CPU µs/delta is the
event-loop thread's CPU time (`time.thread_time`: time spent descheduled by other load is not counted,
though contention for caches or for the host's CPUs still shows) per delta: the whole server cost of a
delta without a socket (model step, framing, session bookkeeping, send path), hence the largest share
observability can take. Per-stream costs (span, histogram binding,
End timings) are spread over the {size.tokens} deltas of a stream. Configurations run in an order rotated
by one each round, for each subprotocol.

{in_proc}

**End to end**: {size.e2e_rounds} rounds after {size.warmup} warm-up. Two uvicorn servers (Starlette
middleware, demo model) in child processes on 127.0.0.1, one with the default observability (metrics,
stage timings, tracing with opentelemetry-api and no SDK) and one with all of it off; the Python
`AsyncClient` in this process streams {size.e2e_streams} concurrent requests of {size.e2e_tokens} tokens over
one connection per server and subprotocol. Wall µs/delta is what the client sees (client and machine
load included); server CPU µs/delta is the server process's CPU time (`GET /cpu` on it before and
after each sample).

{e2e_table}

{instr_text}

{line}
"""
    text = (f"{facts}\n\nIn process ({deltas} deltas/sample, {size.rounds} rounds):\n{in_proc}\n\n"
            f"End to end ({size.e2e_rounds} rounds):\n{e2e_table}\n\n{line}")
    if instr is not None:
        text += f"\n\n{instr_text}"
    return SuiteResult(name=NAME, heading=HEADING, body=body, text=text, rows=rows)


@suite(NAME, HEADING)
def run(mode: str) -> SuiteResult:
    size = SIZES[mode]
    configs = [c for c in CONFIGS if _available(c.tracing)]
    factory, loop_name = _loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        log(f"   in process: {len(configs)} configurations x 2 subprotocols x {size.rounds} rounds")
        samples = runner.run(InProcess(size, configs).run())
        log(f"   end to end: 2 servers x 2 subprotocols x {size.e2e_rounds} rounds")
        e2e = runner.run(_e2e(size))
    instr = None
    if mode == "full":
        log("   instructions per delta (cachegrind, if valgrind is installed)")
        instr = instructions_per_delta()
    return report(mode, size, configs, samples, e2e, loop_name, instr)
