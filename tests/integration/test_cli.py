"""`lowlat-mw serve` + `lowlat-mw chat` as real subprocesses."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("lowlat-mw")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lowlat_mw.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(proc: subprocess.Popen, port: int, log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"server did not listen on {port} within {timeout} s:\n{log.read_text()}")


@pytest.fixture
def cli_server(tmp_path):
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*_cli(), "serve", "--host", "127.0.0.1", "--port", str(port), "--delay", "0", "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        _wait_listening(proc, port, log)
        yield port, proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.parametrize("mode", ["proto", "json"])
def test_serve_and_chat(cli_server, mode):
    port, proc, log = cli_server
    result = subprocess.run(
        [*_cli(), "chat", f"ws://127.0.0.1:{port}/ws", "hello", "--mode", mode, "--stats"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "You said: 'hello'" in result.stdout
    assert result.stdout.startswith("Hello! This is the lowlat-mw demo model.")
    # streamed token by token: one delta per word of the reply
    match = re.search(r"\[(\d+) deltas", result.stderr)
    assert match, result.stderr
    assert int(match.group(1)) == len(result.stdout.strip().split(" "))
    assert proc.poll() is None, log.read_text()

