"""A misspelt setting stops the server at startup, with a message naming it, on every framework.

Two sources per framework: the framework's own idiom (``settings.LOWLAT_MW``, ``app.config``,
middleware keyword arguments; the ``bad_*`` modules next to this file) and a ``LOWLAT_*``
environment variable read by the unmodified example.
"""

from __future__ import annotations

import http.client
import json
import os
import time

import pytest
from conformance_servers import VENV_BIN, base_env, http_get, server_argv

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

EXIT_BOUND = 30.0
TYPO = "idle_timout"

BAD_APPS = {
    "starlette": "bad_starlette_app:app",
    "fastapi": "bad_fastapi_app:app",
    "django": None,  # the example's asgi module with DJANGO_SETTINGS_MODULE=bad_django_settings
    "flask": "bad_flask_app:app",
}


def _wait_exit_or_serving(srv, bound: float = EXIT_BOUND) -> int | None:
    """The exit code, or None as soon as the server answers HTTP at all (it started despite the typo)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        code = srv.wait_exit(0.1)
        if code is not None:
            return code
        try:
            http_get(srv.port, timeout=0.5)  # any status (a 500 too): the server is up and serving
            return None
        except (OSError, http.client.HTTPException):
            pass
    raise AssertionError(f"{srv.name} neither exited nor served within {bound} s\n{srv.output()}")


def _launch_bad(launch, conformance_dir, framework: str, source: str, extra_args=(), bad: dict | None = None):
    env_extra = {"BAD_SETTINGS": json.dumps(bad)} if bad is not None else {}
    app = None
    if source == "env":
        env_extra["LOWLAT_IDLE_TIMOUT"] = "5"
    elif framework == "django":
        env_extra["DJANGO_SETTINGS_MODULE"] = "bad_django_settings"
    else:
        app = BAD_APPS[framework]
    env = base_env(conformance_dir, env_extra)
    return launch(f"bad-{framework}-{source}{'-'.join(('', *extra_args))}", framework,
                  lambda p: server_argv(framework, p, app=app, extra=extra_args, env=env), env, ready=False)


@pytest.mark.parametrize("source", ["config", "env"])
@pytest.mark.parametrize("framework", ["starlette", "fastapi", "django", "flask"])
def test_unknown_setting_fails_startup(launch, conformance_dir, framework, source):
    srv = _launch_bad(launch, conformance_dir, framework, source)
    code = _wait_exit_or_serving(srv)
    output = srv.output(limit=20000)
    assert code is not None, f"{srv.name} started serving despite the unknown setting\n{output}"
    assert code != 0, output
    assert f"'{TYPO}'" in output, output
    assert "unknown setting" in output, output
    assert output.count(f"unknown setting '{TYPO}'") == 1, output  # said once (issue 38: it was printed twice)


# Four wrong values, as a new user wrote them (issue 38): a type mistake and three out of range; every one
# must be in the one start-up error (FastAPI named only the first, Django two of four).
FOUR_BAD = {"heartbeat_interval": "soon", "idle_timeout": -1, "max_streams": 0, "path": "ws"}


@pytest.mark.parametrize("framework", ["starlette", "fastapi", "django", "flask"])
def test_every_wrong_value_is_reported_in_one_startup(launch, conformance_dir, framework):
    srv = _launch_bad(launch, conformance_dir, framework, "config", bad=FOUR_BAD)
    code = _wait_exit_or_serving(srv)
    output = srv.output(limit=20000)
    assert code is not None, f"{srv.name} started serving despite the wrong values\n{output}"
    assert code != 0, output
    assert "4 settings are wrong" in output, output
    for name in FOUR_BAD:
        assert f"'{name}'" in output, (name, output)


@pytest.mark.parametrize("source", ["config", "env"])
@pytest.mark.parametrize("framework", ["starlette", "fastapi"])
def test_unknown_setting_fails_startup_with_lifespan_on(launch, conformance_dir, framework, source):
    srv = _launch_bad(launch, conformance_dir, framework, source, extra_args=("--lifespan", "on"))
    code = _wait_exit_or_serving(srv)
    output = srv.output(limit=20000)
    assert code is not None, f"{srv.name} started serving despite the unknown setting\n{output}"
    assert code != 0, output
    assert f"'{TYPO}'" in output and "unknown setting" in output, output


@pytest.mark.parametrize("problem", ["typo", "model"])
def test_fastapi_mistake_stops_plain_uvicorn(launch, conformance_dir, tmp_path, problem):
    """`uvicorn app:app` with no options at all (uvicorn's lifespan 'auto'): a misspelt setting or a model path
    that does not import stops the server with a non-zero exit naming it, instead of a server that answers 500
    to every request, the app's own routes included."""
    app = tmp_path / "typo_app.py"
    setting = "idle_timout=5" if problem == "typo" else "idle_timeout=5"
    model = "model" if problem == "typo" else "'nosuchmodule:generate'"
    app.write_text(
        "from fastapi import FastAPI\n"
        "from lowlat_mw.adapters.starlette import LowLatMiddleware\n\n"
        "async def model(req):\n    return 'unreachable'\n\n"
        f"app = FastAPI()\napp.add_middleware(LowLatMiddleware, model={model}, path='/ws', {setting})\n")
    env = base_env(conformance_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    srv = launch(f"plain-uvicorn-{problem}", "fastapi",
                 lambda p: [str(VENV_BIN / "uvicorn"), "typo_app:app", "--host", "127.0.0.1", "--port", str(p)],
                 env, ready=False)
    code = _wait_exit_or_serving(srv)
    output = srv.output(limit=20000)
    assert code is not None, f"{srv.name} started serving despite the mistake\n{output}"
    assert code != 0, output
    assert "Application startup failed" in output, output
    if problem == "typo":
        assert f"'{TYPO}'" in output and "did you mean 'idle_timeout'" in output, output
    else:
        assert "nosuchmodule" in output, output
