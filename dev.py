#!/usr/bin/env python3
"""Set up and run lowlat-mw with nothing but Python 3.11+ and pip.

    python3 dev.py demo   # create .venv, install what the demo needs, serve it on http://127.0.0.1:8000
    python3 dev.py test   # create .venv, install with test extras, run ruff and the whole test suite

Extra arguments after the command go to `lowlat-mw serve` or pytest.

`test` also makes sure what some tests need is there: Debian's chromium and chromium-driver (the browser
tests), nginx (the balancer test), redis-server (the tests that use Redis), nodejs and npm with tests/node's
npm packages (the AsyncAPI schema, TypeScript). Run as root on a Debian-like system it installs the Debian
packages with apt-get when missing. Elsewhere (or with SKIP_BROWSER_INSTALL / SKIP_NGINX_INSTALL /
SKIP_REDIS_INSTALL / SKIP_NODE_INSTALL set) those tests are skipped, and the run says why. On a machine slower
than ours, LOWLAT_TEST_TIME_SCALE=2 doubles every bound the tests wait for or allow (tests/support/time.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("LOWLAT_DEV_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")


def _run(*cmd: str | Path, quiet: bool = False) -> None:
    """Run `cmd` from the checkout; `quiet`: its output shown only if it fails (pip's build backend prints
    banners on success, e.g. setuptools' notes on editable installs)."""
    print("+", " ".join(str(c) for c in cmd), flush=True)
    if not quiet:
        subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT)
        return
    result = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise subprocess.CalledProcessError(result.returncode, cmd)


# What each command installs: the demo only what `lowlat-mw serve` needs (uvicorn, Starlette), the tests
# everything. The test set includes the demo's, so `test` then `demo` installs once.
EXTRAS = {"demo": "starlette", "test": "test"}
COVERS = {"starlette": ("starlette", "test"), "test": ("test",)}


def _stamp(extras: str) -> Path:
    return VENV / f".lowlat-installed-{extras}"


def setup(extras: str) -> None:
    """Create the venv and install the package editable with `extras` (skipped when up to date)."""
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py itself runs on any python3
        sys.exit(f"lowlat-mw needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if any(_stamp(e).exists() and _stamp(e).read_text() == digest for e in COVERS[extras]):
        return
    if not PY.exists():
        print(f"+ creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    _run(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip", quiet=True)
    # pip byte-compiles what it installs: keep it (with PYTHONDONTWRITEBYTECODE set, as on our CI
    # machines, --no-compile made every server process compile its imports again: tests +107 s).
    _run(PY, "-m", "pip", "install", "--quiet", "-e", f".[{extras}]", quiet=True)
    _stamp(extras).write_text(digest)


def ensure_debian(packages: list[str], commands: list[str], why: str, skip: str, skip_env: str) -> bool:
    """Install Debian `packages` when one of `commands` is missing (root with apt-get only); True when all of
    `commands` are there afterwards. Otherwise say why `skip` (the tests that need them are skipped)."""
    if all(shutil.which(c) or Path("/usr/sbin", c).exists() for c in commands):
        return True
    names = " and ".join(packages)
    if os.environ.get(skip_env):
        print(f"+ {skip_env} is set: {names} not installed, {skip}", flush=True)
        return False
    apt = shutil.which("apt-get")
    if apt is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        print(f"+ {names} not installed and installing needs root and apt-get: {skip}", flush=True)
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-qq", "--no-install-recommends", *packages]
    print("+ apt-get " + " ".join(install[1:]) + f"   ({why})", flush=True)
    start = time.monotonic()

    def attempt(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)

    try:
        result = attempt(install, 900)
        if result.returncode != 0:  # no or stale package lists: refresh them once and retry
            print("+ apt-get update", flush=True)
            attempt([apt, "update", "-qq"], 300)
            result = attempt(install, 900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"+ installing {names} failed ({exc}): {skip}", flush=True)
        return False
    tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-5:])
    if not all(shutil.which(c) or Path("/usr/sbin", c).exists() for c in commands):
        print(f"+ installing {names} failed (exit {result.returncode}): {skip}\n{tail}", flush=True)
        return False
    # (installed: a package script may still have failed, e.g. nginx's service start when port 80 is taken)
    note = f" (apt-get exit {result.returncode}: {tail.splitlines()[-1] if tail else ''})" if result.returncode else ""
    print(f"+ {names} installed in {time.monotonic() - start:.0f} s{note}", flush=True)
    return True


