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

from benchmarks.shared import (  # noqa: E402
    FAILOVER_EVENTS,
    FAILOVER_PAIRS,
    FAILOVER_SIZES,
    HEADING,
    LABELS,
    SERVERS,
    WORKER_COUNTS,
)
from lowlat_mw.testing.nginx import find_nginx  # noqa: E402


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_shared_suite_quick_measures_both_stores(quick_bench: Any) -> None:
    require_redis_server()
    result = quick_bench.results["shared"]
    workers = {f"workers{w}" for w in WORKER_COUNTS}
    failover = {f"failover {a}-{b} {event}" for a, b in FAILOVER_PAIRS[:1] for event in FAILOVER_EVENTS}
    assert set(result.rows) == {*SERVERS, "ratio", *workers, "workers_ratio", *failover}
    for name, row in result.rows.items():
        assert all(isinstance(v, float) and math.isfinite(v) for v in row.values()), (name, row)
        if name not in failover:
            assert all(v > 0 for k, v in row.items() if k != "errors"), (name, row)
    streams = FAILOVER_SIZES["quick"][0]
    for name in failover:  # every stream whole and exact, or (A killed) an exact prefix then ResumeFailed
        row = result.rows[name]
        assert row["bad"] == 0 and row["exact"] + row["prefix"] == streams, (name, row)
        assert row["prefix"] == 0 or name.endswith("kill"), (name, row)
        assert row["moved"] <= streams, (name, row)
    for name in workers:
        assert result.rows[name]["errors"] == 0, result.rows[name]  # every paced request of every connection
    section = quick_bench.section(HEADING)
    assert all(LABELS[name] in section for name in SERVERS)
    assert "**Verdict** (issue 18" in section and "**Workers.**" in section and "**Failover**" in section
    assert ("through nginx" in section) == (find_nginx() is not None)  # (else a FaultProxy stands in, and says so)

