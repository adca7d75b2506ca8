"""Django composition: the consumer behind AllowedHostsOriginValidator(AuthMiddlewareStack(...)) in daphne.

Django-only by nature (Channels middleware), so these tests are not parametrized by framework.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conformance_servers import (
    HERE,
    REPO,
    VENV_BIN,
    ServerProcess,
    base_env,
    free_port,
    server_argv,
    server_env,
    start_ready,
    wait_for_line,
)
from conformance_support import MODES
from guide_support import guide_block
from support.ports import wait_listening  # (tests/: the guides' code blocks)
from support.raw import PROTO, raw_connect
from test_conformance_backpressure import CHUNK, CHUNKS, SLOW_CONSUMER_TIMEOUT, no_ack_client_gets_4003
from websockets.exceptions import InvalidStatus

from lowlat_mw import Backoff, ConnectionClosed, ErrorCode, StreamError
from lowlat_mw.client import connect
from lowlat_mw.protocol import events as ev
from lowlat_mw.testing import LoggedProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

USERNAME = "alice"


@dataclass
class Composed:
    server: ServerProcess
    sessionid: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def origin(self) -> str:
        return self.server.origin


def _run(argv: list[str], env: dict[str, str], what: str) -> str:
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def composed(conformance_dir: Path) -> Iterator[Composed]:
    env = base_env(conformance_dir, {
        "DJANGO_DB": str(conformance_dir / "composed.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "examples.django_project.settings",
    })
    _run([str(VENV_BIN / "django-admin"), "migrate", "--noinput"], env, "django-admin migrate")
    sessionid = _run([sys.executable, str(HERE / "conformance_django_login.py"), USERNAME], env,
                     "creating a user and a session").strip()
    assert sessionid
    srv = start_ready("django-composed", "django",
                      lambda p: server_argv("django", p, app="conformance_django_asgi:application"), env,
                      conformance_dir / "logs")
    try:
        yield Composed(srv, sessionid)
    finally:
        srv.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_matching_origin_streams(composed, mode):
    async with asyncio.timeout(20), connect(composed.url, mode=mode, headers={"Origin": composed.origin}) as client:
        assert await client.complete("x", model="agen", params={"n": 3}) == "a0;a1;a2;"
        assert await client.complete("x", model="user") == "user:AnonymousUser"


@pytest.mark.parametrize(
    ("origin", "refused_by"),
    [
        ("http://evil.example", "AllowedHostsOriginValidator"),
        (None, "AllowedHostsOriginValidator (no Origin header)"),
        ("http://localhost:{port}", "lowlat-mw (allowed host, but not the same host as Host: 127.0.0.1)"),
    ],
    ids=["foreign", "no-origin", "other-allowed-host"],
)
async def test_bad_origin_is_refused(composed, origin, refused_by):
    headers = {"Origin": origin.format(port=composed.server.port)} if origin else {}
    with pytest.raises(InvalidStatus) as info:
        async with raw_connect(composed.url, [PROTO], additional_headers=headers):
            pass
    assert info.value.response.status_code == 403, refused_by
    # the Python client reports it as a final refusal, without retrying
    async with asyncio.timeout(10):
        client = connect(composed.url, headers=headers, backoff=Backoff(retries=0))
        with pytest.raises(ConnectionClosed, match="403"):
            await client.open()
        await client.close()


@pytest.mark.parametrize("mode", MODES)
async def test_authenticated_user_reaches_the_model(composed, mode):
    headers = {"Origin": composed.origin, "Cookie": f"sessionid={composed.sessionid}"}
    async with asyncio.timeout(20):
        async with connect(composed.url, mode=mode, headers=headers) as client:
            assert await client.complete("x", model="user") == f"user:{USERNAME}"
            assert await client.complete("x", model="agen", params={"n": 2}) == "a0;a1;"
        bogus = {"Origin": composed.origin, "Cookie": "sessionid=not-a-session"}
        async with connect(composed.url, mode=mode, headers=bogus) as client:
            assert await client.complete("x", model="user") == "user:AnonymousUser"


# ---------------------------------------------------------------- the guide, followed in a new project

GUIDE_MODEL = '''async def generate(req):
    for word in ("hello", " from", " runserver"):
        yield word
'''


def _new_project(tmp_path: Path, env: dict[str, str], settings_block: str, model: str = GUIDE_MODEL) -> Path:
    """`django-admin startproject mysite` + `startapp myapp`, then the guide's routing.py, asgi.py and
    `settings_block` (appended to settings.py), with `model` as myapp/ai.py (default: a model that streams three
    words)."""
    tmp_path.mkdir(parents=True)
    _run([str(VENV_BIN / "django-admin"), "startproject", "mysite", str(tmp_path)], env, "startproject")
    subprocess.run([sys.executable, "manage.py", "startapp", "myapp"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=120)
    (tmp_path / "myapp" / "routing.py").write_text(guide_block("django.md", "# routing.py"))
    (tmp_path / "myapp" / "ai.py").write_text(model)
    (tmp_path / "mysite" / "asgi.py").write_text(guide_block("django.md", "# asgi.py"))
    with open(tmp_path / "mysite" / "settings.py", "a") as f:
        f.write("\n" + settings_block)
    return tmp_path


def _runserver(project: Path, env: dict[str, str], logdir: Path, name: str,
               reload: bool = False) -> tuple[LoggedProcess, int]:
    """`manage.py runserver` on a free port (`reload`: with Django's autoreloader, as by default: the server runs
    in a child process; stop() ends the process group, both)."""
    port = free_port()
    proc = LoggedProcess(name, [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}",
                                *(() if reload else ("--noreload",))], logdir=logdir, env=env, cwd=project)
    return proc, port


def _project_env(conformance_dir: Path) -> dict[str, str]:
    env = server_env()
    env.pop("DJANGO_SETTINGS_MODULE", None)  # (manage.py sets mysite.settings)
    return env


async def test_a_new_project_following_the_guide_streams_under_runserver(tmp_path, conformance_dir):
    env = _project_env(conformance_dir)
    settings = guide_block("django.md", "# settings.py", "ASGI_APPLICATION") \
        + guide_block("django.md", "# settings.py", "LOGGING")
    project = _new_project(tmp_path / "site", env, settings)
    proc, port = _runserver(project, env, conformance_dir / "logs", "django-runserver-guide")
    try:
        assert wait_listening(port, proc.alive, proc.output), proc.output()
        async with asyncio.timeout(30), connect(f"ws://127.0.0.1:{port}/ws") as client:
            assert await client.complete("hi") == "hello from runserver"
        text = await asyncio.to_thread(wait_for_line, proc, "closed by client")  # the guide's LOGGING
        assert "connection " in text and " open: " in text, text
    finally:
        proc.stop()


async def test_the_guides_logging_shows_each_line_once_under_the_daphne_runner(tmp_path, conformance_dir):
    """Issue 38: the guide's LOGGING doubled every lowlat-mw line under `python -m lowlat_mw.servers.daphne`:
    the lowlat_mw logger's own handler, then the root logger's, which daphne's command line configures."""
    env = _project_env(conformance_dir)
    settings = guide_block("django.md", "# settings.py", "ASGI_APPLICATION") \
        + guide_block("django.md", "# settings.py", "LOGGING")
    project = _new_project(tmp_path / "site", env, settings)
    command = guide_block("django.md", "python -m lowlat_mw.servers.daphne -b 127.0.0.1 -p 8000 \\", lang="sh")
    port = free_port()
    argv = [sys.executable if a == "python" else str(port) if a == "8000" else a
            for a in shlex.split(command.replace("\\\n", " "))]
    proc = LoggedProcess("django-daphne-guide-logging", argv, logdir=conformance_dir / "logs", env=env, cwd=project)
    try:
        assert wait_listening(port, proc.alive, proc.output), proc.output()
        async with asyncio.timeout(30), connect(f"ws://127.0.0.1:{port}/ws") as client:
            assert await client.complete("hi") == "hello from runserver"
        await asyncio.to_thread(wait_for_line, proc, "closed by client")
        text = proc.output(limit=100_000)
        opened = [line for line in text.splitlines() if "connection " in line and " open: " in line]
        closed = [line for line in text.splitlines() if "closed by client" in line]
        assert len(opened) == 1 and len(closed) == 1, text
    finally:
        proc.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_a_request_over_1_mib_under_runserver_gets_message_too_big(tmp_path, conformance_dir, mode):
    # Issue 38, item 15, what the new user did: the guide's project under `manage.py runserver` (daphne's), a JSON
    # request over 1 MiB. daphne's autobahn dropped the TCP connection (1006); the client resumed, sent it again,
    # lost it again and raised ResumeFailed "stream 2 is unknown to this session". Now: Error message_too_big and
    # close 1009 (ConnectionClosed), as on every other server, and no resume. (Proto compresses the request under
    # the frame limit: the server's max_request_size answers on the stream, the connection goes on.)
    env = _project_env(conformance_dir)
    settings = guide_block("django.md", "# settings.py", "ASGI_APPLICATION")
    project = _new_project(tmp_path / "big", env, settings)
    proc, port = _runserver(project, env, conformance_dir / "logs", f"django-runserver-too-big-{mode}", reload=True)
    try:
        assert wait_listening(port, proc.alive, proc.output), proc.output()
        backoff = Backoff(base=0.05, cap=0.2, retries=2, jitter=False)
        async with asyncio.timeout(30), connect(f"ws://127.0.0.1:{port}/ws", mode=mode, backoff=backoff) as client:
            assert await client.complete("hi") == "hello from runserver"
            if mode == "json":
                with pytest.raises(ConnectionClosed) as closed:
                    await client.complete("x" * (1024 * 1024 + 10))
                assert closed.value.code == 1009, closed.value
                assert client.last_error is not None and client.last_error.code is ErrorCode.MESSAGE_TOO_BIG
            else:
                with pytest.raises(StreamError) as refused:
                    await client.complete("x" * (1024 * 1024 + 10))
                assert refused.value.code is ErrorCode.MESSAGE_TOO_BIG
                assert await client.complete("hi") == "hello from runserver"
            assert client.connections == 1 and client.resumes == 0
    finally:
        proc.stop()


