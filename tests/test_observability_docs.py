"""docs/observability.md and docs/grafana/lowlat-mw.json cannot drift from lowlat_mw.observability.metrics.

The metrics reference embedded in the guide must be the generated one; every ``lowlat_*`` name in
the PromQL cheat sheet and in the Grafana dashboard must be a sample name a scrape really shows.
"""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lowlat_mw import docs
from lowlat_mw.observability import metrics
from lowlat_mw.observability.metrics import Metrics
from lowlat_mw.protocol.base import FrameStats

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "observability.md"
DASHBOARD = ROOT / "docs" / "grafana" / "lowlat-mw.json"
NAME = re.compile(r"\blowlat_[a-z0-9_]+")


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a Markdown text."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def _cheat_sheet_queries() -> list[str]:
    """The PromQL lines of the cheat sheet's code blocks (comments and blank lines dropped)."""
    section = _section(GUIDE.read_text(), "PromQL cheat sheet")
    blocks = re.findall(r"```promql\n(.*?)```", section, re.S)
    assert blocks, "no ```promql block in the cheat sheet"
    return [line for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # panels of collapsed rows
    return out


def _exprs(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]


def _balanced(expr: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for ch in re.sub(r'"[^"]*"', '""', expr):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


# ------------------------------------------------------------------------------ reference
def test_metrics_reference_is_current() -> None:
    text = GUIDE.read_text()
    start, end = text.index(docs.METRICS_BEGIN), text.index(docs.METRICS_END) + len(docs.METRICS_END) + 1
    assert text[start:end] == docs.metrics_markdown(), (
        "the metrics reference in docs/observability.md is stale: "
        "python -m lowlat_mw.docs metrics --update docs/observability.md"
    )
    assert docs.embed_metrics(text) == text


def test_reference_lists_every_metric_and_stage() -> None:
    reference = docs.metrics_markdown()
    for spec in metrics._SPECS:
        assert f"`lowlat_{spec.name}" in reference, spec.name
    for stage in metrics.STAGES:
        assert re.search(rf"^\| `{stage}` \| \S", reference, re.M), stage


def test_docs_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert docs.main([]) == 0
    assert capsys.readouterr().out == docs.settings_markdown()  # the default stays the settings table
    assert docs.main(["metrics"]) == 0
    assert capsys.readouterr().out == docs.metrics_markdown()
    page = tmp_path / "page.md"
    page.write_text(f"before\n{docs.METRICS_BEGIN}\nold table\n{docs.METRICS_END}\nafter\n")
    assert docs.main(["metrics", "--update", str(page)]) == 0
    assert page.read_text() == f"before\n{docs.metrics_markdown()}after\n"
    assert docs.main(["nonsense"]) == 2


def test_exported_names_match_a_real_scrape() -> None:
    """Every series family recorded once, scraped: the sample names are exactly docs.exported_names()."""
    registry = CollectorRegistry()
    m = Metrics(registry)
    for spec in metrics._SPECS:
        labels = tuple(f"v{i}" for i in range(len(spec.labels)))
        if spec.kind == "counter" and spec.name not in ("frames_sent", "payload_bytes", "wire_bytes",
                                                        "frames_received", "received_bytes"):
            m.inc(spec.name, *labels)
        elif spec.kind == "histogram":
            m.observe(spec.name, 0.001, *labels)
    stats = FrameStats("proto")
    stats.count_sent(1, 100, 40)
    stats.received[:] = [1, 10]
    m.attach(stats)
    scraped = {s.name for fam in text_string_to_metric_families(generate_latest(registry).decode())
               for s in fam.samples}
    assert scraped == docs.exported_names()


# ------------------------------------------------------------------------------ cheat sheet
def test_cheat_sheet_names_exist() -> None:
    valid = docs.exported_names()
    queries = _cheat_sheet_queries()
    for query in queries:
        assert _balanced(query), query
        names = NAME.findall(query)
        assert names, query
        assert set(names) <= valid, (query, set(names) - valid)


def test_cheat_sheet_covers_the_questions() -> None:
    text = "\n".join(_cheat_sheet_queries())
    for needle in (
        "histogram_quantile(0.5, sum by (le) (rate(lowlat_time_to_first_delta_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(lowlat_time_to_first_delta_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(lowlat_inter_delta_seconds_bucket",
        "sum by (outcome) (rate(lowlat_streams_finished_total",
        "sum by (code) (rate(lowlat_errors_total",
        'lowlat_connections_closed_total{name="idle_timeout"}',
        'lowlat_connections_closed_total{name="heartbeat_timeout"}',
        "1 - sum(rate(lowlat_wire_bytes_total[5m])) / sum(rate(lowlat_payload_bytes_total[5m]))",
        "sum by (stage) (rate(lowlat_stage_seconds_sum",
        "rate(lowlat_heartbeat_rtt_seconds_bucket",
        "sum(lowlat_connections)",
        "sum(lowlat_streams)",
        "rate(lowlat_resumes_total",
    ):
        assert needle in text, needle


# ------------------------------------------------------------------------------ dashboard
def test_dashboard_is_importable_json_with_a_datasource_input() -> None:
    dash = _dashboard()
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    assert dash["__inputs"][0]["pluginId"] == "prometheus"
    assert dash["title"] and dash["uid"]
    panels = _panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 10
    for panel in graphs:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert _balanced(target["expr"]), target["expr"]
    for var in dash["templating"]["list"]:
        if "datasource" in var:
            assert var["datasource"]["uid"] == "${DS_PROMETHEUS}", var["name"]


def test_dashboard_names_exist_and_cover_the_cheat_sheet() -> None:
    dash = _dashboard()
    valid = docs.exported_names()
    everywhere = set(NAME.findall(DASHBOARD.read_text()))  # exprs, variable queries, descriptions
    assert everywhere <= valid, everywhere - valid
    in_exprs = {n for e in _exprs(dash) for n in NAME.findall(e)}
    in_cheat_sheet = {n for q in _cheat_sheet_queries() for n in NAME.findall(q)}
    assert in_cheat_sheet <= in_exprs, f"cheat-sheet metrics without a panel: {in_cheat_sheet - in_exprs}"


def test_guide_links_resolve() -> None:
    text = GUIDE.read_text()
    assert "(grafana/lowlat-mw.json)" in text
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (GUIDE.parent / target).exists() or target == "benchmarks.md", target
    assert "(docs/observability.md)" in (ROOT / "README.md").read_text()


# ------------------------------------------------------------------------------ logging example
def test_extras_formatter_example_prints_extras() -> None:
    """The standard-library formatter in the guide prints extras on the message line."""
    section = _section(GUIDE.read_text(), "Structured logs")
    code = next(b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "class ExtrasFormatter" in b)
    namespace: dict[str, Any] = {"__name__": "guide_example"}
    exec(code.split("\nhandler = ")[0], namespace)  # the class only, not the handler set-up
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(namespace["ExtrasFormatter"]("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("guide_example.lowlat_mw")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("connection %s closed", "s1", extra={"session_id": "s1", "close_code": 4000})
    finally:
        logger.removeHandler(handler)
    assert out.getvalue() == "WARNING guide_example.lowlat_mw: connection s1 closed session_id='s1' close_code=4000\n"
