"""Frameworks suite: the same streaming benchmark through the Starlette, FastAPI, Django Channels and Flask apps.

The four example apps (examples/starlette_app.py and fastapi_app.py under uvicorn, django_project
under daphne, flask_app.py under gunicorn's gthread worker: the conformance suite's command lines,
see benchmarks/_frameworks_servers.py) run at the same time in child processes on 127.0.0.1, each
serving benchmarks._bare_models (``LOWLAT_MODEL``; rate limit off). Clients are
lowlat_mw.client.AsyncClient (proto) in this process, on one event loop, connected up front.

Each round visits the frameworks in an order rotated by one per round. Per framework it runs a block
of sequential echo round trips (Request -> Delta -> End on one connection) and one streaming sample:
N connections each stream M tokens at the same time. Reported per framework: aggregate deltas/s,
time to first delta (client side, from sending the Request) p50/p99 over every stream, round-trip
p50/p99, and the server's CPU time per delta (its whole process tree), each also as a
ratio to Starlette measured in the same rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._bare_common import Child, kept_on_failure, log_dir, loop_factory, wait_http_ready
from ._frameworks_servers import FRAMEWORKS, SERVER_NAMES, server_argv, spawn
from .core import SuiteResult, log, machine_facts, markdown_table, median, paired_ratios, quantiles, rotated, suite

NAME = "frameworks"
HEADING = "Frameworks: Starlette, FastAPI, Django Channels, Flask"
PAYLOAD = "ping 0123456789"
SAMPLE_TIMEOUT = 120.0
_PORT_IN_USE = re.compile(r"address already in use|errno 98|couldn't listen|cannot listen", re.I)
LABELS = {"starlette": "Starlette (uvicorn)", "fastapi": "FastAPI (uvicorn)", "django": "Django Channels (daphne)",
          "flask": "Flask (gunicorn gthread)"}


@dataclass(frozen=True)
class Size:
    clients: int  # concurrent connections per streaming sample
    tokens: int  # per stream
    roundtrips: int  # per framework per round
    rounds: int
    warmup: int
    plots: bool


SIZES = {
    "tiny": Size(clients=2, tokens=50, roundtrips=10, rounds=1, warmup=1, plots=False),
    "quick": Size(clients=4, tokens=250, roundtrips=30, rounds=2, warmup=1, plots=True),
    "full": Size(clients=8, tokens=1000, roundtrips=200, rounds=15, warmup=2, plots=True),
}


@dataclass
class Samples:
    first: list[float] = field(default_factory=list)  # round trips: seconds to the Delta
    end: list[float] = field(default_factory=list)  # round trips: seconds to the End
    round_first_p50: list[float] = field(default_factory=list)
    ttfd: list[float] = field(default_factory=list)  # every stream's time to first delta
    server_ttfd: list[float] = field(default_factory=list)  # the same, as the server's End reports it
    round_ttfd_p50: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)  # per round: aggregate deltas/s
    server_cpu: float = 0.0  # seconds over every kept streaming sample
    client_cpu: float = 0.0
    deltas: int = 0


# ================================================================================ servers
async def _start_all(logdir: Any) -> dict[str, Child]:
    """Every framework's server, ready (GET /health answers 200); retried on a port taken meanwhile."""
    children: dict[str, Child] = {}
    try:
        for fw in FRAMEWORKS:
            children[fw] = spawn(fw, logdir)
        for fw in FRAMEWORKS:
            for attempt in range(1, 4):
                try:
                    await wait_http_ready(children[fw], "/health")
                    break
                except RuntimeError:
                    child = children[fw]
                    child.stop()
                    if attempt < 3 and _PORT_IN_USE.search(child.output()):
                        children[fw] = spawn(fw, logdir, attempt)
                        continue
                    raise
    except BaseException:
        for child in children.values():
            child.stop()
        raise
    return children


