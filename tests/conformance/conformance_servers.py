"""Server processes for the conformance suite: ports, command lines, environments, start and stop.

Output goes to files (never pipes, which a chatty server could fill and block). Every wait is
bounded; ``ServerProcess.stop`` sends SIGTERM, then SIGKILL to the whole process group.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from support.ports import free_port

from lowlat_mw.errors import SettingsError
from lowlat_mw.servers.serving import daphne_args, gunicorn_args, uvicorn_args
from lowlat_mw.settings import Settings
from lowlat_mw.testing import LoggedProcess

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENV_BIN = Path(sys.prefix) / "bin"
FRAMEWORKS = ("starlette", "fastapi", "django", "flask")
# Every server we ship with, for the server-level tests (limits, timers, transport, delivery, load,
# shutdown): uvicorn websockets-sansio (the Starlette example), uvicorn wsproto (the same app,
# "wsproto"), daphne (Django) and gunicorn (Flask), and the Starlette example with direct writes off
# ("asgi": LOWLAT_DIRECT_WRITES=false, every frame through ASGI send, as under any server that offers no
# direct writes; our uvicorn protocols offer them). The FastAPI example is not among them: it is the
# same LowLatMiddleware under the same uvicorn protocols as the Starlette one, so those modules would
# run the same code twice. It runs the framework-level modules (handshake, streaming, cancel, bad
# frames, merge, metrics, examples, startup) with the other frameworks.
SERVERS = ("starlette", "django", "flask", "wsproto", "asgi")
DIRECT_OFF = "asgi"
# Where frames are written straight to the socket (lowlat_mw.runtime.direct): our uvicorn protocols, our daphne
# runner (lowlat_mw.servers.daphne.DaphneDirect) and the Flask adapter's thread bridge (SocketWriter).
DIRECT_WRITES = frozenset({"starlette", "fastapi", "wsproto", "serve", "django", "flask"})
DIRECT_READS = frozenset({"starlette", "fastapi", "serve", "django"})  # (our wsproto protocol offers writes only)

START_TIMEOUT = 30.0  # daphne + Django on a busy 2-core machine can take a few seconds
_PORT_IN_USE = re.compile(r"address already in use|errno 98|couldn't listen|cannot listen", re.I)


# ================================================================================ processes
def transport_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The settings a server started with `env` runs with (defaults if they are invalid: startup tests)."""
    try:
        return Settings.load(env={k: v for k, v in (env or {}).items() if k.startswith("LOWLAT_")})
    except SettingsError:
        return Settings()


def server_argv(framework: str, port: int, app: str | None = None, extra: Sequence[str] = (),
                env: Mapping[str, str] | None = None, ws: str = "websockets-sansio") -> list[str]:
    """The command line that serves `framework`'s example (or `app`) on 127.0.0.1:`port`.

    Each server gets the transport options that match the settings in `env` (lowlat_mw.servers.serving,
    docs/security.md "Transport"), as the examples' "Run:" lines do.
    """
    settings = transport_settings(env)
    if framework == "wsproto":
        framework, ws = "starlette", "wsproto"
    if framework == DIRECT_OFF:
        framework = "starlette"  # ServerProcess adds LOWLAT_DIRECT_WRITES=false
    if framework in ("starlette", "fastapi"):
        return [str(VENV_BIN / "uvicorn"), app or f"examples.{framework}_app:app", "--host", "127.0.0.1",
                "--port", str(port), *uvicorn_args(settings, ws), *extra]
    if framework == "django":
        return [str(VENV_BIN / "python"), "-m", "lowlat_mw.servers.daphne", "-b", "127.0.0.1", "-p", str(port),
                *daphne_args(settings), *extra, app or "examples.django_project.asgi:application"]
    if framework == "serve":  # `lowlat-mw serve` itself (uvicorn, configured by lowlat_mw.servers.serving.run)
        return [str(VENV_BIN / "lowlat-mw"), "serve", app or "conformance_models:MODELS", "--host", "127.0.0.1",
                "--port", str(port), "--log-level", "warning", *extra]
    if framework == "flask":
        return [str(VENV_BIN / "gunicorn"), *gunicorn_args(settings), "--threads", "300", "-b", f"127.0.0.1:{port}",
                *extra, app or "examples.flask_app:app"]
    raise ValueError(framework)


