"""The guides' logging snippets, run as a user would: lowlat-mw's INFO lines show under each server.

Each app is written from the guide's own snippet (the ```python block that configures ``lowlat_mw``), served
by the guide's command on a free loopback port; one stream, then its log line is looked for. Django's
LOGGING is tested under ``runserver`` in test_conformance_django.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from conformance_servers import VENV_BIN, server_env, wait_for_line
from guide_support import guide_block
from support.ports import free_port, wait_listening

from lowlat_mw.client import connect
from lowlat_mw.testing import LoggedProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]



APPS = {
    "starlette": ("starlette.md", '''
from starlette.applications import Starlette
from lowlat_mw.adapters.starlette import LowLatMiddleware

async def generate(req):
    yield "logged"

app = Starlette()
app.add_middleware(LowLatMiddleware, model=generate, path="/ws")
''', lambda port: [str(VENV_BIN / "uvicorn"), "guide_app:app", "--host", "127.0.0.1", "--port", str(port)]),
    "flask": ("flask.md", '''
from flask import Flask
from lowlat_mw.adapters.flask import LowLat

def generate(req):
    yield "logged"

app = Flask(__name__)
app.config["LOWLAT_MW"] = {"path": "/ws"}
lowlat = LowLat(app, model=generate)
''', lambda port: [str(VENV_BIN / "gunicorn"), "-k", "lowlat_mw.servers.gunicorn.ThreadWorker", "--threads", "8",
                   "-b", f"127.0.0.1:{port}", "guide_app:app"]),
}


@pytest.mark.parametrize("framework", sorted(APPS))
async def test_the_guides_logging_snippet_shows_lowlat_lines(framework: str, tmp_path: Path, conformance_dir):
    guide, app, argv = APPS[framework]
    # The app's own logging on the root logger too, as many apps have (issue 38: each line then came out twice).
    root = "\nlogging.basicConfig(level=logging.INFO, format='root: %(message)s')\n"
    (tmp_path / "guide_app.py").write_text(guide_block(guide, "import logging", "lowlat_mw") + root + app)
    env = server_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    port = free_port()
    proc = LoggedProcess(f"guide-logs-{framework}", argv(port), logdir=conformance_dir / "logs", env=env,
                         cwd=tmp_path)
    try:
        assert wait_listening(port, proc.alive, proc.output), proc.output()
        async with asyncio.timeout(30), connect(f"ws://127.0.0.1:{port}/ws") as client:
            assert await client.complete("hi") == "logged"
        text = await asyncio.to_thread(wait_for_line, proc, "closed by client")
        assert "connection " in text and " open: " in text, text
        assert len([line for line in proc.output(limit=100_000).splitlines() if " open: " in line]) == 1, text
    finally:
        proc.stop()


async def test_serve_shows_lowlat_lines(tmp_path: Path, conformance_dir):
    port = free_port()
    proc = LoggedProcess("serve-logs", [sys.executable, "-m", "lowlat_mw", "serve", "--port", str(port)],
                         logdir=conformance_dir / "logs", env=server_env(), cwd=tmp_path)
    try:
        assert wait_listening(port, proc.alive, proc.output), proc.output()
        async with asyncio.timeout(30), connect(f"ws://127.0.0.1:{port}/ws") as client:
            assert await client.complete("hi")
        text = await asyncio.to_thread(wait_for_line, proc, "lowlat-mw: connection ")
        assert " open: " in text, text
    finally:
        proc.stop()
