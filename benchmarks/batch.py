"""Micro-batching: a batch-capable model against the same model called once per request.

One uvicorn server on lowlat-mw's protocol (benchmarks._warmup_server) with two models whose every call costs
``call_ms`` plus ``item_ms`` per request it holds, one call at a time (one forward pass on one accelerator): the
gain is set by that cost model, so the report gives its ceiling (what the calls alone would take) beside the
measured ratio, which says what lowlat-mw's batching loses on the way. ``single`` is called
once per request, ``batched`` is marked batch-capable (lowlat-mw groups concurrent requests, up to the default
``max_batch_size`` of 16, within the default ``max_batch_wait`` of 2 ms). One AsyncClient connection sends
``concurrency`` requests at once per round, for one model then the other (order alternating per round), and
times the round (throughput) and each request (Request -> End). Issue 19's target: at 64 concurrent requests,
batched throughput at least 4x unbatched, at equal or better p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from lowlat_mw.settings import Settings

from .core import SuiteResult, machine_facts, markdown_table, median, paired_ratios, quantiles, rotated, suite
from .warmup import _Server

HEADING = "Micro-batching"
MODELS = ("single", "batched")
TARGET = 4.0  # issue 19: throughput at 64 concurrent requests at least 4x unbatched, p99 equal or better


@dataclass(frozen=True)
class Size:
    rounds: int
    concurrency: int
    call_ms: float
    item_ms: float


SIZES = {"tiny": Size(rounds=1, concurrency=8, call_ms=5.0, item_ms=0.25),
         "quick": Size(rounds=2, concurrency=64, call_ms=5.0, item_ms=0.25),
         "full": Size(rounds=20, concurrency=64, call_ms=10.0, item_ms=0.5)}


def ceiling(size: Size, batch: int) -> float:
    """Batched throughput over single's if the model calls were all the time there is."""
    calls = -(-size.concurrency // batch)
    single = size.concurrency * (size.call_ms + size.item_ms)
    batched = calls * size.call_ms + size.concurrency * size.item_ms
    return single / batched


async def _measure(size: Size) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per model: requests per second of each round, and every request's Request -> End (ms)."""
    from lowlat_mw.client import AsyncClient

    server = _Server(0.0, call_ms=size.call_ms, item_ms=size.item_ms)
    client = AsyncClient(server.url, open_timeout=30.0)
    rates: dict[str, list[float]] = {m: [] for m in MODELS}
    latency: dict[str, list[float]] = {m: [] for m in MODELS}

    async def one(model: str, i: int) -> float:
        t0 = time.perf_counter()
        if await client.complete(f"q{i}", model=model) != f"q{i}:done":
            raise RuntimeError(f"{model} answered something else")
        return (time.perf_counter() - t0) * 1000

    try:
        try:
            await client.open()
        except Exception as exc:
            raise RuntimeError(f"the batch server did not serve (exit code {server.proc.poll()}): {exc!r}") from exc
        for r in range(1 + size.rounds):  # round 0 warms up
            for model in rotated(MODELS, r):
                t0 = time.perf_counter()
                took = await asyncio.gather(*(one(model, i) for i in range(size.concurrency)))
                wall = time.perf_counter() - t0
                if r:
                    rates[model].append(size.concurrency / wall)
                    latency[model].extend(took)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
        server.stop()
    return rates, latency


@suite("batch", HEADING)
def run(mode: str) -> SuiteResult:
    size = SIZES[mode]
    rates, latency = asyncio.run(_measure(size))
    rows: dict[str, dict[str, float]] = {}
    table = []
    for model in MODELS:
        p50, p99 = quantiles(latency[model], [0.5, 0.99])
        rows[model] = {"requests_per_s": median(rates[model]), "p50_ms": p50, "p99_ms": p99}
        table.append([model, f"{median(rates[model]):,.0f}", f"{p50:.1f}", f"{p99:.1f}"])
    speedup = median(paired_ratios(rates["batched"], rates["single"]))
    p99_ratio = rows["batched"]["p99_ms"] / rows["single"]["p99_ms"]
    top = ceiling(size, Settings().max_batch_size)
    rows["batched vs single"] = {"throughput": speedup, "p99": p99_ratio, "ceiling": top}
    met = speedup >= TARGET and p99_ratio <= 1.0
    verdict = (f"**Verdict** (issue 19: at {size.concurrency} concurrent requests, batched throughput at least "
               f"{TARGET:g}x unbatched at equal or better p99): {speedup:.1f}x the throughput (median of "
               f"{size.rounds} per-round ratios; the cost model's ceiling: {top:.1f}x, so batching kept "
               f"{speedup / top:.0%} of it), p99 {p99_ratio:.2f}x: **{'met' if met else 'missed'}**. The gain is "
               f"the cost model's: a model whose calls cost more per request gains less.")
    header = ["model", "requests/s (median of rounds)", "Request -> End p50 (ms)", "p99 (ms)"]
    text = markdown_table(header, table) + "\n\n" + verdict
    body = f"""{machine_facts(mode)}

Reproduce: `.venv/bin/python -m benchmarks --suite batch` (`--quick`: the CI-sized run). One uvicorn server on
lowlat-mw's protocol (`benchmarks/_warmup_server.py`) with two models whose every call costs {size.call_ms:g} ms
plus {size.item_ms:g} ms per request it holds, one call at a time (an awaited sleep under a lock: one forward pass
on one accelerator):
`single`, called once per request, and `batched`, marked batch-capable (default settings: `max_batch_size` 16,
`max_batch_wait` 2 ms). One AsyncClient connection; {size.rounds} rounds after one of warm-up, each sending
{size.concurrency} requests at once to one model then the other (order alternating). Throughput is requests over
the round's wall time; latency is each request's Request -> End, pooled over the rounds.

{text}
"""
    return SuiteResult("batch", HEADING, body, text, rows)
