"""The shared suite runs in quick mode (the Redis session store against the in-process one, a redis-server of its
own) and writes its section; numbers meaningless here (docs/benchmarks.md has the full run)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from redis_support import require_redis_server  # noqa: E402

from benchmarks.shared import HEADING, LABELS, SERVERS, WORKER_COUNTS  # noqa: E402


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_shared_suite_quick_measures_both_stores(quick_bench: Any) -> None:
    require_redis_server()
    result = quick_bench.results["shared"]
    workers = {f"workers{w}" for w in WORKER_COUNTS}
    assert set(result.rows) == {*SERVERS, "ratio", *workers, "workers_ratio"}
    for name, row in result.rows.items():
        assert all(isinstance(v, float) and math.isfinite(v) for v in row.values()), (name, row)
        assert all(v > 0 for k, v in row.items() if k != "errors"), (name, row)
    for name in workers:
        assert result.rows[name]["errors"] == 0, result.rows[name]  # every paced request of every connection
    section = quick_bench.section(HEADING)
    assert all(LABELS[name] in section for name in SERVERS)
    assert "**Verdict** (issue 18" in section and "**Workers.**" in section
