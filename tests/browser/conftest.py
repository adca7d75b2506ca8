"""Fixtures of the browser tests: one headless Chromium for the session, one `lowlat-mw serve` per module.

Without Chromium (or selenium) the tests that need the browser are skipped, and the reason is
printed in the summary at the end of the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import NpmInstall, ServeProcess, chromium_paths, start_chromium, start_serve, stop_chromium

_skipped: list[str] = []
_npm: list[NpmInstall] = []


def _start_npm_if_needed(items: list[Any]) -> None:
    """Start installing React from npm (in the background) if one of `items` needs it."""
    if not _npm and any("react_modules" in getattr(item, "fixturenames", ()) for item in items):
        _npm.append(NpmInstall.start(Path(__file__).resolve().parents[2] / "examples" / "react" / "package.json"))


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(items: list[Any]) -> None:
    """In one process, start the install at collection. Under pytest-xdist every process collects every test,
    and only the one running tests/browser needs it: there it starts with its first browser test."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _start_npm_if_needed(items)


@pytest.fixture(scope="session", autouse=True)
def _npm_with_the_first_browser_test(request: pytest.FixtureRequest) -> None:
    """Under pytest-xdist: the install starts with this process's first browser test (see above)."""
    _start_npm_if_needed(request.session.items)


@pytest.fixture(scope="session")
def npm_react() -> NpmInstall:
    """The background `npm install` of examples/react/package.json (removed at the end of the run)."""
    if not _npm:
        _npm.append(NpmInstall.start(Path(__file__).resolve().parents[2] / "examples" / "react" / "package.json"))
    return _npm[0]


def pytest_sessionfinish() -> None:
    while _npm:
        _npm.pop().cleanup()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's, through chromedriver): one for the whole run."""
    found = chromium_paths()
    if isinstance(found, str):
        _skipped.append(found)
        pytest.skip(found)
    driver = start_chromium(*found)
    try:
        yield driver
    finally:
        stop_chromium(driver)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """The browser, left on a blank page afterwards (so no socket of one test outlives it)."""
    yield browser
    try:
        browser.get("about:blank")
    except Exception:  # the next test's get() reports a broken browser
        pass


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """`lowlat-mw serve` as a user runs it (python3 dev.py demo): demo page at /, metrics at /metrics."""
    # server Pings every 0.5 s, so the page's answers are exercised within a test's time
    server = start_serve(tmp_path_factory.mktemp("serve") / "serve.log", "--set", "heartbeat_interval=0.5")
    try:
        yield server
    finally:
        server.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _skipped:
        terminalreporter.write_line(f"browser tests skipped: {_skipped[0]}", yellow=True, bold=True)
