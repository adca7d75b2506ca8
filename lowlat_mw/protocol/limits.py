"""Sans-IO limiters: a token bucket for request rates and a connection counter per client address."""

from __future__ import annotations

from collections import Counter

__all__ = ["ConnectionLimiter", "TokenBucket"]


class TokenBucket:
    """`rate` tokens per second, holding at most `burst`; ``take(now)`` spends one if it can."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.updated = now

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Spend `cost` tokens if available (refilling for the time since the last call)."""
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False

    def retry_after(self, cost: float = 1.0) -> float:
        """Seconds until `cost` tokens will be there."""
        return max(0.0, (cost - self.tokens) / self.rate) if self.rate > 0 else float("inf")


class ConnectionLimiter:
    """Counts open connections in total and per client address, refusing past the limits (0: none)."""

    def __init__(self, max_total: int = 0, max_per_client: int = 0) -> None:
        self.max_total, self.max_per_client = max_total, max_per_client
        self.total = 0
        self.per_client: Counter[str] = Counter()

    def acquire(self, client: str | None) -> str | None:
        """Count a new connection; returns why it is refused, or None when admitted."""
        if self.max_total and self.total >= self.max_total:
            return f"server is at its connection limit ({self.max_total})"
        key = client or ""
        if self.max_per_client and key and self.per_client[key] >= self.max_per_client:
            return f"too many connections from {key} (limit {self.max_per_client})"
        self.total += 1
        if key:
            self.per_client[key] += 1
        return None

    def release(self, client: str | None) -> None:
        """A counted connection ended."""
        self.total = max(0, self.total - 1)
        key = client or ""
        if key and self.per_client[key] > 0:
            self.per_client[key] -= 1
            if not self.per_client[key]:
                del self.per_client[key]
