"""Helpers shared by the conformance tests: raw protocol clients and measurements."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from support.waits import wait_until

from lowlat_mw.client import connect

MODES = ("proto", "json")

# Settings of the "short timers" servers (as LOWLAT_* variables) and the same as numbers.
HEARTBEAT_INTERVAL, HEARTBEAT_MAX_INTERVAL, HEARTBEAT_TIMEOUT = 0.3, 0.6, 0.3
IDLE_TIMEOUT, HANDSHAKE_TIMEOUT = 1.0, 1.0
SHORT_TIMERS = {
    "LOWLAT_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL),
    "LOWLAT_HEARTBEAT_MAX_INTERVAL": str(HEARTBEAT_MAX_INTERVAL),
    "LOWLAT_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
    "LOWLAT_IDLE_TIMEOUT": str(IDLE_TIMEOUT),
    "LOWLAT_HANDSHAKE_TIMEOUT": str(HANDSHAKE_TIMEOUT),
}

# Filled by the tests, printed by conftest.pytest_terminal_summary.
STARTUP_TIMES: dict[str, list[float]] = {}
MEASUREMENTS: dict[str, str] = {}


class KnownBug(AssertionError):
    """Raised where a test observes the specific symptom of a known, described bug.

    Tests mark such cases ``xfail(strict=True, raises=KnownBug)``: any other failure still fails.
    """


def measure(name: str, value: str) -> None:
    """Record a measured number for the end-of-run summary (and print it for -s runs)."""
    MEASUREMENTS[name] = value
    print(f"{name}: {value}")


_MAXIMA: dict[str, float] = {}


def measure_max(name: str, seconds: float) -> None:
    """Record the largest of several timings under one name."""
    _MAXIMA[name] = max(seconds, _MAXIMA.get(name, 0.0))
    MEASUREMENTS[name] = f"{_MAXIMA[name] * 1000:.0f} ms"


async def assert_streams(url: str, mode: str = "proto", n: int = 3) -> None:
    """A well-behaved client can still stream a reply from the server at `url`."""
    async with asyncio.timeout(15):
        async with connect(url, mode=mode) as client:
            stream = client.stream("still alive?", model="agen", params={"n": n})
            chunks = [c async for c in stream]
            assert chunks == [f"a{i};" for i in range(n)]
            assert stream.end is not None and stream.end.last_seq == n


async def wait_for_file(path: Path, timeout: float) -> float:
    """Seconds until `path` exists; AssertionError after `timeout`."""
    start = time.monotonic()
    await wait_until(path.exists, timeout, interval=0.02, what=f"{path.name} to appear")
    return time.monotonic() - start
