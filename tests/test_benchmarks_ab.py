"""The bench command's records (docs/benchmarks.md rewritten by a whole run, JSON results in benchmarks/results/)
and the A/B tool (``python -m benchmarks.ab``): its order of runs, its comparison, and that each side runs its own
code. No suite runs here: fake suites stand in, and no timing is asserted."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

import benchmarks  # noqa: E402
from benchmarks import ab, core  # noqa: E402


# ------------------------------------------------------------------------------ the bench command's records
def _fake_suites() -> dict[str, core.Suite]:
    def make(name: str, heading: str) -> core.Suite:
        def run(mode: str) -> core.SuiteResult:
            rows = {"x vs y": {"ratio": 1.25, "x_us": 10.0, "nan_ratio": math.nan}}
            return core.SuiteResult(name, heading, f"{name} body ({mode})", f"{name} text", rows)

        return core.Suite(name, heading, run)

    return {"one": make("one", "One: first"), "two": make("two", "Two: second")}


def test_a_whole_run_rewrites_the_doc_and_records_its_numbers(tmp_path: Path, monkeypatch: Any) -> None:
    """`lowlat-mw bench` (every suite): the doc holds that run alone (today's intro, no section left from an
    earlier run) and the run's rows go to a JSON record named by date, commit and mode."""
    monkeypatch.setattr(benchmarks, "all_suites", _fake_suites)
    out, results = tmp_path / "benchmarks.md", tmp_path / "results"
    out.write_text("# Old intro\n\n## Stale: a suite that is gone\n\nold numbers\n\n## One: first\n\nold one\n")
    done = benchmarks.run_suites(None, "tiny", str(out), str(results))
    assert [r.name for r in done] == ["one", "two"]
    text = out.read_text()
    assert text.startswith(core.INTRO.rstrip("\n")) and "Old intro" not in text
    assert "## Stale" not in text and "old one" not in text
    assert text.index("## One: first") < text.index("## Two: second") and "two body (tiny)" in text
    [path] = results.glob("*.json")
    assert path.name.endswith("-tiny.json")
    record = json.loads(path.read_text())  # (strict JSON: no NaN)
    assert set(record) >= {"date", "commit", "changed", "mode", "machine", "suites"} and record["mode"] == "tiny"
    assert record["machine"]["cpus"] >= 1 and record["machine"]["python"].startswith("CPython")
    assert record["suites"]["one"]["rows"] == {"x vs y": {"ratio": 1.25, "x_us": 10.0, "nan_ratio": None}}
    assert record["suites"]["two"]["heading"] == "Two: second"


