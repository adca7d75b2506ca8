"""A/B: ``python -m benchmarks.ab --base REV [--head REV|PATH] --suite bare --suite scale --rounds N [--quick]``.

Runs benchmark suites from two versions of lowlat-mw, interleaved, and compares their ratios: did a change keep
the speed? Each side is a temporary snapshot of a commit (``git archive``: nothing is written to the repository, its
worktrees or its git metadata) or a checkout given by path; each runs with its own code, on this virtualenv's
Python and packages, with ``PYTHONPATH`` pointing at the side (the suites' server and client processes inherit it)
and ``lowlat_mw.adapters`` mapped to the side's ``adapters/`` (the editable install maps it to this checkout's).

In each round every suite runs once per side, the side that goes first alternating (A B, then B A, ...), so drift
and background load hit both alike. A side runs a suite through ``benchmarks.run_suites`` (present in every
version of the harness) and hands back the suite's ``rows``; the ratios (columns named ``ratio`` or ``*_ratio``)
of every round are compared: per ratio, the median over rounds for base and head, and head / base, marked when
more than ``--tolerance`` (5%) apart. docs/benchmarks.md, "A/B against another commit", says how to read it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .core import ROOT, log, markdown_table

THRESHOLD = 0.05  # the acceptance's "every ratio within 5% of before"
SIDES = ("base", "head")

# Run inside a side's process (cwd and PYTHONPATH: the side): its own harness, its suite's rows to a JSON file.
RUNNER = """
import json, sys
from benchmarks import run_suites
[result] = run_suites([sys.argv[1]], sys.argv[2], None)
with open(sys.argv[3], "w") as f:
    json.dump({"name": result.name, "rows": result.rows}, f)
"""

# Imported at start-up by every Python process of a side (PYTHONPATH's first folder): `lowlat_mw.adapters` from
# the side's `adapters/`, where the package's build maps it; without it the editable install's finder would give
# this checkout's adapters to both sides.
SITECUSTOMIZE = """
import importlib.util, sys

_ADAPTERS = {adapters!r}


class _SideAdapters:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "lowlat_mw.adapters":
            return None
        return importlib.util.spec_from_file_location(name, _ADAPTERS + "/__init__.py",
                                                      submodule_search_locations=[_ADAPTERS])


sys.meta_path.insert(0, _SideAdapters)
"""

# What a side's processes import, checked before the first round: (module, where it must come from).
CHECKED = ("lowlat_mw", "lowlat_mw.adapters", "benchmarks")


# ================================================================================ the order of runs
def schedule(rounds: int, suites: Sequence[str]) -> list[tuple[int, str, str]]:
    """(round, suite, side) in run order: each round runs every suite on both sides, base first in even rounds and
    head first in odd ones (A B B A A B ...), so neither side always runs right after the other."""
    order = []
    for r in range(rounds):
        sides = SIDES if r % 2 == 0 else SIDES[::-1]
        order += [(r, name, side) for name in suites for side in sides]
    return order


# ================================================================================ comparing
Key = tuple[str, str, str]  # (suite, row label, column)


def ratios_of(suite: str, rows: dict[str, dict[str, float]]) -> dict[Key, float]:
    """The ratios among one run's rows: columns named ``ratio`` or ending in ``_ratio`` (finite numbers only)."""
    out = {}
    for label, cols in rows.items():
        for col, value in cols.items():
            if (col == "ratio" or col.endswith("_ratio")) and isinstance(value, int | float) and value == value \
                    and abs(value) != float("inf"):
                out[(suite, label, col)] = float(value)
    return out


@dataclass
class Compared:
    """One ratio, base against head: the median over rounds of each side, and head / base."""

    key: Key
    base: float
    head: float
    rounds: tuple[int, int]  # rounds that measured it on each side

    @property
    def change(self) -> float:
        """head / base (1.0 when both are 0; inf when only base is)."""
        if self.base == 0:
            return 1.0 if self.head == 0 else float("inf")
        return self.head / self.base

    def flagged(self, threshold: float = THRESHOLD) -> bool:
        """More than `threshold` apart, either way (a ratio may be better higher or lower: both are a change)."""
        return abs(self.change - 1.0) > threshold


