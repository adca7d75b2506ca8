"""The ``lowlat-mw`` command: ``serve`` a model over WebSocket, ``chat`` with a server.

    lowlat-mw serve                         # the built-in demo model on 127.0.0.1:8000/ws
    lowlat-mw serve mypkg.models:generate --port 9000 --set idle_timeout=60
    lowlat-mw serve --stats-interval 10        # and a one-line latency summary on stderr every 10 s
    lowlat-mw serve --workers 4 --set session_store=redis://127.0.0.1:6379/0   # 4 processes sharing sessions
    lowlat-mw chat ws://127.0.0.1:8000/ws "hello"

``serve`` shows the demo page at / (a browser client streaming from the model; its files are
served under /lowlat, ``--client-path ""`` turns both off) and answers Prometheus scrapes at
/metrics (``--metrics-path ""`` turns that off).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from ..errors import ClientError, SettingsError, StreamError
from ..observability.metrics import Metrics
from ..settings import ENV_PREFIX, Settings

__all__ = ["StatsPrinter", "build_app", "main", "source_checkout"]

_HOME_PAGE = """<!doctype html><meta charset=utf-8><title>lowlat-mw</title>
<h1>lowlat-mw is serving</h1><p>WebSocket endpoint: <code>{path}</code>
(subprotocols <code>lowlat.v1.proto</code>, <code>lowlat.v1.json</code>).</p>
<p>Try: <code>lowlat-mw chat ws://HOST:PORT{path} "hello"</code></p>{links}"""
DEFAULT_METRICS_PATH = "/metrics"
DEFAULT_ASYNCAPI_PATH = "/asyncapi.json"
DEFAULT_HEALTH_PATH = "/healthz"
DEFAULT_CLIENT_PATH = "/lowlat"
SERVE_GC_THRESHOLD = 50_000  # net allocations between young collections under `serve` (Settings.gc_threshold)
WORKER_ENV = "LOWLAT_SERVE_WORKER"  # what `serve --workers` hands each worker process (see worker_app)


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


def build_app(model: Any = None, dialects: Mapping[str, Any] | None = None, **options: Any) -> Any:
    """The ASGI app ``serve`` runs: `model` (default: the demo model) with `options` as settings, on a
    home page. No web framework: :class:`~lowlat_mw.runtime.asgi.LowLatASGI` over a one-page ASGI app
    (`dialects`: its other wire protocols, path -> Dialect or ``"module:attr"`` naming one).

    With ``client_path`` set, ``/`` is the browser demo page (lowlat_mw/static/demo.html);
    otherwise a short text page. Other paths are 404.
    """
    from .. import static_files as static
    from ..demo import demo_model
    from ..runtime.asgi import LowLatASGI, refuse_handshake

    settings = Settings.load(options)
    links = ""
    if settings.metrics and settings.metrics_path:
        mp = settings.metrics_path
        links += f'\n<p>Prometheus metrics: <a href="{mp}"><code>{mp}</code></a></p>'
    if settings.asyncapi_path:
        ap = settings.asyncapi_path
        links += f'\n<p>AsyncAPI 3.0 document: <a href="{ap}"><code>{ap}</code></a></p>'
    text_page = _HOME_PAGE.format(path=settings.path, links=links).encode()

    async def home(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await refuse_handshake(scope, send, 404, f"lowlat-mw: no WebSocket endpoint at {scope['path']}: "
                                   f"this server's is {settings.path}")  # (not our path)
            return
        if scope["type"] != "http":
            return
        if scope["path"] != "/":
            answer = static.respond(None)
        elif settings.client_path:
            etag = dict(scope.get("headers") or ()).get(b"if-none-match")
            answer = static.respond(static.demo_page(settings), scope.get("method", "GET"),
                                    etag.decode("latin-1") if etag is not None else None)
        else:
            answer = static.StaticResponse(200, (("content-type", "text/html; charset=utf-8"),
                                                 ("content-length", str(len(text_page)))), text_page)
        await static.send_asgi(answer, send)

    routes = {at: _load_dialect(d) if isinstance(d, str) else d for at, d in (dialects or {}).items()}
    return LowLatASGI(model or demo_model, app=home, settings=settings, dialects=routes)


def _load_dialect(spec: str) -> Any:
    """The Dialect ``"module:attr"`` names (``serve --dialect PATH=module:attr``)."""
    from ..protocol.dialect import Dialect

    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"--dialect {spec!r}: expected PATH=module:attr")
    found: Any = importlib.import_module(module)
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ImportError(f"--dialect {spec!r}: module {module!r} has no attribute {attr!r}") from None
    if not isinstance(found, Dialect):
        raise TypeError(f"--dialect {spec!r} is {type(found).__name__}, not a lowlat_mw.protocol.dialect.Dialect")
    return found


