"""The browser client's static files (``lowlat_mw/static/``), served the same way by every adapter.

The package ships ``lowlat.js`` (the dependency-free ES module client, docs/browser.md), the demo
page (``demo.html``, ``demo.js``, ``demo.css``) and nothing else. This module is framework-free:
the adapters hand it a request path and method and send back what :func:`respond` returns.

Only the files present in the package when it is imported can be served, looked up by exact
name: nothing from a request path ever reaches the filesystem. ``demo.html`` is a template
that gets the endpoint's WebSocket path and the client path filled in.

Under the prefix ``client_path`` (e.g. ``/lowlat``)::

    /lowlat/            the demo page           /lowlat/lowlat.js   the client module
    /lowlat/demo.html   the demo page too       /lowlat/demo.js     the demo page's script
"""

from __future__ import annotations

import functools
import hashlib
import html
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .settings import Settings

__all__ = ["DEMO_PAGE", "STATIC_DIR", "Asset", "StaticResponse", "asgi_respond", "asset", "demo_page", "lookup",
           "names", "respond", "send_asgi"]

STATIC_DIR = Path(__file__).with_name("static")
DEMO_PAGE = "demo.html"
CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
NOT_SERVED = frozenset({"package.json"})  # the npm package's manifest (docs/browser.md), not a page's file
_NAMES = tuple(sorted(p.name for p in STATIC_DIR.iterdir()
                      if p.is_file() and p.suffix in CONTENT_TYPES and p.name not in NOT_SERVED))


@dataclass(frozen=True, slots=True)
class Asset:
    """One file as served: its bytes, content type and a strong ETag."""

    name: str
    body: bytes
    content_type: str
    etag: str


@dataclass(frozen=True, slots=True)
class StaticResponse:
    """What an adapter sends: status, headers (name, value) and body (empty for HEAD and 304)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def names() -> tuple[str, ...]:
    """The names of the files that can be served."""
    return _NAMES


@functools.lru_cache(maxsize=64)
def asset(name: str, *, ws_path: str = "/ws", client_path: str = "/lowlat", metrics_path: str = "") -> Asset | None:
    """The shipped file `name` (None if there is none); ``demo.html`` is rendered for these paths."""
    if name not in _NAMES:
        return None
    body = (STATIC_DIR / name).read_bytes()
    if name == DEMO_PAGE:
        metrics = (f'<a href="{html.escape(metrics_path)}">Prometheus metrics</a> &middot; ' if metrics_path else "")
        body = (body.decode()
                .replace("{{ws_path}}", html.escape(ws_path))
                .replace("{{client_path}}", html.escape(client_path.rstrip("/")))
                .replace("{{metrics_link}}", metrics)
                .encode())
    etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
    return Asset(name, body, CONTENT_TYPES[Path(name).suffix], etag)


def demo_page(settings: Settings, *, ws_path: str | None = None, client_path: str | None = None) -> Asset:
    """The demo page for an endpoint with `settings` (its scripts under ``settings.client_path``)."""
    found = asset(DEMO_PAGE, ws_path=ws_path or settings.path,
                  client_path=client_path if client_path is not None else settings.client_path,
                  metrics_path=settings.metrics_path if settings.metrics else "")
    assert found is not None, "the demo page is missing from the package"
    return found


def lookup(path: str, settings: Settings) -> Asset | None:
    """The asset for request path `path` under ``settings.client_path`` (None: not ours).

    ``<client_path>`` and ``<client_path>/`` are the demo page; ``<client_path>/<name>`` a file.
    """
    prefix = settings.client_path.rstrip("/")
    if not settings.client_path or not path.startswith(prefix):
        return None
    rest = path[len(prefix):]
    if rest in ("", "/"):
        return demo_page(settings)
    if not rest.startswith("/"):
        return None
    name = rest[1:]
    if name == DEMO_PAGE:
        return demo_page(settings)
    return asset(name)


def respond(found: Asset | None, method: str = "GET", if_none_match: str | None = None) -> StaticResponse:
    """Status, headers and body for a GET/HEAD of `found` (404 if None, 405 for other methods).

    Assets carry ``Access-Control-Allow-Origin: *`` so pages on other origins may load the client
    (the WebSocket handshake still checks their Origin), ``Cache-Control: no-cache`` with an ETag
    (revalidated on each load, answered 304 when unchanged) and ``X-Content-Type-Options: nosniff``.
    """
    if found is None:
        return StaticResponse(404, (("content-type", "text/plain; charset=utf-8"),), b"not found\n")
    method = method.upper()
    if method not in ("GET", "HEAD"):
        return StaticResponse(405, (("allow", "GET, HEAD"), ("content-type", "text/plain; charset=utf-8")),
                              b"method not allowed\n")
    headers = [("etag", found.etag), ("cache-control", "no-cache"), ("x-content-type-options", "nosniff"),
               ("access-control-allow-origin", "*")]
    if if_none_match and found.etag in (t.strip() for t in if_none_match.split(",")):
        return StaticResponse(304, tuple(headers), b"")
    headers += [("content-type", found.content_type), ("content-length", str(len(found.body)))]
    return StaticResponse(200, tuple(headers), found.body if method == "GET" else b"")


async def send_asgi(response: StaticResponse, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Send `response` on an ASGI HTTP connection."""
    await send({"type": "http.response.start", "status": response.status,
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]})
    await send({"type": "http.response.body", "body": response.body})


def asgi_respond(scope: dict[str, Any], settings: Settings) -> StaticResponse | None:
    """For an ASGI HTTP scope: the response if its path is one of ours, else None (pass it on)."""
    found = lookup(scope["path"], settings)
    if found is None:
        return None
    inm = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"if-none-match"), None)
    return respond(found, scope.get("method", "GET"), inm)

