"""Shared fixtures: real uvicorn servers on loopback, in background threads.

``uvicorn_server`` is a factory fixture::

    def test_x(uvicorn_server):
        srv = uvicorn_server(make_starlette_app(model), ws="wsproto")
        ...  # srv.url == "ws://127.0.0.1:PORT/ws", srv.port, srv.stop()

Each server listens on a socket the fixture binds itself to ("127.0.0.1", 0) (or to a given
port, with SO_REUSEADDR, to restart a server on the same port), so there is no
pick-a-port-then-bind race. Every server still running at teardown is stopped and its thread
joined, with bounded waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis_support import RedisServer
from support.ports import bind_loopback
from support.time import seconds
from support.waits import wait_until_sync

START_TIMEOUT = seconds(10.0)
STOP_TIMEOUT = seconds(10.0)
WS_IMPLEMENTATIONS = ("websockets-sansio", "wsproto", "websockets")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadscope`` (`python3 dev.py test`): support.scheduling's grouping (why: its docstring)."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from support.scheduling import SuiteScheduling

    return SuiteScheduling(config, log)


@dataclass
class RunningServer:
    """A uvicorn server running in a background thread."""

    server: Any  # uvicorn.Server
    thread: threading.Thread
    port: int
    path: str = "/ws"
    errors: list[BaseException] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The WebSocket URL of the lowlat-mw endpoint."""
        return f"ws://127.0.0.1:{self.port}{self.path}"

    @property
    def http_url(self) -> str:
        """The HTTP base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Ask the server to exit (open connections get 1012) and join its thread (bounded)."""
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"uvicorn server on port {self.port} did not stop within {2 * timeout} s")


def start_uvicorn(
    app: Any,
    *,
    ws: str = "websockets-sansio",
    port: int = 0,
    path: str = "/ws",
    **config: Any,
) -> RunningServer:
    """Start `app` under uvicorn on 127.0.0.1 in a daemon thread; return once it serves."""
    import uvicorn

    sock = bind_loopback(port)
    options: dict[str, Any] = {
        "ws": ws,
        "ws_ping_interval": None,
        "ws_per_message_deflate": False,
        "log_level": "warning",
        "lifespan": "off",
        "timeout_graceful_shutdown": 3,
    }
    options.update(config)
    server = uvicorn.Server(uvicorn.Config(app, **options))
    running = RunningServer(server=server, thread=threading.Thread(), port=sock.getsockname()[1], path=path)

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # reported by the starter / at teardown
            running.errors.append(exc)
        finally:
            sock.close()

    running.thread = threading.Thread(target=run, name=f"uvicorn-{running.port}", daemon=True)
    running.thread.start()
    try:
        wait_until_sync(lambda: server.started or not running.thread.is_alive(), START_TIMEOUT, what="uvicorn to start")
    except AssertionError:
        running.stop()
        raise
    if not server.started:
        raise RuntimeError(f"uvicorn failed to start: {running.errors!r}")
    return running


