"""`lowlat-mw serve` + `lowlat-mw chat` as real subprocesses."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ports import free_port, wait_listening
from support.time import seconds
from support.waits import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("lowlat-mw")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lowlat_mw.servers.cli"]


def _wait_listening(proc: subprocess.Popen, port: int, log: Path, timeout: float = 20.0) -> None:
    assert wait_listening(port, lambda: proc.poll() is None, log.read_text, timeout), \
        f"server exited with {proc.returncode}:\n{log.read_text()}"


@contextlib.contextmanager
def _serve_model(tmp_path: Path, module: str, source: str, *options: str) -> Iterator[int]:
    """`lowlat-mw serve module:model` on a free port for the `module` written from `source`: yields the port."""
    (tmp_path / f"{module}.py").write_text(source)
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*_cli(), "serve", f"{module}:model", "--app-dir", str(tmp_path), *options,
                                 "--port", str(port), "--log-level", "warning"], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(proc, port, log)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def cli_server(tmp_path):
    port = free_port()
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



def _http_get(url: str) -> tuple[int, str]:
    """GET `url` directly (no proxy from the environment); (status, body)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(errors="replace")


def _start_serve(tmp_path: Path, *extra: str) -> tuple[int, subprocess.Popen, Path, Path]:
    port = free_port()
    out_log, err_log = tmp_path / "serve.out", tmp_path / "serve.err"
    with out_log.open("w") as out, err_log.open("w") as err:
        proc = subprocess.Popen(
            [*_cli(), "serve", "--host", "127.0.0.1", "--port", str(port), "--delay", "0", "--log-level", "warning",
             *extra],
            stdout=out, stderr=err,
        )
    return port, proc, out_log, err_log


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_serve_metrics_and_stats_lines(tmp_path):
    port, proc, out_log, err_log = _start_serve(tmp_path, "--stats-interval", "0.5")
    try:
        _wait_listening(proc, port, err_log)
        result = subprocess.run([*_cli(), "chat", f"ws://127.0.0.1:{port}/ws", "hello"],
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        assert "You said: 'hello'" in result.stdout

        status, body = _http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200, body
        finished = re.search(r'^lowlat_streams_finished_total\{[^}]*outcome="stop"[^}]*\} (\S+)$', body, re.M)
        assert finished and float(finished.group(1)) >= 1, body
        assert "lowlat_time_to_first_delta_seconds_bucket" in body

        # the stream shows up in a summary line within a few intervals
        wait_until_sync(lambda: "p50" in err_log.read_text(), seconds(10), interval=0.1, what="a summary line")
        lines = err_log.read_text().splitlines()
        summaries = [line for line in lines if line.startswith("lowlat-mw: ")]
        assert any(re.search(r"p50 .* over 1 streams?$", line) for line in summaries), lines
        assert "metrics at http://127.0.0.1:" in out_log.read_text()
        assert proc.poll() is None, err_log.read_text()
    finally:
        _stop(proc)


def test_serve_metrics_path_can_be_turned_off(tmp_path):
    port, proc, _out, err_log = _start_serve(tmp_path, "--metrics-path", "")
    try:
        _wait_listening(proc, port, err_log)
        status, body = _http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 404, body
        assert "lowlat_" not in body
    finally:
        _stop(proc)


def test_stats_printer_stops(tmp_path):
    from lowlat_mw.observability.metrics import Metrics
    from lowlat_mw.servers.cli import StatsPrinter

    metrics = Metrics()
    out = io.StringIO()
    printer = StatsPrinter(metrics, 0.02, out)
    printer.start()
    metrics.observe("time_to_first_delta_seconds", 0.003, "demo")
    wait_until_sync(lambda: "no new streams" in out.getvalue().partition("p50")[2], seconds(5), interval=0.01,
                    what="a line after the first summary")
    printer.stop()
    printed = out.getvalue()
    # each line covers the streams since the previous one: the stream is counted exactly once
    assert sum(bool(re.search(r"over 1 streams?$", line)) for line in printed.splitlines()) == 1, printed
    assert "no new streams" in printed.partition("p50")[2], printed
    time.sleep(0.1)
    assert out.getvalue() == printed  # nothing after stop()


def test_serve_metrics_path_options(monkeypatch):
    from lowlat_mw.servers.cli import _serve_options, main

    def options(*argv: str) -> dict:
        import argparse

        ns = argparse.Namespace(set=[], path=None, metrics_path=None)
        for key, value in zip(argv[::2], argv[1::2], strict=True):
            setattr(ns, key, value)
        return _serve_options(ns)

    monkeypatch.delenv("LOWLAT_METRICS_PATH", raising=False)
    assert options()["metrics_path"] == "/metrics"
    assert options("metrics_path", "")["metrics_path"] == ""
    assert options("metrics_path", "/stats")["metrics_path"] == "/stats"
    assert options("set", ["metrics_path=/m"])["metrics_path"] == "/m"
    assert "metrics_path" not in options("path", "/metrics")  # the WebSocket took the default path
    monkeypatch.setenv("LOWLAT_METRICS_PATH", "/from-env")
    assert "metrics_path" not in options()  # the environment decides
    assert options("drain_grace", 2.5)["drain_grace"] == 2.5  # --drain-grace is the drain_grace setting
    assert "drain_grace" not in options()  # else the setting's own default (or LOWLAT_DRAIN_GRACE)
    monkeypatch.delenv("LOWLAT_GC_FREEZE", raising=False)
    assert options()["gc_freeze"] is True  # serve owns its process: the startup heap is frozen
    assert options("set", ["gc_freeze=false"])["gc_freeze"] is False
    monkeypatch.setenv("LOWLAT_GC_FREEZE", "false")
    assert "gc_freeze" not in options()  # the environment decides
    monkeypatch.delenv("LOWLAT_GC_THRESHOLD", raising=False)
    assert options()["gc_threshold"] == 50_000  # and a stream's objects die young
    assert options("set", ["gc_threshold=0"])["gc_threshold"] == 0
    monkeypatch.setenv("LOWLAT_GC_THRESHOLD", "0")
    assert "gc_threshold" not in options()
    # refused before anything is served
    assert main(["serve", "--stats-interval", "1", "--set", "metrics=false"]) == 2
    assert main(["serve", "--stats-interval", "-1"]) == 2


def test_bench_runs_the_benchmarks_entry_point(capsys, monkeypatch, tmp_path):
    """`lowlat-mw bench ARGS` is `python -m benchmarks ARGS` of the checkout the package runs from (from any
    directory), and says so clearly from an installed package, which has no benchmarks."""
    from lowlat_mw.servers import cli
    from lowlat_mw.servers.cli import main

    repo = Path(__file__).resolve().parents[2]
    assert cli.source_checkout() == repo  # an editable install
    monkeypatch.chdir(repo)
    assert main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out
    for suite in ("transport", "bare", "frameworks", "codec", "compression", "scale", "overhead"):
        assert f"{suite}: " in listed
    monkeypatch.chdir(tmp_path)  # elsewhere: the same checkout's benchmarks, not a `benchmarks` of the cwd
    assert main(["bench", "--list"]) == 0
    assert "overhead: " in capsys.readouterr().out
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != repo])
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(cli, "source_checkout", lambda: None)  # an installed package (a wheel)
    assert main(["bench", "--list"]) == 2
    assert "source checkout" in capsys.readouterr().err