def _dialect_routes(values: list[str]) -> dict[str, str]:
    """``--dialect PATH=module:attr`` (repeatable) as path -> spec; ValueError naming a bad one."""
    routes: dict[str, str] = {}
    for value in values:
        path, sep, spec = value.partition("=")
        if not sep or not path.startswith("/") or not spec:
            raise ValueError(f"--dialect {value!r}: expected PATH=module:attr, e.g. /ndjson=myapp.dialects:NDJSON")
        routes[path] = spec
    return routes


class StatsPrinter:
    """Prints ``metrics.snapshot().summary(previous)`` to `out` every `interval` seconds, from a thread.

    Each line covers the streams since the previous line (the first: since :meth:`start`).
    """

    def __init__(self, metrics: Metrics, interval: float, out: TextIO | None = None) -> None:
        if not interval > 0:
            raise ValueError(f"the stats interval must be > 0 seconds, got {interval!r}")
        self.metrics = metrics
        self.interval = interval
        self.out = out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lowlat-mw-stats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop printing (returns once the thread has ended; no line is printed after it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=max(5.0, self.interval))

    def _run(self) -> None:
        previous = self.metrics.snapshot()
        while not self._stop.wait(self.interval):
            current = self.metrics.snapshot()
            print(current.summary(previous), file=self.out or sys.stderr, flush=True)
            previous = current


def _serve_options(args: argparse.Namespace) -> dict[str, Any]:
    """Settings from --set, --path, --metrics-path and --client-path, with serve's defaults for the HTTP paths
    (/metrics, /healthz, /asyncapi.json, /lowlat) unless configured elsewhere."""
    options = _parse_set(args.set)
    if args.path:
        options["path"] = args.path
    if getattr(args, "drain_grace", None) is not None:
        options["drain_grace"] = args.drain_grace
    _default_path(options, "metrics_path", DEFAULT_METRICS_PATH, args.metrics_path)
    if "gc_freeze" not in options and f"{ENV_PREFIX}GC_FREEZE" not in os.environ:
        options["gc_freeze"] = True  # the process is ours: its startup heap leaves the collector (Settings.gc_freeze)
    if "gc_threshold" not in options and f"{ENV_PREFIX}GC_THRESHOLD" not in os.environ:
        options["gc_threshold"] = SERVE_GC_THRESHOLD  # and a stream's objects die young (Settings.gc_threshold)
    _default_path(options, "health_path", DEFAULT_HEALTH_PATH)
    _default_path(options, "asyncapi_path", DEFAULT_ASYNCAPI_PATH)
    _default_path(options, "client_path", DEFAULT_CLIENT_PATH, getattr(args, "client_path", None))
    return options


def _default_path(options: dict[str, Any], name: str, default: str, given: str | None = None) -> None:
    """Set the HTTP path setting `name`: `given` (its command-line option) if there is one; else `default`, unless
    --set or a LOWLAT_* variable configures it, or the WebSocket or metrics path took it."""
    if given is not None:
        options[name] = given
    elif name not in options and f"{ENV_PREFIX}{name.upper()}" not in os.environ:
        loaded = Settings.load(options)
        if default not in (loaded.path, loaded.metrics_path):
            options[name] = default


