"""Packaging facts: public API, generated docs, no framework imports in the core."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import lowlat_mw
from lowlat_mw.docs import settings_markdown
from lowlat_mw.security import origin_allowed

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = {"starlette", "fastapi", "django", "channels", "flask", "flask_sock", "simple_websocket", "werkzeug"}
SERVERS = {"uvicorn", "daphne", "gunicorn"}


def test_all_matches_public_names() -> None:
    public = {n for n in dir(lowlat_mw) if not n.startswith("_") and n != "annotations" and not isinstance(
        getattr(lowlat_mw, n), type(lowlat_mw))}
    assert set(lowlat_mw.__all__) == public | {"__version__"}


def test_settings_reference_is_current() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    assert text == settings_markdown(), "docs/settings.md is stale: python -m lowlat_mw.docs > docs/settings.md"


def test_core_imports_no_web_framework() -> None:
    # lowlat_mw/servers runs servers (uvicorn, daphne, gunicorn) and may import them; nothing imports a framework.
    for path in (ROOT / "lowlat_mw").rglob("*.py"):
        forbidden = FRAMEWORKS if "servers" in path.relative_to(ROOT / "lowlat_mw").parts else FRAMEWORKS | SERVERS
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module-level imports only
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"


def test_adapters_installed_under_lowlat_mw_only(tmp_path: Path) -> None:
    # Outside the repo (so its folder is not on sys.path), only lowlat_mw.adapters is importable.
    code = ("import importlib.util as u; import lowlat_mw.adapters.starlette;"
            "print(u.find_spec('adapters') is None)")
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "True", out.stderr
    mods = {m.name for m in pkgutil.iter_modules(importlib.import_module("lowlat_mw.adapters").__path__)}
    assert "starlette" in mods


@pytest.mark.parametrize(
    ("origin", "host", "allowed", "ok"),
    [
        (None, "a.example:8000", (), True),                     # non-browser client
        ("http://a.example:8000", "a.example:8000", (), True),  # same host
        ("http://evil.example", "a.example:8000", (), False),   # cross-origin refused by default
        ("http://evil.example", "a.example", ("*",), True),
        ("https://app.example.com", "api.example.com", ("https://app.example.com",), True),
        ("http://app.example.com", "api.example.com", ("https://app.example.com",), False),  # scheme matters
        ("https://x.example.com", "api.example.com", ("*.example.com",), True),
        ("https://example.com.evil", "api.example.com", ("*.example.com",), False),
        ("https://app.example.com", "api.example.com", ("app.example.com",), True),
        ("null", "a.example", (), False),
        ("garbage", "a.example", (), False),
    ],
)
def test_origin_allowed(origin: str | None, host: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert origin_allowed(origin, host, allowed) is ok


def test_protocol_doc_embeds_the_shipped_schema() -> None:
    doc = (ROOT / "docs" / "protocol.md").read_text()
    start = doc.index("```proto\n") + len("```proto\n")
    inline = doc[start:doc.index("```", start)]
    shipped = (ROOT / "lowlat_mw" / "proto" / "lowlat_v1.proto").read_text()
    assert inline == shipped, "docs/protocol.md section 4 must be the shipped .proto verbatim"


# ---------------------------------------------------------------- issue 17's first-hour rows, as docs
def test_fastapi_users_are_told_to_install_the_fastapi_extra() -> None:
    """`pip install 'lowlat-mw[starlette]'` then `from fastapi import FastAPI` was a ModuleNotFoundError."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("fastapi") for req in extras["fastapi"])
    for doc in (ROOT / "README.md", ROOT / "docs" / "starlette.md"):
        text = doc.read_text()
        assert "lowlat-mw[fastapi]" in text, doc
        for line in text.splitlines():  # wherever FastAPI is installed, it is with [fastapi]
            if "pip install" in line and "FastAPI" in line:
                assert "[fastapi]" in line, line


def test_every_guide_says_what_the_defaults_do_to_a_backend_client() -> None:
    """rate_limit and max_connections_per_client throttle a backend talking to the model service: each guide
    says so and points at security.md's table of defaults."""
    assert "## Defaults at a glance" in (ROOT / "docs" / "security.md").read_text()
    for guide in ("starlette.md", "django.md", "flask.md"):
        text = " ".join((ROOT / "docs" / guide).read_text().split())
        assert "your own backend services" in text and "`rate_limit`" in text, guide
        assert "`max_connections_per_client`" in text and '"Defaults at a glance"' in text, guide


def test_settings_reference_has_no_blank_default_and_the_readme_table_no_issue_column() -> None:
    rows = [line for line in (ROOT / "docs" / "settings.md").read_text().splitlines() if line.startswith("| `")]
    assert rows and all(row.split("|")[3].strip() for row in rows), [r for r in rows if not r.split("|")[3].strip()]
    header_lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| ")]
    assert not any("issue" in line.lower() and "target" in line.lower() for line in header_lines)


# What a README snippet may use without defining it: the reader's own objects, named in the text around it.
README_READERS_OWN = {"client", "get_weather"}


def test_readme_snippets_import_what_they_use() -> None:
    """Issue 38: the typed-events snippet used `Delta` without importing it (a NameError for whoever copies it).
    Each ```python block of the README is checked alone (ruff's undefined-name rule, F821)."""
    import json
    import re
    import shutil
    import textwrap

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("needs ruff (the test extra)")
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    undefined = []
    for i, block in enumerate(blocks):
        source = "async def _snippet():\n" + textwrap.indent(block, "    ")  # (top-level await and async for)
        out = subprocess.run([ruff, "check", "--isolated", "--select", "F821", "--output-format", "json",
                              "--stdin-filename", f"readme_{i}.py", "-"], input=source, capture_output=True,
                             text=True, timeout=60)
        names = {re.search(r"`(\w+)`", e["message"]).group(1) for e in json.loads(out.stdout or "[]")}
        undefined += [(i, name) for name in sorted(names - README_READERS_OWN)]
    assert not undefined, undefined