def ensure_chromium() -> None:
    """Debian's chromium + chromium-driver for tests/browser."""
    ensure_debian(["chromium", "chromium-driver"], ["chromium", "chromedriver"],
                  "Debian's headless browser for tests/browser", "the browser tests (tests/browser) will be skipped",
                  "SKIP_BROWSER_INSTALL")


def ensure_nginx() -> None:
    """Debian's nginx, the balancer in front of two servers in tests/integration/test_balancer.py and in the
    shared benchmark's failover run (each runs its own nginx on free loopback ports; on a machine with an init
    system the package also starts the system's nginx on port 80, as installing it by hand would)."""
    ensure_debian(["nginx"], ["nginx"], "the balancer of tests/integration/test_balancer.py and the failover run",
                  "the balancer test will be skipped and the failover run will use a proxy instead",
                  "SKIP_NGINX_INSTALL")


def ensure_redis() -> None:
    """Debian's redis-server for the tests that use Redis (tests/redis_support.py runs its own redis-server on a
    free loopback port; on a machine with an init system the package also starts the system's on port 6379)."""
    ensure_debian(["redis-server"], ["redis-server"], "the Redis of tests/redis_support.py",
                  "the tests that use Redis will be skipped (fail where CI=true)", "SKIP_REDIS_INSTALL")


NODE_TESTS = ROOT / "tests" / "node"


def ensure_node_packages() -> None:
    """npm install tests/node's packages (AsyncAPI schemas, TypeScript, ws) when missing or changed; with no npm,
    Debian's nodejs and npm first (root with apt-get only). Without them the tests that need them are skipped."""
    skip = "the AsyncAPI-schema and npm-package tests will be skipped"
    if os.environ.get("SKIP_NODE_INSTALL"):
        print(f"+ SKIP_NODE_INSTALL is set: tests/node's npm packages not installed, {skip}", flush=True)
        return
    if not ensure_debian(["nodejs", "npm"], ["node", "npm"], "Debian's Node.js, for tests/node", skip,
                         "SKIP_NODE_INSTALL"):
        return
    npm = shutil.which("npm")
    assert npm is not None
    digest = hashlib.sha256((NODE_TESTS / "package.json").read_bytes()).hexdigest()
    stamp = NODE_TESTS / "node_modules" / ".lowlat-installed"
    if stamp.exists() and stamp.read_text() == digest:
        return
    cmd = [npm, "install", "--no-audit", "--no-fund", "--no-package-lock", "--loglevel=error"]
    print("+ (tests/node) " + " ".join(["npm", *cmd[1:]]), flush=True)
    try:
        result = subprocess.run(cmd, cwd=NODE_TESTS, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"+ npm install failed ({exc}): {skip}", flush=True)
        return
    if result.returncode != 0:
        print(f"+ npm install failed (exit {result.returncode}): {skip}\n{result.stdout}{result.stderr}", flush=True)
        return
    stamp.write_text(digest)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "setup"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    setup(EXTRAS.get(command, "test"))
    if command == "demo":
        args = rest or ["--host", "127.0.0.1", "--port", os.environ.get("PORT", "8000")]
        os.execv(BIN / "lowlat-mw", [str(BIN / "lowlat-mw"), "serve", *args])
    if command == "test":
        ensure_chromium()
        ensure_nginx()
        ensure_redis()
        ensure_node_packages()
        _run(BIN / "ruff", "check", ".")
        # In 3 processes (pytest-xdist), each module's tests in one of them (their servers are per module): the
        # suite mostly waits on sockets, so on 2 cores this takes about half the time of one process. The
        # benchmark modules run as one unit, sent first (their one quick run of every suite), and conformance
        # tests are grouped by server: tests/support/scheduling.py says why.
        default = ["-q", "--durations=30", "-n", "3", "--dist", "loadscope"]
        result = subprocess.run([str(PY), "-m", "pytest", *(rest or default)], cwd=ROOT)
        return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
