"""Run an ASGI app under uvicorn with lowlat-mw's recommended options and a graceful drain.

uvicorn closes every WebSocket with 1012 as soon as it starts shutting down. ``run`` first stops
accepting connections, then drains every lowlat-mw connection (GoAway, running streams finish for
up to `drain_grace` seconds, close 4002 so clients reconnect: :func:`lowlat_mw.runtime.drain.drain_all`, as
our ``--ws`` shims do), and only then lets uvicorn shut down.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from ..endpoint import Endpoint
from ..errors import ErrorCode, SettingsError
from ..protocol import events as ev
from ..protocol.wire import codec_for
from ..settings import Settings

__all__ = ["DAPHNE_RUNSERVER", "HANDSHAKE_HEADER_LIMIT", "READ_BUDGET", "READ_SLICE", "SMALL_FRAGMENT", "HeaderBudget",
           "add_fragment", "check_server", "close_timeout_of", "daphne_args", "daphne_runserver", "gunicorn_args",
           "log_config", "read_slices", "run", "run_options", "several_workers", "too_big_message", "transport_limit",
           "uvicorn_args", "uvicorn_options"]

# Bytes of request line + headers a WebSocket handshake may take (daphne's and h11's own limit).
HANDSHAKE_HEADER_LIMIT = 16 * 1024
UVICORN_HTTP = "lowlat_mw.servers.uvicorn:HttpToolsProtocol"
# websockets-sansio, with fragment floods bounded; wsproto, with its close codes and reads bounded (.uvicorn)
UVICORN_WS = "lowlat_mw.servers.uvicorn:WebSocketProtocol"
UVICORN_WSPROTO = "lowlat_mw.servers.uvicorn:WSProtoProtocol"
GUNICORN_WORKER = "lowlat_mw.servers.gunicorn.ThreadWorker"


class HeaderBudget:
    """The byte budget of a connection's first request line and headers (no I/O: bytes in, slices out).

    The uvicorn shim and the daphne runner both feed each read through :meth:`split` until the
    server reports the headers in, so that the same rule bounds them on both.
    """

    def __init__(self, limit: int = HANDSHAKE_HEADER_LIMIT) -> None:
        self.limit = limit
        self.received = 0

    def split(self, data: bytes) -> tuple[bytes, bytes | None]:
        """Split one read into what may still be request line and headers, and the rest.

        The rest is None while the whole read fits the budget. Otherwise it is what follows the
        budget's last byte: if the headers are in after parsing the first part, the rest is a body
        or (after an upgrade) the WebSocket's first bytes, not bounded here; if not, answer 431.
        """
        room = max(self.limit - self.received, 0)
        self.received += len(data)
        if len(data) <= room:
            return data, None
        return data[:room], data[room:]


_ENV_SETTINGS: list[Settings] = []  # the environment's settings, read once (app_timeout's fallback)


def app_timeout(name: str) -> float:
    """The setting `name` (a timeout) that bounds the server's own work where no endpoint has seen the connection yet:
    the shortest of the endpoints this process made (each middleware, consumer or extension, with its framework's
    settings); before any exists, the environment's (``LOWLAT_*``, read once) or the default. Our uvicorn shims and
    daphne runner bound the HTTP handshake with it, and the closes of connections no driver took (a refused
    handshake), so a value set in the app or by ``serve --set`` applies to them too. A connection's driver tells the
    server its own endpoint's ``close_timeout`` (:class:`~lowlat_mw.runtime.direct.DropsCloses`): one app's short
    bound does not cut another's closes."""
    endpoints = list(Endpoint.instances)
    if endpoints:
        return min(getattr(e.settings, name) for e in endpoints)  # type: ignore[no-any-return]
    if not _ENV_SETTINGS:
        try:
            _ENV_SETTINGS.append(Settings.load())
        except SettingsError:  # the app reports the bad setting itself; bound the server all the same
            _ENV_SETTINGS.append(Settings())
    return getattr(_ENV_SETTINGS[0], name)  # type: ignore[no-any-return]


def close_timeout_of(given: float | None) -> float:
    """The close_timeout bounding one connection's close: `given` by its driver (its own endpoint's, through
    ``close_within``), else the process's (:func:`app_timeout`: no driver took the connection)."""
    return app_timeout("close_timeout") if given is None else given