# ---------------------------------------------------------------- which server runs lowlat-mw's daphne runner
# The adapter used to call lowlat_mw.servers.daphne.install() whenever daphne.server was imported, and daphne's app
# config imports it in every process of a project with "daphne" in INSTALLED_APPS (the guide's): a project served by
# uvicorn got daphne patched (and daphne.cli imported), plain `daphne` silently became our runner, and runserver got
# half of it (daphne's own Server with our protocol). Now only runserver gets the runner, whole.

# Run before the server's own code (python -c): at exit, one line saying what the process did to daphne.
REPORT = """\
import atexit, json, signal, sys

SERVED = []

def _report():
    state = {"adapter imported": "lowlat_mw.adapters.channels" in sys.modules,
             "daphne.server imported": "daphne.server" in sys.modules,
             "daphne.cli imported": "daphne.cli" in sys.modules,
             "runner imported": "lowlat_mw.servers.daphne" in sys.modules}
    if state["daphne.server imported"]:
        import daphne.server
        from daphne.http_protocol import HTTPFactory
        from daphne.ws_protocol import WebSocketFactory
        state["daphne's factories"] = (daphne.server.HTTPFactory is HTTPFactory
                                       and daphne.server.WebSocketFactory is WebSocketFactory)
    if state["daphne.cli imported"]:
        import daphne.cli
        import daphne.endpoints
        endpoints = daphne.endpoints.build_endpoint_description_strings
        state["daphne's cli"] = (daphne.cli.CommandLineInterface.server_class is daphne.server.Server
                                 and daphne.cli.build_endpoint_description_strings is endpoints)
    if SERVED:
        state["server class"] = type(SERVED[0].server).__module__ + "." + type(SERVED[0].server).__name__
    print("REPORT " + json.dumps(state), flush=True)

atexit.register(_report)
# uvicorn raises the SIGTERM it caught again once it has shut down: exit then (the report runs), not by the signal
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
"""
UNDER_UVICORN = REPORT + "import uvicorn\nuvicorn.main()\n"  # (click: sys.argv[1:] are uvicorn's arguments)
UNDER_DAPHNE = REPORT + ("from daphne.cli import CommandLineInterface\n"  # what the `daphne` command does
                         "SERVED.append(CommandLineInterface())\nSERVED[0].run(sys.argv[1:])\n")


