"""The warm-up and cache suite runs in quick mode and writes its section (its numbers mean little on a busy machine: no
test asserts a speed; docs/benchmarks.md has the full run)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.warmup import CACHE_CONFIGS, CONFIGS, HEADING  # noqa: E402


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_warmup_suite_quick_measures_every_configuration(quick_bench: Any) -> None:
    result = quick_bench.results["warmup"]
    assert set(result.rows) == {*CONFIGS, "warm-up request", *CACHE_CONFIGS}
    for config in (*CONFIGS, *CACHE_CONFIGS):
        row = result.rows[config]
        assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in row.values()), (config, row)
    # A cold key waits for the model's preparation, an awaited 20 ms in quick mode, and so does the warm-up request
    # (lower bounds only, with room for a timer that fires a little early: load can only make them longer).
    assert result.rows["cold"]["ttfd_p50_ms"] >= 15
    assert result.rows["warm-up request"]["ms_p50"] >= 15
    section = quick_bench.section(HEADING)
    assert "| after warm-up |" in section and "| cache hit, raw client |" in section
    assert section.count("**Verdict** (issue 19") == 2  # the warm-up's and the cache's
