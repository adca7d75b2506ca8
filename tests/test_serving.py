"""The server options lowlat_mw.servers.serving derives from the settings, and the shims they name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowlat_mw.servers.serving import (
    HANDSHAKE_HEADER_LIMIT,
    READ_BUDGET,
    READ_SLICE,
    SMALL_FRAGMENT,
    UVICORN_WS,
    UVICORN_WSPROTO,
    HeaderBudget,
    add_fragment,
    daphne_args,
    log_config,
    read_slices,
    run_options,
    transport_limit,
    uvicorn_args,
    uvicorn_options,
)
from lowlat_mw.settings import Settings


def test_uvicorn_runs_the_hardened_protocol_of_either_implementation():
    settings = Settings(max_frame_size=200_000)
    assert uvicorn_options(settings)["ws"] == UVICORN_WS
    assert uvicorn_options(settings, ws="wsproto")["ws"] == UVICORN_WSPROTO
    assert uvicorn_options(settings, ws="websockets")["ws"] == "websockets"  # no shim for the legacy one
    args = uvicorn_args(settings, ws="wsproto")
    assert args[args.index("--ws") + 1] == UVICORN_WSPROTO
    assert args[args.index("--ws-max-size") + 1] == str(transport_limit(settings)) == "201024"


@pytest.mark.parametrize("name", [UVICORN_WS, UVICORN_WSPROTO, "lowlat_mw.servers.uvicorn:Http"])
def test_the_uvicorn_shims_import(name):
    from uvicorn.importer import import_from_string

    assert isinstance(import_from_string(name), type)


def test_daphne_open_handshake_timeout_is_never_shorter_than_asked():
    """autobahn arms it on txaio's batched timer, which rounds the deadline down to a whole second: with
    the option as given, a handshake that straddles a second boundary was dropped milliseconds in."""
    pytest.importorskip("daphne")
    from lowlat_mw.servers.daphne import ClosingWebSocketFactory

    args = daphne_args(Settings(handshake_timeout=1.0))
    assert args[args.index("--websocket_connect_timeout") + 1] == "1"
    factory = ClosingWebSocketFactory(server_class=None)
    factory.setProtocolOptions(openHandshakeTimeout=1, maxMessagePayloadSize=10)
    assert factory.openHandshakeTimeout == 2
    assert factory.failByDrop is False
    assert factory.maxMessagePayloadSize == 10


def test_run_options_map_ws_to_the_shims_and_keep_the_rest():
    settings = Settings()
    assert run_options(settings)["ws"] == UVICORN_WS
    assert run_options(settings, ws="websockets-sansio", port=9)["ws"] == UVICORN_WS
    options = run_options(settings, ws="wsproto", ws_max_size=5, host="127.0.0.1")
    assert (options["ws"], options["ws_max_size"], options["host"]) == (UVICORN_WSPROTO, 5, "127.0.0.1")


@pytest.mark.parametrize(("argv", "expected"), [([], UVICORN_WS), (["--ws", "wsproto"], UVICORN_WSPROTO)])
def test_lowlat_mw_serve_runs_the_hardened_protocols(monkeypatch, capsys, argv, expected):
    """`lowlat-mw serve` passes --ws through run(), which must not replace the shim by the plain name."""
    import uvicorn

    from lowlat_mw.servers.cli import main

    seen: list[uvicorn.Config] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: seen.append(self.config))
    assert main(["serve", "--port", "0", *argv]) == 0
    (config,) = seen
    assert (config.ws, config.http) == (expected, "lowlat_mw.servers.uvicorn:HttpToolsProtocol")
    assert config.ws_max_size == transport_limit(Settings()) and config.ws_per_message_deflate is False


def test_wsproto_shim_without_wsproto_says_what_to_install():
    """wsproto is optional: the module still imports, and asking for the shim names the missing package."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['wsproto'] = None\n"
            "import lowlat_mw.servers.uvicorn as m\n"
            "try:\n    m.WSProtoProtocol\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "needs wsproto (pip install wsproto)" in out.stdout


def test_header_budget_hands_over_whole_reads_until_the_limit():
    budget = HeaderBudget()
    assert budget.split(b"x" * (HANDSHAKE_HEADER_LIMIT - 1)) == (b"x" * (HANDSHAKE_HEADER_LIMIT - 1), None)
    assert budget.split(b"y") == (b"y", None)  # exactly at the limit: still all headers
    assert budget.split(b"z") == (b"", b"z")  # past it: nothing more may be headers


