"""The context suite runs in quick mode and writes its section (bytes are deterministic: unlike the other suites',
its numbers do not depend on the machine's load, so the issue's target is asserted)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.context import HEADING, TARGET, run  # noqa: E402


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_context_suite_quick_sends_under_5_percent_of_resending(quick_bench: Any) -> None:
    result = quick_bench.results["context"]
    assert set(result.rows) == {"proto", "proto, resend compressed", "json"}
    for row in result.rows.values():
        assert 0 < row["first_bytes"] < row["context_bytes"] < row["resend_bytes"]
        assert row["ratio"] < TARGET, result.rows  # issue 19, item 2
    section = quick_bench.section(HEADING)
    assert "| proto, resend compressed |" in section and "**met**" in section


def test_context_suite_tiny_checks_the_models_text_after_every_edit() -> None:
    result = run("tiny")  # in process, well under a second; an edit the server lost fails the run
    assert result.rows["json"]["edits_ratio"] < result.rows["json"]["ratio"] < 1
