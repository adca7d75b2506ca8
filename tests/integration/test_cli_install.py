"""`lowlat-mw serve` with the packages a documented install brings, and without its server (issue 38, item 9).

A user who ran ``pip install 'lowlat-mw[openai]'`` and then the example's ``lowlat-mw serve`` got the whole
"serving on" banner, then ``No module named 'uvicorn'``, then ``httptools``. Installs are simulated: the child
process refuses the packages the install would not bring (tests/blocked_imports.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from blocked_imports import REPO, not_in_extra, python_without
from support.ports import free_port, wait_listening

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SERVE = "import sys\nfrom lowlat_mw.servers.cli import main\nsys.exit(main())\n"
BANNER = "lowlat-mw serving"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOWLAT_", "OPENAI_")) and k != "PYTHONPATH"}
    env["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"  # (never reached: no request is sent)
    return env


def test_the_openai_example_serves_with_the_openai_extra(tmp_path: Path) -> None:
    """The example's header: ``pip install "lowlat-mw[openai]"``, then ``lowlat-mw serve
    examples.openai_upstream:generate``: it must serve."""
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*python_without(not_in_extra("openai"), SERVE), "serve",
                                 "examples.openai_upstream:generate", "--port", str(port), "--log-level", "warning"],
                                cwd=REPO, env=_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_listening(port, lambda: proc.poll() is None, log.read_text), \
            f"exited with {proc.returncode}:\n{log.read_text()}"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.mark.parametrize(("missing", "args", "names"), [
    ({"uvicorn", "httptools", "uvloop"}, (), ("uvicorn", "pip install 'lowlat-mw[serve]'")),  # the [openai] of before
    ({"httptools", "uvloop"}, (), ("httptools", "pip install 'lowlat-mw[serve]'")),  # uvicorn without [standard]
    ({"wsproto"}, ("--ws", "wsproto"), ("wsproto", "pip install wsproto")),  # uvicorn[standard] brings no wsproto
])
def test_serve_without_its_server_says_what_to_install_before_any_banner(missing: set[str], args: tuple[str, ...],
                                                                        names: tuple[str, str]) -> None:
    result = subprocess.run([*python_without(missing, SERVE), "serve", "--port", str(free_port()), *args],
                            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert BANNER not in result.stdout, result.stdout  # nothing announced that is not served
    assert "Traceback" not in result.stderr, result.stderr
    package, command = names
    assert package in result.stderr and command in result.stderr, result.stderr  # what is missing, how to install it


def test_serving_run_without_its_server_says_what_to_install() -> None:
    """The guides' `lowlat_mw.servers.serving.run(app, ...)` (your own process) checks the same, first."""
    code = "from lowlat_mw.servers.serving import run\nrun(lambda scope, receive, send: None, port=9)\n"
    result = subprocess.run(python_without({"httptools", "uvloop"}, code), cwd=REPO, env=_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert ("ImportError: lowlat-mw's server needs httptools, which is not installed: pip install 'lowlat-mw[serve]'"
            in result.stderr), result.stderr


def test_the_daphne_runner_without_daphne_says_what_to_install() -> None:
    """`python -m lowlat_mw.servers.daphne` (the Django guide's command) with daphne missing: one line naming the
    extra, no traceback (it was a raw ModuleNotFoundError)."""
    code = "import runpy\nrunpy.run_module('lowlat_mw.servers.daphne', run_name='__main__')\n"
    result = subprocess.run(python_without({"daphne", "twisted", "autobahn"}, code), cwd=REPO, env=_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    assert "lowlat_mw.servers.daphne needs daphne: pip install 'lowlat-mw[django]'" in result.stderr, result.stderr
