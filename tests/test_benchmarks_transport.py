"""The transport suite (benchmarks/transport.py) runs end to end in quick mode and writes its section.

Tiny mode starts the real processes (a plain and a TLS uvicorn server, the delaying proxies) and
measures a few requests per configuration on loopback and at 25 ms one way: every row must exist
with finite numbers. No timing assertions: the speed targets are checked by the benchmark itself
(docs/benchmarks.md), never by timed unit tests. The report and its plot are also checked on
synthetic samples, without servers.
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

from benchmarks.transport import HEADING, KEYS, LABELS, SIZES, TRANSPORTS, Measured, Size, report  # noqa: E402

ABS_COLUMNS = {"ttfd_p50_ms", "ttfd_p99_ms", "total_p50_ms", "total_p99_ms", "connections"}
RATIO_COLUMNS = {"ttfd_c_vs_a", "ttfd_c_vs_b", "ttfd_c_minus_b_ms", "c_faster_than_b_share", "total_c_vs_a",
                 "total_c_vs_b"}


def expected_rows(size: Size) -> set[str]:
    rows = {"target"}
    for d in size.delays_ms:
        for tls in size.tls:
            name = "tls" if tls else "plain"
            rows.add(f"ratio {d}ms {name}")
            rows.update(f"{KEYS[t]} {d}ms {name}" for t in TRANSPORTS)
    return rows


def check_rows(rows: dict[str, dict[str, float]], size: Size) -> None:
    assert set(rows) == expected_rows(size)
    for label, cols in rows.items():
        if label == "target":
            assert set(cols) == {"ttfd_c_vs_a", "ttfd_c_vs_b", "cut_met", "sse_met"}
        elif label.startswith("ratio "):
            assert set(cols) == RATIO_COLUMNS
        elif label.startswith("lowlat-ws "):
            assert set(cols) == {*ABS_COLUMNS, "server_ttfd_p50_ms"}
        else:
            assert set(cols) == ABS_COLUMNS
        for col, value in cols.items():
            assert isinstance(value, float) and math.isfinite(value), (label, col, value)


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_transport_suite_quick_writes_every_row(quick_bench: Any) -> None:
    result = quick_bench.results["transport"]
    size = SIZES["quick"]
    check_rows(result.rows, size)
    for d in size.delays_ms:
        for tls in size.tls:
            name = "tls" if tls else "plain"
            # (a) opens a connection per request (warm-up included); (b) and (c) reuse one.
            assert result.rows[f"http-new {d}ms {name}"]["connections"] == size.rounds[d] + size.warmup
            assert result.rows[f"sse-keepalive {d}ms {name}"]["connections"] == 1
            assert result.rows[f"lowlat-ws {d}ms {name}"]["connections"] == 1
            for t in TRANSPORTS:
                row = result.rows[f"{KEYS[t]} {d}ms {name}"]
                assert 0 < row["ttfd_p50_ms"] <= row["ttfd_p99_ms"] and row["ttfd_p50_ms"] <= row["total_p50_ms"]

    text = quick_bench.text
    assert "intro kept" in text and "## Transport: kept" in text and "other suite's table" in text
    assert text.count(f"## {HEADING}") == 1
    section = quick_bench.section(HEADING)
    assert "Machine: " in section and "CPUs" in section and "TLS: TLSv1" in section
    assert "`.venv/bin/python -m benchmarks --suite transport`" in section
    for t in TRANSPORTS:
        assert f"| {LABELS[t]} |" in section
    assert "| 25 ms | on |" in section and "| loopback | on |" in section  # quick mode: TLS on only
    assert section.count("**Verdict**") == 2 and "40%" in section
    assert result.text and "**Verdict**" in result.text
    assert set(result.plots) == {"transport-ttfd.png"}


def test_report_and_plot_from_synthetic_samples() -> None:
    size = Size(delays_ms=(0, 25), tls=(False, True), rounds={0: 4, 25: 4}, warmup=0, plot=True)
    base = {"a": 3.0, "b": 1.0, "c": 0.9}
    m = Measured(tokens=37, tls_version="TLSv1.3")
    for d in size.delays_ms:
        for tls in size.tls:
            for t in TRANSPORTS:
                rtts = {"a": 3 if tls else 2, "b": 1, "c": 1}[t] if d else 0
                ttfd = [base[t] + rtts * 2 * d + 0.1 * i for i in range(4)]
                m.ttfd[(d, tls, t)] = ttfd
                m.total[(d, tls, t)] = [x + 2.0 for x in ttfd]
                m.connections[(d, tls, t)] = 4 if t == "a" else 1
            m.server_ttfd[(d, tls)] = [0.3, 0.2, 0.4, 0.3]
    result = report("quick", size, m, "asyncio event loop")
    check_rows(result.rows, size)
    assert result.rows["target"]["cut_met"] == 1.0 and result.rows["target"]["sse_met"] == 1.0
    assert set(result.plots) == {"transport-ttfd.png"}
    assert result.plots["transport-ttfd.png"].startswith(b"\x89PNG\r\n\x1a\n")
    assert "(benchmarks/transport-ttfd.png)" in result.body
    assert result.body.count("**met**") == 2