SMALL_FRAGMENT = 4096  # continuation payloads smaller than this are appended to one buffer


def add_fragment(parts: list[Any], data: Any) -> None:
    """Append one fragment's payload to a message being reassembled (`parts`, joined at its end).

    A small one is appended to the buffer of the small ones before it (a one-byte fragment kept as
    an object of its own costs ~120 bytes: 12 MiB for a 100 KB message sent a byte a frame); a big
    one stays its own object, never copied into a growing buffer (whose reallocations can hold the
    message twice while it grows). So a message costs about its own size however it is cut.
    Used by the uvicorn shim and the daphne runner.
    """
    if len(data) < SMALL_FRAGMENT:
        tail = parts[-1] if parts else None
        if type(tail) is bytearray:
            tail += data
        else:
            parts.append(bytearray(data))
    else:
        parts.append(data)


READ_SLICE = 2 * 1024  # bytes of a socket read handed to a WebSocket parser at a time
READ_BUDGET = 0.002  # seconds of parsing per callback; the rest of the read waits for the next loop turn
_NOTHING = memoryview(b"")


def read_slices(data: bytes | memoryview, parse: Callable[[bytes], None], stop: Callable[[], bool], *,
                size: int = READ_SLICE, budget: float = READ_BUDGET,
                clock: Callable[[], float] = time.perf_counter) -> memoryview | None:
    """Hand a socket read to a WebSocket parser by the read rule of our servers' WebSocket protocols (the uvicorn
    shims and the daphne runner): `size` bytes at a time, while `stop()` is false (the application has messages
    waiting, the connection is failing or closing) and until `budget` seconds of this call are spent. Returns what
    it did not parse, for the caller to hold with reading paused until the application took its input (or, when the
    budget is spent, the next loop turn); empty when all of it was parsed but `stop()` holds what comes next; None
    when all of it was parsed and reading goes on. Nothing but the calls: no socket, no loop (`clock` is asked).

    Why: a parser handed a whole read (64-256 KiB: thousands of tiny frames) parses it, and queues every message,
    in one callback (autobahn 100-700 ms measured, wsproto ~20 ms per 16 KiB), while every other connection of the
    process waits; and what it queues has no bound. A 2 KiB slice of tiny frames takes 1-2 ms on the slowest."""
    end = len(data)
    if end <= size:
        if stop():
            return memoryview(data)
        if end:
            parse(data if type(data) is bytes else bytes(data))
        return _NOTHING if stop() else None
    view = memoryview(data)
    began = clock()
    pos = 0
    while True:
        if stop():
            return view[pos:]
        if pos >= end:
            return None
        if pos and clock() - began >= budget:
            return view[pos:]
        piece = bytes(view[pos:pos + size])
        pos += len(piece)
        parse(piece)


def transport_limit(settings: Settings) -> int:
    """The hosting server's own message size limit (after any permessage-deflate): just above
    ``max_frame_size``, so a message a little too big gets our Error + 1009 and anything bigger is
    refused by the server (also with 1009, after the same Error: :func:`too_big_message`) before it is
    buffered whole."""
    return settings.max_frame_size + 1024


def too_big_message(subprotocol: str | None) -> bytes | str:
    """The ``Error{0, message_too_big}`` a server sends before closing with 1009 a message its own size limit
    (:func:`transport_limit`) refused before lowlat-mw saw it (docs/protocol.md 10.3, 11.1): encoded for the
    connection's subprotocol (bytes for ``lowlat.v1.proto``, text for JSON), not yet framed."""
    return codec_for(subprotocol).encode(ev.Error(stream_id=0, code=ErrorCode.MESSAGE_TOO_BIG,
                                                  message="message exceeds max_frame_size"))


def uvicorn_options(settings: Settings | None = None, ws: str = "websockets-sansio") -> dict[str, Any]:
    """uvicorn keyword arguments that match lowlat-mw's settings (docs/security.md, "Transport")."""
    settings = settings or Settings.load()
    return {
        "ws": {"websockets-sansio": UVICORN_WS, "wsproto": UVICORN_WSPROTO}.get(ws, ws),
        # request line + headers within handshake_timeout and HANDSHAKE_HEADER_LIMIT (lowlat_mw/servers/uvicorn.py)
        "http": UVICORN_HTTP,
        # Our own limit answers first (Error frame + 1009); the server's is a backstop just above it.
        "ws_max_size": transport_limit(settings),
        "ws_ping_interval": None,  # the protocol's application-level heartbeat replaces it
        # Off: the protocol negotiates its own bounded compression; wsproto would inflate without a bound.
        "ws_per_message_deflate": False,
    }


