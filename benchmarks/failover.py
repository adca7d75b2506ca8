"""The shared suite's failover part alone (issue 18's acceptance run, benchmarks/shared.py):

    .venv/bin/python -m benchmarks.failover [--quick] [--output docs/benchmarks.md]

``python -m benchmarks --suite shared`` runs it after the suite's CPU and workers parts, which take long at full
size; this runs only the failover part (full size unless --quick: every pair, both events), with a redis-server
of its own, and prints its text. With --output it replaces only that part of the file's Shared sessions section
(from "**Failover**" to the section's end), adding when and where it ran. The servers' and nginx's output (error
and access logs) stay in the folder it names at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path

from ._bare_common import log_dir
from .core import log, machine_facts
from .shared import HEADING, NAME, _failover, _redis_server

MARK = "**Failover**"


def splice(path: Path, text: str) -> None:
    """Replace the failover part of `path`'s ``## HEADING`` section (MARK to the section's end) with `text`."""
    doc = path.read_text(encoding="utf-8")
    head = doc.index(f"\n## {HEADING}\n")
    start = doc.index(MARK, head)
    following = re.compile(r"^## ", re.M).search(doc, start)
    end = following.start() if following else len(doc)
    path.write_text(doc[:start] + text.strip() + "\n" + ("\n" if following else "") + doc[end:], encoding="utf-8")


async def _run(mode: str, folder: Path) -> str:
    redis_proc, redis_port = _redis_server(folder)
    try:
        text, _ = await _failover(mode, folder, redis_port)
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="quick size: one pair (CI's)")
    parser.add_argument("--output", default="", metavar="PATH",
                        help="markdown file whose Shared sessions section gets this failover part (default: none)")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    folder = log_dir(f"{NAME}-failover")
    log(f"== {NAME} suite, failover part only ({mode} mode); output in {folder}")
    facts = machine_facts(mode)  # (the load average at the start)
    text = asyncio.run(_run(mode, folder))
    text += f"\n\nThis part was run alone (`.venv/bin/python -m benchmarks.failover`).\n{facts}"
    print(f"\n{text}\n", flush=True)
    if args.output:
        splice(Path(args.output), text)
        log(f"== wrote the failover part of section {HEADING!r} of {args.output}")
    log(f"== server, redis and nginx output kept in {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