def compare(samples: dict[str, dict[Key, list[float]]]) -> list[Compared]:
    """Per ratio measured on both sides, the medians of its rounds (samples: side -> key -> one value per round).
    A reference row's ratios (1 in every round on both sides: the bare endpoint against itself) are left out."""
    keys = [k for k in samples["base"] if samples["head"].get(k)
            and any(v != 1.0 for side in SIDES for v in samples[side][k])]
    return [Compared(k, statistics.median(samples["base"][k]), statistics.median(samples["head"][k]),
                     (len(samples["base"][k]), len(samples["head"][k]))) for k in keys]


def table(compared: Sequence[Compared], threshold: float = THRESHOLD) -> str:
    """The comparison as a markdown table, one row per ratio, flagged rows marked."""
    rows = []
    for c in compared:
        suite, label, col = c.key
        mark = f"**beyond {threshold:.0%}**" if c.flagged(threshold) else ""
        rows.append([suite, label, col, f"{c.base:.3f}", f"{c.head:.3f}", f"{c.change:.3f}", mark])
    return markdown_table(["suite", "row", "ratio", "base (median)", "head (median)", "head / base", ""], rows,
                          "lllrrrl")


def summary(compared: Sequence[Compared], threshold: float = THRESHOLD) -> str:
    flagged = [c for c in compared if c.flagged(threshold)]
    if not flagged:
        return f"Every one of {len(compared)} ratios within {threshold:.0%} of base."
    return f"{len(flagged)} of {len(compared)} ratios more than {threshold:.0%} from base: " + ", ".join(
        f"{s} / {r} / {c}" for (s, r, c) in (f.key for f in flagged)) + "."


# ================================================================================ the sides
@dataclass
class Side:
    name: str
    spec: str  # what was asked for: a revision or a path
    root: Path  # the code it runs
    env: dict[str, str] = field(default_factory=dict)
    commit: str = ""


def snapshot(repo: Path, rev: str, folder: Path) -> str:
    """Extract revision `rev` of `repo` into `folder` (``git archive``: nothing written to the repository); its
    commit id."""
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True, timeout=60)
    if commit.returncode != 0:
        raise SystemExit(f"not a commit of {repo}: {rev!r} ({commit.stderr.strip()})")
    folder.mkdir(parents=True)
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit.stdout.strip()], stdout=tar,
                       check=True, timeout=300)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as archive:
            archive.extractall(folder, filter="data")
    return commit.stdout.strip()


