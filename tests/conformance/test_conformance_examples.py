"""Every example's docstring header works as written: its "Run:" command serves, its "Then:" chats."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from conformance_servers import REPO, server_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

EXAMPLES = {
    "starlette": "examples/starlette_app.py",
    "fastapi": "examples/fastapi_app.py",
    "django": "examples/django_project/asgi.py",
    "flask": "examples/flask_app.py",
}
DOC_PORT = "8000"


def header(path: Path) -> tuple[str, str]:
    """The "Run:" and "Then:" commands of a module docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    run = re.search(r"^Run:\s+(.+?)\s*$", doc, re.M)
    then = re.search(r"^Then:\s+(.+?)\s*$", doc, re.M)
    assert run and then, f"{path} has no 'Run:' / 'Then:' line in its docstring"
    return run.group(1), then.group(1)


def with_port(command: str, port: int) -> list[str]:
    assert re.search(rf"\b{DOC_PORT}\b", command), command
    return shlex.split(re.sub(rf"\b{DOC_PORT}\b", str(port), command))


@pytest.mark.parametrize("framework", list(EXAMPLES))
def test_example_header_commands_work(launch, conformance_dir, framework):
    run, then = header(REPO / EXAMPLES[framework])
    assert f"ws://127.0.0.1:{DOC_PORT}/ws" in then
    # as a user would run it: from the repository root, the venv's bin on PATH, no PYTHONPATH,
    # the example's own model (no LOWLAT_MODEL); only the Django database goes to a temp file
    env = server_env({"DJANGO_DB": str(conformance_dir / "example.sqlite3")}, pythonpath=False)
    srv = launch(f"example-{framework}", framework, lambda port: with_port(run, port), env)
    chat = subprocess.run(with_port(then, srv.port), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert chat.returncode == 0, f"{then!r} failed:\n{chat.stdout}\n{chat.stderr}\n{srv.output()}"
    assert chat.stdout.strip() == "You said: hello", chat.stdout
