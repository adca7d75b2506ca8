"""The benchmark harness: suite registry, run modes, machine facts, statistics and docs/benchmarks.md sections.

A suite is a module in this package that decorates one function with :func:`suite`::

    @suite("codec", "Codec: encode and decode per message")
    def run(mode: str) -> SuiteResult: ...

and is listed in :data:`SUITE_MODULES`. `mode` is ``"full"`` (the numbers in docs/benchmarks.md),
``"quick"`` (the CI smoke test; every suite together well under 2 minutes) or ``"tiny"`` (unit
tests: every code path, seconds, numbers meaningless). Suites compare configurations measured in
the same run, interleaved, and report ratios: absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import importlib
import importlib.util
import itertools
import math
import os
import platform
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "MODES",
    "SUITE_MODULES",
    "ChildServer",
    "Suite",
    "SuiteResult",
    "all_suites",
    "http_get",
    "machine_facts",
    "markdown_table",
    "median",
    "paired_ratios",
    "quantiles",
    "rotated",
    "suite",
    "update_headlines",
    "update_section",
    "write_results",
]

MODES = ("tiny", "quick", "full")

# Suite modules in report order; a module registers its suite when imported.
SUITE_MODULES: tuple[str, ...] = ("transport", "bare", "frameworks", "codec", "compression", "scale", "overhead",
                                  "soak", "shared", "warmup", "batch", "context")

INTRO = """# Benchmarks

<!-- Written by `lowlat-mw bench` (`python -m benchmarks`): a run of every suite rewrites this file; a run of some
suites (`--suite`) replaces only their sections. Do not edit by hand: the next run overwrites it. -->

This file has the latest run of each suite: its method, its tables and its verdicts, with the machine, commit
and time in each section's first line. Earlier runs and what was tried along the way are in
[benchmarks/results/](../benchmarks/results/) (a JSON record per run, and `history.md`); user-visible changes in
[CHANGELOG.md](../CHANGELOG.md).

### How to run

From the repository root with the project's virtualenv (`.venv/bin/lowlat-mw bench` takes the same options):

```sh
.venv/bin/python -m benchmarks                    # every suite, full size (a few minutes per suite)
.venv/bin/python -m benchmarks --quick            # small sizes, all suites in under 2 minutes (CI runs it)
.venv/bin/python -m benchmarks --suite overhead   # one suite (repeat --suite for several)
```

Each suite writes its section of this file (`--output` picks another file, `''` none) and prints its tables. A
full-size run also writes its numbers, machine-readable, to `benchmarks/results/<date>-<commit>-full.json`
(`--results DIR` picks another directory, `''` none; quick runs write none unless given one): per suite its sizes
(`config`) and its `rows`, each row's ratios and the raw medians they come from, beside the commit, the date
and the machine. History accumulates there, not here. A full-size run also rewrites the README's table of
headline numbers (`HEADLINES` in benchmarks/core.py) for the suites it ran (`--readme PATH`, `''` none).

### Method

Results are ratios between configurations measured in one run, interleaved in rounds so that drift
and background load hit every configuration alike, on the machine named in the section's header.
Absolute times (µs) are only comparable within one section: they depend on that machine and its load.
Each section says how its suite measures: what runs, in which processes, how many rounds, and how its
ratios are taken (usually the median over rounds of the ratio within each round).

**A/B against another commit.** To show that a change kept the speed, compare the suites' ratios before and after
it, measured interleaved on the same machine:

```sh
.venv/bin/python -m benchmarks.ab --base main~3 --suite bare --suite scale --rounds 4
.venv/bin/python -m benchmarks.ab --base HEAD~1 --head ../other-checkout --suite bare --quick --rounds 2
```

