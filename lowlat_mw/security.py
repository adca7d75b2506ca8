"""What security rules need, framework-free: the Origin check and what the ``authenticate`` hook sees.

The Endpoint applies them (:meth:`lowlat_mw.endpoint.Endpoint.admit`); the driver runs the hook
(:func:`lowlat_mw.runtime.auth.run_authenticator`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

__all__ = ["Handshake", "load_authenticator", "origin_allowed"]


def _host_of(value: str) -> str:
    return value.strip().lower().rstrip(".")


def origin_allowed(origin: str | None, host: str | None, allowed: Iterable[str]) -> bool:
    """Whether a handshake with this Origin header may proceed.

    No Origin (non-browser clients) is allowed. A browser Origin is allowed when its
    host[:port] equals the request's Host header (same host), when it is listed in `allowed`
    (full origin like ``https://app.example.com`` or a bare host, ``*.example.com`` for
    subdomains), or when `allowed` contains ``"*"``. This blocks cross-site WebSocket hijacking
    by default.
    """
    if origin is None:
        return True
    allowed = tuple(allowed)
    if "*" in allowed:
        return True
    if origin == "null":
        return "null" in allowed
    parts = urlsplit(origin)
    if not parts.scheme or not parts.netloc:
        return False
    netloc = _host_of(parts.netloc)
    if host is not None and netloc == _host_of(host):
        return True
    origin_l = origin.lower().rstrip("/")
    hostname = (parts.hostname or "").lower()
    for entry in allowed:
        e = entry.lower().rstrip("/")
        if "://" in e:
            if e == origin_l:
                return True
        elif e.startswith("*."):
            if hostname.endswith(e[1:]):
                return True
        elif e in (netloc, hostname):
            return True
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class Handshake:
    """What the ``authenticate`` hook sees of a connecting client."""

    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    subprotocol: str | None = None
    client: tuple[str, int] | None = None
    user: Any = None
    """The framework's user, where there is one (Django's ``scope["user"]``)."""
    token: str = field(default="", repr=False)
    """``Hello.auth``: credentials sent in the first message (browsers cannot set headers)."""

    @property
    def bearer(self) -> str:
        """A token from, in order: ``Hello.auth``, ``Authorization: Bearer ...``, ``?token=...``."""
        if self.token:
            return self.token
        auth = self.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        return self.query.get("token", "")

    @classmethod
    def from_info(cls, info: Any, token: str) -> Handshake:
        """Build from a :class:`~lowlat_mw.model.SessionInfo` and the Hello's ``auth``."""
        qs = (info.extra or {}).get("query_string", "")
        return cls(headers=dict(info.headers), query=dict(parse_qsl(qs)), subprotocol=info.subprotocol,
                   client=info.client, user=info.user, token=token)


@functools.lru_cache(maxsize=16)
def load_authenticator(path: str | Callable[[Handshake], Any]) -> Callable[[Handshake], Any]:
    """The ``authenticate`` hook: `path` itself if it is a callable, else imported from its dotted path (cached)."""
    from .model import load_callable

    return load_callable(path)