def side_env(root: Path, shim: Path) -> dict[str, str]:
    """This environment, for a side: PYTHONPATH its shim folder (the sitecustomize) then its checkout, bytecode
    cached beside the shim (nothing written into a checkout given by path), no LOWLAT_* settings."""
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE.format(adapters=str(root / "adapters")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWLAT_")}
    env["PYTHONPATH"] = os.pathsep.join((str(shim), str(root)))
    env["PYTHONPYCACHEPREFIX"] = str(shim / "pycache")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def check_side(side: Side) -> None:
    """Fail unless the side's processes import lowlat_mw, its adapters and the harness from the side itself."""
    code = ("import importlib, json, sys; print(json.dumps({m: importlib.import_module(m).__file__ "
            "for m in sys.argv[1:]}))")
    out = subprocess.run([sys.executable, "-c", code, *CHECKED], cwd=side.root, env=side.env, capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"{side.name} ({side.spec}): cannot import its code:\n{out.stderr[-3000:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    wrong = {m: f for m, f in found.items() if not Path(f).resolve().is_relative_to(side.root.resolve())}
    if wrong:
        raise SystemExit(f"{side.name} ({side.spec}) would not run its own code: {wrong}")


@contextlib.contextmanager
def sides(base: str, head: str | None, repo: Path) -> Iterator[dict[str, Side]]:
    """The two sides, each in a temporary folder (snapshots and their sitecustomize), removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="lowlat-ab-"))
    try:
        made = {}
        for name, spec in (("base", base), ("head", head)):
            if spec is None:  # this checkout's working tree, changes included
                spec = str(ROOT)
            if Path(spec).is_dir():
                root, commit = Path(spec).resolve(), ""
            else:
                root = tmp / name
                commit = snapshot(repo, spec, root)
            made[name] = Side(name, spec, root, side_env(root, tmp / f"{name}-site"), commit)
        yield made
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_side(side: Side, suite: str, mode: str, out: Path, timeout: float) -> dict[str, dict[str, float]]:
    """Run `suite` once with the side's code; its rows. Its output goes to a log next to `out`."""
    logfile = out.with_suffix(".log")
    with logfile.open("wb") as f:
        proc = subprocess.run([sys.executable, "-c", RUNNER, suite, mode, str(out)], cwd=side.root, env=side.env,
                              stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        tail = logfile.read_text(errors="replace")[-4000:]
        raise SystemExit(f"{side.name} ({side.spec}): suite {suite} exited with {proc.returncode}:\n{tail}")
    return json.loads(out.read_text())["rows"]


# ================================================================================ command line
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision before the change (a commit, a branch, HEAD~1) "
                                                       "or a checkout's path")
    parser.add_argument("--head", default=None, help="the revision or checkout's path after it (default: this "
                                                     "checkout's working tree, uncommitted changes included)")
    parser.add_argument("--suite", action="append", metavar="NAME", help="a suite to compare (repeatable; default: "
                                                                         "bare and scale)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds; each runs every suite once per side "
                                                              "(default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="the suites' quick sizes (a smoke test: quick ratios "
                                                             "are too noisy to judge 5%% by)")
    parser.add_argument("--tolerance", type=float, default=THRESHOLD, help="flag head / base beyond 1 +- this "
                                                                           "(default: %(default)s)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the git repository revisions are taken from "
                                                               "(default: this checkout's)")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds one suite may run on one side")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every round's ratios here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    suites = list(dict.fromkeys(args.suite or ["bare", "scale"]))
    mode = "quick" if args.quick else "full"
    samples: dict[str, dict[Key, list[float]]] = {s: {} for s in SIDES}
    with sides(args.base, args.head, args.repo.resolve()) as made, tempfile.TemporaryDirectory(
            prefix="lowlat-ab-runs-") as runs:
        for side in made.values():
            check_side(side)
            log(f"== {side.name}: {side.spec}" + (f" ({side.commit[:10]})" if side.commit else "") + f" in {side.root}")
        order = schedule(args.rounds, suites)
        started = time.monotonic()
        for i, (r, suite, name) in enumerate(order):
            log(f"== round {r + 1}/{args.rounds}: {suite} on {name} ({i + 1}/{len(order)}, "
                f"{time.monotonic() - started:.0f} s so far)")
            rows = run_side(made[name], suite, mode, Path(runs) / f"{i:03d}-{suite}-{name}.json", args.timeout)
            for key, value in ratios_of(suite, rows).items():
                samples[name].setdefault(key, []).append(value)
        specs = {n: {"spec": s.spec, "commit": s.commit} for n, s in made.items()}
    compared = compare(samples)
    print(f"\nA/B, {args.rounds} rounds, {mode} size: base {args.base}, head {args.head or 'this working tree'}\n")
    print(table(compared, args.tolerance))
    print(f"\n{summary(compared, args.tolerance)}")
    if args.json:
        args.json.write_text(json.dumps({"sides": specs, "mode": mode, "rounds": args.rounds, "ratios": [
            {"suite": k[0], "row": k[1], "ratio": k[2], "base": samples["base"][k], "head": samples["head"].get(k, [])}
            for k in samples["base"]]}, indent=1, allow_nan=True) + "\n")
    return 1 if any(c.flagged(args.tolerance) for c in compared) else 0


if __name__ == "__main__":
    raise SystemExit(main())
