"""The suite's one time unit: every bound a test waits for or asserts on is written in it.

``LOWLAT_TEST_TIME_SCALE`` (default 1) multiplies every bound: a slower machine sets it above 1 instead of each
test growing its own slack. At scale 1 every bound is the value the test states.
"""

from __future__ import annotations

import os

__all__ = ["MARGIN", "TIME_SCALE", "WAIT", "seconds"]


def _scale(env: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """LOWLAT_TEST_TIME_SCALE as a positive float (default 1); a readable error for anything else."""
    raw = env.get("LOWLAT_TEST_TIME_SCALE", "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"LOWLAT_TEST_TIME_SCALE must be a number, not {raw!r}") from None
    if not scale > 0:
        raise ValueError(f"LOWLAT_TEST_TIME_SCALE must be above 0, not {raw!r}")
    return scale


TIME_SCALE = _scale()


def seconds(x: float) -> float:
    """`x` seconds in the suite's time unit (scaled by LOWLAT_TEST_TIME_SCALE)."""
    return x * TIME_SCALE


# Scheduling slack on a loaded 2-core machine: the late end of every "a timer fires within its bound" window.
MARGIN = seconds(1.0)
# How long a wait for something that happens "soon" (an event, a log line, a state change) may take before the
# test fails: generous, since each such wait ends at its event, long before.
WAIT = seconds(10.0)
