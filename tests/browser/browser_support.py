"""Helpers for the browser tests: Debian's chromium through selenium, and servers on loopback.

Chromium comes from Debian's packages (``chromium`` and ``chromium-driver``, installed by
``python3 dev.py test`` when missing and root); nothing is ever downloaded at run time: selenium
is given the chromedriver path, so Selenium Manager never runs.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.ports import free_port
from support.time import seconds
from support.waits import wait_until_sync

START_TIMEOUT = seconds(15.0)
PAGE_WAIT = seconds(15.0)  # how long a page may take to show what a test waits for
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--disable-extensions", "--disable-default-apps", "--no-proxy-server",
    "--window-size=1000,860", "--force-device-scale-factor=1",
)


def chromium_paths() -> tuple[str, str] | str:
    """(chromium, chromedriver) paths, or the reason they cannot be used."""
    chromium = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("CHROMEDRIVER_PATH") or shutil.which("chromedriver")
    if not chromium or not driver:
        return ("Chromium is not installed (Debian: apt-get install chromium chromium-driver; `python3 dev.py test` "
                "does it when run as root): the browser tests are skipped")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]'): the browser tests are skipped"
    return chromium, driver


def start_chromium(chromium: str, driver: str) -> Any:
    """A headless Chromium driven by selenium through Debian's chromedriver (fresh profile)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="lowlat-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=driver, log_output=os.devnull)
    browser = webdriver.Chrome(service=service, options=options)
    browser.set_page_load_timeout(30)
    browser.set_script_timeout(30)
    browser._lowlat_profile = profile  # removed after quit()
    return browser


def stop_chromium(browser: Any) -> None:
    try:
        browser.quit()
    finally:
        shutil.rmtree(getattr(browser, "_lowlat_profile", ""), ignore_errors=True)


def wait_until(predicate: Callable[[], Any], timeout: float = PAGE_WAIT, what: str = "") -> Any:
    """support's wait_until_sync at a page's pace: every poll is a round trip to chromium, so every 50 ms."""
    return wait_until_sync(predicate, timeout, interval=0.05, what=what)


@dataclass
class Uvicorn:
    """A uvicorn server on 127.0.0.1 in a daemon thread."""

    server: Any
    thread: threading.Thread
    port: int
    errors: list[BaseException] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(10)


def start_uvicorn(app: Any) -> Uvicorn:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # (asyncio: TCP_NODELAY)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, ws="websockets-sansio", ws_ping_interval=None,
                                           ws_per_message_deflate=False, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=2))
    running = Uvicorn(server, threading.Thread(), sock.getsockname()[1])

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:
            running.errors.append(exc)
        finally:
            sock.close()

    running.thread = threading.Thread(target=run, name=f"uvicorn-{running.port}", daemon=True)
    running.thread.start()
    wait_until_sync(lambda: server.started or running.errors, START_TIMEOUT, interval=0.01, what="uvicorn to start")
    if running.errors:
        raise RuntimeError(f"uvicorn failed to start: {running.errors!r}")
    return running


@dataclass
class ServeProcess:
    """A `lowlat-mw serve` subprocess on 127.0.0.1."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_serve(log: Path, *args: str) -> ServeProcess:
    """Run `lowlat-mw serve` (the venv's script) on a free loopback port; return once it listens."""
    script = Path(sys.executable).with_name("lowlat-mw")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "lowlat_mw.servers.cli"]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWLAT_")}
    with log.open("w") as out:
        proc = subprocess.Popen([*command, "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level",
                                 "warning", "--drain-grace", "1", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    server = ServeProcess(proc, port, log)

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"lowlat-mw serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    try:
        wait_until_sync(listening, seconds(30), interval=0.05, what="lowlat-mw serve to listen")
    except BaseException:
        server.stop()
        raise
    return server


class NpmInstall:
    """`npm install` of a package.json into a temporary folder, in a background thread."""

    def __init__(self, package_json: Path) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="lowlat-react-"))
        self.problem: str | None = None
        shutil.copyfile(package_json, self.folder / "package.json")
        self.thread = threading.Thread(target=self._run, name="npm-install", daemon=True)

    @classmethod
    def start(cls, package_json: Path) -> NpmInstall:
        install = cls(package_json)
        install.thread.start()
        return install

    def _run(self) -> None:
        npm = shutil.which("npm")
        if npm is None:
            self.problem = "npm is not installed"
            return
        try:
            done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=self.folder,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.problem = f"npm install failed: {exc}"
            return
        if done.returncode != 0:
            self.problem = f"npm install failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"

    def wait(self, timeout: float = 150.0) -> str | None:
        """None once installed, else what went wrong."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            return "npm install did not finish in time"
        return self.problem

    def cleanup(self) -> None:
        self.thread.join(150)
        shutil.rmtree(self.folder, ignore_errors=True)


class PageServer:
    """A plain HTTP server on its own loopback port (another origin) serving fixed pages."""

    def __init__(self, pages: dict[str, str]) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path.partition("?")[0])
                if body is None:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="page-server", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
