"""Command line: ``python -m benchmarks [--quick] [--suite NAME ...] [--output PATH] [--results DIR]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import all_suites, run_suites

RESULTS = Path(__file__).resolve().parent / "results"  # this checkout's, from any directory
README = Path(__file__).resolve().parents[1] / "README.md"


def main(argv: list[str] | None = None) -> int:
    suites = all_suites()
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run lowlat-mw benchmark suites, write their sections of docs/benchmarks.md and (full size) "
                    "their numbers as JSON into benchmarks/results/.",
    )
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, every suite together well under 2 minutes (the CI smoke test)")
    parser.add_argument("--suite", action="append", metavar="NAME", choices=list(suites),
                        help=f"run only this suite (repeatable; default: all of {', '.join(suites)})")
    parser.add_argument("--output", default="docs/benchmarks.md", metavar="PATH",
                        help="markdown file whose suite sections are replaced (default: %(default)s; '' to skip)")
    parser.add_argument("--results", default=None, metavar="DIR",
                        help=f"folder for the run's JSON record (default: {RESULTS} for a full-size run, none for "
                             "--quick; '' for none)")
    parser.add_argument("--readme", default=None, metavar="PATH",
                        help=f"file whose table of headline numbers a run updates (default: {README} for a full-size "
                             "run, none for --quick; '' for none)")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    args = parser.parse_args(argv)
    if args.list:
        for s in suites.values():
            print(f"{s.name}: {s.heading}")
        return 0
    results = (None if args.quick else str(RESULTS)) if args.results is None else args.results or None
    readme = (None if args.quick else str(README)) if args.readme is None else args.readme or None
    run_suites(args.suite, "quick" if args.quick else "full", args.output or None, results, readme)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
