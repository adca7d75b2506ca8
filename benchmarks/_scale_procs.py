"""Child processes of the scale suite: uvicorn servers and client processes, always killed.

Every child runs in its own session (process group) and is stopped by group, so nothing it
spawned outlives the benchmark, also when the benchmark fails half way.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from .core import http_get

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


_LIVE: set[int] = set()  # process groups started here and not yet stopped


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


@atexit.register
def _kill_leftovers() -> None:
    """Last resort (e.g. an interrupted run): no child outlives this process."""
    for pid in list(_LIVE):
        _kill_group(pid, signal.SIGKILL)
    _LIVE.clear()


class Server:
    """A benchmarks._scale_server child on a listening socket bound here (port 0: a free port)."""

    def __init__(self, kind: str, *, ws: str, heartbeat: float = 30.0, ws_ping: float = 0.0,
                 tracemalloc: int = 0, serve_gc: str = "auto") -> None:
        self.kind = kind
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(2048)  # clients queue here until the child accepts
        self.port: int = self.sock.getsockname()[1]
        args = [sys.executable, "-m", "benchmarks._scale_server", kind, "--fd", str(self.sock.fileno()),
                "--ws", ws, "--heartbeat", repr(heartbeat), "--ws-ping", repr(ws_ping)]
        if tracemalloc:
            args += ["--tracemalloc", str(tracemalloc)]
        if serve_gc != "auto":
            args += ["--serve-gc", serve_gc]
        try:
            self.proc = subprocess.Popen(args, pass_fds=(self.sock.fileno(),), cwd=ROOT, env=_env(),
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            self.sock.close()
            raise
        _LIVE.add(self.proc.pid)

    async def get(self, path: str, timeout: float = 30.0) -> dict[str, Any]:
        """GET `path` on the server's control routes; the JSON body."""
        status, body = await http_get(self.port, path, timeout)
        if status != 200:
            raise RuntimeError(f"GET {path} on the {self.kind} server answered {status}: {body[:60]!r}")
        return json.loads(body)

    async def ready(self, timeout: float = 60.0) -> None:
        """Wait until the server answers (bounded; fails at once when the process exited)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await self.get("/cpu", 1.0)
                return
            except Exception as exc:
                if self.proc.poll() is not None or loop.time() > deadline:
                    raise RuntimeError(f"{self.kind} server did not serve (exit code {self.proc.poll()}): "
                                       f"{exc!r}") from exc

    def stop(self) -> None:
        """Kill the server's process group (a benchmark server needs no graceful shutdown)."""
        self.sock.close()
        _kill_group(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        _LIVE.discard(self.proc.pid)


class ClientProc:
    """A benchmarks._scale_client child: JSON commands on its stdin, answers (by id) on its stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls, timeout: float = 60.0) -> ClientProc:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks._scale_client", cwd=ROOT, env=_env(), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, start_new_session=True, limit=1 << 24)
        _LIVE.add(proc.pid)
        self = cls(proc)
        first: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[0] = first
        try:
            async with asyncio.timeout(timeout):
                await first
        except BaseException:
            self.kill()
            raise
        return self

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    break
                msg = json.loads(line)
                fut = self._waiting.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(f"client process exited (code {self.proc.returncode})"))
            self._waiting.clear()

    async def call(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one command; its answer (RuntimeError when the client reports a failure)."""
        ident = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = fut
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({**cmd, "id": ident}) + "\n").encode())
        try:
            async with asyncio.timeout(timeout):
                await self.proc.stdin.drain()
                msg = await fut
        finally:
            self._waiting.pop(ident, None)
        if not msg.get("ok"):
            raise RuntimeError(f"client command {cmd['cmd']!r} failed: {msg.get('error')}")
        return msg

    def kill(self) -> None:
        if self.proc.returncode is None:
            _kill_group(self.proc.pid, signal.SIGKILL)
        self._reader.cancel()

    async def stop(self) -> None:
        self.kill()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10):
                await self.proc.wait()
        _LIVE.discard(self.proc.pid)
        if self.proc.stdin is not None:
            self.proc.stdin.close()