# ================================================================================ measurement
async def _roundtrip(client: Any) -> tuple[float, float]:
    t0 = time.perf_counter()
    stream = client.stream(PAYLOAD, model="echo")
    chunk = await anext(stream)
    t1 = time.perf_counter()
    async for extra in stream:
        raise RuntimeError(f"echo model sent a second delta {extra!r}")
    if chunk != PAYLOAD:
        raise RuntimeError(f"echo answered {chunk!r}")
    return t1 - t0, time.perf_counter() - t0


async def _one_stream(client: Any, n: int) -> tuple[int, float, float]:
    """(deltas, client-side time to first delta, server-side one from End.timings_ms) in seconds."""
    stream = client.stream(model="tokens", params={"n": n})
    count = 0
    async for _ in stream:
        count += 1
    ttfd = stream.time_to_first_delta
    server = stream.timings.server_first_delta
    if ttfd is None or server is None:
        raise RuntimeError(f"a stream finished without a first delta (client {ttfd}, server {server} s)")
    return count, ttfd, server


async def _measure(size: Size, children: dict[str, Child]) -> dict[str, Samples]:
    from lowlat_mw.client import AsyncClient

    samples = {fw: Samples() for fw in FRAMEWORKS}
    rt_clients: dict[str, AsyncClient] = {}
    st_clients: dict[str, list[AsyncClient]] = {}
    try:
        for fw, child in children.items():
            url = f"ws://127.0.0.1:{child.port}/ws"
            try:
                async with asyncio.timeout(60.0):
                    rt_clients[fw] = AsyncClient(url, open_timeout=30.0)
                    await rt_clients[fw].open()
                    st_clients[fw] = [AsyncClient(url, open_timeout=30.0) for _ in range(size.clients)]
                    await asyncio.gather(*(c.open() for c in st_clients[fw]))
            except Exception as exc:
                raise RuntimeError(f"{fw}: could not connect ({exc!r})\n{child.output()}") from exc
        gc.collect()
        gc.freeze()  # what exists now (imports, connections) is never garbage: each sample's collect skips it
        for r in range(size.warmup + size.rounds):
            keep = r >= size.warmup
            for fw in rotated(list(FRAMEWORKS), r):
                s, child = samples[fw], children[fw]
                gc.collect()
                firsts, ends = [], []
                async with asyncio.timeout(SAMPLE_TIMEOUT):
                    for _ in range(size.roundtrips):
                        first, end = await _roundtrip(rt_clients[fw])
                        firsts.append(first)
                        ends.append(end)
                gc.collect()
                cpu0, c0 = child.cpu_seconds(), time.process_time()
                t0 = time.perf_counter()
                async with asyncio.timeout(SAMPLE_TIMEOUT):
                    results = await asyncio.gather(*(_one_stream(c, size.tokens) for c in st_clients[fw]))
                wall = time.perf_counter() - t0
                c1, cpu1 = time.process_time(), child.cpu_seconds()
                deltas = sum(r[0] for r in results)
                if deltas != size.clients * size.tokens:
                    raise RuntimeError(f"{fw}: expected {size.clients * size.tokens} deltas, got {deltas}")
                if not child.alive():
                    raise RuntimeError(f"{fw} server died\n{child.output()}")
                if keep:
                    s.first += firsts
                    s.end += ends
                    s.round_first_p50.append(median(firsts))
                    ttfds = [r[1] for r in results]
                    s.ttfd += ttfds
                    s.server_ttfd += [r[2] for r in results]
                    s.round_ttfd_p50.append(median(ttfds))
                    s.rate.append(deltas / wall)
                    s.server_cpu += cpu1 - cpu0
                    s.client_cpu += c1 - c0
                    s.deltas += deltas
            if keep and (r - size.warmup) % 5 == 4:
                log(f"   round {r - size.warmup + 1}/{size.rounds}")
    finally:
        gc.unfreeze()
        every = [*rt_clients.values(), *(c for cs in st_clients.values() for c in cs)]
        with contextlib.suppress(Exception):
            async with asyncio.timeout(15.0):
                await asyncio.gather(*(c.close() for c in every), return_exceptions=True)
    return samples


