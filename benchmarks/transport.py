"""Transport suite: time to first delta and total stream time, HTTP vs SSE vs one persistent WebSocket.

One uvicorn server process (Starlette app, benchmarks._transport_server) serves the demo model with
no model delay both as Server-Sent Events over HTTP (``POST /sse``, a plain StreamingResponse) and
through the lowlat-mw middleware (``/ws``); a second one serves the same app over TLS with a
certificate from a throwaway ``trustme`` CA that the clients trust. Transports, from this process:

(a) HTTP with a new connection per request: an httpx client that keeps no idle connection, so each
    request pays the TCP handshake (and the TLS one) before its request can leave;
(b) HTTP keep-alive streaming: one httpx client whose connection is reused, reading the SSE stream;
(c) lowlat-mw: one ``lowlat_mw.client.AsyncClient`` connected (and welcomed) once, one stream per
    request.

Time to first delta (TTFD) runs from the start of the request (before the connection, for (a)) to
the first token read by the caller; total to the end of the stream (SSE ``[DONE]``, lowlat End).
Links: loopback (straight to the server) or through delaying proxies (a FaultProxy per server and
delay, in a child process of their own) adding a one-way delay in each direction and one round
trip to every new connection's first bytes, as the TCP handshake over that link would. Each round
measures each (TLS, transport) configuration of one delay once, in an order rotated by one per
round; ratios are medians over rounds of the ratio within the round.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import math
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core import SuiteResult, log, machine_facts, markdown_table, median, paired_ratios, quantiles, rotated, suite

NAME = "transport"
HEADING = "Transport: HTTP vs SSE vs one persistent WebSocket"
ROOT = Path(__file__).resolve().parents[1]

TARGET_DELAY_MS = 25    # issue 7: the acceptance condition is 25 ms one way, with TLS
TARGET_RATIO = 0.40     # (c) TTFD at most 40% of (a), i.e. a cut of at least 60%
TRANSPORTS = ("a", "b", "c")
LABELS = {
    "a": "(a) HTTP, new connection per request",
    "b": "(b) HTTP keep-alive, SSE",
    "c": "(c) lowlat-mw, one WebSocket",
}
KEYS = {"a": "http-new", "b": "sse-keepalive", "c": "lowlat-ws"}
PROMPT = "benchmark"
PARAMS = {"delay": 0}   # the demo model's whole canned reply, no delay between tokens
SAMPLE_TIMEOUT = 30.0
SETTLE = 0.003          # pause after each sample, on top of the one-way delay (see _measure)
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class Size:
    delays_ms: tuple[int, ...]
    tls: tuple[bool, ...]
    rounds: dict[int, int]   # measured rounds per delay
    warmup: int
    plot: bool


SIZES = {
    "tiny": Size(delays_ms=(0, 25), tls=(False, True), rounds={0: 3, 25: 2}, warmup=1, plot=False),
    "quick": Size(delays_ms=(0, 25), tls=(True,), rounds={0: 30, 25: 12}, warmup=2, plot=True),
    "full": Size(delays_ms=(0, 5, 25, 50), tls=(False, True), rounds={0: 300, 5: 150, 25: 120, 50: 60},
                 warmup=3, plot=True),
}


def _tls_name(tls: bool) -> str:
    return "tls" if tls else "plain"


# ================================================================================ child processes
class _Child:
    """A child process in its own process group, alive while its stdin is open; always reaped."""

    def __init__(self, args: Sequence[str], *, pass_fds: Sequence[int] = (), stdout: Any = None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", *args], pass_fds=tuple(pass_fds), cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=stdout, start_new_session=True)

    def stop(self) -> None:
        proc = self.proc
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # the child's lifeline: it exits on its own
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc.stdout is not None:
            proc.stdout.close()


class _Server(_Child):
    """benchmarks._transport_server on a socket bound here (clients queue in its backlog until it serves)."""

    def __init__(self, tls_files: tuple[str, str] | None) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
            sock.listen(256)
            self.port = sock.getsockname()[1]
            args = ["benchmarks._transport_server", "--fd", str(sock.fileno())]
            if tls_files:
                args += ["--certfile", tls_files[0], "--keyfile", tls_files[1]]
            super().__init__(args, pass_fds=(sock.fileno(),))
        finally:
            sock.close()  # the child holds it now: if the child dies, connecting fails instead of hanging


class _Proxies(_Child):
    """benchmarks._transport_proxy: one delaying FaultProxy per (name, upstream port, one-way delay)."""

    def __init__(self, links: dict[str, tuple[int, int]]) -> None:
        super().__init__(["benchmarks._transport_proxy", *(f"{n}={p}:{d}" for n, (p, d) in links.items())],
                         stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"delaying proxies did not start (exit code {self.proc.poll()})")
        self.ports: dict[str, int] = json.loads(line)


# ================================================================================ clients
class _Endpoint:
    """The three transports' clients for one (delay, TLS) link."""

    def __init__(self, port: int, tls: bool, ctx: ssl.SSLContext, expected: str) -> None:
        import httpx

        from lowlat_mw.client import AsyncClient

        self.expected = expected
        self.sse_url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/sse"
        timeout = httpx.Timeout(SAMPLE_TIMEOUT)
        # (a): keeps no idle connection, so every request opens (and handshakes) a new one.
        self.http_new = httpx.AsyncClient(verify=ctx, trust_env=False, timeout=timeout,
                                          limits=httpx.Limits(max_keepalive_connections=0))
        self.http_keep = httpx.AsyncClient(verify=ctx, trust_env=False, timeout=timeout)
        self.ws = AsyncClient(f"{'wss' if tls else 'ws'}://127.0.0.1:{port}/ws", open_timeout=START_TIMEOUT,
                              ssl=ctx if tls else None)
        self.body = json.dumps({"text": PROMPT, "params": PARAMS}).encode()
        self.headers = {"content-type": "application/json", "accept": "text/event-stream"}
        # Connections opened per HTTP transport: a request whose network stream is not the previous
        # request's one opened a new connection (the previous one is kept alive, so ids cannot repeat).
        self.http_connections = {"a": 0, "b": 0}
        self.last_stream: dict[str, Any] = {}
        self.tls_version = ""
        self.server_first_delta_ms = 0.0  # the last lowlat stream's server-side time to first delta

    async def open(self) -> None:
        await self.ws.open()

    async def close(self) -> None:
        for c in (self.http_new, self.http_keep):
            with contextlib.suppress(Exception):
                await c.aclose()
        with contextlib.suppress(Exception):
            await self.ws.close()

    def connections(self, transport: str) -> int:
        return self.ws.connections if transport == "c" else self.http_connections[transport]

    async def sample(self, transport: str) -> tuple[float, float]:
        """(time to first delta, total) in seconds for one request over `transport`."""
        async with asyncio.timeout(SAMPLE_TIMEOUT):
            if transport == "c":
                return await self._lowlat()
            return await self._sse(self.http_new if transport == "a" else self.http_keep, transport)

    async def _sse(self, client: Any, transport: str) -> tuple[float, float]:
        parts: list[str] = []
        first = end = 0.0
        start = time.perf_counter()
        async with client.stream("POST", self.sse_url, content=self.body, headers=self.headers) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"POST {self.sse_url} answered {resp.status_code}")
            async for line in resp.aiter_lines():  # read to the end of the body so (b) keeps its connection
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    end = time.perf_counter()
                    continue
                if not parts:
                    first = time.perf_counter()
                    self._note_connection(resp, transport)
                parts.append(json.loads(data))
        self._check("".join(parts), end)
        return first - start, end - start

    def _note_connection(self, resp: Any, transport: str) -> None:
        stream = resp.extensions["network_stream"]
        if stream is not self.last_stream.get(transport):
            self.http_connections[transport] += 1
            self.last_stream[transport] = stream
        if not self.tls_version and (obj := stream.get_extra_info("ssl_object")) is not None:
            self.tls_version = obj.version() or ""

    async def _lowlat(self) -> tuple[float, float]:
        parts: list[str] = []
        first = 0.0
        start = time.perf_counter()
        stream = self.ws.stream(PROMPT, params=PARAMS)
        async for chunk in stream:
            if not parts:
                first = time.perf_counter()
            parts.append(chunk)  # type: ignore[arg-type]
        end = time.perf_counter()
        self._check("".join(parts), end)
        self.server_first_delta_ms = (stream.timings.server_first_delta or 0.0) * 1000
        return first - start, end - start

    def _check(self, text: str, end: float) -> None:
        if text != self.expected or not end:
            raise RuntimeError(f"wrong reply: {text[:60]!r}... (expected {self.expected[:60]!r}...)")


