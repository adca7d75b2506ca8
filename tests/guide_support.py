"""The guides' code blocks, for tests that run what a guide tells users to write."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

__all__ = ["guide_block"]


def guide_block(guide: str, first_line: str, containing: str = "", lang: str = "python") -> str:
    """The ````lang` block of docs/`guide` that starts with `first_line` (and contains `containing`)."""
    blocks = (REPO / "docs" / guide).read_text().split(f"```{lang}\n")[1:]
    found = [b.split("```", 1)[0] for b in blocks if b.startswith(first_line + "\n") and containing in b]
    assert len(found) == 1, f"docs/{guide} has {len(found)} {lang} blocks starting {first_line!r}"
    return found[0]