# ================================================================================ report
def _check(rows: dict[str, dict[str, float]]) -> None:
    for label, cols in rows.items():
        for col, v in cols.items():
            if not (isinstance(v, float) and math.isfinite(v)):
                raise RuntimeError(f"frameworks row {label!r} column {col!r} is {v!r}")


def _spread(ratios: Sequence[float]) -> str:
    q1, q3 = quantiles(ratios, (0.25, 0.75))
    return f"[{q1:.2f}, {q3:.2f}]"


def _plot(samples: dict[str, Samples]) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fws = list(FRAMEWORKS)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    rates = [median(samples[f].rate) / 1000 for f in fws]
    axes[0].bar(fws, rates, color="#3a7dc9")
    axes[0].set_ylabel("thousand deltas/s (median over rounds)")
    axes[0].set_title("Streaming throughput")
    for ax, attr, title, unit, scale in ((axes[1], "ttfd", "Time to first delta", "ms", 1e3),
                                         (axes[2], "first", "Round trip (to the Delta)", "µs", 1e6)):
        p50 = [quantiles(getattr(samples[f], attr), (0.5,))[0] * scale for f in fws]
        p99 = [quantiles(getattr(samples[f], attr), (0.99,))[0] * scale for f in fws]
        xs = range(len(fws))
        ax.bar([x - 0.2 for x in xs], p50, width=0.4, label="p50", color="#3a7dc9")
        ax.bar([x + 0.2 for x in xs], p99, width=0.4, label="p99", color="#e08a3c")
        ax.set_xticks(list(xs), fws)
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=8)
    for ax in axes:
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return {"frameworks.png": buf.getvalue()}