def _serve(args: argparse.Namespace) -> int:
    from .serving import check_server, log_config, run

    if args.delay is not None:
        os.environ["LOWLAT_DEMO_DELAY"] = str(args.delay)
    if args.stats_interval < 0:
        raise SettingsError(f"--stats-interval must be >= 0 seconds, got {args.stats_interval!r}")
    options = _serve_options(args)
    settings = Settings.load(options)
    if args.stats_interval and not settings.metrics:
        raise SettingsError("--stats-interval needs metrics (remove --set metrics=false)")
    if args.workers < 1:
        raise SettingsError(f"--workers must be at least 1, got {args.workers}")
    if args.workers > 1:
        if not settings.session_store:
            raise SettingsError(
                f"--workers {args.workers} needs sessions shared between the workers, or a reconnect that lands on "
                "another worker cannot resume its streams: --set session_store=redis://HOST:6379/0 (docs/scaling.md; "
                "--set session_store=memory to run them without)")
        if args.stats_interval:
            raise SettingsError("--stats-interval prints one process's metrics: use it with one worker")
    check_server(settings, args.ws)
    # Like uvicorn: the model's module is looked for in --app-dir (default: the current folder) first. build_app
    # imports it (the Endpoint resolves its models), so a wrong path stops here with its reason; with several
    # workers each builds its own (worker_app) after this check.
    app_dir = os.path.abspath(args.app_dir)
    if args.model is not None and app_dir not in sys.path:
        sys.path.insert(0, app_dir)
    dialects = _dialect_routes(getattr(args, "dialect", []))
    app: Any = build_app(args.model, dialects=dialects, settings=settings)
    extra: dict[str, Any] = {}
    if args.workers > 1:
        os.environ[WORKER_ENV] = json.dumps({"model": args.model, "options": options, "app_dir": app_dir,
                                             "dialects": dialects})
        app = f"{__name__}:worker_app"
        extra = {"workers": args.workers, "factory": True}
    print(f"lowlat-mw serving {args.model or 'the demo model'} on ws://{args.host}:{args.port}{settings.path}",
          flush=True)
    for at, spec in dialects.items():
        print(f"lowlat-mw serving the dialect {spec} on ws://{args.host}:{args.port}{at}", flush=True)
    if settings.client_path:
        print(f"lowlat-mw demo page at http://{args.host}:{args.port}/", flush=True)
    if settings.metrics and settings.metrics_path:
        print(f"lowlat-mw metrics at http://{args.host}:{args.port}{settings.metrics_path}", flush=True)
    if settings.asyncapi_path:
        print(f"lowlat-mw AsyncAPI document at http://{args.host}:{args.port}{settings.asyncapi_path}", flush=True)
    if settings.health_path:
        print(f"lowlat-mw health check at http://{args.host}:{args.port}{settings.health_path}", flush=True)
    stats = StatsPrinter(Metrics.for_registry(), args.stats_interval) if args.stats_interval else None
    if stats is not None:
        stats.start()
    try:
        run(app, settings=settings, host=args.host, port=args.port, log_level=args.log_level,
            log_config=log_config(args.log_level), ws=args.ws, lifespan="off", **extra)
    finally:
        if stats is not None:
            stats.stop()
    return 0


def worker_app() -> Any:
    """The app of one ``serve --workers`` process (uvicorn's factory): the model and settings the command was given."""
    spec = json.loads(os.environ[WORKER_ENV])
    if spec["model"] is not None and spec["app_dir"] not in sys.path:
        sys.path.insert(0, spec["app_dir"])
    return build_app(spec["model"], spec.get("dialects"), **spec["options"])


def _headers(values: list[str]) -> dict[str, str]:
    """``--header "Name: value"`` (repeatable) as a dict; ValueError naming a bad one."""
    headers: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--header {value!r}: expected 'Name: value'")
        headers[name.strip()] = rest.strip()
    return headers


