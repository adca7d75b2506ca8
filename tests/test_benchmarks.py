"""The benchmark harness (benchmarks/, ``python -m benchmarks``) works: suites run and write their docs section.

The overhead suite's rows come from the one quick-mode run of every suite that the quick_bench
fixture makes (tests/conftest.py; numbers meaningless), including its two uvicorn
child processes. No timing assertions here: speed targets are checked by the benchmarks themselves
(docs/benchmarks.md), never by timed unit tests.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.core import INTRO, update_section  # noqa: E402
from benchmarks.overhead import CONFIGS, HEADING  # noqa: E402


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_update_section_replaces_only_its_own_section(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "benchmarks.md"
    update_section(out, "Transport: one", "first body")
    text = out.read_text()
    assert text.startswith(INTRO.rstrip("\n"))
    update_section(out, "Overhead: two", "second body")
    update_section(out, "Transport: one", "replaced body\n\n| a | b |")
    text = out.read_text()
    assert text.count("## Transport: one") == 1 and text.count("## Overhead: two") == 1
    assert "first body" not in text and "replaced body" in text and "second body" in text
    assert text.index("## Transport: one") < text.index("## Overhead: two")  # a section keeps its place
    assert text.startswith("# Benchmarks") and text.endswith("second body\n")


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_overhead_suite_quick_writes_every_row(quick_bench: Any) -> None:
    result = quick_bench.results["overhead"]

    keys = ["A", "B", "C"]
    if _has("opentelemetry.sdk"):
        keys.append("D")
    if _has("opentelemetry.trace"):
        keys.append("E")
    expected = {*keys, "C vs B", "e2e proto", "e2e json"}
    assert set(result.rows) == expected
    for key in keys:
        assert set(result.rows[key]) == {"proto_us", "proto_ratio_vs_A", "json_us", "json_ratio_vs_A"}
    assert set(result.rows["C vs B"]) == {"proto_ratio", "json_ratio"}
    for sp in ("proto", "json"):
        assert set(result.rows[f"e2e {sp}"]) == {f"{m}_{c}" for m in ("wall", "cpu")
                                                 for c in ("off_us", "on_us", "ratio")}
    for label, cols in result.rows.items():
        for col, value in cols.items():
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (label, col, value)

    text = quick_bench.text
    assert "intro kept" in text and "## Transport: kept" in text and "other suite's table" in text
    assert text.count(f"## {HEADING}") == 1
    section = quick_bench.section(HEADING)
    assert "Machine: " in section and "CPUs" in section and "Python" in section
    for cfg in CONFIGS:
        assert (f"| {cfg.key}: {cfg.label} |" in section) == (cfg.key in keys)
    assert "| C vs B" in section and "| proto |" in section and "| json |" in section
    assert "**Verdict**" in section and "5%" in section
    assert result.text and "**Verdict**" in result.text


def test_command_line_lists_suites() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"overhead: {HEADING}" in out.stdout.splitlines()
    bad = subprocess.run([sys.executable, "-m", "benchmarks", "--suite", "nope"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_permuted_orders_put_every_server_right_after_every_other_equally_often() -> None:
    """The scale suite's streaming rounds: over 3! rounds each server runs in each place, and right after each
    other server, equally often (a rotation always put the same server after the same other one)."""
    import itertools
    from collections import Counter

    from benchmarks.core import permuted

    keys = ["bare", "lowlat", "lowlat-direct"]
    orders = [permuted(keys, r) for r in range(6)]
    assert all(sorted(order) == sorted(keys) for order in orders) and permuted(keys, 6) == orders[0]
    assert Counter((i, k) for order in orders for i, k in enumerate(order)) == Counter(
        {(i, k): 2 for i in range(3) for k in keys})
    after = Counter(pair for order in orders for pair in itertools.pairwise(order))
    assert set(after.values()) == {2} and len(after) == 6  # every ordered pair, twice
    assert permuted([], 3) == []