async def _expected_reply() -> str:
    from lowlat_mw.demo import demo_model
    from lowlat_mw.model import ModelRequest, SessionInfo

    req = ModelRequest(stream_id=1, text=PROMPT, params=PARAMS, session=SessionInfo(session_id="x"))
    return "".join([str(c) async for c in demo_model(req)])


@dataclass
class Measured:
    """Samples in ms per (delay, tls, transport): ttfd, total (same order: round by round)."""

    ttfd: dict[tuple[int, bool, str], list[float]] = field(default_factory=dict)
    total: dict[tuple[int, bool, str], list[float]] = field(default_factory=dict)
    connections: dict[tuple[int, bool, str], int] = field(default_factory=dict)
    server_ttfd: dict[tuple[int, bool], list[float]] = field(default_factory=dict)
    """(c)'s server-side time to first delta (End timings: Request frame in to first Delta out), ms."""
    tokens: int = 0
    tls_version: str = ""


async def _measure(size: Size, ports: dict[tuple[int, bool], int], ctx: ssl.SSLContext) -> Measured:
    expected = await _expected_reply()
    out = Measured(tokens=len(expected.split(" ")))
    for delay in size.delays_ms:
        endpoints = {tls: _Endpoint(ports[(delay, tls)], tls, ctx, expected) for tls in size.tls}
        configs = [f"{int(tls)}{t}" for tls in size.tls for t in TRANSPORTS]
        rounds = size.rounds[delay]
        # What a sample leaves behind (the FIN and TLS close_notify of (a)'s connection, (c)'s final
        # Ack) reaches the server one delay later: let it land before the next sample starts, so no
        # configuration pays for its predecessor (in rotated order, (b) always follows (a)).
        settle = delay / 1000 + SETTLE
        for tls in size.tls:
            for t in TRANSPORTS:
                out.ttfd[(delay, tls, t)], out.total[(delay, tls, t)] = [], []
            out.server_ttfd[(delay, tls)] = []
        log(f"   {delay} ms one way: {len(configs)} configurations x {rounds} rounds (+{size.warmup} warm-up)")
        started = time.monotonic()
        try:
            for ep in endpoints.values():
                await ep.open()
            gc.collect()
            gc.freeze()  # what exists now is never collected again: per-round collections stay cheap
            for r in range(size.warmup + rounds):
                gc.collect()
                for key in rotated(configs, r):
                    tls, t = key[0] == "1", key[1]
                    ttfd, total = await endpoints[tls].sample(t)
                    await asyncio.sleep(settle)
                    if r >= size.warmup:
                        out.ttfd[(delay, tls, t)].append(ttfd * 1000)
                        out.total[(delay, tls, t)].append(total * 1000)
                        if t == "c":
                            out.server_ttfd[(delay, tls)].append(endpoints[tls].server_first_delta_ms)
            for tls, ep in endpoints.items():
                for t in TRANSPORTS:
                    out.connections[(delay, tls, t)] = ep.connections(t)
                out.tls_version = out.tls_version or ep.tls_version
        finally:
            gc.unfreeze()
            for ep in endpoints.values():
                await ep.close()
        log(f"   {delay} ms done in {time.monotonic() - started:.1f} s")
    return out


