"""One frozen, validated settings object and its loaders (kwargs, dict, ``LOWLAT_*`` env).

Every adapter feeds its framework's idiom into :meth:`Settings.load`; precedence is
explicit values > environment variables > defaults. Unknown keys are errors that name the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, get_type_hints

from .errors import SettingsError

__all__ = ["ENV_PREFIX", "SUBPROTOCOL_JSON", "SUBPROTOCOL_PROTO", "Settings"]

ENV_PREFIX = "LOWLAT_"
SUBPROTOCOL_PROTO = "lowlat.v1.proto"
SUBPROTOCOL_JSON = "lowlat.v1.json"
KNOWN_CODECS = ("zstd", "lz4", "snappy")
MiB = 1024 * 1024
MIN_CACHE_SIZE = 4096  # the smallest result cache that can keep a reply (cache.py: one is at most a quarter of it)
# LOWLAT_* variables that are read elsewhere (the demo model, dev.py) and are not settings.
NOT_SETTINGS = frozenset({"LOWLAT_DEMO_DELAY", "LOWLAT_DEV_VENV", "LOWLAT_MODEL", "LOWLAT_SERVE_WORKER"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """All lowlat-mw settings. Times are seconds, sizes bytes. See docs/settings.md."""

    path: str = "/ws"
    """URL path the middleware serves the protocol at."""
    heartbeat_interval: float = 30.0
    """Seconds between server Pings while the peer is quiet."""
    heartbeat_max_interval: float = 120.0
    """Upper bound the interval stretches to while the peer keeps sending."""
    heartbeat_timeout: float = 10.0
    """Seconds to wait for any frame after a Ping before closing with 4001."""
    idle_timeout: float = 600.0
    """Close with 4000 after this long with no application traffic, no stream running and no push group joined."""
    handshake_timeout: float = 10.0
    """Close with 4004 when the handshake is not done this long after the WebSocket opens: no Hello yet, or
    the authenticate hook (or the resume's lookup) still running."""
    max_frame_size: int = MiB
    """Largest WebSocket message accepted, in bytes (1009 above it)."""
    max_decompressed_size: int = 8 * MiB
    """Largest payload after decompression, in bytes (1009 above it)."""
    max_streams: int = 8
    """Concurrent streams per connection."""
    resume_window: float = 60.0
    """Seconds a dropped connection's session (its streams and replay buffer) waits to be resumed."""
    resume_buffer_size: int = MiB
    """Bytes of sent-but-unacknowledged output kept per session for replay after a drop."""
    session_store: str = ""
    """Where sessions are shared so a client can resume on another process or machine: a Redis URL
    (``redis://host:6379/0``, ``rediss://``, ``unix://``), checked when the app starts; "" or "memory": this
    process only (docs/scaling.md)."""
    flow_window: int = 256 * 1024
    """Most bytes of unacknowledged output per session for clients that send Acks (models pause beyond)."""
    slow_consumer_timeout: float = 30.0
    """Close with 4003 when output stays blocked (window full, or a send stuck) this long."""
    close_timeout: float = 5.0
    """Seconds a closed connection may take to go after the server's close frame (a peer that does not read it or
    answer it); then it is aborted, so its socket, thread and connection slot are released."""
    max_connections: int = 10000
    """Open connections per endpoint and process; more are closed with 1013 (try again later)."""
    max_connections_per_client: int = 256
    """Open connections per client address; more are closed with 1013 (0: no limit)."""
    rate_limit: float = 20.0
    """Requests per second per connection (token bucket); over it, Error rate_limited (0: no limit)."""
    rate_burst: int = 40
    """Requests a connection may send at once before rate_limit applies."""
    control_rate_limit: float = 200.0
    """Messages per second per connection that are not Requests (Ping, Pong, Cancel, Ack, unknown kinds; token
    bucket; each Request adds 2, up to the burst, for its stream's Ack and Cancel); over it, Error rate_limited and
    close 1008 (0: no limit)."""
    control_rate_burst: int = 1000
    """Such messages a connection may send at once before control_rate_limit applies."""
    max_unread_inputs: int = 256
    """(Protocol v1.3) Inputs a running stream's model may leave unread (``req.inputs``); one more fails the stream
    with Error bad_request: a client cannot pile up memory behind a model that does not read."""
    max_request_size: int = MiB
    """Bytes of a Request's input (text, data, messages, params); larger gets Error message_too_big."""
    max_session_lifetime: float = 0.0
    """Close an idle-between-streams connection with 4005 after this many seconds (0: never)."""
    drain_grace: float = 30.0
    """On server shutdown: seconds running streams get to finish after GoAway, before close 4002."""
    authenticate: str | Callable[..., Any] = ""
    """A (sync or async) callable that admits a handshake, or its dotted path (see docs/security.md)."""
    compression: tuple[str, ...] = KNOWN_CODECS
    """Codecs the server may use and accept, preferred first; empty disables compression."""
    compression_min_size: int = 512
    """Payloads smaller than this are never compressed (it costs more than it saves)."""
    link_mbps: float = 1000.0
    """Assumed link speed for the compression cost model, in Mbit/s."""
    allowed_origins: tuple[str, ...] = ()
    """Cross-origin Origins allowed; same host is always allowed; "*" allows every origin."""
    push_groups: tuple[str, ...] = ("*",)
    """Push groups a client may join with Subscribe (protocol v1.1), as shell-style patterns ("news", "team-*");
    others are refused with unauthorized. Empty: clients join none (the server can still push to their session
    and user; docs/push.md)."""
    max_groups: int = 64
    """Push groups one session may be in; a Subscribe past it is refused with bad_request."""
    max_contexts: int = 16
    """Context documents one session may hold (protocol v1.3); a Context for one more is refused with
    context_limit (0: clients may create none)."""
    max_context_bytes: int = 2 * 1024 * 1024
    """UTF-8 bytes of all the context documents of one session (protocol v1.3); a Context past it is refused
    with context_limit."""
    history_size: int = 256 * 1024
    """Bytes of turns (a stream's input and text output) kept per session whose client asked for them
    (Hello.history, protocol v1.3) so that a Request can continue one; the oldest go first, and at most 64 are
    kept (0: none, Request.continues is refused)."""
    subprotocols: tuple[str, ...] = (SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON)
    """Subprotocols served, in server preference order."""
    model_threads: int = 64
    """Worker threads for sync model callables and generators (each chunk is one hop)."""
    slow_step_warning: float = 0.1
    """Warn (once per model, then at most every 10 minutes) when one step of an async model of this endpoint holds the
    event loop longer than this many seconds: a blocking call in an ``async def`` model (time.sleep, a blocking
    client) stops every connection of the process meanwhile (0: off for this endpoint's models; other endpoints keep
    their own setting; docs/architecture.md)."""
    expose_model_errors: bool = False
    """Send the model exception's message to clients (off: only its type name)."""
    server_name: str = "lowlat-mw"
    """Server name announced in Welcome."""
    metrics: bool = True
    """Record Prometheus metrics (lowlat_* in the registry given to the adapter, default the global one)."""
    metrics_path: str = ""
    """HTTP path where the Starlette middleware and Flask extension serve the metrics ("" = don't serve)."""
    client_path: str = ""
    """HTTP path prefix where the Starlette middleware and Flask extension serve the browser client
    (lowlat.js) and the demo page, e.g. "/lowlat" ("" = don't serve; docs/browser.md)."""
    health_path: str = ""
    """HTTP path where the Starlette middleware and Flask extension answer a balancer's health check: 200 and the
    process's load as JSON, 503 once it drains ("" = don't serve; docs/scaling.md)."""
    asyncapi_path: str = ""
    """HTTP path where the Starlette middleware and Flask extension serve the endpoint's AsyncAPI 3.0 document
    (JSON), e.g. "/asyncapi.json" ("" = don't serve; docs/protocol.md)."""
    stage_timings: bool = True
    """Send each stream's per-stage server timings in End.timings_ms (docs/observability.md)."""
    delta_timing: bool = False
    """Time every Delta stage by stage and put every inter-delta gap in the metrics (off: a stream's first two
    Deltas and two in every 32, the rest estimated from them, with no clock read; docs/observability.md)."""
    tracing: bool = True
    """OpenTelemetry spans for handshakes and streams, when opentelemetry-api is installed."""
    merge_deltas: bool = False
    """Merge text chunks an async-generator model yields back to back, without waiting in between,
    into one Delta (at most merge_max_delay late); a model that waits between chunks still gets one
    Delta per chunk. Fewer, larger frames for fast token producers (docs/protocol.md 8.2)."""
    merge_max_delay: float = 0.0005
    """Longest time (seconds) a chunk waits for more to merge with, when merge_deltas is on."""
    direct_writes: bool = True
    """Where the server offers it (lowlat-mw's uvicorn protocols and daphne runner, the Flask adapter), frame output
    here and write it straight to the socket, a loop turn's frames in one write, instead of one ASGI send per frame
    (docs/architecture.md)."""
    max_batch_size: int = 16
    """Micro-batching: at most this many requests in one call of a model marked batch-capable
    (``generate.batch = True``: it takes a list of requests and returns one reply per request;
    lowlat_mw/runtime/batch.py)."""
    max_batch_wait: float = 0.002
    """Micro-batching: seconds the first request of a batch waits for more to join it (a full batch goes at once)."""
    cache_size: int = 0
    """Bytes of whole replies kept by the result cache (0: off). Only models marked deterministic
    (``generate.deterministic = True``: the reply depends on the request alone) are cached: a request with the same
    model, input and params then gets the kept reply at once, without the model running (lowlat_mw/cache.py). With
    the Redis ``session_store``, replies are also kept in Redis, up to this many bytes there too, and every process
    finds what another one kept."""
    cache_ttl: float = 300.0
    """Seconds a reply stays in the result cache."""
    gc_freeze: bool = False
    """When the first connection arrives, move what the process holds then (modules, classes, your app) out of
    the garbage collector's reach (gc.freeze()), so a full collection visits only what came after and stalls
    every stream far less (docs/architecture.md). Off by default: it changes the whole process (gc.get_objects
    and gc.get_referrers no longer see those objects); `lowlat-mw serve`, which owns its process, turns it on."""
    gc_threshold: int = 0
    """When > 0, at the first connection the collector's young generation is collected every this many
    allocations and the older ones every 50 and 100 collections (gc.set_threshold(n, 50, 100)): objects that live
    as long as a stream (seconds) die before they reach the oldest generation, whose full collections stall every
    stream (docs/architecture.md). 0: the interpreter's (700, 10, 10). A process-wide change, as gc_freeze:
    `lowlat-mw serve` uses 50000 (above what 2,000 running streams hold: no collection while they come and go)."""

    def __post_init__(self) -> None:
        problems = self._problems()
        if problems:
            raise settings_error(problems)

    def _problems(self) -> list[str]:
        """Every wrong value (and combination of values), so that all of them are reported at once."""
        return [*self._number_problems(), *self._wire_problems(), *self._path_problems()]

    def _number_problems(self) -> list[str]:
        """Every time, size, count or limit out of its range (and the two that must agree: the heartbeats)."""
        problems: list[str] = []
        for name in ("heartbeat_interval", "heartbeat_max_interval", "heartbeat_timeout",
                     "idle_timeout", "handshake_timeout", "link_mbps", "resume_window",
                     "slow_consumer_timeout", "close_timeout", "merge_max_delay"):
            if not getattr(self, name) > 0:
                problems.append(f"setting {name!r} must be > 0, got {getattr(self, name)!r}")
        for name in ("heartbeat_interval", "idle_timeout", "resume_window"):
            if getattr(self, name) * 1000 > 0xFFFFFFFF:  # announced in Welcome as 32-bit milliseconds
                problems.append(f"setting {name!r} must be at most 4294967 seconds, got {getattr(self, name)!r}")
        if self.heartbeat_max_interval < self.heartbeat_interval:
            problems.append("setting 'heartbeat_max_interval' must be >= 'heartbeat_interval'")
        for name in ("max_frame_size", "max_decompressed_size", "max_streams", "model_threads",
                     "resume_buffer_size", "flow_window", "max_unread_inputs"):
            value = getattr(self, name)
            if not 0 < value <= 0xFFFFFFFF:
                problems.append(f"setting {name!r} must be between 1 and 2**32-1, got {value!r}")
        if self.max_frame_size < 64:
            problems.append("setting 'max_frame_size' must be at least 64 bytes")
        for name in ("max_connections", "max_connections_per_client", "rate_limit", "control_rate_limit",
                     "max_session_lifetime", "drain_grace", "gc_threshold", "cache_size", "max_batch_wait",
                     "max_contexts", "max_context_bytes", "history_size", "slow_step_warning"):
            if getattr(self, name) < 0:
                problems.append(f"setting {name!r} must be >= 0, got {getattr(self, name)!r}")
        if self.max_batch_size < 1:
            problems.append(f"setting 'max_batch_size' must be >= 1, got {self.max_batch_size!r}")
        if 0 < self.cache_size < MIN_CACHE_SIZE:
            problems.append(f"setting 'cache_size' must be 0 (off) or at least {MIN_CACHE_SIZE} bytes, "
                            f"got {self.cache_size!r}")
        if not self.cache_ttl > 0:
            problems.append(f"setting 'cache_ttl' must be > 0, got {self.cache_ttl!r}")
        for name in ("rate_burst", "control_rate_burst", "max_request_size"):
            if getattr(self, name) < 1:
                problems.append(f"setting {name!r} must be >= 1, got {getattr(self, name)!r}")
        if self.compression_min_size < 0:
            problems.append("setting 'compression_min_size' must be >= 0")
        return problems

    def _wire_problems(self) -> list[str]:
        """Every unknown compression codec or subprotocol, and a session store that is neither memory nor Redis."""
        problems: list[str] = []
        for codec in self.compression:
            if codec not in KNOWN_CODECS:
                problems.append(f"setting 'compression' has unknown codec {codec!r}; known: {', '.join(KNOWN_CODECS)}")
        if not self.subprotocols:
            problems.append("setting 'subprotocols' must name at least one subprotocol")
        for sp in self.subprotocols:
            if sp not in (SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON):
                problems.append(f"setting 'subprotocols' has unknown subprotocol {sp!r}")
        if self.shares_sessions and not self.session_store.startswith(
                ("redis://", "rediss://", "unix://")):
            problems.append(f"setting 'session_store' must be \"memory\" or a Redis URL (redis://, rediss://, "
                            f"unix://), got {self.session_store!r}")
        return problems

    def _path_problems(self) -> list[str]:
        """Every HTTP path that does not start with '/' or clashes with another one it must differ from."""
        problems: list[str] = []
        if not self.path.startswith("/"):
            problems.append(f"setting 'path' must start with '/', got {self.path!r}")
        if self.metrics_path and (not self.metrics_path.startswith("/") or self.metrics_path == self.path):
            problems.append(f"setting 'metrics_path' must start with '/' and differ from 'path', "
                            f"got {self.metrics_path!r}")
        if self.health_path and (not self.health_path.startswith("/") or self.health_path in (
                self.path, self.metrics_path, self.asyncapi_path)):
            problems.append(f"setting 'health_path' must start with '/' and differ from 'path', 'metrics_path' "
                            f"and 'asyncapi_path', got {self.health_path!r}")
        if self.asyncapi_path and (not self.asyncapi_path.startswith("/") or self.asyncapi_path in (
                self.path, self.metrics_path)):
            problems.append(f"setting 'asyncapi_path' must start with '/' and differ from 'path' and "
                            f"'metrics_path', got {self.asyncapi_path!r}")
        if self.client_path and (not self.client_path.startswith("/") or self.client_path.rstrip("/") in (
                "", self.path, self.metrics_path)):
            problems.append(f"setting 'client_path' must start with '/', not be '/' and differ from 'path' and "
                            f"'metrics_path', got {self.client_path!r}")
        return problems

    @property
    def shares_sessions(self) -> bool:
        """Whether `session_store` names a store shared between processes (Redis), not this process's memory."""
        return self.session_store not in ("", "memory")

    # ----------------------------------------------------------------- loaders
    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every setting name, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def load(
        cls,
        values: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        source: str = "settings",
    ) -> Settings:
        """Build settings from `values` over ``LOWLAT_*`` variables in `env` (default os.environ).

        `source` names where `values` came from, for error messages (e.g. "LOWLAT_MW").
        """
        values = dict(values or {})
        if isinstance(values.get("settings"), Settings):  # Settings passed through kwargs
            base = values.pop("settings")
            return base.replace(**values) if values else base
        env = os.environ if env is None else env
        hints = _hints()
        merged: dict[str, Any] = {}
        problems: list[str] = []  # every wrong name and value, reported together
        for key, raw in env.items():
            if not key.startswith(ENV_PREFIX) or key in NOT_SETTINGS:
                continue
            name = key[len(ENV_PREFIX):].lower()
            if name not in hints:
                problems.append(unknown_setting(name, f"environment variable {key}"))
                continue
            try:
                merged[name] = _parse_env(name, raw, hints[name], f"environment variable {key}")
            except SettingsError as exc:
                problems.append(str(exc))
        for key, value in values.items():
            if key not in hints:
                problems.append(unknown_setting(key, source))
                continue
            try:
                merged[key] = _coerce(key, value, hints[key])
            except SettingsError as exc:
                problems.append(str(exc))
        return _build(lambda: cls(**merged), problems)

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` applied and validated (every wrong one reported at once, as by :meth:`load`)."""
        hints = _hints()
        coerced: dict[str, Any] = {}
        problems: list[str] = []
        for key, value in changes.items():
            try:
                if key not in hints:
                    raise SettingsError(unknown_setting(key, "settings"))
                coerced[key] = _coerce(key, value, hints[key])
            except SettingsError as exc:
                problems.append(str(exc))
        return _build(lambda: dataclasses.replace(self, **coerced), problems)


def _build(make: Callable[[], Settings], problems: list[str]) -> Settings:
    """`make()`, the settings from the values that have the right type, raising one SettingsError for `problems`
    (wrong names and types) and whatever is wrong with those values too: every mistake in one start-up."""
    try:
        settings = make()
    except SettingsError as exc:
        problems = [*problems, *getattr(exc, "problems", [str(exc)])]
    if problems:
        raise settings_error(problems)
    return settings


def _hints() -> dict[str, Any]:
    hints = get_type_hints(Settings)
    return {f.name: hints[f.name] for f in fields(Settings)}


def settings_error(problems: list[str]) -> SettingsError:
    """One error for every problem found, so a user fixes them all in one go, not one start-up at a time
    (its ``problems`` attribute lists them)."""
    message = problems[0] if len(problems) == 1 else \
        f"{len(problems)} settings are wrong:\n" + "\n".join(f"- {p}" for p in problems)
    error = SettingsError(message)
    error.problems = list(problems)  # type: ignore[attr-defined]
    return error


def parse_text(name: str, raw: str, where: str) -> Any:
    """A setting's value given as text in a framework's configuration (``"300"``, ``"true"``, ``"zstd,lz4"``),
    converted to the setting's type; SettingsError naming `where` if it is not one."""
    hint = _hints().get(name)
    if hint is str or hint is None:
        return raw
    return _parse_env(name, raw, hint, where)


def unknown_setting(key: str, source: str) -> str:
    """The message for a setting name that does not exist, with the closest real name as a hint."""
    close = difflib.get_close_matches(key, Settings.names(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown setting {key!r} in {source}{hint}"


HOOKS = frozenset({"authenticate"})
"""Settings that take a callable or its dotted path (in the environment and text configuration: the path)."""


def _coerce(name: str, value: Any, hint: Any) -> Any:
    if name in HOOKS:
        if isinstance(value, str) or callable(value):
            return value
        raise SettingsError(f"setting {name!r} must be a callable or its dotted path, got {type(value).__name__} "
                            f"{value!r}")
    try:
        if hint is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if hint is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError
            return value
        if hint is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError
            return float(value)
        if hint is str:
            if not isinstance(value, str):
                raise TypeError
            return value
        # tuple[str, ...]
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        items = tuple(value)
        if not all(isinstance(v, str) for v in items):
            raise TypeError
        return items
    except (TypeError, OverflowError):  # OverflowError: an int too large for a float setting
        raise SettingsError(
            f"setting {name!r} must be {_type_name(hint)}, got {type(value).__name__} {value!r}"
        ) from None


def _parse_env(name: str, raw: str, hint: Any, where: str) -> Any:
    """Setting `name` given as text (`where`: the environment variable or config key, for the error)."""
    raw = raw.strip()
    if name in HOOKS:  # its dotted path
        return raw
    try:
        if hint is bool:
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
        if hint is str:
            return raw
        return tuple(v.strip() for v in raw.split(",") if v.strip())
    except ValueError:
        raise SettingsError(f"{where} must be {_type_name(hint)}, got {raw!r}") from None


def _type_name(hint: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        hint, "a list of strings"
    )