@given(st.lists(st.binary(min_size=0, max_size=64), max_size=20), st.integers(1, 200))
def test_header_budget_parses_exactly_the_first_limit_bytes_of_any_split(reads, limit):
    """However the stream is cut into reads, the parts parsed as headers are its first `limit` bytes."""
    budget = HeaderBudget(limit)
    heads, rests = b"", b""
    for data in reads:
        head, rest = budget.split(data)
        assert head + (rest or b"") == data
        assert rests == b"" or head == b""  # once past the budget, nothing more is headers
        heads += head
        rests += rest or b""
    stream = b"".join(reads)
    assert heads == stream[:limit] and rests == stream[limit:]


@given(st.lists(st.sampled_from([0, 1, 7, SMALL_FRAGMENT - 1, SMALL_FRAGMENT, 3 * SMALL_FRAGMENT]), max_size=40))
def test_add_fragment_reassembles_exactly_with_one_object_per_run_of_small_fragments(sizes):
    fragments = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    parts: list = []
    for fragment in fragments:
        add_fragment(parts, fragment)
    assert b"".join(parts) == b"".join(fragments)
    big = sum(n >= SMALL_FRAGMENT for n in sizes)
    assert len(parts) <= 2 * big + 1  # each big one whole, and one buffer per run of small ones between them
    assert all(type(p) is bytearray or len(p) >= SMALL_FRAGMENT for p in parts)


def test_version_and_python_dash_m(capsys):
    """CLI conventions: ``--version``, and ``python -m lowlat_mw`` as the same command (issue 17)."""
    import subprocess
    import sys

    from lowlat_mw import __version__
    from lowlat_mw.servers.cli import main, version_line

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == version_line() == \
        f"lowlat-mw {__version__} (wire protocol v1; Python {sys.version.split()[0]})"
    run = subprocess.run([sys.executable, "-m", "lowlat_mw", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == version_line()
    run = subprocess.run([sys.executable, "-m", "lowlat_mw"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "usage: python -m lowlat_mw" in run.stderr


def test_serve_imports_the_model_at_start_from_the_current_folder(monkeypatch, capsys, tmp_path):
    """Issue 17: `serve nosuch:fn` used to print "serving", run, and answer 500 to every handshake; `serve
    mymod:fn` from mymod's own folder failed without PYTHONPATH=. Now the model is imported before the server
    starts (a wrong path exits 2 with the reason) and the current folder (--app-dir) is searched first."""
    import sys

    import uvicorn

    from lowlat_mw.servers.cli import main

    seen: list[uvicorn.Config] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: seen.append(self.config))
    monkeypatch.setattr(sys, "path", list(sys.path))  # (serve puts the app folder in front)
    assert main(["serve", "lowlat_no_such_module:fn", "--port", "0"]) == 2
    assert "cannot import model module 'lowlat_no_such_module'" in capsys.readouterr().err and not seen

    (tmp_path / "soak_user_model.py").write_text("def fn(req):\n    return 'hi'\n")
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "soak_user_model:nothere", "--port", "0"]) == 2
    assert "has no attribute 'nothere'" in capsys.readouterr().err and not seen
    assert main(["serve", "soak_user_model:fn", "--port", "0"]) == 0
    assert len(seen) == 1 and "serving soak_user_model:fn" in capsys.readouterr().out
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "soak_other_model.py").write_text("def fn(req):\n    return 'hi'\n")
    assert main(["serve", "soak_other_model:fn", "--app-dir", str(other), "--port", "0"]) == 0


def test_log_config_adds_the_lowlat_logger_at_uvicorns_level_and_run_options_leave_logging_alone():
    import logging

    assert log_config("warning")["loggers"]["lowlat_mw"]["level"] == logging.WARNING
    assert log_config()["loggers"]["lowlat_mw"]["level"] == logging.INFO
    assert log_config("trace")["loggers"]["lowlat_mw"]["level"] == logging.DEBUG
    assert "uvicorn.error" in log_config()["loggers"]  # (uvicorn's own, kept)
    assert "log_config" not in run_options(Settings())  # a user's run() keeps the user's logging


