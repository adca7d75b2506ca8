"""A redis-server of the tests' own: Debian's (installed by `python3 dev.py test` when run as root) on a free
loopback port, with no persistence, a private directory and its output captured to a file there.

    with RedisServer() as redis_server:
        redis_server.url   # redis://127.0.0.1:PORT/0
        redis_server.stop(); redis_server.start()   # Redis gone, then back on the same port (empty)

Without redis-server the test is skipped, or failed where CI=true (CI's `python3 dev.py test` installs it).
Only the process it started is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import pytest
from support.ports import free_port, wait_listening

__all__ = ["REDIS_SERVER", "RedisServer", "require_redis_server"]

REDIS_SERVER = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server")
                                                else None)
START_TIMEOUT = 10.0
STOP_TIMEOUT = 8.0  # seconds for each of SIGTERM and SIGKILL to take effect


def require_redis_server() -> str:
    """The path of redis-server. Without it the calling test is skipped, or failed where CI=true."""
    if REDIS_SERVER is None:
        reason = "redis-server is not installed (`python3 dev.py test` installs Debian's redis-server as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI=true, where it must be there", pytrace=False)
        pytest.skip(reason)
    return REDIS_SERVER


class RedisServer:
    """redis-server on 127.0.0.1 (a free port, kept across stop/start), in a private temporary directory."""

    def __init__(self) -> None:
        self._port: int | None = None
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("RedisServer was never started")
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log(self) -> Path:
        """Where the server's stdout and stderr go (appended to by every start)."""
        if self._dir is None:
            raise RuntimeError("RedisServer was never started")
        return self._dir / "redis.log"

    def output(self, limit: int = 6000) -> str:
        """The last `limit` characters of the server's output, labelled."""
        try:
            text = self.log.read_text(errors="replace")
        except (OSError, RuntimeError):
            text = ""
        return f"--- output of redis-server (port {self._port}) ---\n{text[-limit:]}"

    def start(self) -> RedisServer:
        """Start redis-server (on the same port as before, after stop() or kill()); return once it listens."""
        if self.running:
            raise RuntimeError(f"redis-server is already running on port {self._port}")
        binary = require_redis_server()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="lowlat-redis-"))
        fixed = self._port is not None  # a restart: the port it had
        # A first start picks a free port (again, should another process take it before redis-server binds it).
        for _ in range(1 if fixed else 3):
            self._port = self._port if fixed else free_port()
            argv = [binary, "--bind", "127.0.0.1", "--port", str(self._port), "--save", "", "--appendonly", "no",
                    "--protected-mode", "yes", "--daemonize", "no", "--dir", str(self._dir)]
            with self.log.open("ab") as out:
                self._proc = subprocess.Popen(argv, cwd=self._dir, stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT)
            try:
                if wait_listening(self._port, lambda: self.running, self.output, START_TIMEOUT):
                    return self
            except AssertionError:  # alive but not listening within START_TIMEOUT
                self._reap()
                raise
            self._reap()
        failed = f"redis-server did not start on 127.0.0.1:{self._port}\n{self.output()}"
        if not fixed:
            self._port = None
        raise RuntimeError(failed)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM to the server (SIGKILL if it outlives `timeout`) and wait for it; the port and directory stay."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout)
        self._reap(timeout)

    def kill(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGKILL to the server (a crash: no shutdown) and wait for it; the port and directory stay."""
        self._reap(timeout)

    def _reap(self, timeout: float = STOP_TIMEOUT) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:  # pragma: no cover
                raise RuntimeError(f"redis-server (pid {self._proc.pid}) did not die after SIGKILL") from None

    def close(self) -> None:
        """Stop the server and remove its directory."""
        try:
            self.stop()
        finally:
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None

    def __enter__(self) -> RedisServer:
        if not self.running:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
