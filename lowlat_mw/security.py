"""Handshake checks shared by every adapter (framework-free, pure functions)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .protocol.server import negotiate_subprotocol
from .settings import Settings

log = logging.getLogger("lowlat_mw")

__all__ = ["Handshake", "check_handshake", "load_authenticator", "origin_allowed", "run_authenticator"]


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
def load_authenticator(path: str) -> Callable[[Handshake], Any]:
    """Import the ``authenticate`` hook named by `path` (cached)."""
    from .model import load_callable

    return load_callable(path)


async def run_authenticator(
    hook: Callable[[Handshake], Any], handshake: Handshake, executor: Executor | None = None
) -> tuple[Any, str]:
    """Call the hook (async, or sync in `executor`): (principal or None, refusal reason).

    A hook admits by returning anything but None/False and refuses by returning None/False or
    raising PermissionError (its message becomes the reason); other exceptions refuse too and
    are logged, so a broken hook fails closed.
    """
    try:
        if inspect.iscoroutinefunction(hook):
            principal = await hook(handshake)
        else:
            principal = await asyncio.get_running_loop().run_in_executor(executor, hook, handshake)
            if inspect.isawaitable(principal):
                principal = await principal
    except PermissionError as exc:
        return None, str(exc) or "authentication failed"
    except Exception:
        log.exception("authenticate hook failed")
        return None, "authentication failed"
    if principal is None or principal is False:
        return None, "authentication failed"
    return principal, ""