def _chat(port: int, *args: str, stdin: str = "", timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_cli(), "chat", f"ws://127.0.0.1:{port}/ws", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def _opened(port: int) -> float:
    """lowlat_connections_opened_total of the server, summed over its labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("lowlat_connections_opened_total"))


def test_chat_reads_the_prompt_from_stdin_with_a_dash(cli_server):
    port, _, _ = cli_server
    result = _chat(port, "-", stdin="hello from\nstdin\n")
    assert result.returncode == 0, result.stderr
    assert "You said: 'hello from\\nstdin'" in result.stdout, result.stdout  # (repr; the final newline dropped)


def test_chat_without_a_prompt_sends_each_line_on_one_connection(cli_server):
    port, _, _ = cli_server
    before = _opened(port)
    result = _chat(port, stdin="one\n\ntwo\n")
    assert result.returncode == 0, result.stderr
    replies = result.stdout.splitlines()
    assert len(replies) == 2 and "You said: 'one'" in replies[0] and "You said: 'two'" in replies[1], result.stdout
    assert "> " not in result.stderr  # (stdin is not a terminal: no prompt shown)
    assert _opened(port) - before == 1


def test_chat_bad_header_is_a_usage_error(cli_server):
    port, _, _ = cli_server
    result = _chat(port, "--header", "no colon here", "hi")
    assert result.returncode == 2
    assert "--header 'no colon here': expected 'Name: value'" in result.stderr


def test_chat_sends_auth_and_headers(tmp_path):
    source = ("def model(req):\n"
              "    return f\"{req.session.principal}|{req.session.headers.get('x-tag')}\"\n\n"
              "def authenticate(handshake):\n"
              "    if handshake.bearer != 'sesame':\n"
              "        raise PermissionError('bad token')\n"
              "    return 'alice'\n")
    with _serve_model(tmp_path, "whoami", source, "--set", "authenticate=whoami:authenticate") as port:
        result = _chat(port, "--auth", "sesame", "--header", "X-Tag: blue", "hi")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "alice|blue\n"
        result = _chat(port, "--header", "Authorization: Bearer sesame", "hi")
        assert result.stdout == "alice|None\n", result.stderr
        result = _chat(port, "--auth", "wrong", "--retries", "0", "hi")
        assert result.returncode == 1 and "lowlat-mw chat:" in result.stderr, result.stderr


def test_chat_is_interactive_on_a_terminal(cli_server):
    """stdin a terminal: a '> ' prompt on stderr before each line, replies on stdout, Ctrl-D ends."""
    import os
    import pty

    port, _, _ = cli_server
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen([*_cli(), "chat", f"ws://127.0.0.1:{port}/ws"], stdin=terminal,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.write(controller, b"first\nsecond\n\x04")  # two lines, then Ctrl-D at the prompt
        out, err = proc.communicate(timeout=30)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 0, err
    assert out.count("You said:") == 2 and "'first'" in out and "'second'" in out, out
    assert err.count("> ") == 3, err  # before each line and before the Ctrl-D


def test_chat_keeps_the_conversation_after_a_failed_reply_and_needs_a_prompt(tmp_path):
    source = ("def model(req):\n"
              "    if req.prompt == 'boom':\n"
              "        raise ValueError('no')\n"
              "    return 'ok:' + req.prompt\n")
    with _serve_model(tmp_path, "picky", source) as port:
        result = _chat(port, stdin="one\nboom\ntwo\n")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["ok:one", "ok:two"], result.stdout
        assert result.stderr.count("lowlat-mw chat:") == 1 and "model_error" in result.stderr, result.stderr
        result = _chat(port, stdin="")
        assert result.returncode == 2 and "no prompt" in result.stderr, result.stderr


def test_chat_takes_the_demo_pages_http_url_and_says_what_a_url_must_be(cli_server):
    """Issue 38: `lowlat-mw chat http://...` (the address the demo page is at) printed a raw traceback."""
    port, _, _ = cli_server
    result = subprocess.run([*_cli(), "chat", f"http://127.0.0.1:{port}/ws", "hello"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "You said: 'hello'" in result.stdout
    result = subprocess.run([*_cli(), "chat", f"127.0.0.1:{port}/ws", "hello"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "is not a WebSocket URL: give ws:// or wss://" in result.stderr, result.stderr


@pytest.mark.parametrize(("source", "what"), [
    ("from starlette.applications import Starlette\n\napp = Starlette()\n", "an ASGI application"),
    ("from flask import Flask\n\napp = Flask(__name__)\n", "a WSGI application"),
    ("def app(req, extra):\n    return 'x'\n", "a callable of 2 required arguments (req, extra)"),
], ids=["asgi", "wsgi", "two-arguments"])
def test_serve_refuses_an_app_that_is_not_a_model_before_serving(tmp_path, source, what):
    """Issue 38: `lowlat-mw serve myapp:app` (an ASGI app, not a model callable) started, announced itself, and
    failed every request with a model error."""
    (tmp_path / "notamodel.py").write_text(source)
    out_log, err_log = tmp_path / "serve.out", tmp_path / "serve.err"
    with out_log.open("w") as out, err_log.open("w") as err:
        proc = subprocess.Popen([*_cli(), "serve", "notamodel:app", "--app-dir", str(tmp_path), "--port",
                                 str(free_port())], stdout=out, stderr=err)
    try:
        wait_until_sync(lambda: proc.poll() is not None or "lowlat-mw serving" in out_log.read_text(), seconds(30),
                        interval=0.05, what="serve to exit")
        assert proc.poll() is not None, f"it started serving:\n{out_log.read_text()}{err_log.read_text()}"
    finally:
        _stop(proc)
    assert proc.returncode == 2, err_log.read_text()
    assert "lowlat-mw serving" not in out_log.read_text()
    err = err_log.read_text()
    assert f"model 'notamodel:app' is {what}, not a model callable" in err, err
    assert "takes one argument, the request" in err and "Traceback" not in err, err


def test_serve_routes_a_dialect_given_on_the_command_line(tmp_path, monkeypatch):
    """`serve --dialect PATH=module:attr`: the Dialect (tests/support/ndjson.py) at PATH, lowlat.v1 at /ws still."""
    import asyncio
    import json

    from websockets.asyncio.client import connect

    tests = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", f"{tests}:{tests.parent}")  # (the subprocess imports support.ndjson)
    source = "async def model(req):\n    return req.text[::-1]\n"
    with _serve_model(tmp_path, "reverse", source, "--dialect", "/ndjson=support.ndjson:NDJSON") as port:
        async def main() -> list[dict]:
            async with connect(f"ws://127.0.0.1:{port}/ndjson") as ws:
                await ws.send(json.dumps({"model": "", "input": "olleh"}))
                return [json.loads(await ws.recv()) for _ in range(2)]

        assert asyncio.run(main()) == [{"delta": "hello"}, {"done": True, "reason": "stop"}]
    assert "serving the dialect support.ndjson:NDJSON on ws://127.0.0.1:" in (tmp_path / "serve.log").read_text()


@pytest.mark.parametrize(("value", "error"), [
    ("ndjson", "expected PATH=module:attr"),
    ("/x=json", "expected PATH=module:attr"),
    ("/x=json:dumps", "not a lowlat_mw.protocol.dialect.Dialect"),
    ("/x=json:nothing", "has no attribute 'nothing'"),
])
def test_serve_says_what_is_wrong_with_a_dialect_option(value, error, capsys):
    from lowlat_mw.servers.cli import main

    assert main(["serve", "--dialect", value]) == 2
    assert error in capsys.readouterr().err