def report(mode: str, size: Size, samples: dict[str, Samples], loop_name: str, plots: dict[str, bytes]) -> SuiteResult:
    ref = samples["starlette"]
    ref_rate = median(ref.rate)
    ref_t50, ref_t99 = quantiles(ref.ttfd, (0.5, 0.99))
    ref_f50, ref_f99 = quantiles(ref.first, (0.5, 0.99))
    ref_cpu = ref.server_cpu / ref.deltas
    rows: dict[str, dict[str, float]] = {}
    stream_rows: list[list[str]] = []
    rt_rows: list[list[str]] = []
    for fw in FRAMEWORKS:
        s = samples[fw]
        rate = median(s.rate)
        t50, t99 = quantiles(s.ttfd, (0.5, 0.99))
        st50, st99 = quantiles(s.server_ttfd, (0.5, 0.99))
        f50, f99 = quantiles(s.first, (0.5, 0.99))
        e50, e99 = quantiles(s.end, (0.5, 0.99))
        cpu = s.server_cpu / s.deltas
        client_cpu = s.client_cpu / s.deltas
        rows[fw] = {
            "deltas_per_s": rate, "deltas_ratio": rate / ref_rate,
            "ttfd_p50_ms": t50 * 1e3, "ttfd_p99_ms": t99 * 1e3, "ttfd_p50_ratio": t50 / ref_t50,
            "ttfd_p99_ratio": t99 / ref_t99, "server_ttfd_p50_ms": st50 * 1e3, "server_ttfd_p99_ms": st99 * 1e3,
            "rt_p50_us": f50 * 1e6, "rt_p99_us": f99 * 1e6, "rt_p50_ratio": f50 / ref_f50,
            "rt_p99_ratio": f99 / ref_f99,
            "rt_end_p50_us": e50 * 1e6, "rt_end_p99_us": e99 * 1e6,
            "server_cpu_us_per_delta": cpu * 1e6, "server_cpu_ratio": cpu / ref_cpu,
            "client_cpu_us_per_delta": client_cpu * 1e6,
        }
        is_ref = fw == "starlette"
        rr = paired_ratios(s.rate, ref.rate)
        tr = paired_ratios(s.round_ttfd_p50, ref.round_ttfd_p50)
        fr = paired_ratios(s.round_first_p50, ref.round_first_p50)
        stream_rows.append([
            LABELS[fw], f"{rate:,.0f}", "1 (reference)" if is_ref else f"**{rate / ref_rate:.2f}** {_spread(rr)}",
            f"{t50 * 1e3:.2f}", f"{t99 * 1e3:.2f}",
            "1 (reference)" if is_ref else f"**{t50 / ref_t50:.2f}** {_spread(tr)} / {t99 / ref_t99:.2f}",
            f"{st50 * 1e3:.2f}", f"{st99 * 1e3:.2f}",
            f"{cpu * 1e6:.1f}", "1" if is_ref else f"{cpu / ref_cpu:.2f}", f"{client_cpu * 1e6:.1f}",
        ])
        rt_rows.append([
            LABELS[fw], f"{f50 * 1e6:.0f}", f"{f99 * 1e6:.0f}",
            "1 (reference)" if is_ref else f"**{f50 / ref_f50:.2f}** {_spread(fr)} / {f99 / ref_f99:.2f}",
            f"{e50 * 1e6:.0f}", f"{e99 * 1e6:.0f}",
        ])
    _check(rows)
    stream_table = markdown_table(
        ["Framework (server)", "deltas/s", "ratio vs Starlette [per-round IQR]", "first delta p50 ms", "p99 ms",
         "p50 ratio [IQR] / p99 ratio", "server's first delta p50 ms", "p99 ms", "server CPU µs/delta", "ratio",
         "client CPU µs/delta"], stream_rows)
    rt_table = markdown_table(
        ["Framework (server)", "to Delta p50 µs", "p99 µs", "p50 ratio [IQR] / p99 ratio", "to End p50 µs",
         "p99 µs"], rt_rows)
    ranked = sorted((f for f in FRAMEWORKS if f != "starlette"), key=lambda f: rows[f]["deltas_ratio"])
    summary = ", ".join(f"{LABELS[f]} {rows[f]['deltas_ratio']:.2f}x deltas/s, {rows[f]['ttfd_p50_ratio']:.2f}x "
                        f"first-delta p50, {rows[f]['rt_p50_ratio']:.2f}x round-trip p50, "
                        f"{rows[f]['server_cpu_ratio']:.2f}x server CPU per delta" for f in ranked)
    verdict = (f"**Verdict**: no numeric target (issue 7 asks for the comparison). Relative to Starlette in the "
               f"same rounds: {summary}.")
    facts = machine_facts(mode, extra=[f"client on {loop_name}"])
    commands = "\n".join(f"- {LABELS[fw]}: `{' '.join(_display_argv(fw))}`" for fw in FRAMEWORKS)
    plot_md = "\n![Frameworks: deltas/s, time to first delta, round trip](benchmarks/frameworks.png)\n" \
        if "frameworks.png" in plots else ""
    body = f"""{facts}

Reproduce: `.venv/bin/python -m benchmarks --suite frameworks` (this section comes from one such run;
`--quick` is the CI-sized run).

**Method.** The four example apps run at the same time, each in its own child process group, with
the conformance suite's command lines, `LOWLAT_MODEL=benchmarks._bare_models:MODELS` (an async
generator `tokens` yielding N small tokens with no delay, and an `echo` model answering with one Delta)
and `LOWLAT_RATE_LIMIT=0`; everything else is the example's own settings (metrics on, stage timings,
tracing through opentelemetry-api):

{commands}

Clients are `lowlat_mw.client.AsyncClient` (proto) in the benchmark process, one event loop, every
connection opened before the first round. {size.rounds} rounds after {size.warmup} warm-up, frameworks
in an order rotated by one per round; per framework and round: {size.roundtrips} sequential echo round
trips on one connection, then one streaming sample in which {size.clients} connections each stream
{size.tokens} tokens at the same time. Deltas/s is all deltas of the sample over its wall time (median
over rounds); time to first delta is per stream, from sending its Request (p50/p99 over every stream of
every round; ratios are of those pooled percentiles, with the [25th, 75th percentile] of per-round p50
ratios), and the server's first delta is the same as the server reports it in the End (`timings_ms`:
from the Request's arrival to the first chunk sent); server CPU is the CPU time of the server's process
tree (each process's CPU clock, gunicorn's master and worker together) summed over every kept sample,
per delta; client CPU is this process's.
Other load on the machine (see the load average above) hits every framework alike through the rotation.

**Streaming** ({size.clients} concurrent connections x {size.tokens} tokens)

{stream_table}

**Round trip** (echo model: Request -> Delta -> End on one connection, µs)

{rt_table}
{plot_md}
**Reading the numbers** (the causes below come from the adapters' code, not from a profile).
Starlette and FastAPI run the same `LowLatMiddleware` under the same uvicorn, and FastAPI adds nothing
on the WebSocket path (the middleware answers before FastAPI's router), so the gap between those two
rows is this run's noise floor. Flask runs each connection on the thread driver
(`lowlat_mw/runtime/threads.py`): the protocol and the model run on one background event loop, every outgoing
frame is handed to a send thread (`run_in_executor` per frame) that writes it with simple-websocket, and
every incoming frame waits for the loop (`run_coroutine_threadsafe`): thread hops per delta and per
request. Django Channels under daphne frames the WebSocket in Python (autobahn on Twisted) and passes
each incoming frame through the consumer's message queue. With {size.clients} streams at once, the time to
first delta is mostly queueing: the client side (one event loop for every connection) and a server that
runs each model for 64 tokens between yields both make a stream's first delta wait behind the others'
deltas. The server's own figure ends when lowlat-mw hands the first Delta to the framework's send, so the
gap between the two columns is the framework's and the client's queueing (daphne queues outgoing frames
for Twisted's reactor). A server that sends each
frame through a thread (Flask) interleaves the streams sooner, so its first deltas come early even though
it streams slower; the unloaded latency is the round-trip table's. Deltas/s is a whole-system figure (the
clients share the 2 CPUs), so server CPU per delta is the cleaner comparison of the servers' own cost.

{verdict}
"""
    text = f"{facts}\n\nStreaming:\n{stream_table}\n\nRound trip:\n{rt_table}\n\n{verdict}"
    return SuiteResult(name=NAME, heading=HEADING, body=body, text=text, rows=rows, plots=plots)


def _display_argv(framework: str) -> list[str]:
    argv = server_argv(framework, 8000)
    argv[0] = ".venv/bin/" + argv[0].rsplit("/", 1)[-1]
    return argv


@suite(NAME, HEADING)
def run(mode: str) -> SuiteResult:
    size = SIZES[mode]
    factory, loop_name = loop_factory()
    logdir = log_dir(NAME)

    async def main() -> dict[str, Samples]:
        log(f"   starting {', '.join(SERVER_NAMES[f] + ' ' + f for f in FRAMEWORKS)}")
        children = await _start_all(logdir)
        try:
            log(f"   {len(FRAMEWORKS)} frameworks x {size.rounds} rounds ({size.roundtrips} round trips + "
                f"{size.clients} x {size.tokens}-token streams each)")
            return await _measure(size, children)
        finally:
            for child in children.values():
                child.stop()

    with kept_on_failure(logdir), asyncio.Runner(loop_factory=factory) as runner:
        samples = runner.run(main())
    plots = _plot(samples) if size.plots else {}
    return report(mode, size, samples, loop_name, plots)
