"""The micro-batching suite runs in quick mode and writes its section (its numbers mean little on a busy machine:
no test asserts a speed; docs/benchmarks.md has the full run)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.batch import HEADING, MODELS  # noqa: E402


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_batch_suite_quick_measures_both_models(quick_bench: Any) -> None:
    result = quick_bench.results["batch"]
    assert set(result.rows) == {*MODELS, "batched vs single"}
    for row in result.rows.values():
        assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in row.values()), row
    section = quick_bench.section(HEADING)
    assert "| batched |" in section and "**Verdict** (issue 19" in section
