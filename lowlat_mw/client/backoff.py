"""Reconnect backoff policy: exponential with full jitter (sans-IO: the caller sleeps)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Delay before attempt n (0-based) is uniform in [0, min(cap, base * factor**n)].

    Defaults: base 1 s, factor 2, cap 30 s, 5 retries. `rng` makes it deterministic in tests.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 30.0
    retries: int = 5
    jitter: bool = True
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.base < 0 or self.factor < 1 or self.cap < 0 or self.retries < 0:
            raise ValueError("backoff needs base >= 0, factor >= 1, cap >= 0, retries >= 0")

    def ceiling(self, attempt: int) -> float:
        """Upper bound of the delay before retry number `attempt` (0-based)."""
        return min(self.cap, self.base * self.factor ** min(attempt, 64))

    def delay(self, attempt: int) -> float:
        """The delay before retry number `attempt` (0-based)."""
        ceiling = self.ceiling(attempt)
        return self.rng.uniform(0, ceiling) if self.jitter else ceiling

    def delays(self) -> list[float]:
        """All the delays of one reconnect sequence."""
        return [self.delay(i) for i in range(self.retries)]