def _loop_factory() -> tuple[Any, str]:
    """uvloop when installed (as uvicorn[standard] runs), else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return None, "asyncio event loop"
    return uvloop.new_event_loop, f"uvloop {uvloop.__version__}"


def _collect(size: Size) -> tuple[Measured, str]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    factory, loop_name = _loop_factory()
    children: list[_Child] = []
    with tempfile.TemporaryDirectory(prefix="lowlat-transport-") as tmp:
        certfile, keyfile = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        for pem in cert.cert_chain_pems:
            pem.write_to_path(certfile, append=True)
        cert.private_key_pem.write_to_path(keyfile)
        try:
            servers: dict[bool, _Server] = {}
            for tls in size.tls:
                servers[tls] = _Server((certfile, keyfile) if tls else None)
                children.append(servers[tls])
            ports = {(0, tls): srv.port for tls, srv in servers.items()}
            links = {f"{d}-{int(tls)}": (servers[tls].port, d) for d in size.delays_ms if d for tls in size.tls}
            if links:
                proxies = _Proxies(links)
                children.append(proxies)
                ports.update({(d, tls): proxies.ports[f"{d}-{int(tls)}"]
                              for d in size.delays_ms if d for tls in size.tls})
            with asyncio.Runner(loop_factory=factory) as runner:
                for tls, srv in servers.items():
                    try:
                        runner.run(_wait_ready(srv.port, tls, ctx))
                    except Exception as exc:
                        raise RuntimeError(f"{_tls_name(tls)} server did not serve (exit code "
                                           f"{srv.proc.poll()}): {exc!r}") from exc
                measured = runner.run(_measure(size, ports, ctx))
        finally:
            for child in children:
                child.stop()
    return measured, loop_name


async def _wait_ready(port: int, tls: bool, ctx: ssl.SSLContext) -> None:
    import httpx

    async with httpx.AsyncClient(verify=ctx, trust_env=False, timeout=START_TIMEOUT) as client:
        resp = await client.get(f"{'https' if tls else 'http'}://127.0.0.1:{port}/health")
        resp.raise_for_status()


# ================================================================================ report
def _ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _ratio_cell(ratios: list[float]) -> str:
    q1, mid, q3 = quantiles(ratios, (0.25, 0.5, 0.75))
    return f"{mid:.3f} [{q1:.3f}, {q3:.3f}]"


def _check(rows: dict[str, dict[str, float]]) -> None:
    for label, cols in rows.items():
        for col, v in cols.items():
            if not (isinstance(v, float) and math.isfinite(v)):
                raise RuntimeError(f"transport row {label!r} column {col!r} is {v!r}")


def _plot(size: Size, m: Measured) -> dict[str, bytes]:
    from matplotlib.figure import Figure

    tls_cdf = True if True in size.tls else size.tls[0]
    delay_cdf = TARGET_DELAY_MS if TARGET_DELAY_MS in size.delays_ms else max(size.delays_ms)
    fig = Figure(figsize=(12, 4.4))
    ax1, ax2 = fig.subplots(1, 2)
    colors = {"a": "tab:red", "b": "tab:blue", "c": "tab:green"}
    for t in TRANSPORTS:
        xs = sorted(m.ttfd[(delay_cdf, tls_cdf, t)])
        ax1.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", color=colors[t], label=LABELS[t])
    if delay_cdf:
        ax1.axvline(2 * delay_cdf, color="gray", linestyle=":", label=f"one round trip ({2 * delay_cdf} ms)")
    ax1.set_title(f"Time to first delta, {delay_cdf} ms one way, {'TLS' if tls_cdf else 'no TLS'}")
    p99 = max(quantiles(m.ttfd[(delay_cdf, tls_cdf, t)], (0.99,))[0] for t in TRANSPORTS)
    ax1.set_xlim(0, p99 * 1.15)  # the slowest 1% beyond: see the tables
    ax1.set_xlabel("ms (the slowest 1% of a transport may lie beyond the right edge)")
    ax1.set_ylabel("fraction of requests")
    ax1.grid(alpha=0.3)
    ax1.legend(loc="lower right", fontsize=8)
    for tls in size.tls:
        for t in TRANSPORTS:
            ys = [median(m.ttfd[(d, tls, t)]) for d in size.delays_ms]
            ax2.plot(size.delays_ms, ys, marker="o", color=colors[t], linestyle="-" if tls else "--",
                     label=f"{LABELS[t][:3]} {'TLS' if tls else 'no TLS'}")
    ax2.set_title("Median time to first delta by one-way delay")
    ax2.set_xlabel("one-way delay, ms")
    ax2.set_ylabel("ms")
    ax2.set_xticks(list(size.delays_ms))
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return {"transport-ttfd.png": buf.getvalue()}


def report(mode: str, size: Size, m: Measured, loop_name: str) -> SuiteResult:
    import httpx
    import uvicorn
    import websockets

    rows: dict[str, dict[str, float]] = {}
    abs_rows: list[list[str]] = []
    ratio_rows: list[list[str]] = []
    for d in size.delays_ms:
        link = "loopback" if d == 0 else f"{d} ms"
        for tls in size.tls:
            for t in TRANSPORTS:
                ttfd, total = m.ttfd[(d, tls, t)], m.total[(d, tls, t)]
                t50, t99 = quantiles(ttfd, (0.5, 0.99))
                s50, s99 = quantiles(total, (0.5, 0.99))
                conns = m.connections[(d, tls, t)]
                row = rows[f"{KEYS[t]} {d}ms {_tls_name(tls)}"] = {
                    "ttfd_p50_ms": t50, "ttfd_p99_ms": t99, "total_p50_ms": s50, "total_p99_ms": s99,
                    "connections": float(conns)}
                server = ""
                if t == "c":
                    row["server_ttfd_p50_ms"] = median(m.server_ttfd[(d, tls)])
                    server = _ms(row["server_ttfd_p50_ms"])
                abs_rows.append([link, "on" if tls else "off", LABELS[t], _ms(t50), _ms(t99), server, _ms(s50),
                                 _ms(s99), str(conns)])

            def vs(kind: str, num: str, den: str, d: int = d, tls: bool = tls) -> list[float]:
                src = m.ttfd if kind == "ttfd" else m.total
                return paired_ratios(src[(d, tls, num)], src[(d, tls, den)])

            ca, cb = vs("ttfd", "c", "a"), vs("ttfd", "c", "b")
            faster = sum(r < 1 for r in cb) / len(cb)
            diff = median(c - b for c, b in zip(m.ttfd[(d, tls, "c")], m.ttfd[(d, tls, "b")], strict=True))
            rows[f"ratio {d}ms {_tls_name(tls)}"] = {
                "ttfd_c_vs_a": median(ca), "ttfd_c_vs_b": median(cb), "ttfd_c_minus_b_ms": diff,
                "c_faster_than_b_share": faster,
                "total_c_vs_a": median(vs("total", "c", "a")), "total_c_vs_b": median(vs("total", "c", "b"))}
            ratio_rows.append([link, "on" if tls else "off", _ratio_cell(ca), f"{1 - median(ca):.0%}",
                               _ratio_cell(cb), f"{diff:+.2f}", f"{faster:.0%}",
                               _ratio_cell(vs("total", "c", "a")), _ratio_cell(vs("total", "c", "b"))])
    abs_table = markdown_table(["Link (one way)", "TLS", "Transport", "TTFD p50 ms", "TTFD p99 ms",
                                "server's TTFD p50 ms", "total p50 ms", "total p99 ms", "connections opened"],
                               abs_rows, "lllrrrrrr")
    ratio_table = markdown_table(
        ["Link (one way)", "TLS", "TTFD (c)/(a)", "TTFD cut vs (a)", "TTFD (c)/(b)", "TTFD (c)-(b) ms",
         "rounds (c) faster than (b)", "total (c)/(a)", "total (c)/(b)"], ratio_rows, "llrrrrrrr")

    key = f"ratio {TARGET_DELAY_MS}ms tls"
    if key in rows:
        r = rows[key]
        met_cut, met_sse = r["ttfd_c_vs_a"] <= TARGET_RATIO, r["ttfd_c_vs_b"] <= 1.0
        rows["target"] = {"ttfd_c_vs_a": r["ttfd_c_vs_a"], "ttfd_c_vs_b": r["ttfd_c_vs_b"],
                          "cut_met": float(met_cut), "sse_met": float(met_sse)}
        verdicts = [
            f"**Verdict** (issue 7, {TARGET_DELAY_MS} ms one way with TLS: lowlat-mw's time to first delta at most "
            f"{TARGET_RATIO:.0%} of HTTP with a new connection): (c)/(a) = {r['ttfd_c_vs_a']:.3f}, a "
            f"{1 - r['ttfd_c_vs_a']:.0%} cut: **{'met' if met_cut else 'not met'}**.",
            f"**Verdict** (issue 7, same link: no worse than HTTP keep-alive SSE): (c)/(b) = {r['ttfd_c_vs_b']:.3f} "
            f"(median difference {r['ttfd_c_minus_b_ms']:+.2f} ms, (c) faster in "
            f"{r['c_faster_than_b_share']:.0%} of rounds): **{'met' if met_sse else 'not met'}**.",
        ]
    else:
        verdicts = [f"**Verdict**: not measured in `{mode}` mode ({TARGET_DELAY_MS} ms with TLS is not in it)."]
    loop_totals = {tls: rows[f"ratio 0ms {_tls_name(tls)}"]["total_c_vs_b"] for tls in size.tls
                   if 0 in size.delays_ms}
    slow = [f"{'TLS' if tls else 'no TLS'} {r:.2f}" for tls, r in loop_totals.items() if r > 1]
    if slow:
        verdicts.append(
            f"Note: on loopback, lowlat-mw's total stream time exceeds SSE's (total (c)/(b): {', '.join(slow)}). "
            "With no network delay the per-delta server cost shows: each Delta is its own WebSocket frame, "
            "framed by uvicorn's websockets-sansio `send` (roughly twice the CPU of an httptools body chunk, "
            "timed in the server during development) after lowlat's encode and session bookkeeping (see the "
            "overhead suite). Time to first delta is not affected, and any network delay hides it.")
    verdict = "\n\n".join(verdicts)

    plots = _plot(size, m) if size.plot else {}
    plot_line = ("![Time to first delta: CDF at 25 ms one way with TLS, and medians by delay]"
                 "(benchmarks/transport-ttfd.png)\n\n" if plots else "")
    facts = machine_facts(mode, extra=[
        f"server: uvicorn {uvicorn.__version__} (httptools, websockets-sansio), Starlette; "
        f"client: {loop_name}, httpx {httpx.__version__}, websockets {websockets.__version__}",
        f"TLS: {m.tls_version or 'not measured'}"])
    rounds = ", ".join(f"{'loopback' if d == 0 else f'{d} ms'}: {size.rounds[d]}" for d in size.delays_ms)
    body = f"""{facts}