class Fleet:
    """Servers and client processes of one phase; stops all of them on exit, errors included."""

    def __init__(self) -> None:
        self.servers: dict[str, Server] = {}
        self.clients: list[ClientProc] = []

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def add_server(self, name: str, kind: str, **options: Any) -> Server:
        self.servers[name] = srv = Server(kind, **options)
        return srv

    async def start_clients(self, n: int) -> None:
        for _ in range(n):
            self.clients.append(await ClientProc.start())

    async def ready(self) -> None:
        await asyncio.gather(*(s.ready() for s in self.servers.values()))

    async def quiet(self, *, step: float = 0.025, busy: float = 0.1, limit: float = 3.0) -> float:
        """Wait until the fleet's processes (servers and clients) use less than `busy` of one core over two
        `step`s in a row, at most `limit` seconds; the seconds waited. What a burst leaves behind (the
        clients' Acks of its Ends, its streams' cleanup, the collector) then does not fall on the next one.
        (Their CPU clocks, read to the nanosecond: psutil's 10 ms ticks could not tell 2.5 ms from none.)"""
        from ._bare_common import process_cpu

        pids = [s.proc.pid for s in self.servers.values()] + [c.proc.pid for c in self.clients]

        def cpu() -> float:
            return sum(process_cpu(pid) for pid in pids)

        loop = asyncio.get_running_loop()
        start = loop.time()
        calm = 0
        last = cpu()
        while calm < 2 and loop.time() - start < limit:
            await asyncio.sleep(step)
            now = cpu()
            calm = calm + 1 if now - last < busy * step else 0
            last = now
        return loop.time() - start

    async def each(self, cmd: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
        """`cmd` sent to every client process at once; their answers."""
        return list(await asyncio.gather(*(c.call(cmd, timeout) for c in self.clients)))

    async def open(self, name: str, n: int, *, group: str | None = None, concurrency: int = 32,
                   timeout: float = 30.0) -> dict[str, Any]:
        """Open `n` more connections to server `name` (client group `group`, default `name`), split over
        the client processes."""
        srv = self.servers[name]
        k = len(self.clients)
        shares = [n // k + (1 if i < n % k else 0) for i in range(k)]
        budget = timeout + 60.0 + 0.02 * n
        answers = await asyncio.gather(*(
            c.call({"cmd": "open", "group": group or name, "port": srv.port, "n": share, "lowlat": srv.kind == "lowlat",
                    "concurrency": concurrency, "timeout": timeout}, budget)
            for c, share in zip(self.clients, shares, strict=True) if share))
        return {"opened": sum(a["opened"] for a in answers), "failed": sum(a["failed"] for a in answers),
                "errors": [e for a in answers for e in a["errors"]][:5]}

    async def stats(self, group: str) -> dict[str, Any]:
        """A client group's counters, summed over the client processes."""
        answers = await self.each({"cmd": "stats", "group": group}, 30.0)
        return {"open": sum(a["open"] for a in answers), "pings": sum(a["pings"] for a in answers),
                "lost": sum(a["lost"] for a in answers), "errors": [e for a in answers for e in a["errors"]][:5]}

    async def drop(self, servers: list[str], groups: list[str]) -> None:
        """Abort the client connections of `groups` (not counted as lost), then kill `servers`."""
        for group in groups:
            await self.each({"cmd": "drop", "group": group}, 60.0)
        for name in servers:
            srv = self.servers.pop(name)
            await asyncio.to_thread(srv.stop)

    async def close(self) -> None:
        clients, self.clients = self.clients, []
        servers, self.servers = self.servers, {}
        await asyncio.gather(*(c.stop() for c in clients), return_exceptions=True)
        for srv in servers.values():
            await asyncio.to_thread(srv.stop)
