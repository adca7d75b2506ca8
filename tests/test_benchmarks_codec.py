"""The codec benchmark suite (benchmarks/codec.py) runs in quick mode and writes every row and its section.

No timing assertions: the byte target (token-delta proto frames at most 0.40x compact JSON) is a property of
the encoding, so it is checked here; speed is reported by the benchmark only (docs/benchmarks.md).
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

from benchmarks.codec import FORMATS, HEADING, KINDS, SIZES, build_messages  # noqa: E402

COLUMNS = {"bytes", "bytes_vs_json", "encode_us", "decode_us", "total_us", "total_p99_us", "time_vs_json_frame"}


@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_codec_suite_quick_writes_every_row(quick_bench: Any) -> None:
    result = quick_bench.results["codec"]

    expected = {f"{kind} {fmt.key}" for kind in KINDS for fmt in FORMATS} | {"target"}
    assert set(result.rows) == expected
    for kind in KINDS:
        for fmt in FORMATS:
            assert set(result.rows[f"{kind} {fmt.key}"]) == COLUMNS
    assert set(result.rows["target"]) == {"delta_proto_vs_json", "with_ws_header", "worst_message",
                                          "nonascii_proto_vs_json"}
    for label, cols in result.rows.items():
        for col, value in cols.items():
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (label, col, value)
    for kind in KINDS:  # compact JSON is the byte reference: JSON frames, stdlib json and orjson are it
        for key in ("json-frame", "json", "orjson"):
            assert result.rows[f"{kind} {key}"]["bytes_vs_json"] == 1.0
    assert result.rows["target"]["delta_proto_vs_json"] <= 0.40  # issue 7's byte target
    assert result.plots == {}  # only full mode draws the plot

    text = quick_bench.text
    assert "intro kept" in text and "## Transport: kept" in text and "other suite's table" in text
    assert text.count(f"## {HEADING}") == 1
    section = quick_bench.section(HEADING)
    assert "Machine: " in section and "CPUs" in section and "--suite codec" in section
    for label in KINDS.values():
        assert f"| {label} |" in section
    for fmt in FORMATS:
        assert f"| {fmt.label} |" in section
    assert "**Verdict**" in section and "0.40x" in section and "**met**" in section
    assert "benchmarks/codec-bytes-time.png" not in section  # no plot, no link


def test_messages_are_deterministic_and_realistic() -> None:
    a, b = build_messages(SIZES["tiny"]), build_messages(SIZES["tiny"])
    assert a == b
    tokens = [d.text for d in build_messages(SIZES["quick"])["delta"]]
    assert all(1 <= len(t) <= 8 for t in tokens)
    non_ascii = sum(not t.isascii() for t in tokens) / len(tokens)
    assert 0.02 < non_ascii < 0.1
    [large] = build_messages(SIZES["tiny"])["request-large"]
    assert 45_000 < sum(len(m.content.encode()) for m in large.messages) < 60_000
