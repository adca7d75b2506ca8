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

from benchmarks.core import update_section  # noqa: E402
from benchmarks.failover import splice  # noqa: E402
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
        assert row["moved"] + row["ended_before_hit"] == streams, (name, row)  # A the primary: all start on A
    for name in workers:
        assert result.rows[name]["errors"] == 0, result.rows[name]  # every paced request of every connection
    section = quick_bench.section(HEADING)
    assert all(LABELS[name] in section for name in SERVERS)
    assert "**Verdict** (issue 18" in section and "**Workers.**" in section and "**Failover**" in section
    assert ("through nginx" in section) == (find_nginx() is not None)  # (else a FaultProxy stands in, and says so)


def test_the_failover_part_alone_replaces_only_its_part_of_the_section(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    update_section(out, "Before", "before body")
    update_section(out, HEADING, "CPU part\n\n**Workers.** workers part\n\n**Failover** old text\n\n| old |")
    update_section(out, "After", "after body")
    splice(out, "**Failover** new text\n\n| new |\n\nrun alone")
    text = out.read_text()
    assert "old" not in text and "**Failover** new text\n\n| new |\n\nrun alone\n\n## After\n" in text
    assert all(part in text for part in ("before body", "CPU part", "**Workers.** workers part", "after body"))
    last = tmp_path / "last.md"  # (docs/benchmarks.md: the section is the file's last)
    update_section(last, HEADING, "CPU part\n\n**Failover** old")
    splice(last, "**Failover** new")
    assert last.read_text().endswith(f"## {HEADING}\n\nCPU part\n\n**Failover** new\n")