def server_env(extra: Mapping[str, str] | None = None, *, pythonpath: bool = True) -> dict[str, str]:
    """A clean environment for a server: the venv's bin first, no stray LOWLAT_* / Django variables."""
    drop = {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "GUNICORN_CMD_ARGS", "LOWLAT_MODEL"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWLAT_") and k not in drop}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    # gunicorn >= 25 opens a control socket in ~/.gunicorn by default: one path for every instance.
    env["GUNICORN_CMD_ARGS"] = "--no-control-socket"
    if pythonpath:  # (tests/: the helpers these modules import, tests/support, for a process run from one of them)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), str(REPO)])
    env.update(extra or {})
    return env


class ServerProcess(LoggedProcess):
    """One conformance server subprocess (its framework's example, or `argv`) with its output in files."""

    def __init__(self, name: str, framework: str, port: int, argv: Sequence[str], env: Mapping[str, str],
                 logdir: Path) -> None:
        if framework == DIRECT_OFF:
            env = {**env, "LOWLAT_DIRECT_WRITES": "false"}
        super().__init__(name, argv, logdir=logdir, env=env, cwd=REPO)
        self.framework = framework
        self.port = port
        self.started_at = time.monotonic()
        self.ready_after: float | None = None

    def __repr__(self) -> str:
        return f"ServerProcess({self.name!r}, port={self.port}, pid={self.proc.pid})"

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def origin(self) -> str:
        """The same-host Origin a browser on this server's pages would send."""
        return f"http://127.0.0.1:{self.port}"

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None if still running after `timeout` s."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def spawn(name: str, framework: str, argv_for_port: Callable[[int], list[str]], env: Mapping[str, str],
          logdir: Path, *, port: int | None = None) -> ServerProcess:
    """Start a process; output to ``logdir/<name>.stdout|stderr``."""
    port = port or free_port()
    return ServerProcess(name, framework, port, argv_for_port(port), env, logdir)


def http_get(port: int, path: str = "/health", timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body) of GET http://127.0.0.1:port/path."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_ready(srv: ServerProcess, timeout: float = START_TIMEOUT, path: str | None = None) -> None:
    """Poll GET `path` until it answers 200; raise with the server's output if it dies or hangs."""
    path = path or ("/" if srv.framework == "serve" else "/health")  # `lowlat-mw serve` has no /health
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        code = srv.proc.poll()
        if code is not None:
            raise ServerDied(srv, f"{srv.name} exited with code {code} before serving\n{srv.output()}")
        try:
            status, _ = http_get(srv.port, path, timeout=1.0)
            if status == 200:
                srv.ready_after = time.monotonic() - srv.started_at
                return
            last = f"HTTP {status}"
        except (OSError, http.client.HTTPException) as exc:
            last = exc
        if time.monotonic() > deadline:
            srv.stop()
            raise RuntimeError(f"{srv.name} not ready within {timeout} s (last: {last!r})\n{srv.output()}")
        time.sleep(0.05)


class ServerDied(RuntimeError):
    def __init__(self, srv: ServerProcess, message: str) -> None:
        super().__init__(message)
        self.srv = srv


def start_ready(name: str, framework: str, argv_for_port: Callable[[int], list[str]], env: Mapping[str, str],
                logdir: Path, *, attempts: int = 3) -> ServerProcess:
    """spawn() + wait_ready(), retrying on another port if the picked one was taken meanwhile."""
    for attempt in range(attempts):
        srv = spawn(f"{name}-try{attempt}" if attempt else name, framework, argv_for_port, env, logdir)
        try:
            wait_ready(srv)
            return srv
        except ServerDied as exc:
            srv.stop()
            if attempt + 1 < attempts and _PORT_IN_USE.search(srv.output()):
                continue
            raise RuntimeError(str(exc)) from None
    raise AssertionError("unreachable")


def base_env(conformance_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a conformance server: the conformance models, markers and a temp Django DB.

    ``drain_grace`` is 1 s: stopping a server (SIGTERM) drains it, and a stream still running then
    must not hold the stop for the default 30 s (test_conformance_shutdown.py tests the drain itself).
    The result cache is on (``cache_size`` 1 MiB): it only ever touches the models marked deterministic
    (conformance_models.det, test_conformance_cache.py), so every other test sees default behaviour. Batches of the
    models marked batch-capable hold 4 requests and wait for them as long as 30 s (a batch goes when full:
    test_conformance_batch.py sends 8 at once and gets two calls, whatever the load); no other model batches.
    """
    return server_env({
        "LOWLAT_MODEL": "conformance_models:MODELS",
        "LOWLAT_DRAIN_GRACE": "1",
        "LOWLAT_CACHE_SIZE": "1048576",
        "LOWLAT_MAX_BATCH_SIZE": "4",
        "LOWLAT_MAX_BATCH_WAIT": "30",
        "CONFORMANCE_MARKS": str(conformance_dir / "marks"),
        "DJANGO_DB": str(conformance_dir / "django.sqlite3"),
        **(extra or {}),
    })


def running_server(name: str, framework: str, conformance_dir: Path, extra: Mapping[str, str],
                   startup_times: dict[str, list[float]]) -> Iterator[ServerProcess]:
    """Fixture body: start a framework's example app with `extra` env, yield it, stop it.

    Records the start-up time under `name`, and fails the test if the server died meanwhile.
    """
    import pytest

    env = base_env(conformance_dir, extra)
    srv = start_ready(name, framework, lambda p: server_argv(framework, p, env=env), env, conformance_dir / "logs")
    startup_times.setdefault(name, []).append(srv.ready_after or 0.0)
    try:
        yield srv
    finally:
        died = srv.proc.poll()
        srv.stop()
        if died is not None:
            pytest.fail(f"{srv.name} died during the tests (code {died})\n{srv.output()}")


def wait_for_line(proc: LoggedProcess, needle: str, bound: float = 30.0) -> str:
    """The captured stderr once it contains `needle` (bounded)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        text = proc.stderr_path.read_text(errors="replace")
        if needle in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"no {needle!r} in {proc.name}'s stderr within {bound} s\n{proc.output()}")