def test_a_run_of_some_suites_replaces_only_their_sections(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(benchmarks, "all_suites", _fake_suites)
    out = tmp_path / "benchmarks.md"
    out.write_text("# Kept intro\n\n## Stale: kept\n\nother run\n\n## One: first\n\nold one\n")
    benchmarks.run_suites(["one"], "tiny", str(out), None)
    text = out.read_text()
    assert text.startswith("# Kept intro") and "## Stale: kept" in text and "other run" in text
    assert "one body (tiny)" in text and "old one" not in text and "## Two" not in text
    assert not list(tmp_path.glob("**/*.json"))


def test_full_runs_record_json_by_default_quick_runs_do_not(monkeypatch: Any) -> None:
    import benchmarks.__main__ as cli

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(cli, "run_suites", lambda *args: calls.append(args))
    cli.main(["--suite", "codec"])
    cli.main(["--quick", "--suite", "codec"])
    cli.main(["--suite", "codec", "--results", "", "--readme", ""])
    cli.main(["--quick", "--results", "elsewhere", "--readme", "R.md"])
    assert [c[3] for c in calls] == [str(ROOT / "benchmarks" / "results"), None, None, "elsewhere"]
    assert [c[4] for c in calls] == [str(ROOT / "README.md"), None, None, "R.md"]
    assert [c[1] for c in calls] == ["full", "quick", "full", "quick"]


def test_a_run_writes_its_headline_numbers_into_the_readme(tmp_path: Path, monkeypatch: Any) -> None:
    codec = core.SuiteResult("codec", "Codec", "body", "text", {"target": {"delta_proto_vs_json": 0.2468}})
    monkeypatch.setattr(benchmarks, "all_suites", lambda: {"codec": core.Suite("codec", "Codec", lambda mode: codec)})
    readme = tmp_path / "README.md"
    readme.write_text(f"{core.README_START}\n| Measure | Result |\n| --- | ---: |\n{core.README_END}\n")
    benchmarks.run_suites(["codec"], "tiny", None, None, str(readme))
    assert "| Protobuf delta frame vs compact JSON | 0.25x the bytes |" in readme.read_text()


def test_the_readme_table_is_the_one_the_bench_command_writes(tmp_path: Path) -> None:
    """The README's headline numbers are HEADLINES' rows, in the form update_headlines writes them."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index(core.README_START) + len(core.README_START):readme.index(core.README_END)]
    labels = [line.split("|")[1].strip() for line in table.strip().splitlines()[2:]]
    assert labels == [h.label for h in core.HEADLINES]
    copy = tmp_path / "README.md"
    copy.write_text(readme)
    assert core.update_headlines(copy, []) == [] and copy.read_text() == readme


def test_a_run_rewrites_the_headline_numbers_of_its_suites_only(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nintro\n\n{core.README_START}\n| Measure | Result |\n| --- | ---: |\n"
                      f"| {core.HEADLINES[0].label} | 0.33x |\n{core.README_END}\n\n## After\n")
    bare = core.SuiteResult("bare", "B", "", "", {"roundtrip proto": {"first_p50_ratio": 1.234},
                                            "stream proto-raw": {"server_cpu_ratio": math.nan}})
    assert core.update_headlines(readme, [bare]) == [core.HEADLINES[1].label]
    text = readme.read_text()
    assert f"| {core.HEADLINES[0].label} | 0.33x |" in text  # (transport did not run: kept)
    assert f"| {core.HEADLINES[1].label} | 1.23x |" in text  # (this run's)
    assert f"| {core.HEADLINES[2].label} | not measured yet |" in text  # (not finite, nothing kept)
    assert text.startswith("# x\n\nintro\n\n") and text.endswith(f"{core.README_END}\n\n## After\n")


def test_update_section_still_keeps_the_intro_of_an_existing_file(tmp_path: Path) -> None:
    out = tmp_path / "b.md"
    out.write_text("# Mine\n\n## A: a\n\nold\n")
    core.update_section(out, "A: a", "new")
    assert out.read_text() == "# Mine\n\n## A: a\n\nnew\n"


# ------------------------------------------------------------------------------ A/B: order and comparison
def test_runs_alternate_which_side_goes_first() -> None:
    """A B, B A, A B, ...: each round runs every suite once per side, and over two rounds each side runs first and
    second equally often, so neither always follows the other."""
    order = ab.schedule(4, ["bare", "scale"])
    assert len(order) == 4 * 2 * 2
    for suite in ("bare", "scale"):
        sides = [side for _, s, side in order if s == suite]
        assert sides == ["base", "head", "head", "base", "base", "head", "head", "base"]
    per_round = Counter((r, s, side) for r, s, side in order)
    assert set(per_round.values()) == {1} and len(per_round) == 16
    firsts = Counter(order[i][2] for i in range(0, len(order), 2))
    assert firsts == {"base": 4, "head": 4}
    assert ab.schedule(1, ["bare"]) == [(0, "bare", "base"), (0, "bare", "head")]


def test_ratios_are_the_ratio_columns_with_finite_values() -> None:
    rows = {"stream proto": {"ratio": 1.2, "server_cpu_ratio": 0.5, "deltas_per_s": 1e5, "ratio_of": 3.0},
            "bad": {"x_ratio": math.nan, "y_ratio": math.inf}}
    assert ab.ratios_of("bare", rows) == {("bare", "stream proto", "ratio"): 1.2,
                                          ("bare", "stream proto", "server_cpu_ratio"): 0.5}


def test_comparison_takes_medians_and_flags_a_change_beyond_five_percent_either_way() -> None:
    key = ("bare", "stream proto", "ratio")
    samples = {
        "base": {key: [1.0, 1.1, 0.9, 5.0], ("s", "up", "ratio"): [1.0, 1.0, 1.0], ("s", "down", "r_ratio"): [2.0],
                 ("s", "ref", "ratio"): [1.0, 1.0], ("s", "base only", "ratio"): [1.5]},
        "head": {key: [1.04, 1.0, 0.2, 1.05], ("s", "up", "ratio"): [1.06, 1.06, 1.07], ("s", "down", "r_ratio"): [1.8],
                 ("s", "ref", "ratio"): [1.0, 1.0]},
    }
    compared = {c.key: c for c in ab.compare(samples)}
    assert set(compared) == {key, ("s", "up", "ratio"), ("s", "down", "r_ratio")}  # no reference, no one-sided
    c = compared[key]
    assert c.base == pytest.approx(1.05) and c.head == pytest.approx(1.02) and c.rounds == (4, 4)
    assert not c.flagged() and compared[("s", "up", "ratio")].flagged()  # 1.06x
    assert compared[("s", "down", "r_ratio")].flagged() and compared[("s", "down", "r_ratio")].change == 0.9
    assert not compared[("s", "up", "ratio")].flagged(threshold=0.10)
    text = ab.table(list(compared.values()))
    line = next(x for x in text.splitlines() if "| up |" in x)
    assert "1.000" in line and "1.060" in line and "**beyond 5%**" in line
    assert "beyond" not in next(x for x in text.splitlines() if "stream proto" in x)
    assert ab.summary(list(compared.values())).startswith("2 of 3 ratios more than 5% from base")
    assert ab.summary([c]) == "Every one of 1 ratios within 5% of base."


# ------------------------------------------------------------------------------ A/B: each side its own code
def _git_checkout() -> bool:
    return shutil.which("git") is not None and subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _git_checkout(), reason="needs this repository as a git checkout")
def test_each_side_imports_its_own_code_and_the_snapshots_go_afterwards() -> None:
    """A snapshot of a commit runs its own lowlat_mw, adapters and harness (the editable install would give it this
    checkout's adapters without the side's sitecustomize); the repository is not written; the folders go."""
    before = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True,
                            timeout=30).stdout
    with ab.sides("HEAD", None, ROOT) as made:
        base, head = made["base"], made["head"]
        assert head.root == ROOT and base.root != ROOT and (base.root / "lowlat_mw" / "__init__.py").exists()
        assert len(base.commit) == 40
        for side in (base, head):
            ab.check_side(side)
        for side in (base, head):  # (bytecode beside the shim: nothing written into a checkout given by path)
            assert Path(side.env["PYTHONPYCACHEPREFIX"]).is_relative_to(base.root.parent)
        shim = Path(base.env["PYTHONPATH"].split(":")[0]) / "sitecustomize.py"
        shim.write_text("")  # no mapping: the adapters come from the editable install, this checkout's
        with pytest.raises(SystemExit, match="would not run its own code"):
            ab.check_side(base)
        tmp = base.root.parent
    assert not tmp.exists()
    assert subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True,
                          timeout=30).stdout == before
    with pytest.raises(SystemExit, match="not a commit"):
        with ab.sides("no-such-revision-here", None, ROOT):
            pass
