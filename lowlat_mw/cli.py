"""The ``lowlat-mw`` command: ``serve`` a model over WebSocket, ``chat`` with a server.

    lowlat-mw serve                         # the built-in demo model on 127.0.0.1:8000/ws
    lowlat-mw serve mypkg.models:generate --port 9000 --set idle_timeout=60
    lowlat-mw chat ws://127.0.0.1:8000/ws "hello"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .errors import ClientError, SettingsError
from .settings import Settings

__all__ = ["build_app", "main"]

_HOME_PAGE = """<!doctype html><meta charset=utf-8><title>lowlat-mw</title>
<h1>lowlat-mw is serving</h1><p>WebSocket endpoint: <code>{path}</code>
(subprotocols <code>lowlat.v1.proto</code>, <code>lowlat.v1.json</code>).</p>
<p>Try: <code>lowlat-mw chat ws://HOST:PORT{path} "hello"</code></p>"""


def _parse_set(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise SettingsError(f"--set expects KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out


def build_app(model: Any = None, **options: Any) -> Any:
    """A Starlette app serving `model` (default: the demo model) with `options` as settings."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    from .adapters.starlette import LowLatMiddleware
    from .demo import demo_model

    settings = Settings.load(options)

    async def home(request: Any) -> HTMLResponse:
        return HTMLResponse(_HOME_PAGE.format(path=settings.path))

    app = Starlette(routes=[Route("/", home)])
    app.add_middleware(LowLatMiddleware, model=model or demo_model, settings=settings)
    return app


def _serve(args: argparse.Namespace) -> int:
    from .serving import run

    if args.delay is not None:
        os.environ["LOWLAT_DEMO_DELAY"] = str(args.delay)
    options = _parse_set(args.set)
    if args.path:
        options["path"] = args.path
    app = build_app(args.model, **options)
    settings = Settings.load(options)
    print(f"lowlat-mw serving {args.model or 'the demo model'} on ws://{args.host}:{args.port}{settings.path}",
          flush=True)
    run(app, drain_grace=args.drain_grace, settings=settings, host=args.host, port=args.port,
        log_level=args.log_level, ws=args.ws, lifespan="off")
    return 0


def _chat(args: argparse.Namespace) -> int:
    from .backoff import Backoff
    from .client import connect_sync

    params = _parse_set(args.param)
    try:
        with connect_sync(args.url, mode=args.mode, backoff=Backoff(retries=args.retries)) as client:
            for chunk in client.stream(args.prompt, params=params, model=args.model):
                sys.stdout.write(chunk if isinstance(chunk, str) else chunk.decode("utf-8", "replace"))
                sys.stdout.flush()
            sys.stdout.write("\n")
            stream = client.last_stream
            if args.stats and stream is not None and stream.end is not None:
                ttfd = stream.time_to_first_delta or 0.0
                print(f"[{stream.end.usage.get('deltas', 0)} deltas, first delta {ttfd * 1000:.1f} ms, "
                      f"total {(stream.total_time or 0) * 1000:.1f} ms]", file=sys.stderr)
    except ClientError as exc:
        print(f"lowlat-mw chat: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lowlat-mw`` console script."""
    parser = argparse.ArgumentParser(prog="lowlat-mw", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve a model callable over WebSocket (uvicorn)")
    serve.add_argument("model", nargs="?", default=None, help="module:callable (default: the demo model)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--path", default=None, help="WebSocket path (default /ws)")
    serve.add_argument("--delay", type=float, default=None, help="demo model: seconds between tokens")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a setting (see docs/settings.md), e.g. --set idle_timeout=60")
    serve.add_argument("--ws", default="websockets-sansio", help="uvicorn WebSocket implementation")
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--drain-grace", type=float, default=30.0,
                       help="seconds running streams may finish on shutdown before clients are moved")
    serve.set_defaults(func=_serve)

    chat = sub.add_parser("chat", help="stream a reply from a lowlat-mw server to the terminal")
    chat.add_argument("url", help="e.g. ws://127.0.0.1:8000/ws")
    chat.add_argument("prompt")
    chat.add_argument("--mode", choices=("proto", "json"), default="proto")
    chat.add_argument("--model", default="")
    chat.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    chat.add_argument("--stats", action="store_true", help="print timings to stderr")
    chat.add_argument("--retries", type=int, default=5, help="reconnect attempts before giving up")
    chat.set_defaults(func=_chat)

    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (SettingsError, ImportError, TypeError, ValueError) as exc:
        print(f"lowlat-mw: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