def _ws_url(url: str) -> str:
    """`url` as a WebSocket URL: ``http://`` and ``https://`` (the demo page's address, the same server) become
    ``ws://`` and ``wss://``; ValueError for anything else that is not ``ws://`` or ``wss://``."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if sep and scheme in ("ws", "wss"):
        return url
    if sep and scheme in ("http", "https"):
        return ("ws" if scheme == "http" else "wss") + "://" + rest
    raise ValueError(f"{url!r} is not a WebSocket URL: give ws:// or wss://, e.g. ws://127.0.0.1:8000/ws")


def _chat(args: argparse.Namespace) -> int:
    """One prompt (``-``: all of stdin), or none: each line of stdin is a prompt on the same connection
    (interactive on a terminal: a ``>`` prompt; Ctrl-C stops the reply, Ctrl-D or Ctrl-C at the prompt ends)."""
    from ..client import connect_sync
    from ..client.backoff import Backoff

    try:
        url = _ws_url(args.url)
        params = _parse_set(args.param)
        headers = _headers(args.header)
    except ValueError as exc:
        print(f"lowlat-mw chat: {exc}", file=sys.stderr)
        return 2
    prompt = sys.stdin.read().rstrip("\n") if args.prompt == "-" else args.prompt  # (as $(...) drops it)
    interactive = prompt is None and sys.stdin.isatty()
    sent = 0
    try:
        with connect_sync(url, mode=args.mode, backoff=Backoff(retries=args.retries), headers=headers,
                          auth=args.auth) as client:
            if prompt is not None:
                _reply(client, prompt, params, args)
                return 0
            while True:
                if interactive:
                    print("> ", end="", file=sys.stderr, flush=True)
                try:
                    line = sys.stdin.readline()
                except KeyboardInterrupt:
                    break
                if not line:
                    break
                if not line.strip():
                    continue
                sent += 1
                try:
                    _reply(client, line.rstrip("\r\n"), params, args)
                except KeyboardInterrupt:  # stop this reply (the stream is cancelled), keep the conversation
                    print(" [stopped]", file=sys.stderr)
                except StreamError as exc:  # this reply failed (an unknown model, a rate limit): say so, go on
                    print(f"\nlowlat-mw chat: {exc}", file=sys.stderr)
            if interactive:
                print(file=sys.stderr)
            elif not sent:
                print("lowlat-mw chat: no prompt: give one, '-' to read it from stdin, or lines on stdin",
                      file=sys.stderr)
                return 2
    except ClientError as exc:
        print(f"lowlat-mw chat: {exc}", file=sys.stderr)
        return 1
    return 0


def _reply(client: Any, prompt: str, params: dict[str, Any], args: argparse.Namespace) -> None:
    """Stream the reply to `prompt` to stdout, a newline after it (and its timings to stderr with --stats)."""
    for chunk in client.stream(prompt, params=params, model=args.model):
        sys.stdout.write(chunk if isinstance(chunk, str) else chunk.decode("utf-8", "replace"))
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    stream = client.last_stream
    if args.stats and stream is not None and stream.end is not None:
        ttfd = stream.time_to_first_delta or 0.0
        print(f"[{stream.end.usage.get('deltas', 0)} deltas, first delta {ttfd * 1000:.1f} ms, "
              f"total {(stream.total_time or 0) * 1000:.1f} ms]", file=sys.stderr)


def source_checkout() -> Path | None:
    """The source checkout this package runs from (an editable install), which holds the benchmarks; None
    for an installed package (the suites are not in the wheel)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "benchmarks" / "__main__.py").is_file() and (root / "pyproject.toml").is_file():
        return root
    return None


