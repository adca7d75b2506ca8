"""The four example apps as benchmark servers: command lines and environments.

The same command lines and environment rules as the conformance suite
(tests/conformance/conformance_servers.py): uvicorn with websockets-sansio for
examples/starlette_app.py and examples/fastapi_app.py, daphne for examples/django_project, gunicorn's
gthread worker with 300 threads for examples/flask_app.py, each on 127.0.0.1 and a free port, with
``LOWLAT_MODEL`` naming the benchmark's models and the rate limit off (``LOWLAT_RATE_LIMIT=0``), so a
benchmark's bursts of requests are never refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ._bare_common import ROOT, Child, free_port

FRAMEWORKS = ("starlette", "fastapi", "django", "flask")
MODEL = "benchmarks._bare_models:MODELS"
VENV_BIN = Path(sys.prefix) / "bin"
SERVER_NAMES = {"starlette": "uvicorn", "fastapi": "uvicorn", "django": "daphne", "flask": "gunicorn gthread"}


def server_argv(framework: str, port: int) -> list[str]:
    """The command line that serves `framework`'s example app on 127.0.0.1:`port`."""
    if framework in ("starlette", "fastapi"):
        return [str(VENV_BIN / "uvicorn"), f"examples.{framework}_app:app", "--host", "127.0.0.1", "--port", str(port),
                "--ws", "websockets-sansio"]
    if framework == "django":
        return [str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port),
                "examples.django_project.asgi:application"]
    if framework == "flask":
        return [str(VENV_BIN / "gunicorn"), "-k", "gthread", "--threads", "300", "-b", f"127.0.0.1:{port}",
                "examples.flask_app:app"]
    raise ValueError(framework)


def server_env(logdir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment: the venv's bin first, no stray LOWLAT_* / Django / gunicorn variables."""
    drop = {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "GUNICORN_CMD_ARGS"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWLAT_") and k not in drop}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT)  # examples/ and benchmarks/ importable
    # gunicorn >= 25 opens a control socket in ~/.gunicorn by default: one path for every instance.
    env["GUNICORN_CMD_ARGS"] = "--no-control-socket"
    env["LOWLAT_MODEL"] = MODEL
    env["LOWLAT_RATE_LIMIT"] = "0"
    env["DJANGO_DB"] = str(logdir / "django.sqlite3")
    env.update(extra or {})
    return env


def spawn(framework: str, logdir: Path, attempt: int = 0) -> Child:
    """Start `framework`'s example app on a free port (not yet ready: poll GET /health)."""
    port = free_port()
    name = framework if not attempt else f"{framework}-try{attempt}"
    return Child(name, server_argv(framework, port), env=server_env(logdir), port=port, logdir=logdir)