async def _served_then_reported(project: Path, env: dict[str, str], logdir: Path, name: str,
                                argv: list[str], port: int) -> dict[str, object]:
    """Run `argv` (a server of the guide's project on `port`), stream one reply through it, stop it (SIGTERM): the
    state its REPORT printed at exit."""
    proc = LoggedProcess(name, argv, logdir=logdir, env=env, cwd=project)
    try:
        assert wait_listening(port, proc.alive, proc.output), proc.output()
        async with asyncio.timeout(30), connect(f"ws://127.0.0.1:{port}/ws") as client:
            assert await client.complete("hi") == "hello from runserver"
    finally:
        proc.stop()
    lines = [line for line in proc.stdout_path.read_text().splitlines() if line.startswith("REPORT ")]
    assert len(lines) == 1, proc.output()
    return json.loads(lines[0].removeprefix("REPORT "))


async def test_a_project_served_by_uvicorn_leaves_daphne_as_it_is(tmp_path, conformance_dir):
    # (a) The guide's project ("daphne" in INSTALLED_APPS) served by uvicorn: daphne.server is imported (daphne's app
    # config), the adapter too (the routing), and nothing of daphne is changed or imported by lowlat-mw.
    env = _project_env(conformance_dir)
    project = _new_project(tmp_path / "site", env, guide_block("django.md", "# settings.py", "ASGI_APPLICATION"))
    port = free_port()
    state = await _served_then_reported(project, env, conformance_dir / "logs", "django-guide-under-uvicorn",
                                        [sys.executable, "-c", UNDER_UVICORN, "--host", "127.0.0.1", "--port",
                                         str(port), "mysite.asgi:application"], port)
    assert state == {"adapter imported": True, "daphne.server imported": True, "daphne.cli imported": False,
                     "runner imported": False, "daphne's factories": True}, state