def test_the_servers_own_bounds_follow_the_apps_settings(monkeypatch):
    """Our uvicorn shims and daphne runner bound handshakes and closes with the app's settings (the shortest of the
    process's endpoints): under uvicorn they read only LOWLAT_* variables, so a close_timeout given to the
    middleware or to `serve --set` bounded lowlat-mw's closes but not the shim's abort of an unread close."""
    import weakref

    from lowlat_mw.endpoint import Endpoint
    from lowlat_mw.servers import serving

    monkeypatch.setattr(Endpoint, "instances", weakref.WeakSet())
    monkeypatch.setattr(serving, "_ENV_SETTINGS", [])
    monkeypatch.setenv("LOWLAT_CLOSE_TIMEOUT", "7")
    assert serving.app_timeout("close_timeout") == 7.0  # no app yet: the environment's
    first = Endpoint(lambda req: "", Settings(close_timeout=3.0, handshake_timeout=4.0))
    second = Endpoint(lambda req: "", Settings(close_timeout=1.5))
    assert serving.app_timeout("close_timeout") == 1.5
    assert serving.app_timeout("handshake_timeout") == 4.0
    del first, second


# ---------------------------------------------------------------- the servers' read rule (read_slices)
class _Reader:
    """A parser that records what it is given, a fake clock that each parse moves on by `cost`, and a stop rule."""

    def __init__(self, cost: float = 0.0, stop_after: int | None = None) -> None:
        self.pieces: list[bytes] = []
        self.now = 0.0
        self.cost = cost
        self.stop_after = stop_after  # stop() once this many pieces were parsed
        self.closing = False

    def parse(self, piece: bytes) -> None:
        assert type(piece) is bytes  # (autobahn and wsproto take bytes)
        self.pieces.append(piece)
        self.now += self.cost

    def stop(self) -> bool:
        return self.closing or (self.stop_after is not None and len(self.pieces) >= self.stop_after)

    def feed(self, data: bytes | memoryview) -> memoryview | None:
        return read_slices(data, self.parse, self.stop, clock=lambda: self.now)


def test_a_small_read_is_parsed_whole_and_reading_goes_on():
    r = _Reader()
    assert r.feed(b"abc") is None and r.pieces == [b"abc"]


def test_a_big_read_is_parsed_a_slice_at_a_time_within_the_budget():
    data = bytes(range(256)) * (5 * READ_SLICE // 256) + b"tail"
    r = _Reader(cost=READ_BUDGET / 10)
    assert r.feed(data) is None  # five slices and a bit: within the budget
    assert [len(p) for p in r.pieces] == [READ_SLICE] * 5 + [4] and b"".join(r.pieces) == data


def test_past_the_budget_the_rest_is_handed_back():
    data = b"x" * (10 * READ_SLICE)
    r = _Reader(cost=READ_BUDGET / 2.5)  # the budget is spent after three slices
    rest = r.feed(data)
    assert len(r.pieces) == 3 and rest is not None and bytes(rest) == data[3 * READ_SLICE:]
    r.now = 0.0
    assert r.feed(rest) is not None and len(r.pieces) == 6  # the next loop turn: three more


def test_once_the_application_has_input_waiting_the_rest_waits_too():
    data = b"y" * (4 * READ_SLICE)
    r = _Reader(stop_after=1)
    rest = r.feed(data)
    assert r.pieces == [data[:READ_SLICE]] and rest is not None and bytes(rest) == data[READ_SLICE:]
    assert r.feed(rest) is not None and len(r.pieces) == 1  # still waiting: not a byte parsed
    r.stop_after = None
    assert r.feed(rest) is None and b"".join(r.pieces) == data


def test_a_read_that_made_the_application_wait_holds_the_next_one():
    # All of it parsed, but what it queued waits: an empty rest, so that the caller keeps reading paused.
    r = _Reader(stop_after=1)
    rest = r.feed(b"z" * 10)
    assert r.pieces == [b"z" * 10] and rest is not None and len(rest) == 0
    r = _Reader(stop_after=2)
    rest = r.feed(b"w" * (2 * READ_SLICE))
    assert len(r.pieces) == 2 and rest is not None and len(rest) == 0


def test_a_closing_connection_parses_nothing_more():
    r = _Reader()
    r.closing = True
    assert r.feed(b"abc") is not None and r.pieces == []
    assert r.feed(b"a" * (3 * READ_SLICE)) is not None and r.pieces == []
