#!/usr/bin/env python3
"""Set up and run lowlat-mw with nothing but Python 3.11+ and pip.

    python3 dev.py demo   # create .venv, install, serve the demo model on http://127.0.0.1:8000
    python3 dev.py test   # create .venv, install with test extras, run ruff and the whole test suite

Extra arguments after the command go to `lowlat-mw serve` or pytest.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("LOWLAT_DEV_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")


def _run(*cmd: str | Path) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT)


def setup(extras: str) -> None:
    """Create the venv and install the package editable with `extras` (skipped when up to date)."""
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py itself runs on any python3
        sys.exit(f"lowlat-mw needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()
    stamp = VENV / ".lowlat-installed"
    if stamp.exists() and stamp.read_text() == digest:
        return
    if not PY.exists():
        print(f"+ creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    _run(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    _run(PY, "-m", "pip", "install", "--quiet", "-e", f".[{extras}]")
    stamp.write_text(digest)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "setup"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    setup("test")  # one environment for both commands, so `demo` then `test` installs once
    if command == "demo":
        args = rest or ["--host", "127.0.0.1", "--port", os.environ.get("PORT", "8000")]
        os.execv(BIN / "lowlat-mw", [str(BIN / "lowlat-mw"), "serve", *args])
    if command == "test":
        _run(BIN / "ruff", "check", ".")
        result = subprocess.run([str(PY), "-m", "pytest", *(rest or ["-q"])], cwd=ROOT)
        return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
