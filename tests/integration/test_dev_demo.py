"""`python3 dev.py demo` as the README's quick start runs it: a new environment with only what the demo needs,
no banner from the build, and the demo model served. Uses pip (the package registries, as CI allows) and a
venv of its own (LOWLAT_DEV_VENV), never the checkout's .venv."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.ports import free_port
from support.waits import wait_until

from lowlat_mw.client import connect
from lowlat_mw.testing import LoggedProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]
INSTALL_BOUND = 300.0  # a cold pip cache on a loaded machine; warm, it is ~11 s
TEST_ONLY = {"pytest", "selenium", "grpcio-tools", "atheris", "matplotlib", "hypothesis", "django", "flask"}


async def test_dev_demo_installs_only_the_demo_and_serves_it(tmp_path: Path) -> None:
    port = free_port()
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOWLAT_", "PYTHON"))}
    env.update(LOWLAT_DEV_VENV=str(venv), PORT=str(port))
    proc = LoggedProcess("dev-demo", [sys.executable, str(ROOT / "dev.py"), "demo"], logdir=tmp_path, env=env,
                         cwd=ROOT)
    try:
        await wait_until(lambda: "Uvicorn running" in proc.output(100_000) or not proc.alive(), INSTALL_BOUND,
                         interval=0.2, what="the demo to serve")
        assert proc.alive(), proc.output()
        async with asyncio.timeout(30), connect(f"ws://127.0.0.1:{port}/ws") as client:
            assert "You said: 'hi'" in await client.complete("hi")
        log = proc.stdout_path.read_text() + proc.stderr_path.read_text()
        before_serving = log.split("lowlat-mw serving", 1)[0]
        assert [line for line in before_serving.splitlines() if not line.startswith("+ ")] == [], log
        installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                                   capture_output=True, text=True, check=True).stdout
        names = {line.split("==")[0].lower() for line in installed.splitlines()}
        assert {"lowlat-mw", "uvicorn", "starlette"} <= names, names
        assert not names & TEST_ONLY, names & TEST_ONLY
    finally:
        proc.stop()
