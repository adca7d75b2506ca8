"""Run Python as if some packages were not installed: for tests of what a user with a smaller install sees.

A fresh virtual environment per install would be faithful but slow; instead the child process gets a finder at
the front of ``sys.meta_path`` that refuses the named top-level packages, as a missing one is refused
(``ModuleNotFoundError`` with its ``name``).
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

__all__ = ["not_in_extra", "python_without"]

REPO = Path(__file__).resolve().parents[1]

_BLOCKER = '''
import sys


class _NotInstalled:
    """Refuses the packages named on the command line, as if they were not installed."""

    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled(set(filter(None, sys.argv.pop(1).split(",")))))
'''


def python_without(missing: Iterable[str], code: str) -> list[str]:
    """The argv prefix running `code` (with ``python -c``) with the packages `missing` unimportable; arguments after
    it are the program's ``sys.argv[1:]``."""
    return [sys.executable, "-c", _BLOCKER + code, ",".join(sorted(missing))]


# Packages the test environment has that an extra may not bring: (the requirement that brings it, its modules).
_OPTIONAL = {"uvicorn": ("uvicorn",), "uvicorn[standard]": ("httptools", "uvloop", "watchfiles")}


def not_in_extra(extra: str) -> set[str]:
    """The server packages ``pip install 'lowlat-mw[extra]'`` does not install, as pyproject.toml declares it
    today (one level of lowlat-mw[...] extras is followed)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    requirements = list(extras[extra])
    for requirement in list(requirements):
        if requirement.startswith("lowlat-mw["):
            for name in requirement[len("lowlat-mw["):].rstrip("]").split(","):
                requirements += extras[name]
    names = {r.split(">")[0].split("=")[0].split(";")[0].strip().lower() for r in requirements}
    missing: set[str] = set()
    for requirement, modules in _OPTIONAL.items():
        brought = requirement in names or (requirement == "uvicorn" and "uvicorn[standard]" in names)
        if not brought:
            missing.update(modules)
    return missing
