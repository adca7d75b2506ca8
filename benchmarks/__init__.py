"""lowlat-mw benchmarks: ``python -m benchmarks [--quick] [--suite NAME ...] [--output docs/benchmarks.md]``.

Suites measure configurations against each other in one run and write their section of
docs/benchmarks.md, and a full run its numbers as JSON into benchmarks/results/. See :mod:`benchmarks.core` for how
to add a suite, :mod:`benchmarks.ab` to compare two commits.
"""

from __future__ import annotations

from .core import MODES, SUITE_MODULES, Suite, SuiteResult, all_suites, suite, update_section

__all__ = ["MODES", "SUITE_MODULES", "Suite", "SuiteResult", "all_suites", "run_suites", "suite", "update_section"]


def run_suites(names: list[str] | None, mode: str, output: str | None,
               results: str | None = None, readme: str | None = None) -> list[SuiteResult]:
    """Run suites `names` (None: all) in `mode`, print them, write their sections into `output` (a run of every
    suite rewrites it whole: it then holds this run alone), the run's numbers as JSON into the folder `results` and
    its headline numbers into the table of `readme`."""
    import datetime as dt
    from pathlib import Path

    from .core import keep_only, log, update_headlines, write_results

    suites = all_suites()
    unknown = [n for n in names or () if n not in suites]
    if unknown:
        raise SystemExit(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(suites)}")
    chosen = [suites[n] for n in dict.fromkeys(names)] if names else list(suites.values())
    started = dt.datetime.now(dt.UTC)
    done: list[SuiteResult] = []
    for s in chosen:
        log(f"== suite {s.name} ({mode} mode)")
        result = s.run(mode)
        print(f"\n## {result.heading}\n\n{result.text}\n", flush=True)
        if output:
            update_section(Path(output), result.heading, result.body)
            log(f"== wrote section {result.heading!r} of {output}")
            for name, png in result.plots.items():
                folder = Path(output).parent / "benchmarks"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(png)
                log(f"== wrote {folder / name}")
        done.append(result)
        if results:  # after each suite, so a run that fails later keeps what it measured
            path = write_results(Path(results), done, mode, started)
            log(f"== wrote {path}")
        if readme and (updated := update_headlines(Path(readme), [result])):
            log(f"== wrote {len(updated)} headline number(s) into {readme}")
    if output and not names:
        keep_only(Path(output), [r.heading for r in done])
        log(f"== {output} holds this run alone")
    return done