def _bench(args: argparse.Namespace) -> int:
    """`lowlat-mw bench ...` = `python -m benchmarks ...` of the checkout this package runs from."""
    root = source_checkout()
    if root is None:
        raise ImportError("the benchmark suites are not installed with the package: they need a lowlat-mw source "
                          "checkout (clone it, `pip install -e '.[bench]'`, then `lowlat-mw bench` or "
                          "`python -m benchmarks` there)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from benchmarks.__main__ import main as bench_main

    rest = list(args.rest)
    if not any(a == "--output" or a.startswith("--output=") for a in rest):
        rest = ["--output", str(root / "docs" / "benchmarks.md"), *rest]  # the checkout's, from any directory
    return bench_main(rest)


def version_line() -> str:
    """What ``lowlat-mw --version`` prints: the package, the wire protocol and the Python it runs on."""
    from lowlat_mw._version import __version__

    return f"lowlat-mw {__version__} (wire protocol v1; Python {sys.version.split()[0]})"


def main(argv: list[str] | None = None, prog: str = "lowlat-mw") -> int:
    """Entry point of the ``lowlat-mw`` console script (and of ``python -m lowlat_mw``)."""
    parser = _build_parser(prog)
    args = _parse_args(parser, sys.argv[1:] if argv is None else list(argv))
    try:
        return int(args.func(args))
    except (SettingsError, ImportError, TypeError, ValueError) as exc:
        print(f"lowlat-mw: {exc}", file=sys.stderr)
        return 2


def _build_parser(prog: str) -> argparse.ArgumentParser:
    """The command line's parser: the serve, chat and bench commands (bench's options are the benchmarks')."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    _add_chat(sub)
    bench = sub.add_parser("bench", add_help=False,
                           help="run the benchmark suites (source checkout; options of python -m benchmarks)")
    bench.set_defaults(func=_bench, rest=[])
    return parser


def _add_serve(sub: Any) -> None:
    """The ``serve`` command: its options map to uvicorn's and to settings (docs/settings.md)."""
    serve = sub.add_parser("serve", help="serve a model callable over WebSocket (uvicorn)")
    serve.add_argument("model", nargs="?", default=None, help="module:callable (default: the demo model)")
    serve.add_argument("--app-dir", default=".", metavar="DIR",
                       help="look for the model's module in DIR first (default: the current folder, as uvicorn)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--path", default=None, help="WebSocket path (default /ws)")
    serve.add_argument("--dialect", action="append", default=[], metavar="PATH=module:attr",
                       help="also serve this Dialect (another wire protocol, docs/architecture.md) at PATH")
    serve.add_argument("--delay", type=float, default=None, help="demo model: seconds between tokens")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a setting (see docs/settings.md), e.g. --set idle_timeout=60")
    serve.add_argument("--ws", default="websockets-sansio", help="uvicorn WebSocket implementation")
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--workers", type=int, default=1,
                       help="server processes sharing the port (more than 1 needs the session_store setting: "
                            "sessions shared through Redis, docs/scaling.md)")
    serve.add_argument("--drain-grace", type=float, default=None,
                       help="seconds running streams may finish on shutdown before clients are moved "
                            "(the drain_grace setting, default 30)")
    serve.add_argument("--metrics-path", default=None,
                       help=f"HTTP path of the Prometheus metrics (default {DEFAULT_METRICS_PATH}; \"\" = off)")
    serve.add_argument("--client-path", default=None,
                       help=f"HTTP path prefix of the browser client's files; / is then the demo page "
                            f"(default {DEFAULT_CLIENT_PATH}; \"\" = off)")
    serve.add_argument("--stats-interval", type=float, default=0.0, metavar="SECONDS",
                       help="print a one-line summary (connections, streams, first-delta p50/p99) to stderr "
                            "every SECONDS (default 0: off)")
    serve.set_defaults(func=_serve)


def _add_chat(sub: Any) -> None:
    """The ``chat`` command: a terminal client of a lowlat-mw server."""
    chat = sub.add_parser("chat", help="stream a reply from a lowlat-mw server to the terminal")
    chat.add_argument("url", help="e.g. ws://127.0.0.1:8000/ws (http:// and https:// are taken as ws:// and wss://)")
    chat.add_argument("prompt", nargs="?", default=None,
                      help="what to send; '-' reads it from stdin; none: one prompt per line of stdin, "
                           "interactively on a terminal")
    chat.add_argument("--auth", default="", metavar="TOKEN", help="the Hello's auth token (the authenticate hook)")
    chat.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                      help="an HTTP header for the handshake (repeatable), e.g. 'Authorization: Bearer x'")
    chat.add_argument("--mode", choices=("proto", "json"), default="proto")
    chat.add_argument("--model", default="")
    chat.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    chat.add_argument("--stats", action="store_true", help="print timings to stderr")
    chat.add_argument("--retries", type=int, default=5, help="reconnect attempts before giving up")
    chat.set_defaults(func=_chat)


def _parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`argv` parsed: everything after ``bench`` goes to the benchmarks' own parser, and chat's prompt may come
    after its options (argparse alone would refuse it there)."""
    if argv[:1] == ["bench"]:  # everything after it belongs to the benchmarks' own parser
        return argparse.Namespace(func=_bench, rest=argv[1:])
    args, extra = parser.parse_known_args(argv)
    if args.command == "chat" and args.prompt is None and len(extra) == 1 \
            and (extra[0] == "-" or not extra[0].startswith("-")):
        args.prompt = extra[0]  # the prompt after an option (argparse fills an optional positional early)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


if __name__ == "__main__":
    sys.exit(main())