def uvicorn_args(settings: Settings | None = None, ws: str = "websockets-sansio") -> list[str]:
    """The same as uvicorn command-line options."""
    opts = uvicorn_options(settings, ws)
    return ["--ws", opts["ws"], "--http", opts["http"], "--ws-max-size", str(opts["ws_max_size"]),
            "--ws-ping-interval", "0", "--ws-per-message-deflate", "false"]


def daphne_args(settings: Settings | None = None) -> list[str]:
    """daphne options for ``python -m lowlat_mw.servers.daphne`` (daphne with lowlat-mw's transport fixes).

    Size limits just above ``max_frame_size`` (message and frame), the WebSocket opening handshake
    within ``handshake_timeout`` (whole seconds, rounded up), no protocol-level pings (the
    application heartbeat replaces them). permessage-deflate stays off (daphne never accepts it).
    """
    settings = settings or Settings.load()
    limit = str(transport_limit(settings))
    return ["--websocket-max-message-size", limit, "--websocket-max-frame-size", limit,
            "--websocket_connect_timeout", str(max(1, math.ceil(settings.handshake_timeout))),
            "--ping-interval", str(10 ** 6)]


def gunicorn_args(settings: Settings | None = None) -> list[str]:
    """gunicorn options: the worker that bounds the handshake and drains on SIGTERM, request-header
    limits under 16 KiB, and a graceful timeout that leaves the drain its ``drain_grace``."""
    settings = settings or Settings.load()
    return ["-k", GUNICORN_WORKER, "--limit-request-line", "4094", "--limit-request-fields", "64",
            "--limit-request-field_size", "8190", "--graceful-timeout", str(math.ceil(settings.drain_grace) + 5)]


def run_options(settings: Settings | None = None, **uvicorn_kwargs: Any) -> dict[str, Any]:
    """What :func:`run` passes to ``uvicorn.Config``: :func:`uvicorn_options` (for ``ws``, if given, so
    ``ws="wsproto"`` still gets the wsproto shim), then the other keyword arguments on top."""
    ws = uvicorn_kwargs.pop("ws", "websockets-sansio")
    return {**uvicorn_options(settings, ws), **uvicorn_kwargs}


