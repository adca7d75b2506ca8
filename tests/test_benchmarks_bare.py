"""The bare suite (lowlat-mw vs a bare Starlette WebSocket) runs in quick mode (quick_bench) and writes its section.

Seconds, numbers meaningless: one uvicorn child process for the measured rounds and one profiled
one. No timing assertions: the speed targets are checked by the benchmark itself (its verdict lines
in docs/benchmarks.md), never by timed unit tests.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks._bare_common import RawClient  # noqa: E402
from benchmarks._bare_server import make_app  # noqa: E402
from benchmarks.bare import CONFIGS, HEADING, _category  # noqa: E402

pytestmark = pytest.mark.integration

ROUNDTRIP_COLUMNS = {"first_p50_us", "first_p99_us", "end_p50_us", "end_p99_us", "first_p50_ratio", "end_p50_ratio",
                     "server_cpu_us", "server_cpu_ratio", "client_cpu_us"}
STREAM_COLUMNS = {"deltas_per_s", "ratio", "server_cpu_us_per_delta", "server_cpu_ratio", "client_cpu_us_per_delta"}
PROFILES = ("lowlat stream", "bare stream", "lowlat roundtrip", "bare roundtrip")


@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_bare_suite_quick_writes_every_row(quick_bench: Any) -> None:
    result = quick_bench.results["bare"]

    expected = ({f"roundtrip {c.key}" for c in CONFIGS} | {f"stream {c.key}" for c in CONFIGS}
                | {f"profile {p}" for p in PROFILES})
    assert set(result.rows) == expected
    for c in CONFIGS:
        assert set(result.rows[f"roundtrip {c.key}"]) == ROUNDTRIP_COLUMNS
        assert set(result.rows[f"stream {c.key}"]) == STREAM_COLUMNS
    for label, cols in result.rows.items():
        for col, value in cols.items():
            assert isinstance(value, float) and math.isfinite(value), (label, col, value)
    for c in CONFIGS:  # every latency and rate is a positive measurement
        rt, st = result.rows[f"roundtrip {c.key}"], result.rows[f"stream {c.key}"]
        assert rt["first_p50_us"] > 0 and rt["end_p50_us"] >= rt["first_p50_us"] * 0.5
        assert st["deltas_per_s"] > 0 and st["server_cpu_us_per_delta"] > 0
    assert result.rows["roundtrip bare"]["first_p50_ratio"] == 1.0
    assert result.rows["stream bare"]["ratio"] == 1.0
    assert set(result.plots) == {"bare.png"}

    text = quick_bench.text
    assert "intro kept" in text and "## Transport: kept" in text and "other suite's table" in text
    assert text.count(f"## {HEADING}") == 1
    section = quick_bench.section(HEADING)
    assert "Machine: " in section and "CPUs" in section and "Python" in section
    assert "--suite bare" in section
    for c in CONFIGS:
        assert section.count(f"| {c.label} |") == 2  # one row in each table
    assert "**Verdict, round trip**" in section and "1.3x" in section
    assert "**Verdict, streaming**" in section and "0.7x" in section
    assert "Where the server's time goes" in section and "lowlat_mw." in section
    assert result.text and "**Verdict, round trip**" in result.text


def test_profile_categories() -> None:
    assert _category("/x/lowlat_mw/runtime/connection.py") == "lowlat_mw.runtime.connection"
    assert _category("/x/lowlat_mw/proto/lowlat_v1_pb2.py") == "lowlat_mw.lowlat_v1_pb2"
    assert _category("/repo/adapters/starlette.py") == "lowlat_mw.adapters.starlette"
    assert _category("/v/lib/python3.11/site-packages/uvicorn/protocols/x.py") == "uvicorn"
    assert _category("/usr/lib/python3.11/asyncio/events.py") == "asyncio"
    assert _category("~") == "C builtins"
    assert _category("/usr/lib/python3.11/inspect.py") == "other Python"


def test_raw_client_classifies_frames_without_decoding() -> None:
    from lowlat_mw.protocol import events as ev
    from lowlat_mw.protocol.wire import codec_for
    from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO

    for mode, sp, table in (("proto", SUBPROTOCOL_PROTO, None), ("json", SUBPROTOCOL_JSON, RawClient._JSON_KIND)):
        codec = codec_for(sp)
        frames = {"delta": codec.encode(ev.Delta(stream_id=1, seq=1, text=" token")),
                  "end": codec.encode(ev.End(stream_id=1, last_seq=1, finish_reason="stop")),
                  "ping": codec.encode(ev.Ping(id=7))}
        for kind, frame in frames.items():
            if table is None:
                assert isinstance(frame, bytes) and RawClient._PROTO_KIND[frame[1]] == kind
            else:
                assert isinstance(frame, str) and any(frame.startswith(p) and k == kind for p, k in table)
        assert RawClient("ws://x/ws", mode).request("echo", text="hi")


def test_server_app_routes() -> None:
    app = make_app()
    paths = {getattr(r, "path", None) for r in app.routes}
    assert {"/echo", "/stream", "/cpu", "/profile"} <= paths