async def test_plain_daphne_stays_plain_daphne(tmp_path, conformance_dir):
    # (b) The guide's project under `daphne` itself: daphne's Server, factories and command line, not our runner's
    # (production runs `python -m lowlat_mw.servers.daphne`; docs/django.md says what plain daphne lacks).
    env = _project_env(conformance_dir)
    project = _new_project(tmp_path / "site", env, guide_block("django.md", "# settings.py", "ASGI_APPLICATION"))
    port = free_port()
    state = await _served_then_reported(project, env, conformance_dir / "logs", "django-guide-under-daphne",
                                        [sys.executable, "-c", UNDER_DAPHNE, "-b", "127.0.0.1", "-p", str(port),
                                         "mysite.asgi:application"], port)
    assert state == {"adapter imported": True, "daphne.server imported": True, "daphne.cli imported": True,
                     "runner imported": False, "daphne's factories": True, "daphne's cli": True,
                     "server class": "daphne.server.Server"}, state


BIG_MODEL = f'''async def generate(req):
    for _ in range({CHUNKS}):
        yield "x" * {CHUNK}
'''


async def test_a_client_that_stops_reading_under_runserver_gets_4003_with_bounded_memory(tmp_path, conformance_dir):
    # (c) runserver gets the runner whole: its server is the runner's DrainingServer (direct writes, flow control),
    # not daphne's own Server with our protocol, whose ASGI send never waited (the whole output queued, no 4003). As
    # test_conformance_backpressure.py on every server, here on the guide's project under `manage.py runserver`.
    env = {**_project_env(conformance_dir), "LOWLAT_SLOW_CONSUMER_TIMEOUT": str(SLOW_CONSUMER_TIMEOUT)}
    project = _new_project(tmp_path / "slow", env, guide_block("django.md", "# settings.py", "ASGI_APPLICATION"),
                           model=BIG_MODEL)
    proc, port = _runserver(project, env, conformance_dir / "logs", "django-runserver-slow-consumer")
    try:
        assert wait_listening(port, proc.alive, proc.output), proc.output()
        await no_ack_client_gets_4003("runserver", f"ws://127.0.0.1:{port}/ws", port, proc.proc.pid,
                                      proc.stderr_path, ev.Request(stream_id=1, text="much"))
    finally:
        proc.stop()


async def test_without_the_guides_settings_runserver_does_what_the_guide_says(tmp_path, conformance_dir):
    """Without daphne in INSTALLED_APPS: Django's WSGI runserver, the handshake answered 404. Without
    ASGI_APPLICATION: daphne's runserver does not start."""
    env = _project_env(conformance_dir)
    project = _new_project(tmp_path / "wsgi", env, 'INSTALLED_APPS = [*INSTALLED_APPS, "myapp"]\n')
    proc, port = _runserver(project, env, conformance_dir / "logs", "django-runserver-no-daphne")
    try:
        assert wait_listening(port, proc.alive, proc.output), proc.output()
        with pytest.raises(InvalidStatus) as info:
            async with asyncio.timeout(30), raw_connect(f"ws://127.0.0.1:{port}/ws", [PROTO]):
                pass
        assert info.value.response.status_code == 404
    finally:
        proc.stop()
    project = _new_project(tmp_path / "noasgi", env, 'INSTALLED_APPS = ["daphne", *INSTALLED_APPS, "myapp"]\n')
    proc, port = _runserver(project, env, conformance_dir / "logs", "django-runserver-no-asgi-app")
    try:
        assert not wait_listening(port, proc.alive, proc.output), proc.output()
        assert proc.proc.wait(30) != 0
        assert "ASGI_APPLICATION" in proc.output(), proc.output()
    finally:
        proc.stop()
