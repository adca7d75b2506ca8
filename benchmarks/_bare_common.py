"""Shared pieces of the bare and frameworks suites: child servers, HTTP probes, a raw protocol client.

Child processes run in their own session (process group), write their output to files (never
pipes), and are stopped with SIGTERM then SIGKILL to the whole group; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO
from lowlat_mw.testing import LoggedProcess

from .core import http_get

ROOT = Path(__file__).resolve().parents[1]
SUBPROTOCOLS = {"proto": SUBPROTOCOL_PROTO, "json": SUBPROTOCOL_JSON}
OPEN_TIMEOUT = 30.0  # daphne + Django on a busy 2-core machine can take several seconds to start


# ================================================================================ processes
def listening_socket() -> socket.socket:
    """A loopback TCP socket bound to a free port and listening (a child can inherit it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)  # clients queue here until the child accepts
    return sock


def free_port() -> int:
    """A loopback port that was free a moment ago (bind to port 0, read it, close)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
    finally:
        sock.close()


class Child(LoggedProcess):
    """A server subprocess in its own process group, output captured to files in `logdir`."""

    def __init__(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, port: int,
                 logdir: Path, pass_fds: Sequence[int] = ()) -> None:
        super().__init__(name, argv, logdir=logdir, env=env, cwd=ROOT, pass_fds=pass_fds)
        self.port = port

    def pids(self) -> list[int]:
        """This process and its descendants (gunicorn's master and worker)."""
        import psutil

        try:
            parent = psutil.Process(self.proc.pid)
            return [parent.pid, *(c.pid for c in parent.children(recursive=True))]
        except psutil.Error:
            return []

    def cpu_seconds(self) -> float:
        """CPU seconds of the process tree so far (every thread, including exited ones).

        On Linux each process's CPU-time clock (``clock_gettime`` on the clock id that
        ``clock_getcpuclockid(pid)`` returns: nanosecond resolution), else psutil's user + system
        time (clock-tick resolution).
        """
        return sum(process_cpu(pid) for pid in self.pids())


def process_cpu(pid: int) -> float:
    """CPU seconds process `pid` has used so far (0.0 if it is gone)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            return time.clock_gettime(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def log_dir(prefix: str) -> Path:
    """A fresh temporary folder for the servers' output (see :func:`kept_on_failure`)."""
    return Path(tempfile.mkdtemp(prefix=f"lowlat-bench-{prefix}-"))


@contextlib.contextmanager
def kept_on_failure(folder: Path) -> Iterator[None]:
    """Remove `folder` when the block succeeds; keep it (and say where) when it fails."""
    try:
        yield
    except BaseException:
        print(f"   server output kept in {folder}", file=sys.stderr, flush=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)


def python_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without LOWLAT_* settings, the repository on PYTHONPATH (benchmarks/ importable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWLAT_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def python_argv(*args: str) -> list[str]:
    return [sys.executable, *args]


# ================================================================================ HTTP
async def wait_http_ready(child: Child, path: str, timeout: float = OPEN_TIMEOUT) -> float:
    """Poll GET `path` until it answers 200; seconds it took. Raises with the child's output."""
    start = time.monotonic()
    last: object = None
    while True:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited with code {child.proc.poll()} before serving\n{child.output()}")
        try:
            status, _ = await http_get(child.port, path, timeout=2.0)
            if status == 200:
                return time.monotonic() - start
            last = f"HTTP {status}"
        except (OSError, TimeoutError) as exc:
            last = exc
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"{child.name} not ready within {timeout} s (last: {last!r})\n{child.output()}")
        await asyncio.sleep(0.05)


# ================================================================================ raw client
class RawClient:
    """lowlat-mw spoken directly over a ``websockets`` connection, as cheaply as a client can.

    It behaves on the wire like the reference client (no compression; a flow window, so it
    acknowledges: every quarter window of output and ``done`` after each End) but does as little as
    possible: Requests are encoded once, up front (stream id 1, reused after each End as
    docs/protocol.md 8.1 allows), Acks are cached by (seq, done), and incoming frames are classified by
    their first bytes (proto: header byte then the Envelope's field tag; JSON: the leading
    ``{"type":"..."``), never decoded. Server Pings are decoded and answered.
    """

    _PROTO_KIND = {0x22: "delta", 0x2A: "end", 0x32: "error", 0x42: "ping"}
    _JSON_KIND = (('{"type":"delta"', "delta"), ('{"type":"end"', "end"), ('{"type":"error"', "error"),
                  ('{"type":"ping"', "ping"))
    DELTA_COST = 64  # what the server charges a Delta beyond its chunk (docs/protocol.md 14.4)

    def __init__(self, url: str, mode: str, flow_window: int = 1024 * 1024) -> None:
        self.url = url
        self.mode = mode
        self.codec = codec_for(SUBPROTOCOLS[mode])
        self.flow_window = flow_window
        self.window = 0  # what the Welcome granted
        self.ws: Any = None
        self.seq = 0  # Deltas of the current stream
        self._unacked = 0
        self._acks: dict[tuple[int, bool], bytes | str] = {}

    async def open(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.url, subprotocols=[SUBPROTOCOLS[self.mode]],  # type: ignore[list-item]
                                compression=None, ping_interval=None, open_timeout=OPEN_TIMEOUT, proxy=None,
                                max_size=16 * 1024 * 1024)
        hello = ev.Hello(client="lowlat-bench-raw", compression=(), flow_window=self.flow_window)
        await self.ws.send(self.codec.encode(hello))
        async with asyncio.timeout(OPEN_TIMEOUT):
            welcome = self.codec.decode(await self.ws.recv(), limit=16 * 1024 * 1024, allowed=())
        if not isinstance(welcome, ev.Welcome):
            raise RuntimeError(f"raw client: expected Welcome, got {welcome!r}")
        self.window = welcome.flow_window

    def request(self, model: str, text: str | None = None, params: Mapping[str, Any] | None = None) -> bytes | str:
        """A pre-encoded Request on stream 1."""
        return self.codec.encode(ev.Request(stream_id=1, model=model, text=text, params=dict(params or {})))

    async def send_request(self, frame: bytes | str) -> None:
        """Start a stream (on stream id 1) with a frame from :meth:`request`."""
        self.seq = 0
        self._unacked = 0
        await self.ws.send(frame)

    async def ack(self, done: bool) -> None:
        """Acknowledge the current stream up to its last Delta (`done`: and its End)."""
        if not self.window:
            return
        key = (self.seq, done)
        frame = self._acks.get(key)
        if frame is None:
            frame = self._acks[key] = self.codec.encode(ev.Ack(stream_id=1, seq=self.seq, done=done))
        self._unacked = 0
        await self.ws.send(frame)

    async def next_kind(self) -> str:
        """Receive frames until a Delta or End (an Error raises); answer Pings, send Acks on the way.

        After an End, call ``ack(done=True)`` (the reference client acknowledges every stream's end).
        """
        while True:
            frame = await self.ws.recv()
            if isinstance(frame, bytes):
                kind = self._PROTO_KIND.get(frame[1], "other") if len(frame) > 1 and frame[0] == 0x10 else "other"
            else:
                kind = next((k for prefix, k in self._JSON_KIND if frame.startswith(prefix)), "other")
            if kind == "delta":
                self.seq += 1
                self._unacked += len(frame) + self.DELTA_COST  # at least the server's charge for it
                if self.window and self._unacked >= self.window // 4:
                    await self.ack(False)
                return kind
            if kind == "end":
                return kind
            if kind == "ping":
                ping = self.codec.decode(frame, limit=1 << 20, allowed=())
                await self.ws.send(self.codec.encode(ping.response()))  # type: ignore[union-attr]
                continue
            detail = frame[:200] if isinstance(frame, str) else repr(frame[:200])
            if kind == "error":
                raise RuntimeError(f"raw client: server sent an Error: {detail}")
            with contextlib.suppress(Exception):
                decoded = self.codec.decode(frame, limit=1 << 20, allowed=())
                if isinstance(decoded, ev.Pong | ev.GoAway):
                    continue
            raise RuntimeError(f"raw client: unexpected frame {detail}")

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


def loop_factory() -> tuple[Any, str]:
    """uvloop when installed (as uvicorn[standard] runs), else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return None, "asyncio event loop"
    return uvloop.new_event_loop, f"uvloop {uvloop.__version__}"