It extracts each side (`--base REV`; `--head REV` or a checkout's path, by default this checkout's working tree)
into a temporary directory (`git archive`: the repository and its worktrees are not written), then runs each suite
once per side per round, alternating which side goes first (A B, B A, A B, ...), so drift and load hit both. Each
side runs with its own code: this virtualenv's Python and packages, with `PYTHONPATH` pointing at the side (and
`lowlat_mw.adapters` mapped to its `adapters/`, and bytecode cached in the temporary directory, so a checkout given
by path is only read), which the suites' server and client processes inherit; it checks that before the first
round. It collects every ratio (`rows` columns named `ratio` or `*_ratio`) of every round and
prints, per ratio, the median over rounds for base and head and head / base, marking those more than 5% apart
(`--tolerance`); `--json PATH` keeps the rounds. A ratio's own noise shows in its spread over rounds: run enough
rounds that a 5% move stands out of it. Suites that set `PYTHONPATH` for their children themselves (frameworks,
overhead's cachegrind part) take `lowlat_mw.adapters` from the virtualenv's checkout: A/B them with a virtualenv
per side.
"""


@dataclass
class SuiteResult:
    """What a suite hands back: its docs section, what to print, and its numbers for checks."""

    name: str
    heading: str
    body: str
    text: str
    rows: dict[str, dict[str, float]] = field(default_factory=dict)
    """Row label -> column -> value (every value a finite number), for tests and tools."""
    plots: dict[str, bytes] = field(default_factory=dict)
    """PNG file name -> bytes; written to the folder ``benchmarks/`` next to the output file, so the
    section links them as ``benchmarks/<name>``."""


@dataclass(frozen=True)
class Suite:
    name: str
    heading: str
    run: Callable[[str], SuiteResult]


_SUITES: dict[str, Suite] = {}


def suite(name: str, heading: str) -> Callable[[Callable[[str], SuiteResult]], Callable[[str], SuiteResult]]:
    """Register `fn(mode) -> SuiteResult` as suite `name`, writing section ``## heading``."""

    def register(fn: Callable[[str], SuiteResult]) -> Callable[[str], SuiteResult]:
        if name in _SUITES and _SUITES[name].run is not fn:
            raise ValueError(f"benchmark suite {name!r} registered twice")
        _SUITES[name] = Suite(name, heading, fn)
        return fn

    return register


def all_suites() -> dict[str, Suite]:
    """Every suite, in report order (importing the suite modules registers them)."""
    for module in SUITE_MODULES:
        if importlib.util.find_spec(f"{__package__}.{module}") is not None:
            importlib.import_module(f"{__package__}.{module}")
    return dict(_SUITES)


# ================================================================================ statistics
def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def quantiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Linear-interpolated quantiles of `values` (no extra dependency, works for 1 value)."""
    data = sorted(values)
    out = []
    for q in qs:
        pos = q * (len(data) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(data) - 1)
        out.append(data[lo] + (data[hi] - data[lo]) * (pos - lo))
    return out


def paired_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Per-round ratios num[i] / den[i] of two configurations measured in the same rounds."""
    if len(num) != len(den):
        raise ValueError("paired samples must come from the same rounds")
    return [a / b for a, b in zip(num, den, strict=True)]


def permuted(items: Sequence[str], r: int) -> list[str]:
    """Round r's order of `items`: the permutations in turn, so over len(items)! rounds every item runs in every
    place and right after every other item equally often (a rotation always puts the same item before another:
    what one item leaves behind, its aftermath, always falls on the same next one)."""
    orders = list(itertools.permutations(items))
    return list(orders[r % len(orders)]) if orders else []


def rotated(items: Sequence[str], shift: int) -> list[str]:
    """`items` rotated left by `shift` (round r of an interleaved benchmark starts with item r)."""
    if not items:
        return []
    k = shift % len(items)
    return [*items[k:], *items[:k]]


# ================================================================================ reporting
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts(mode: str, *, extra: Sequence[str] = ()) -> str:
    """One markdown line naming the machine, software and time of a run."""
    cpus = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = cpus
    try:
        load = f"load average {os.getloadavg()[0]:.2f} at start"
    except OSError:
        load = ""
    from lowlat_mw import __version__

    when = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit, dirty = git_commit()
    parts = [
        f"{cpus} CPUs" + (f" ({usable} usable)" if usable != cpus else "") + f", {_cpu_model()}",
        f"{platform.system()} {platform.release()}",
        f"{platform.python_implementation()} {platform.python_version()}",
        f"lowlat-mw {__version__}" + (f" (commit {commit[:10]}{', with changes' if dirty else ''})" if commit else ""),
        *extra,
        f"`{mode}` mode",
        when,
    ]
    if load:
        parts.append(load)
    return "Machine: " + "; ".join(parts) + "."


ROOT = Path(__file__).resolve().parents[1]


def git_commit(root: Path = ROOT) -> tuple[str, bool]:
    """(commit, changed) of the checkout `root`: its HEAD and whether tracked files differ from it; ("", False)
    outside a git checkout (a snapshot, an sdist), so a run can always say which code it measured when it can."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        if head.returncode != 0:
            return "", False
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "", False
    return head.stdout.strip(), bool(status.stdout.strip())


def machine_record() -> dict[str, object]:
    """The machine facts of :func:`machine_facts` as data, for the JSON results."""
    from lowlat_mw import __version__

    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return {"cpus": os.cpu_count() or 0, "usable_cpus": usable, "cpu_model": _cpu_model(),
            "system": f"{platform.system()} {platform.release()}", "node": platform.node(),
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "lowlat_mw": __version__, "load_average_at_end": load}


def _finite(value: object) -> object:
    """`value` for JSON: a non-finite float becomes None (JSON has no NaN or infinity)."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


def _suite_config(name: str, mode: str) -> object:
    """The sizes suite `name` ran with in `mode` (its module's ``SIZES[mode]``), as JSON data; None if it has none."""
    import dataclasses

    module = sys.modules.get(f"{__package__}.{name}")
    sizes = getattr(module, "SIZES", None)
    size = sizes.get(mode) if isinstance(sizes, dict) else None
    if dataclasses.is_dataclass(size) and not isinstance(size, type):
        return {k: _finite(v) for k, v in dataclasses.asdict(size).items()}
    return list(size) if isinstance(size, tuple) else None


def results_record(results: Sequence[SuiteResult], mode: str, started: _dt.datetime) -> dict[str, object]:
    """One run's machine-readable results: when, which commit, which machine, and each suite's config and rows
    (the ratios and raw medians its tables show)."""
    commit, dirty = git_commit()
    return {
        "format": 1,
        "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "changed": dirty,
        "mode": mode,
        "machine": machine_record(),
        "suites": {r.name: {"heading": r.heading, "config": _suite_config(r.name, mode),
                            "rows": {label: {k: _finite(v) for k, v in cols.items()} for label, cols in r.rows.items()}}
                   for r in results},
    }


def write_results(folder: Path, results: Sequence[SuiteResult], mode: str, started: _dt.datetime) -> Path:
    """Write the run's JSON record into `folder` as ``<date>-<commit>-<mode>.json``; the path written."""
    import json

    record = results_record(results, mode, started)
    commit = str(record["commit"])[:10] or "nocommit"
    name = f"{started.strftime('%Y-%m-%dT%H%M%SZ')}-{commit}{'-changed' if record['changed'] else ''}-{mode}.json"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    return path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A GitHub markdown table; `align` has one of l/r per column (default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


_HEADING = re.compile(r"^## ", re.M)


def update_section(path: Path, heading: str, body: str) -> None:
    """Write ``## heading`` + `body` into `path`, replacing that section only (create the file with the intro)."""
    text = path.read_text(encoding="utf-8") if path.exists() else INTRO
    starts = [m.start() for m in _HEADING.finditer(text)]
    intro = text[: starts[0]] if starts else text
    ends = [*starts[1:], len(text)] if starts else []
    sections = [text[a:b] for a, b in zip(starts, ends, strict=True)]
    new = f"## {heading}\n\n{body.strip()}\n"
    for i, sec in enumerate(sections):
        if sec.splitlines()[0].strip() == f"## {heading}":
            sections[i] = new
            break
    else:
        sections.append(new)
    out = intro.rstrip("\n") + "\n\n" + "\n".join(s.rstrip("\n") + "\n" for s in sections)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out, encoding="utf-8")


def keep_only(path: Path, headings: Iterable[str]) -> None:
    """Rewrite `path` with today's intro and only the sections ``## heading`` of `headings` (a whole run: the doc
    then holds that run alone, not sections left from an earlier one)."""
    keep = {f"## {h}" for h in headings}
    text = path.read_text(encoding="utf-8")
    starts = [m.start() for m in _HEADING.finditer(text)]
    sections = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    kept = [s for s in sections if s.splitlines()[0].strip() in keep]
    path.write_text(INTRO.rstrip("\n") + "\n\n" + "\n".join(s.rstrip("\n") + "\n" for s in kept), encoding="utf-8")


@dataclass(frozen=True)
class Headline:
    """One row of the README's table of headline numbers: a value of one suite's rows, formatted."""

    label: str
    suite: str
    row: str
    column: str
    format: str


# The README's table, in order; a full run of a suite rewrites its rows' cells (README_START .. README_END).
HEADLINES = (
    Headline("Time to first delta, 25 ms away with TLS, vs HTTP with a new connection", "transport", "target",
             "ttfd_c_vs_a", "{:.2f}x"),
    Headline("Round trip to the first delta vs a bare Starlette WebSocket echo", "bare", "roundtrip proto",
             "first_p50_ratio", "{:.2f}x"),
    Headline("Server CPU per streamed token vs the bare Starlette endpoint", "bare", "stream proto-raw",
             "server_cpu_ratio", "{:.2f}x"),
    Headline("1,000 clients at 50 tokens/s: time to first delta p99", "scale", "stream paced lowlat-direct",
             "ttfd_p99_ms", "{:.0f} ms"),
    Headline("Memory per idle connection over bare uvicorn (10,000 held)", "scale", "idle 10000 lowlat-direct",
             "uss_kib_extra", "{:+.1f} KiB"),
    Headline("Protobuf delta frame vs compact JSON", "codec", "target", "delta_proto_vs_json", "{:.2f}x the bytes"),
)
README_START = "<!-- headline numbers: written by `lowlat-mw bench` (benchmarks/core.py, HEADLINES) -->"
README_END = "<!-- end of headline numbers -->"


def update_headlines(path: Path, results: Sequence[SuiteResult]) -> list[str]:
    """Rewrite the table between README_START and README_END in `path` from HEADLINES: a row whose suite is among
    `results` (and measured its value) takes this run's number, the others keep theirs. The labels it updated."""
    text = path.read_text(encoding="utf-8")
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    kept = {}
    for line in text[start:end].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2:
            kept[cells[0]] = cells[1]
    rows = {r.name: r.rows for r in results}
    lines, updated = [], []
    for h in HEADLINES:
        value = rows.get(h.suite, {}).get(h.row, {}).get(h.column)
        if isinstance(value, int | float) and math.isfinite(value):
            cell = h.format.format(value)
            updated.append(h.label)
        else:
            cell = kept.get(h.label, "not measured yet")
        lines.append([h.label, cell])
    table = markdown_table(["Measure", "Result"], lines)
    path.write_text(f"{text[:start]}\n{table}\n{text[end:]}", encoding="utf-8")
    return updated


def log(msg: str) -> None:
    """Progress on stderr (stdout carries the tables)."""
    print(msg, file=sys.stderr, flush=True)


# ================================================================================ HTTP
async def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of GET http://127.0.0.1:port/path (HTTP/1.1, connection closed)."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            data = await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0
    return status, body


class ChildServer:
    """A benchmark server module (``python -m <module> --fd N <args>``) in a child process, on a listening socket
    bound here: the port is known at once, and clients queue in its backlog until the child accepts."""

    def __init__(self, module: str, *args: str) -> None:
        import socket
        import subprocess

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        root = Path(__file__).resolve().parents[1]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", module, "--fd", str(self.sock.fileno()), *args],
                                     pass_fds=(self.sock.fileno(),), cwd=root, env=env, stdin=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def stop(self) -> None:
        import subprocess

        self.sock.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
