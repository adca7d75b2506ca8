"""Handshake checks shared by every adapter (framework-free, pure functions)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from .connection import negotiate_subprotocol
from .settings import Settings

log = logging.getLogger("lowlat_mw")

__all__ = ["check_handshake", "origin_allowed"]


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


def check_handshake(
    offered: Sequence[str], origin: str | None, host: str | None, settings: Settings
) -> tuple[bool, str | None]:
    """(accept?, subprotocol) for a handshake: subprotocol negotiation, then the Origin check.

    Every adapter calls this before accepting, so refusals look the same everywhere (HTTP 403).
    """
    ok, subprotocol = negotiate_subprotocol(tuple(offered), settings)
    if not ok:
        log.info("refused WebSocket: no supported subprotocol in %s", list(offered))
        return False, None
    if not origin_allowed(origin, host, settings.allowed_origins):
        log.warning("refused cross-origin WebSocket from %s", origin)
        return False, None
    return True, subprotocol
