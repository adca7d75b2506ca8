"""The :class:`Endpoint`: one mounted lowlat-mw app, and every rule about who gets in and how it ends.

Every adapter makes one Endpoint per mounted app (the Starlette middleware or route, each
``LowLatConsumer.as_asgi()``, the Flask extension) and asks it, for each WebSocket handshake,
:meth:`Endpoint.admit`: the subprotocol, the Origin, the drain state and the connection limits,
in that order, with the answer to give (HTTP 403 before accepting, or a close code after).
It holds the settings, the models, the metrics, the session store and the connections, so
:meth:`Endpoint.drain` can drain them; :attr:`Endpoint.instances` is the process's registry that
servers drain on shutdown (:func:`lowlat_mw.runtime.drain.drain_all`).

Settings from a framework's configuration go through :func:`settings_from_config` (Flask's
``app.config``, Django's ``settings``): one reading of ``LOWLAT_MW`` and ``LOWLAT_*`` keys.

The core layer: it may import observability, the protocol and the base; it owns no socket, clock or
task (a drain awaits the drivers' own).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import secrets
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, ClassVar

from .cache import ResultCache
from .errors import CloseCode, SettingsError
from .model import Models, ModelSpec, shared_executor
from .observability.logs import CLIENT_LOGS
from .observability.metrics import Metrics
from .protocol.dialect import Dialect
from .protocol.limits import ConnectionLimiter
from .protocol.server import negotiate_subprotocol
from .protocol.session import MemorySessionStore, SessionStore
from .security import load_authenticator, origin_allowed
from .settings import ENV_PREFIX, Settings, parse_text, settings_error, unknown_setting

__all__ = ["Accept", "Endpoint", "Refuse", "health", "new_session_ids", "settings_from_config"]

log = logging.getLogger("lowlat_mw")
_gc_frozen = False  # gc.freeze() done in this process (Settings.gc_freeze)
_gc_tuned = False  # gc.set_threshold() done in this process (Settings.gc_threshold)


@dataclass(frozen=True, slots=True)
class Accept:
    """Admitted: accept the WebSocket with `subprotocol`. It counts against the limits for `client` until
    :meth:`Endpoint.release` (the connection's driver releases it when the socket is gone)."""

    subprotocol: str | None
    client: str | None


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refused. With `status` (403): answer the handshake with that HTTP status, without accepting, and `message` as
    its text where the server can send one (clients show it: which check refused). Otherwise accept with
    `subprotocol`, then close with `close_code` and `message` (4002 draining, 1013 past the limits: clients retry)."""

    reason: str  # the handshakes_refused label: forbidden, draining, limit
    status: int | None = None
    close_code: int = CloseCode.TRY_AGAIN_LATER
    message: str = ""
    subprotocol: str | None = None


def new_session_ids() -> tuple[str, str]:
    """A fresh session id and resume secret (drawn here, never in the protocol machines)."""
    return secrets.token_urlsafe(12), secrets.token_urlsafe(24)


def settings_from_config(config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, *,
                         where: str = "app.config") -> Settings:
    """Settings from a framework's configuration, under `overrides` (an adapter's keyword arguments).

    Reads ``config["LOWLAT_MW"]`` (a dict of settings) and ``LOWLAT_<NAME>`` keys of `config`, over
    ``LOWLAT_*`` environment variables; an unknown name is an error naming it and `where` it was
    (``app.config`` for Flask, ``settings`` for Django), raised when the app starts.
    """
    values: dict[str, Any] = {}
    problems: list[str] = []  # reported together with what Settings.load finds
    names = Settings.names()

    def take(name: str, value: Any, label: str, item: str) -> None:
        """`label`: where the name was given; `item`: where the value was."""
        if name not in names:
            problems.append(unknown_setting(name, label))
            return
        if isinstance(value, str):  # configuration is often text (a .env file, a config loader): "300", "true"
            try:
                value = parse_text(name, value, item)
            except SettingsError as exc:
                problems.append(str(exc))
                return
        values[name] = value

    for key, value in config.items():
        if key == "LOWLAT_MW":
            label = f"{where}['LOWLAT_MW']" if where == "app.config" else f"{where}.LOWLAT_MW"
            if not isinstance(value, Mapping):
                raise SettingsError(f"{label} must be a dict of lowlat-mw settings")
            for k, v in value.items():
                take(k, v, label, f"{label}[{k!r}]")
        elif key.startswith(ENV_PREFIX):
            take(key[len(ENV_PREFIX):].lower(), value, f"{where}[{key!r}]", f"{where}[{key!r}]")
    values.update(overrides or {})
    try:
        settings = Settings.load(values, source=f"{where} and the adapter's arguments")
    except SettingsError as exc:
        if not problems:
            raise
        problems.extend(getattr(exc, "problems", [str(exc)]))
    if problems:
        raise settings_error(problems)
    return settings


class Endpoint:
    """One mounted lowlat-mw app: settings, models, metrics, session store, limits, connections, drain."""

    instances: ClassVar[weakref.WeakSet[Endpoint]] = weakref.WeakSet()
    """Every endpoint of the process (servers drain them on shutdown)."""

    def __init__(self, model: ModelSpec | Models, settings: Settings, *, registry: Any = None) -> None:
        """`registry`: the prometheus_client CollectorRegistry for the metrics (default: the global one)."""
        self.models = model if isinstance(model, Models) else Models(model)
        if settings.authenticate:  # imported now: a wrong path fails when the app is built, not per handshake
            load_authenticator(settings.authenticate)
        self.registry = registry
        self.store: SessionStore = MemorySessionStore()  # sessions waiting to be resumed
        self.connections: weakref.WeakSet[Any] = weakref.WeakSet()  # the drivers of open connections
        self.loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()  # where they ran
        self.draining = False
        self._lock = threading.Lock()
        self.configure(settings)
        Endpoint.instances.add(self)

    def configure(self, settings: Settings) -> None:
        """Use `settings` from now on (new connections; limits restart counting from the open ones)."""
        old = getattr(self, "limiter", None)
        self.settings = settings
        limiter = ConnectionLimiter(settings.max_connections, settings.max_connections_per_client)
        if old is not None:  # the connections already open still count
            limiter.total, limiter.per_client = old.total, old.per_client
        self.limiter = limiter
        self.metrics = Metrics.for_registry(self.registry) if settings.metrics else None
        self.executor: Executor = shared_executor(settings.model_threads)
        # Whole replies of deterministic models (setting cache_size; None: off).
        self.cache = ResultCache(settings.cache_size, settings.cache_ttl) if settings.cache_size else None

    # ------------------------------------------------------------------ admission
    def admit(self, subprotocols: Sequence[str], origin: str | None, host: str | None,
              client: str | None, dialect: Dialect | None = None) -> Accept | Refuse:
        """Whether a WebSocket handshake may become a connection, and the answer to give (`dialect`: the wire
        protocol the connection is routed to, which picks the subprotocol; None: lowlat.v1).

        Refused with HTTP 403 when no offered subprotocol is served or the Origin is not allowed
        (clients treat that as final); accepted and then closed with 4002 while draining (clients retry
        on the server that replaces this one) or 1013 past the connection limits (clients back off).
        An Accept counts against the limits until :meth:`release`.
        """
        settings = self.settings
        if dialect is None:
            ok, subprotocol = negotiate_subprotocol(tuple(subprotocols), settings)
        else:
            ok, subprotocol = dialect.choose(tuple(subprotocols), settings)
        if not ok:
            CLIENT_LOGS.log(log, logging.INFO, client, "refused WebSocket from %s: no supported subprotocol in %s",
                            client, list(subprotocols))
            served = ", ".join(settings.subprotocols if dialect is None or dialect.negotiate is negotiate_subprotocol
                               else dialect.subprotocols) or "none"
            return self._refused(Refuse("forbidden", status=403, message=f"lowlat-mw: no subprotocol offered that this "
                                        f"endpoint serves ({served})"))
        if origin is not None and not origin_allowed(origin, host, settings.allowed_origins):
            CLIENT_LOGS.log(log, logging.WARNING, client, "refused cross-origin WebSocket from %s (client %s)", origin,
                            client)
            return self._refused(Refuse("forbidden", status=403, message="lowlat-mw: cross-origin WebSocket refused: "
                                        "the page's Origin is not in the server's allowed_origins"))
        if self.draining:
            return self._refused(Refuse("draining", close_code=CloseCode.DRAINING, message="server draining",
                                        subprotocol=subprotocol))
        with self._lock:  # Flask admits from request threads, and releases on the driver's loop
            limited = self.limiter.acquire(client)
        if limited is not None:
            CLIENT_LOGS.log(log, logging.WARNING, client, "refused connection from %s: %s", client, limited,
                            extra={"client": client})
            return self._refused(Refuse("limit", close_code=CloseCode.TRY_AGAIN_LATER, message=limited[:120],
                                        subprotocol=subprotocol))
        return Accept(subprotocol, client)

    def _refused(self, refusal: Refuse) -> Refuse:
        if self.metrics is not None:
            self.metrics.inc("handshakes_refused", refusal.reason)
        return refusal

    def release(self, client: str | None) -> None:
        """An admitted connection ended: it no longer counts against the limits."""
        with self._lock:
            self.limiter.release(client)

    # ------------------------------------------------------------------ connections
    def connection_started(self, driver: Any) -> None:
        """A driver runs an admitted connection (on the running loop, if any): drains will reach it."""
        global _gc_frozen, _gc_tuned
        if not _gc_frozen and self.settings.gc_freeze:
            # Once per process: the startup heap (tens of thousands of objects: modules, classes, the app)
            # leaves the collector's generations, so a full collection no longer walks it while streams wait.
            _gc_frozen = True
            gc.freeze()
            log.debug("gc.freeze(): %d objects moved to the permanent generation", gc.get_freeze_count())
        if not _gc_tuned and self.settings.gc_threshold > 0:
            # Once per process: a stream's objects (seconds old) are freed before a young collection promotes
            # them to the oldest generation, whose full collections walk the whole heap while streams wait.
            _gc_tuned = True
            gc.set_threshold(self.settings.gc_threshold, 50, 100)
            log.debug("gc.set_threshold%s", gc.get_threshold())
        self.connections.add(driver)
        loop = getattr(driver, "loop", None)
        if loop is not None:
            self.loops.add(loop)

    def connection_ended(self, driver: Any) -> None:
        """The connection's socket is gone: forget it, and release its place in the limits."""
        self.connections.discard(driver)
        with self._lock:  # (release)
            self.limiter.release(driver.address)

    def open_connections(self, loop: asyncio.AbstractEventLoop | None = None) -> list[Any]:
        """The drivers of connections not closed yet (on `loop`, if given)."""
        return [c for c in list(self.connections)
                if not c.protocol.closed and (loop is None or getattr(c, "loop", None) is loop)]

    def load(self) -> tuple[int, int]:
        """(open connections, running streams) of this endpoint, read from any thread. Streams are counted once
        per session, the detached ones waiting for a resume included (their models run on)."""
        drivers = _snapshot(self.connections)
        connections = 0
        sessions: dict[int, Any] = {}
        for driver in drivers:
            if driver.protocol.closed:
                continue
            connections += 1
            session = driver.protocol.session
            if session is not None:
                sessions[id(session)] = session
        values = getattr(self.store, "values", None)  # (MemorySessionStore: the detached sessions' runners)
        if values is not None:
            for runner in values():
                session = getattr(runner, "session", None)
                if session is not None:
                    sessions[id(session)] = session
        return connections, sum(session.active for session in sessions.values())

    def health(self) -> tuple[int, dict[str, Any]]:
        """This endpoint's health for a balancer: (HTTP status, report), see :func:`health`."""
        return health([self])

    @classmethod
    def on_loop(cls, loop: asyncio.AbstractEventLoop) -> list[Endpoint]:
        """Endpoints that have run connections on `loop`."""
        return [e for e in list(cls.instances) if loop in e.loops]

    # ------------------------------------------------------------------ drain
    async def drain(self, grace: float | None = None, reconnect_after_ms: int = 0) -> None:
        """Graceful shutdown: refuse new connections (4002), GoAway to every open one, let running streams
        finish for up to `grace` seconds (default: the ``drain_grace`` setting), then close them with 4002
        (clients reconnect). Run it on the loop the connections run on."""
        await self.drain_each([self], grace, reconnect_after_ms)

    @staticmethod
    async def drain_each(endpoints: Iterable[Endpoint], grace: float | None = None, reconnect_after_ms: int = 0,
                         *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Drain `endpoints` (their connections on `loop`, if given) side by side; one failing stops none."""
        drivers = []
        for endpoint in endpoints:
            endpoint.draining = True
            drivers += endpoint.open_connections(loop)
        if drivers:
            await asyncio.gather(*(d.drain(grace, reconnect_after_ms) for d in drivers), return_exceptions=True)


def health(endpoints: Iterable[Endpoint] | None = None) -> tuple[int, dict[str, Any]]:
    """Health for a balancer, of `endpoints` (default: every endpoint of this process): (HTTP status, report).
    200 while they take connections, 503 once they all drain (so a health check stops sending new clients
    before the process goes); the report's ``connections`` and ``streams`` (open and running now) are the
    load, for a balancer that weighs by it. The adapters serve their own endpoint's at ``health_path``."""
    members = _snapshot(Endpoint.instances) if endpoints is None else list(endpoints)
    connections = streams = 0
    for endpoint in members:
        c, n = endpoint.load()
        connections += c
        streams += n
    draining = bool(members) and all(endpoint.draining for endpoint in members)
    report = {"status": "draining" if draining else "ok", "connections": connections, "streams": streams,
              "pid": os.getpid()}
    return (503 if draining else 200), report


def _snapshot(items: weakref.WeakSet[Any]) -> list[Any]:
    """The live members of `items`, from any thread: its set of weak references is copied in one step (listing the
    WeakSet itself fails when another thread adds to it meanwhile)."""
    return [item for item in (ref() for ref in list(items.data)) if item is not None]
