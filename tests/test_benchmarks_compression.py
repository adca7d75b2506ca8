"""The compression benchmark suite (benchmarks/compression.py) runs in quick mode and writes every row.

No timing assertions: whether the selector meets its delivery-cost targets is reported by the benchmark
(docs/benchmarks.md). What does not depend on timing is checked: the oracle is the cheapest per-message
choice, no strategy that follows the protocol sends a frame bigger than raw, and the section says so.
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

from benchmarks.compression import (  # noqa: E402
    CLASSES,
    FIXED,
    HEADING,
    LINKS_MBPS,
    ORDER,
    SIZES,
    build_corpus,
)

STRATEGY_COLUMNS = {"cost_ms", "vs_oracle", "wire_bytes", "bytes_vs_raw", "compress_ms", "decompress_ms",
                    "bigger_frames"}


@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_compression_suite_quick_writes_every_row(quick_bench: Any) -> None:
    result = quick_bench.results["compression"]

    links = [f"{mbps:g} Mbit/s" for mbps in LINKS_MBPS]
    expected = {"selector overhead"}
    for link in links:
        expected |= {f"{link} {s}" for s in ORDER}
        expected |= {f"{link} target", f"{link} selector cost"}
        expected |= {f"{link} class {cls}" for cls in CLASSES}
    assert set(result.rows) == expected
    for label, cols in result.rows.items():
        for col, value in cols.items():
            assert isinstance(value, float) and math.isfinite(value), (label, col, value)
            # the one signed column: the selector may be ahead of the best fixed codec ("ahead of" in the text)
            assert col == "gap_to_best_fixed_ms" or value >= 0, (label, col, value)
    for link in links:
        rows = {s: result.rows[f"{link} {s}"] for s in ORDER}
        best_fixed = min(rows[s]["cost_ms"] for s in ("none", *FIXED))
        gap = result.rows[f"{link} selector cost"]["gap_to_best_fixed_ms"]
        assert gap == pytest.approx(rows["selector"]["cost_ms"] - best_fixed), (link, gap)
        for s, cols in rows.items():
            assert set(cols) == STRATEGY_COLUMNS, s
        assert rows["oracle"]["vs_oracle"] == 1.0
        # the oracle picks, per message, the cheapest of none and the fixed codecs (from the same times)
        assert all(rows["oracle"]["cost_ms"] <= rows[s]["cost_ms"] * (1 + 1e-9) for s in ("none", *FIXED))
        assert rows["oracle, any size"]["cost_ms"] <= rows["oracle"]["cost_ms"] * (1 + 1e-9)
        assert rows["none"]["bytes_vs_raw"] == 1.0
        for s in ("none", *FIXED, "selector", "selector-v1", "oracle"):  # the protocol's sender rule
            assert rows[s]["bigger_frames"] == 0.0, (link, s)
        target = result.rows[f"{link} target"]
        assert set(target) == {"selector_vs_oracle", "best_fixed_vs_oracle", "best_fixed_vs_selector", "met"}
        assert target["met"] in (0.0, 1.0)
    assert result.plots == {}  # only full mode draws the plot

    text = quick_bench.text
    assert "intro kept" in text and "## Codec: kept" in text and "other suite's table" in text
    assert text.count(f"## {HEADING}") == 1
    section = quick_bench.section(HEADING)
    assert "Machine: " in section and "CPUs" in section and "--suite compression" in section
    for link in links:
        assert f"**{link}**" in section
    assert "| **adaptive selector (shipped)** |" in section and "| per-message oracle |" in section
    assert "codec id 4" in section and "zstd-stream" in section  # the stream compressor is a reference only
    assert "round trip time" in section
    assert "**Verdict**" in section and "5%" in section
    assert "benchmarks/compression-cost.png" not in section  # no plot, no link


def test_corpus_is_deterministic_and_mixed() -> None:
    a, b = build_corpus(SIZES["tiny"].corpus_bytes), build_corpus(SIZES["tiny"].corpus_bytes)
    assert a == b
    assert {m.cls for m in a} == set(CLASSES)  # every class, even in the smallest corpus
    sizes = [len(m.payload) for m in build_corpus(SIZES["quick"].corpus_bytes)]
    assert min(sizes) < 64 and max(sizes) > 100_000  # tiny token deltas to hundreds of KB
