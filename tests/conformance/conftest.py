"""Conformance suite: every example app, in its real server, as a subprocess on loopback.

Each framework's example (``examples/``) is started the way its docstring says (uvicorn for
Starlette and FastAPI, daphne for Django Channels, gunicorn's gthread worker for Flask) with
``LOWLAT_MODEL=conformance_models:MODELS``, so all four serve the same models, picked per request
by the Request's ``model`` field. Settings reach every server through ``LOWLAT_*`` variables.

Fixtures:

* ``server``: the "default" server of one framework (session scope, parametrized by framework
  id, so each starts once and is stopped when the suite moves on to the next framework).
* ``timer_server``: the same, with short heartbeat / idle / handshake timers (``SHORT_TIMERS``).
* ``launch``: factory for test-specific processes (stopped at the end of the test).
* ``marks_dir``: where the models write ``<tag>.closed`` markers (``CONFORMANCE_MARKS``).

The process machinery (ports, command lines, environments, bounded start/stop) is in
``conformance_servers.py``; raw-client helpers are in tests/support/raw.py (shared with tests/integration).
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from conformance_servers import DIRECT_OFF, FRAMEWORKS, SERVERS, ServerProcess, running_server, spawn, start_ready
from conformance_support import MEASUREMENTS, SHORT_TIMERS, STARTUP_TIMES
from support.scheduling import param_named


# ================================================================================ fixtures
@pytest.fixture(scope="session")
def conformance_dir() -> Iterator[Path]:
    """Session temp dir: server logs, the marker dir, the Django database."""
    with tempfile.TemporaryDirectory(prefix="lowlat-conformance-") as d:
        root = Path(d)
        (root / "logs").mkdir()
        (root / "marks").mkdir()
        yield root


@pytest.fixture(scope="session")
def marks_dir(conformance_dir: Path) -> Path:
    """CONFORMANCE_MARKS of every server: models write ``<tag>.closed`` there."""
    return conformance_dir / "marks"


def _session_server(request: pytest.FixtureRequest, conformance_dir: Path, kind: str,
                    extra: Mapping[str, str]) -> Iterator[ServerProcess]:
    framework = request.param
    yield from running_server(f"{kind}-{framework}", framework, conformance_dir, extra, STARTUP_TIMES)


@pytest.fixture(scope="session", params=(*FRAMEWORKS, DIRECT_OFF))
def server(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    """The default-settings conformance server of one framework (and the Starlette one with direct writes off)."""
    yield from _session_server(request, conformance_dir, "default", {})


@pytest.fixture(scope="session", params=SERVERS)
def timer_server(request: pytest.FixtureRequest, conformance_dir: Path) -> Iterator[ServerProcess]:
    """A conformance server with short heartbeat, idle and handshake timers (SHORT_TIMERS), on every server."""
    yield from _session_server(request, conformance_dir, "timers", SHORT_TIMERS)


@pytest.fixture(autouse=True)
def _servers_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail with the server's output (not a bare connection error) if a shared server has died."""
    used = [request.getfixturevalue(name) for name in ("server", "timer_server") if name in request.fixturenames]
    for srv in used:
        if not srv.alive():
            pytest.fail(f"{srv.name} is not running (exit code {srv.proc.returncode})\n{srv.output()}")
    yield
    for srv in used:
        if not srv.alive():
            pytest.fail(f"{srv.name} died during this test (exit code {srv.proc.returncode})\n{srv.output()}")


@pytest.fixture
def launch(conformance_dir: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Factory: ``launch(name, framework, argv_for_port, env)``; stopped at the end of the test."""
    started: list[ServerProcess] = []

    def factory(name: str, framework: str, argv_for_port: Callable[[int], list[str]],
                env: Mapping[str, str], *, ready: bool = True) -> ServerProcess:
        if ready:
            srv = start_ready(name, framework, argv_for_port, env, conformance_dir / "logs")
        else:
            srv = spawn(name, framework, argv_for_port, env, conformance_dir / "logs")
        started.append(srv)
        return srv

    yield factory
    for srv in started:
        srv.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Server-level modules (``SERVER_LEVEL = True``) run the ``server`` fixture on SERVERS only
    (not the FastAPI example: see conformance_servers.SERVERS); the rest are deselected, visibly."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        framework = callspec.params.get("server") if callspec is not None else None
        server_level = getattr(getattr(item, "module", None), "SERVER_LEVEL", False)
        (drop if server_level and framework is not None and framework not in SERVERS else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# ================================================================================ reporting
_DURATIONS: dict[str, float] = defaultdict(float)
_COUNTS: dict[str, int] = defaultdict(int)


def _framework_of(nodeid: str) -> str:
    found = param_named(nodeid, (*FRAMEWORKS, *SERVERS))
    if found is not None:
        return found
    return "django" if "test_conformance_django.py" in nodeid else "other"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "conformance" not in report.nodeid:
        return
    fw = _framework_of(report.nodeid)
    _DURATIONS[fw] += report.duration
    if report.when == "call":
        _COUNTS[fw] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _DURATIONS:
        return
    tr = terminalreporter
    tr.write_sep("-", "lowlat-mw conformance")
    for fw in (*FRAMEWORKS, "wsproto", DIRECT_OFF, "other"):
        if fw in _DURATIONS:
            tr.write_line(f"{fw:10s} {_COUNTS[fw]:4d} tests  {_DURATIONS[fw]:7.1f} s (setup+call+teardown)")
    for name, times in sorted(STARTUP_TIMES.items()):
        tr.write_line(f"server {name}: started {len(times)}x, ready after {', '.join(f'{t:.2f}' for t in times)} s")
    for name, value in sorted(MEASUREMENTS.items()):
        tr.write_line(f"{name}: {value}")