def log_config(level: str | int | None = None) -> dict[str, Any]:
    """uvicorn's logging configuration plus the ``lowlat_mw`` logger at `level` (uvicorn's ``log_level``;
    default INFO), its lines marked ``lowlat-mw:``: what ``lowlat-mw serve`` runs with (uvicorn's own configures
    only uvicorn's loggers). Pass it as ``log_config=`` to :func:`run` for the same in your own process; it
    replaces the ``lowlat_mw`` logger's handlers and level."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    if isinstance(level, str):
        level = logging.DEBUG if level.lower() == "trace" else logging.getLevelName(level.upper())
    if not isinstance(level, int):
        level = logging.INFO
    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["lowlat_mw"] = {"()": "uvicorn.logging.DefaultFormatter",
                                         "fmt": "%(levelprefix)s lowlat-mw: %(message)s", "use_colors": None}
    config["handlers"]["lowlat_mw"] = {"formatter": "lowlat_mw", "class": "logging.StreamHandler",
                                       "stream": "ext://sys.stderr"}
    config["loggers"]["lowlat_mw"] = {"handlers": ["lowlat_mw"], "level": level, "propagate": False}
    return config


SERVE_INSTALL = "pip install 'lowlat-mw[serve]'"  # what run() and `lowlat-mw serve` need: uvicorn[standard]


def check_server(settings: Settings, ws: Any = "websockets-sansio", http: Any = None) -> None:
    """Import what :func:`run` (and ``lowlat-mw serve``) runs: uvicorn, lowlat-mw's HTTP protocol over httptools and
    the `ws` protocol, before anything is printed or served: a missing package is one line naming what to install,
    not a banner and then a traceback. ImportError (naming the package and the pip command) or ValueError (a `ws`
    uvicorn cannot find). `ws` and `http`: uvicorn's options (`http` default: lowlat-mw's httptools protocol)."""
    try:
        from uvicorn.config import WS_PROTOCOLS
        from uvicorn.importer import ImportFromStringError, import_from_string
    except ImportError as exc:
        raise ImportError(f"lowlat-mw serves with uvicorn, which is not installed ({exc}): {SERVE_INSTALL}") from None
    from uvicorn.config import HTTP_PROTOCOLS

    options = uvicorn_options(settings, ws)
    http = http or options["http"]
    for target in (HTTP_PROTOCOLS.get(http, http), WS_PROTOCOLS.get(options["ws"], options["ws"])):
        try:
            import_from_string(target)
        except ImportFromStringError as exc:
            raise ValueError(f"uvicorn protocol {target!r}: {exc}") from None
        except ImportError as exc:
            missing = getattr(exc, "name", None)
            if missing is None or missing.partition(".")[0] == "wsproto":  # (uvicorn[standard] has no wsproto)
                raise ImportError(f"ws {ws!r}: {exc}") from None
            raise ImportError(f"lowlat-mw's server needs {missing.partition('.')[0]}, which is not installed: "
                              f"{SERVE_INSTALL}") from None


def run(app: Any, *, drain_grace: float | None = None, settings: Settings | None = None,
        **uvicorn_kwargs: Any) -> None:
    """``uvicorn.run`` with a graceful WebSocket drain on shutdown (`drain_grace` default: each
    connection's ``drain_grace`` setting)."""
    check_server(settings or Settings.load(), uvicorn_kwargs.get("ws", "websockets-sansio"), uvicorn_kwargs.get("http"))
    import uvicorn

    from .uvicorn import DrainingServer

    config = uvicorn.Config(app, **run_options(settings, **uvicorn_kwargs))
    server = DrainingServer(config, drain_grace)
    try:
        if config.workers > 1:  # as uvicorn.run does: one socket, a worker process per uvicorn.Server, where the
            from uvicorn.supervisors import Multiprocess  # --ws shims drain on shutdown

            Multiprocess(config, sockets=[config.bind_socket()]).run()
        else:
            server.run()
    except KeyboardInterrupt:  # Ctrl-C: uvicorn re-raises the SIGINT it caught once it has shut down (as uvicorn.run,
        pass  # the end of a stop asked for, not a traceback)


DAPHNE_RUNSERVER = "daphne.management.commands.runserver"  # daphne's `manage.py runserver`: imported to run it


def daphne_runserver() -> bool:
    """Under daphne's ``manage.py runserver`` ("daphne" in INSTALLED_APPS), serve with lowlat-mw's daphne runner,
    whole (:func:`lowlat_mw.servers.daphne.install_runserver`); True if so, False (nothing changed) anywhere else.

    The Channels adapter calls it as runserver imports the application. It keys on the command that runs: its
    module is imported only to run it (or print its help). Not on daphne being imported: daphne's app config imports
    ``daphne.server`` in every process of a project that lists it, one served by uvicorn too; and plain ``daphne`` is
    left as it is (production runs ``python -m lowlat_mw.servers.daphne``: docs/django.md says what daphne lacks)."""
    import sys

    if DAPHNE_RUNSERVER not in sys.modules:
        return False
    from .daphne import install_runserver

    install_runserver()
    return True


SEVERAL_WORKERS = (
    "lowlat-mw: %d worker processes (%s), each with its own in-process sessions: a client whose connection drops "
    "and comes back on another worker cannot resume its streams (ResumeFailed). Run one worker per port behind "
    "a balancer with client affinity, or one worker; see the guide's \"Several workers\""
)
_warned_workers = False


def several_workers(workers: int, how: str) -> bool:
    """Warn once per process (True when it did) that `workers` > 1 server processes (started as `how` says) do not
    share sessions, so resume fails across them (docs: each guide's "Several workers"); not where an endpoint of
    the process shares its sessions (the session_store setting)."""
    global _warned_workers
    if workers <= 1 or _warned_workers:
        return False
    from ..endpoint import Endpoint

    if any(e.settings.shares_sessions for e in list(Endpoint.instances)):
        return False  # sessions shared through Redis: any worker resumes them
    _warned_workers = True
    logging.getLogger("lowlat_mw").warning(SEVERAL_WORKERS, workers, how)
    return True
