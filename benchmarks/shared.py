"""Shared suite: what sharing sessions through Redis (setting ``session_store``) costs a server.

Two `lowlat-mw serve` processes of the benchmark models (``benchmarks._bare_models``): one with the default
in-process session store, one with ``session_store`` pointing at a redis-server of the suite's own (Debian's
package; free loopback port, no persistence). In each round, in an order rotated per round, each server gets:

stream      one connection, one stream of N tokens (``tokens``, no delay) read by the raw client: the server's
            CPU time over the stream / its Deltas (per-request work included), and the redis-server's CPU per
            Delta for the Redis server's round;
round trip  one connection, R requests one after another (``echo``, one Delta each): Request sent to first
            Delta, p50 and p99 over every round.

Ratios are Redis / memory, per round, median over rounds (issue 18: server CPU per Delta at most 1.3x, time
to first Delta unchanged within noise). Then the workers part (``serve --workers 1`` and ``2``) and the failover
part (issue 18's acceptance run: two framework servers sharing Redis behind nginx, one killed or drained), which
``python -m benchmarks.failover`` runs alone.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess
import time
from pathlib import Path

from ._bare_common import (
    Child,
    RawClient,
    free_port,
    kept_on_failure,
    log_dir,
    process_cpu,
    python_argv,
    python_env,
    wait_http_ready,
)
from .core import SuiteResult, log, machine_facts, markdown_table, median, paired_ratios, quantiles, rotated, suite

NAME = "shared"
HEADING = "Shared sessions: the Redis session store's cost"
CPU_TARGET = 1.3  # issue 18: server CPU per Delta with the Redis store at most 1.3x the memory store's
SIZES = {"tiny": (2, 200, 20), "quick": (1, 1000, 100), "full": (8, 20000, 1000)}  # rounds, tokens, round trips
SERVERS = ("memory", "redis")
# The workers part: connections, rounds, tokens per stream (20 ms apart: issue 15's paced workload).
WORKERS_SIZES = {"tiny": (20, 1, 5), "quick": (40, 1, 10), "full": (1000, 4, 100)}
WORKER_COUNTS = (1, 2)
CLIENT_PROCS = 4  # (as the scale suite)
# The failover part: streams (one per connection), Deltas per stream, seconds between Deltas. The streams start
# staggered over half a stream's length (full: 1 s of 2 s), and A goes at a random moment in the next 0.4 of a
# stream's length (full: 0.8 s; less if the first stream is further on) after every stream has its first Delta:
# all on A, none ended, each at another point.
FAILOVER_SIZES = {"tiny": (4, 40, 0.005), "quick": (10, 100, 0.004), "full": (100, 500, 0.004)}
FAILOVER_SPREAD = 0.5  # the streams' starts, staggered over this fraction of a stream's length (deltas * gap)
FAILOVER_WINDOW = 0.4  # A goes this fraction of a stream's length at most after every stream has its first Delta
# A drained server refuses reconnects (lowlat-mw's daphne runner too, since it stops listening when it drains; before,
# daphne took them and closed each with 4002 until it exited: 6.5 to 9.5 s, each client trying 20 to 32 times). A
# reconnect accepted just before the drain began is closed with 4002 and tried again: 60 retries at most 0.5 s apart
# (0.25 s on average, full jitter; and each try takes a handshake) keep a client trying for 15 s or more.
FAILOVER_BACKOFF = {"base": 0.05, "cap": 0.5, "retries": 60}
# How a stream A was running when killed may end (docs/scaling.md): what A had written, then ResumeFailed saying
# so; or, for a session A had not yet written to Redis (it does within 10 ms of the Welcome), B not knowing it:
# taken as that only for a stream whose first Delta came less than FAILOVER_YOUNG s before A went. Any other
# ResumeFailed (e.g. "the session store is unreachable") counts as "anything else".
FAILOVER_KILLED = "the process running it stopped"
FAILOVER_UNKNOWN = "session expired or unknown"
FAILOVER_YOUNG = 0.1
FAILOVER_PAIRS = (("starlette", "flask"), ("flask", "starlette"), ("starlette", "django"), ("django", "starlette"))
FAILOVER_EVENTS = ("kill", "drain")
LABELS = {"memory": "in-process session store (default)", "redis": "`session_store` = Redis (redis-server on loopback)"}


def _redis_server(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    deadline = time.monotonic() + 15
    while True:
        try:
            redis.Redis(port=port, socket_timeout=1).ping()
            return proc, port
        except redis.RedisError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.05)


async def _stream(port: int, tokens: int) -> int:
    client = RawClient(f"ws://127.0.0.1:{port}/ws", "proto")
    await client.open()
    try:
        await client.send_request(client.request("tokens", params={"n": tokens}))
        deltas = 0
        while await client.next_kind() == "delta":
            deltas += 1
        await client.ack(True)
        return deltas
    finally:
        await client.close()


async def _round_trips(port: int, n: int) -> list[float]:
    client = RawClient(f"ws://127.0.0.1:{port}/ws", "proto")
    await client.open()
    try:
        frame = client.request("echo", text="hello")
        out = []
        for _ in range(n):
            start = time.perf_counter()
            await client.send_request(frame)
            assert await client.next_kind() == "delta"
            out.append(time.perf_counter() - start)
            assert await client.next_kind() == "end"
            await client.ack(True)
        return out
    finally:
        await client.close()


async def _workers(mode: str, folder: Path, redis_port: int) -> tuple[str, dict[str, dict[str, float]]]:
    """`serve --workers 1` and `--workers 2` (both with the Redis store), each holding `n` connections from the
    scale suite's client processes; in each round each server's connections all send one paced request at once."""
    from ._scale_procs import ClientProc

    n, rounds, tokens = WORKERS_SIZES[mode]
    servers: dict[int, Child] = {}
    clients: list[ClientProc] = []
    try:
        for w in WORKER_COUNTS:
            port = free_port()
            servers[w] = Child(f"workers-{w}", python_argv(
                "-m", "lowlat_mw", "serve", "benchmarks._scale_server:scale_model", "--port", str(port),
                "--workers", str(w), "--log-level", "warning", "--set", f"session_store=redis://127.0.0.1:{redis_port}/0",
                "--set", "max_connections=0", "--set", "max_connections_per_client=0", "--set", "rate_limit=0"),
                env=python_env(), port=port, logdir=folder)
        for child in servers.values():
            await wait_http_ready(child, "/healthz")
        clients = [await ClientProc.start() for _ in range(CLIENT_PROCS)]
        for w, child in servers.items():
            shares = [n // CLIENT_PROCS + (1 if i < n % CLIENT_PROCS else 0) for i in range(CLIENT_PROCS)]
            answers = await asyncio.gather(*(c.call({"cmd": "open", "group": f"w{w}", "port": child.port, "n": k,
                                                     "lowlat": True, "concurrency": 32, "timeout": 60}, 120 + n / 50)
                                             for c, k in zip(clients, shares, strict=True) if k))
            opened = sum(a["opened"] for a in answers)
            if opened != n:
                raise RuntimeError(f"workers {w}: opened {opened} of {n} connections: {answers[0].get('errors')}")
        ttfd: dict[int, list[float]] = {w: [] for w in WORKER_COUNTS}
        bursts: dict[int, list[float]] = {w: [] for w in WORKER_COUNTS}
        p99s: dict[int, list[float]] = {w: [] for w in WORKER_COUNTS}
        cpu: dict[int, list[float]] = {w: [] for w in WORKER_COUNTS}
        errors = {w: 0 for w in WORKER_COUNTS}
        for r in range(rounds):
            for w in (WORKER_COUNTS if r % 2 == 0 else WORKER_COUNTS[::-1]):
                before = servers[w].cpu_seconds()
                answers = await asyncio.gather(*(c.call({"cmd": "stream", "group": f"w{w}", "tokens": tokens,
                                                         "yield": True, "delay": 0.02, "timeout": 120}, 180)
                                                 for c in clients))
                times = [t for a in answers for t in a["ttfd_ms"]]
                deltas = sum(a["deltas"] for a in answers)
                cpu[w].append((servers[w].cpu_seconds() - before) / max(1, deltas) * 1e6)
                errors[w] += sum(a["errors"] for a in answers) + (n - len(times))
                ttfd[w] += times
                p99s[w].append(quantiles(times, (0.99,))[0] if times else math.nan)
                bursts[w].append((max(a["last_end"] for a in answers) - min(a["first_send"] for a in answers)) * 1000)
            log(f"   workers round {r + 1}/{rounds}: TTFD p99 1 worker {p99s[1][-1]:.0f} ms, "
                f"2 workers {p99s[2][-1]:.0f} ms")
    finally:
        await asyncio.gather(*(c.stop() for c in clients), return_exceptions=True)
        for child in servers.values():
            child.stop()
    rows = []
    numbers: dict[str, dict[str, float]] = {}
    for w in WORKER_COUNTS:
        p50, p99 = quantiles(ttfd[w], (0.5, 0.99))
        rows.append([f"`lowlat-mw serve --workers {w}`", f"{n * rounds:,}", f"{p50:.1f}", f"{p99:.1f}",
                     f"{median(bursts[w]):.0f}", f"{median(cpu[w]):.1f}", str(errors[w])])
        numbers[f"workers{w}"] = {"ttfd_p50_ms": p50, "ttfd_p99_ms": p99, "burst_ms": median(bursts[w]),
                                  "errors": float(errors[w])}
    p99_ratio = median(paired_ratios(p99s[2], p99s[1]))
    burst_ratio = median(paired_ratios(bursts[2], bursts[1]))
    table = markdown_table(["Server (Redis store)", "requests", "TTFD p50 ms", "TTFD p99 ms", "burst ms (median)",
                            "server CPU µs/delta (all workers)", "errors"], rows, "lrrrrrr")
    text = f"""**Workers.** {n:,} connections from {CLIENT_PROCS} client processes (the scale suite's) to each of
`lowlat-mw serve --workers 1` and `--workers 2`, both with the Redis store (one port; the kernel picks the
worker of each connection); in each of {rounds} round(s), in alternating order, every connection of one server
sends one request at once: {tokens} tokens 20 ms apart (issue 15's paced workload). TTFD: request sent to its
first Delta as the client process sees it; burst: first request sent to last End received. The machine has 2
CPUs for the servers and the client processes together.

{table}

Two workers / one, median of the rounds' ratios: TTFD p99 **{p99_ratio:.2f}x**, burst time **{burst_ratio:.2f}x**."""
    numbers["workers_ratio"] = {"ttfd_p99": p99_ratio, "burst": burst_ratio}
    return text, numbers


async def _failover(mode: str, folder: Path, redis_port: int) -> tuple[str, dict[str, dict[str, float]]]:
    """Issue 18's acceptance run: each pair of servers (A, B) sharing Redis, each event (A killed or drained),
    behind nginx (a FaultProxy standing in where nginx is not installed)."""
    import random

    from lowlat_mw.testing.nginx import find_nginx

    nginx = find_nginx()
    if nginx is None:
        log("   failover: nginx is not installed (`python3 dev.py test` installs it as root): a FaultProxy stands in")
    streams, deltas, gap = FAILOVER_SIZES[mode]
    rng = random.Random(18)
    rows, numbers = [], {}
    for a, b in FAILOVER_PAIRS if mode == "full" else FAILOVER_PAIRS[:1]:  # (CI's quick run: one pair)
        for event in FAILOVER_EVENTS:
            counts, took = await _failover_run(a, b, event, folder, redis_port, streams, deltas, gap,
                                               rng.random(), nginx)
            label = f"{a} -> {b}, A {'killed (SIGKILL)' if event == 'kill' else 'drained (SIGTERM)'}"
            rows.append([label, str(streams), str(counts["moved"]),
                         f"{counts['fewest_at_hit']}-{counts['most_at_hit']}", str(counts["exact"]),
                         str(counts["prefix"]), str(counts["bad"]), f"{took:.1f}"])
            numbers[f"failover {a}-{b} {event}"] = {k: float(v) for k, v in counts.items()}
            log(f"   failover {label}: {counts} in {took:.1f} s")
    table = markdown_table(["A -> B, event", "streams", "on A when it went", "Deltas received then (fewest-most)",
                            "whole and exact", "exact prefix, then ResumeFailed", "anything else", "seconds"], rows,
                           "lrrrrrrr")
    spread, window = deltas * gap * FAILOVER_SPREAD, deltas * gap * FAILOVER_WINDOW
    timing = f"""They start staggered over {spread:g} s ({FAILOVER_SPREAD:g} of a stream's length); once every stream
has had its first Delta, A is killed (SIGKILL) or drained (SIGTERM) at a random moment in the next {window:g} s
(less if the stream furthest on would end by then). So every stream is on A when A goes, and fails over, each at
another point of its {deltas} Deltas ("Deltas received then": the fewest and the most a stream had received)."""
    retries, cap = FAILOVER_BACKOFF["retries"], FAILOVER_BACKOFF["cap"]
    if nginx is not None:
        how = f"""{streams} clients each stream {deltas} numbered Deltas ({gap * 1000:g} ms apart) through nginx
(Debian's, with docs/scaling.md's block less `ip_hash`, B marked `backup`: nginx sends every connection to A, and
to B only when A is unavailable, its connect refused or reset; tests/integration/test_balancer.py checks the same
configuration).
{timing}
Killed, A's connections drop: nginx closes the clients' side, the clients reconnect through nginx, and nginx
passes each connection that A refuses (or resets mid-handshake) on to B. Drained, A sends `GoAway` and closes its
connections with 4002 while it finishes their streams into Redis; a reconnect that still reaches A is refused or
reset (every server stops listening when it drains), and nginx passes it on to B; one A accepted just before is
closed with 4002 and the client tries again ({retries:g} retries at most {cap:g} s apart). On B each client
resumes its session from Redis. "On A when it went": the streams whose connection to A
dropped before their End (all of them unless one ended first); seconds: the run's wall time (a killed A's streams
end when B sees A dead, 5 s after its last heartbeat)."""
    else:
        how = f"""{streams} clients each stream {deltas} numbered Deltas ({gap * 1000:g} ms apart) from A through a
proxy.
{timing}
Then the proxy sends new connections to B and cuts the open ones. nginx was not installed where this ran
(`python3 dev.py test` installs it as root): the proxy (lowlat_mw.testing's FaultProxy) stood in for it."""
    text = f"""**Failover** (issue 18's acceptance run). For each pair of servers A and B (the framework examples as
their guides run them, sharing Redis) and each event,
{how}
Every reply is checked Delta by Delta: whole and exact, or (A killed) an exact prefix and then `ResumeFailed` for
the part A had not written ("the process running it stopped"; or "session expired or unknown" for a stream whose
first Delta came less than {FAILOVER_YOUNG * 1000:g} ms before A went, its session maybe not yet written);
"anything else" (a gap, a repeat, another error or ending) must be 0.

{table}"""
    return text, numbers


async def _failover_run(a: str, b: str, event: str, folder: Path, redis_port: int, streams: int, deltas: int,
                        gap: float, hit_at: float, nginx: str | None) -> tuple[dict[str, int], float]:
    """One pair, one event: how many replies were whole and exact, an exact prefix then ResumeFailed, or else;
    how many streams were on A when it went, and the fewest and most Deltas a stream had received then. A goes
    `hit_at` (0 to 1) of the way through its window (FAILOVER_WINDOW). Behind nginx (the binary `nginx`, A the
    primary and B its backup; its error and access logs in `folder`), or a FaultProxy if None."""
    import contextlib
    import os
    import signal

    from lowlat_mw import Backoff, ResumeFailed, connect
    from lowlat_mw.testing import FaultProxy
    from lowlat_mw.testing.nginx import Nginx, guide_nginx_block

    from ._bare_common import ROOT
    from ._frameworks_servers import server_env
    from .soak import server_argv

    expected = [f"{i} " for i in range(deltas)]
    spread, window = deltas * gap * FAILOVER_SPREAD, deltas * gap * FAILOVER_WINDOW
    env = server_env(folder, {"LOWLAT_MODEL": "benchmarks._bare_models:MODELS",
                              "LOWLAT_SESSION_STORE": f"redis://127.0.0.1:{redis_port}/0"})
    pair: dict[str, Child] = {}
    counts = {"exact": 0, "prefix": 0, "bad": 0, "moved": 0, "ended_before_hit": 0, "fewest_at_hit": 0,
              "most_at_hit": 0}
    received = [0] * streams  # Deltas each stream has received so far
    first = [math.inf] * streams  # when each stream's first Delta came
    ended = [False] * streams
    went = [math.inf]  # when A went
    name = f"failover-{a}-{b}-{event}"
    try:
        for role, server in (("a", a), ("b", b)):
            port = free_port()
            pair[role] = Child(f"{name}-{role}", server_argv(server, port), env=env, port=port, logdir=folder)
        for child in pair.values():
            await wait_http_ready(child, "/health")
        with contextlib.ExitStack() as stack:
            balancer: Nginx | FaultProxy
            if nginx is not None:  # A the primary, B its backup (the guide's block less ip_hash); 2 connections
                balancer = stack.enter_context(Nginx(  # per stream
                    guide_nginx_block(ROOT / "docs" / "scaling.md"), (pair["a"].port, pair["b"].port), folder=folder,
                    affinity=False, backup=True, name=f"{name}-nginx", worker_connections=1024, access_log=True,
                    binary=nginx))
            else:
                balancer = stack.enter_context(FaultProxy(("127.0.0.1", pair["a"].port)))
            proxy = balancer if isinstance(balancer, FaultProxy) else None
            running = asyncio.Event()  # every stream has its first Delta (or has ended without one)

            def settled() -> None:
                if sum(1 for i in range(streams) if received[i] or ended[i]) == streams:
                    running.set()

            async def one(i: int) -> None:
                await asyncio.sleep(i * spread / streams)  # staggered: when A goes, each is at another point
                got: list[str] = []
                failed_resume = False
                client = connect(f"ws://127.0.0.1:{balancer.port}/ws", backoff=Backoff(**FAILOVER_BACKOFF))
                try:
                    async with client:
                        async for chunk in client.stream("count", model="count", params={"n": deltas, "gap": gap}):
                            got.append(chunk)
                            received[i] += 1
                            if received[i] == 1:
                                first[i] = time.monotonic()
                                settled()
                    if got != expected:
                        log(f"   failover {a}->{b} {event}: stream {i}: {len(got)} Deltas, not the {deltas} expected")
                    counts["exact" if got == expected else "bad"] += 1
                except ResumeFailed as exc:
                    failed_resume = True
                    young = went[0] - first[i] < FAILOVER_YOUNG  # (not yet in Redis when A went, maybe)
                    ok = (event == "kill" and got == expected[:len(got)]
                          and (FAILOVER_KILLED in str(exc) or (FAILOVER_UNKNOWN in str(exc) and young)))
                    if not ok or not client.resumes:  # (no resume: B did not know the session)
                        log(f"   failover {a}->{b} {event}: stream {i}: after {len(got)} Deltas, "
                            f"{client.resumes} resumes: {exc}")
                    counts["prefix" if ok else "bad"] += 1
                except Exception as exc:  # counted: any other failure is a defect
                    log(f"   failover {a}->{b} {event}: stream {i}: {exc!r}")
                    counts["bad"] += 1
                finally:
                    ended[i] = True
                    settled()
                counts["moved"] += failed_resume or client.resumes > 0  # (it was on A when A went)

            async def hit() -> None:
                with contextlib.suppress(TimeoutError):  # (a stream that never starts is counted, and logged)
                    async with asyncio.timeout(spread + 60):
                        await running.wait()
                # Within the window, and before the stream furthest on can end (on a busy machine the last first
                # Delta comes late): at most 0.8 of the time its remaining Deltas take at least.
                await asyncio.sleep(hit_at * min(window, 0.8 * (deltas - max(received)) * gap))
                at_hit = [received[i] for i in range(streams) if not ended[i]]
                counts["ended_before_hit"] = sum(ended)
                counts["fewest_at_hit"], counts["most_at_hit"] = (min(at_hit), max(at_hit)) if at_hit else (0, 0)
                log(f"   failover {a}->{b} {event}: A goes {time.monotonic() - started:.2f} s in: {len(at_hit)} "
                    f"streams running, {counts['fewest_at_hit']} to {counts['most_at_hit']} Deltas received, "
                    f"{sum(ended)} ended")
                went[0] = time.monotonic()
                if proxy is not None:  # the balancer's part, where nginx does it by itself
                    proxy.target = ("127.0.0.1", pair["b"].port)
                if event == "kill":  # the whole process group: gunicorn's master and its worker at once
                    os.killpg(pair["a"].proc.pid, signal.SIGKILL)
                else:  # the server itself (gunicorn's master passes it on to its worker)
                    os.kill(pair["a"].proc.pid, signal.SIGTERM)
                if proxy is not None:
                    proxy.cut_all()

            started = time.monotonic()
            async with asyncio.timeout(180):
                await asyncio.gather(hit(), *(one(i) for i in range(streams)))
            took = time.monotonic() - started
    finally:
        for child in pair.values():
            child.stop()
    return counts, took


@suite(NAME, HEADING)
def run(mode: str) -> SuiteResult:
    rounds, tokens, trips = SIZES[mode]
    if shutil.which("redis-server") is None and not Path("/usr/bin/redis-server").exists():
        text = "Not run: redis-server is not installed (`python3 dev.py test` installs it)."
        return SuiteResult(NAME, HEADING, text, text)
    folder = log_dir(NAME)
    with kept_on_failure(folder):
        return asyncio.run(_run(mode, folder, rounds, tokens, trips))


async def _run(mode: str, folder: Path, rounds: int, tokens: int, trips: int) -> SuiteResult:
    redis_proc, redis_port = _redis_server(folder)
    children: dict[str, Child] = {}
    try:
        for name in SERVERS:
            port = free_port()
            extra = {"LOWLAT_SESSION_STORE": f"redis://127.0.0.1:{redis_port}/0"} if name == "redis" else {}
            extra["LOWLAT_RATE_LIMIT"] = "0"
            children[name] = Child(name, python_argv("-m", "lowlat_mw", "serve", "benchmarks._bare_models:MODELS",
                                                      "--port", str(port), "--log-level", "warning"),
                                   env=python_env(extra), port=port, logdir=folder)
        for child in children.values():
            await wait_http_ready(child, "/healthz")
            await _stream(child.port, min(tokens, 2000))  # warm-up: imports, the Redis connection, caches
            await _round_trips(child.port, 20)
        cpu: dict[str, list[float]] = {n: [] for n in SERVERS}
        redis_cpu: list[float] = []
        ttfd: dict[str, list[float]] = {n: [] for n in SERVERS}
        ttfd_p50: dict[str, list[float]] = {n: [] for n in SERVERS}
        trip_cpu: dict[str, list[float]] = {n: [] for n in SERVERS}
        for r in range(rounds):
            for name in rotated(SERVERS, r):
                child = children[name]
                before, rbefore = child.cpu_seconds(), process_cpu(redis_proc.pid)
                deltas = await _stream(child.port, tokens)
                cpu[name].append((child.cpu_seconds() - before) / deltas * 1e6)
                if name == "redis":
                    redis_cpu.append((process_cpu(redis_proc.pid) - rbefore) / deltas * 1e6)
                before = child.cpu_seconds()
                times = await _round_trips(child.port, trips)
                trip_cpu[name].append((child.cpu_seconds() - before) / trips * 1e6)
                ttfd[name] += times
                ttfd_p50[name].append(median(times))
            log(f"   round {r + 1}/{rounds}: CPU/delta memory {cpu['memory'][-1]:.2f} us, "
                f"redis {cpu['redis'][-1]:.2f} us")
        for child in children.values():
            child.stop()
        children = {}
        workers_text, workers_rows = await _workers(mode, folder, redis_port)
        failover_text, failover_rows = await _failover(mode, folder, redis_port)
    finally:
        for child in children.values():
            child.stop()
        redis_proc.terminate()
        redis_proc.wait(10)
    cpu_ratio = median(paired_ratios(cpu["redis"], cpu["memory"]))
    p50_ratio = median(paired_ratios(ttfd_p50["redis"], ttfd_p50["memory"]))
    trip_ratio = median(paired_ratios(trip_cpu["redis"], trip_cpu["memory"]))
    rows = []
    for name in SERVERS:
        p50, p99 = quantiles(ttfd[name], (0.5, 0.99))
        rows.append([LABELS[name], f"{median(cpu[name]):.2f}",
                     f"{median(redis_cpu):.2f}" if name == "redis" else "",
                     f"{p50 * 1e6:.0f}", f"{p99 * 1e6:.0f}", f"{median(trip_cpu[name]):.0f}"])
    table = markdown_table(["Server", "server CPU µs/delta (median of rounds)", "redis-server CPU µs/delta",
                            "round trip to first Delta p50 µs", "p99 µs", "server CPU µs per round trip"], rows,
                           "lrrrrr")
    verdict = "met" if cpu_ratio <= CPU_TARGET else "missed"
    body = f"""{machine_facts(mode)}

Reproduce: `.venv/bin/python -m benchmarks --suite {NAME}`. {rounds} rounds; in each, each server (order rotated)
streams {tokens:,} tokens on one connection to the raw client, then answers {trips:,} one-Delta requests one
after another (`lowlat-mw serve`, lowlat-mw's uvicorn protocol, `benchmarks._bare_models`; the Redis server's
session_store is a redis-server of the suite's own on loopback). The Redis store writes each session's output
behind the socket, one pipelined round trip every 10 ms (docs/scaling.md).

{table}

Redis / memory, median of the rounds' ratios: server CPU per Delta **{cpu_ratio:.2f}x**; round trip to the first
Delta p50 **{p50_ratio:.2f}x**; server CPU per round trip (a one-Delta stream: its start, Delta and End written
to Redis in one more round trip) **{trip_ratio:.2f}x**.

**Verdict** (issue 18: with the Redis store, server CPU per Delta at most {CPU_TARGET}x the memory store's, time to
first Delta unchanged within noise): CPU **{verdict}** ({cpu_ratio:.2f}x); time to first Delta {p50_ratio:.2f}x.
How often the store writes, and what the other choices cost: benchmarks/results/history.md.

{workers_text}

{failover_text}"""
    numbers = {name: {"cpu_us_per_delta": median(cpu[name]), "ttfd_p50_us": median(ttfd_p50[name]) * 1e6}
               for name in SERVERS}
    for name in SERVERS:
        numbers[name]["cpu_us_per_round_trip"] = median(trip_cpu[name])
    numbers["ratio"] = {"cpu": cpu_ratio, "ttfd_p50": p50_ratio, "round_trip_cpu": trip_ratio}
    numbers.update(workers_rows)
    numbers.update(failover_rows)
    return SuiteResult(NAME, HEADING, body, body, numbers)