Reproduce: `.venv/bin/python -m benchmarks --suite transport` (this section comes from one such run;
`--quick` is the CI-sized run: loopback and 25 ms with TLS only).

**Method.** One uvicorn server process (Starlette app, `benchmarks/_transport_server.py`) serves the
demo model with no model delay ({m.tokens} small tokens, its whole canned reply) two ways: as Server-Sent
Events from a plain `StreamingResponse` on `POST /sse` (one `data:` event per token) and through the
lowlat-mw middleware on `/ws` (default settings but no rate limit); a second one serves the same app over
TLS with a certificate from a throwaway `trustme` CA the clients trust. From this process (the client,
one {loop_name}):
(a) httpx with no idle connection kept, so every request opens a new TCP (+ TLS) connection;
(b) one httpx client whose keep-alive connection is reused, reading the SSE stream to its end;
(c) one `lowlat_mw.client.AsyncClient` (Protobuf frames), connected and welcomed once, one stream per
request. Time to first delta (TTFD) runs from the start of the request (for (a): before connecting) to
the first token in the caller's hands; total to the end of the stream (SSE `[DONE]`, lowlat End); every
reply is checked against the expected text. Links: loopback (straight to the server), or through a
delaying `lowlat_mw.testing.FaultProxy` (in a process of its own) adding the one-way delay in each
direction, pipelined so it is no bandwidth limit, and one round trip before a new connection's first
bytes, as the TCP handshake over that link would cost. Each round measures every (TLS, transport)
configuration of a link once, in an order rotated by one per round, with a pause of the one-way delay
+ {SETTLE * 1000:.0f} ms after each request so that what it leaves behind (a closing connection's FIN and
TLS close_notify, lowlat's final Ack) reaches the server before the next request; rounds per link after
{size.warmup} warm-up: {rounds}. The "connections opened" column counts warm-up requests too.
"Server's TTFD" is lowlat-mw's own share of (c)'s time to first delta, from the End's timings (Request
frame in to first Delta out); the rest is the network, TLS and the client. Ratio cells: the median over
rounds of the ratio within the round, then [25th, 75th percentile].

{abs_table}

{ratio_table}

Round trips before the first delta: (a) pays the TCP handshake, with TLS the TLS 1.3 handshake, then the
request: 2 round trips (3 with TLS); (b) and (c) pay the request's one. As the delay grows, (c)/(a) tends
to 1/2 (1/3 with TLS), and (c) and (b) differ only by each side's processing.

{plot_line}{verdict}
"""
    text = f"{facts}\n\n{abs_table}\n\n{ratio_table}\n\n{verdict}"
    _check(rows)
    return SuiteResult(name=NAME, heading=HEADING, body=body, text=text, rows=rows, plots=plots)


@suite(NAME, HEADING)
def run(mode: str) -> SuiteResult:
    size = SIZES[mode]
    measured, loop_name = _collect(size)
    return report(mode, size, measured, loop_name)
