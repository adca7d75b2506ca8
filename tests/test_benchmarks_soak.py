"""The soak suite runs in quick mode against every server and writes its section (numbers meaningless here:
1,000 connections are all warm-up; docs/benchmarks.md has the 100,000-connection run). The fit is checked
on made-up readings."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.soak import HEADING, LABELS, SERVERS, fit, server_argv, slope  # noqa: E402

COLUMNS = {"churn_slope_b", "churn_late_slope_b", "resume_slope_b", "resume_late_slope_b", "rss_warm_mib",
           "rss_end_mib", "fds_start", "fds_end", "connections_per_s", "errors"}


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_soak_suite_quick_writes_every_server(quick_bench: Any) -> None:
    result = quick_bench.results["soak"]
    assert set(result.rows) == set(SERVERS)
    for server, row in result.rows.items():
        assert set(row) == COLUMNS
        assert all(isinstance(v, float) and math.isfinite(v) for v in row.values()), (server, row)
        assert row["errors"] == 0, server  # every cycle (handshake, request, close; resume) worked
        assert row["rss_warm_mib"] > 0 and row["connections_per_s"] > 0
        assert row["fds_end"] <= row["fds_start"] + 8, (server, row)  # no descriptor per connection
    section = quick_bench.section(HEADING)
    for server in SERVERS:
        assert f"| {server} |" in section and LABELS[server] in section
    assert "Target (issue 16)" in section


def test_the_fit_is_the_least_squares_slope_after_the_warm_up() -> None:
    assert slope([(1, 10), (2, 20), (3, 30)]) == pytest.approx(10.0)
    assert slope([(5, 7)]) == 0.0
    # Steep while warming up, then 2 bytes per cycle: the warm-up is left out, the second half alone is flat.
    points = [(100, 10_000), (200, 20_000), (300, 20_200), (400, 20_400), (500, 20_500), (600, 20_500)]
    after, late = fit(points, 0.2)
    assert after == pytest.approx(slope(points[1:]))
    assert late == pytest.approx(slope([(400, 20_400), (500, 20_500), (600, 20_500)]))
    assert fit([], 0.2) == (0.0, 0.0)


def test_server_command_lines() -> None:
    assert server_argv("serve", 9)[1:3] == ["serve", "benchmarks._bare_models:MODELS"]
    assert "lowlat_mw.servers.uvicorn:WSProtoProtocol" in server_argv("wsproto", 9)
    assert "lowlat_mw.servers.uvicorn:WebSocketProtocol" in server_argv("starlette", 9)
    assert server_argv("django", 9)[1:3] == ["-m", "lowlat_mw.servers.daphne"]
    assert "lowlat_mw.servers.gunicorn.ThreadWorker" in server_argv("flask", 9)
    with pytest.raises(ValueError):
        server_argv("bottle", 9)