_LOGGERS = ("lowlat_mw", "uvicorn", "uvicorn.error", "uvicorn.access")


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> Iterator[None]:
    """Put back what a test changed of the loggers uvicorn configures. Its ``Config`` sets them up for the whole
    process (``lowlat-mw serve``'s log config puts the lowlat_mw logger at INFO, with a handler): a later test then
    ran with INFO records it did not ask for, and pytest keeps each test's records, with what they refer to, until
    the test ends (test_churn_memory counted them as leaked connections)."""
    import logging

    saved = [(lg, lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in map(logging.getLogger, _LOGGERS)]
    yield
    for lg, level, handlers, propagate, disabled in saved:
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate, lg.disabled = propagate, disabled


@pytest.fixture(autouse=True)
def _fresh_client_log_budget() -> None:
    """Each test starts with a fresh client log budget: CLIENT_LOGS is process-wide and keyed by the client's address,
    and every in-process client is 127.0.0.1, so one test's bad frames would send the next test's lines to DEBUG."""
    from lowlat_mw.observability.logs import CLIENT_LOGS

    CLIENT_LOGS.reset()


@pytest.fixture
def unused_port() -> Iterator[int]:
    """A loopback port that is bound but not listening for the whole test: connecting is refused."""
    sock = bind_loopback(0)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture
def uvicorn_server() -> Iterator[Callable[..., RunningServer]]:
    """Factory: ``uvicorn_server(app, ws=..., port=..., path=..., **uvicorn_config)``."""
    servers: list[RunningServer] = []

    def factory(app: Any, **kwargs: Any) -> RunningServer:
        srv = start_uvicorn(app, **kwargs)
        servers.append(srv)
        return srv

    yield factory
    problems = []
    for srv in servers:
        try:
            srv.stop()
        except RuntimeError as exc:
            problems.append(str(exc))
        problems.extend(repr(e) for e in srv.errors)
    if problems:
        pytest.fail("uvicorn server teardown: " + "; ".join(problems))


def make_starlette_app(model: Any, *, routes: list[Any] | None = None, **settings: Any) -> Any:
    """A Starlette app with ``LowLatMiddleware(model=model, **settings)`` and a ``GET /health`` route."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from lowlat_mw.adapters.starlette import LowLatMiddleware

    async def health(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[Route("/health", health), *(routes or [])],
        middleware=[Middleware(LowLatMiddleware, model=model, **settings)],
    )


@pytest.fixture
def starlette_app() -> Callable[..., Any]:
    """Fixture form of :func:`make_starlette_app`."""
    return make_starlette_app


# ============================================================================ Redis
@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server (Debian's, tests/redis_support.py) on a free loopback port for the whole run, stopped at
    the end. Without redis-server the tests that use it are skipped (failed where CI=true)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The URL of the session's Redis, emptied first (FLUSHALL) so that no test sees another's keys; started
    again (same port) if an earlier test stopped it."""
    import redis

    if not redis_server.running:
        redis_server.start()
    with redis.Redis.from_url(redis_server.url, socket_timeout=5) as client:
        client.flushall()
    yield redis_server.url


# ============================================================================ benchmarks, quick mode
BENCH_SEED = ("# Benchmarks\n\nintro kept\n\n## Transport: kept\n\nother suite's table\n\n"
              "## Codec: kept\n\nanother suite's table\n")


@dataclass
class QuickBench:
    """One run of every benchmark suite in quick mode (`python -m benchmarks --quick`), shared by the tests."""

    results: dict[str, Any]  # suite name -> benchmarks.core.SuiteResult
    path: Any  # the markdown file written (seeded with BENCH_SEED)
    seconds: float

    @property
    def text(self) -> str:
        return self.path.read_text()

    def section(self, heading: str) -> str:
        """The section ``## heading`` of the file written, up to the next section."""
        text = self.text
        start = text.index(f"## {heading}")
        end = text.find("\n## ", start)
        return text[start:] if end < 0 else text[start:end + 1]


# In a process of its own: run inside pytest's (by then large) heap, the suites' gc.collect() per sample
# made the quick run take ~90 s instead of ~50.
_QUICK_BENCH = """
import pickle, sys
from benchmarks import run_suites
results = run_suites(sys.argv[3].split(","), "quick", sys.argv[1])
with open(sys.argv[2], "wb") as f:
    pickle.dump(results, f)
"""
# The suites in two processes at once (about equal halves of the 77 s they take one after the other): none
# asserts a speed, each has its own servers on free ports, and most of their time is waiting (servers starting,
# paced clients), so two at a time on 2 cores take about half the wall time.
QUICK_GROUPS = (("soak", "scale", "transport", "compression"),
                ("overhead", "shared", "frameworks", "bare", "codec", "warmup", "batch", "context"))


@pytest.fixture(scope="session")
def quick_bench(tmp_path_factory: pytest.TempPathFactory) -> QuickBench:
    """The CI smoke test of the benchmarks: every suite runs once in quick mode (the issue's "under 2 minutes").

    The per-suite tests (tests/test_benchmarks*.py) check their suite's rows and section from this one
    run instead of each running a suite of its own. Their numbers mean little on a busy machine: no
    test asserts a speed. The run is ``python -m benchmarks --quick``'s, split over two subprocesses that run at
    once (QUICK_GROUPS), their sections then written into one file.
    """
    import pickle
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]  # benchmarks/ is a top-level folder of the repository
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from benchmarks import all_suites, update_section

    assert sorted(n for g in QUICK_GROUPS for n in g) == sorted(all_suites()), "QUICK_GROUPS must name every suite"
    folder = tmp_path_factory.mktemp("bench")
    out = folder / "benchmarks.md"
    runs = []
    started = time.monotonic()
    for i, group in enumerate(QUICK_GROUPS):  # (each writes a file of its own: merged below)
        written, pickled, log = folder / f"benchmarks-{i}.md", folder / f"results-{i}.pickle", folder / f"bench-{i}.log"
        written.write_text(BENCH_SEED)
        with log.open("wb") as f:
            proc = subprocess.Popen([sys.executable, "-c", _QUICK_BENCH, str(written), str(pickled), ",".join(group)],
                                    cwd=root, stdout=f, stderr=subprocess.STDOUT)
        runs.append((proc, pickled, log))
    results = []
    try:
        for proc, pickled, log in runs:
            code = proc.wait(540)
            if code != 0:
                pytest.fail(f"benchmarks --quick exited with {code}:\n{log.read_text(errors='replace')[-6000:]}")
            with pickled.open("rb") as f:
                results.extend(pickle.load(f))  # our own subprocesses' output
    finally:
        for proc, _, _ in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    took = time.monotonic() - started
    out.write_text(BENCH_SEED)
    for result in results:  # every section into one file, as one `python -m benchmarks --quick` writes it
        update_section(out, result.heading, result.body)
    print(f"\nbenchmarks --quick: every suite in {took:.0f} s (two processes)")
    return QuickBench({r.name: r for r in results}, out, took)
