"""Django Channels adapter: a consumer serving the lowlat-mw protocol.

    # routing.py
    websocket_urlpatterns = [path("ws/ai/", LowLatConsumer.as_asgi(model="myapp.models.generate"))]
    # settings.py
    LOWLAT_MW = {"idle_timeout": 300, "allowed_origins": ["https://app.example.com"]}

Settings come from ``settings.LOWLAT_MW`` (read lazily, re-read on ``setting_changed``), under
keyword arguments to ``as_asgi``. It composes with ``AllowedHostsOriginValidator`` and
``AuthMiddlewareStack``; the authenticated ``scope["user"]`` reaches the model as
``req.session.user``.
"""

from __future__ import annotations

from typing import Any

from channels.consumer import AsyncConsumer
from channels.exceptions import StopConsumer
from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.http import HttpRequest, HttpResponse

from lowlat_mw import static_files as static
from lowlat_mw.drivers.aio import AsyncServerSession
from lowlat_mw.drivers.asgi import asgi_session, check_scope, client_address, refuse
from lowlat_mw.errors import SettingsError, app_close_code
from lowlat_mw.model import Models, ModelSpec
from lowlat_mw.observability.metrics import Metrics
from lowlat_mw.protocol.limits import ConnectionLimiter
from lowlat_mw.protocol.session import MemorySessionStore
from lowlat_mw.settings import Settings

__all__ = ["LowLatConsumer", "client_urlpatterns", "client_view", "django_settings_dict", "metrics_view"]

_cache: dict[str, Any] = {}
_generation = [0]  # bumped when settings.LOWLAT_MW changes


def django_settings_dict() -> dict[str, Any]:
    """``settings.LOWLAT_MW`` as a dict (cached until Django reports it changed)."""
    if "value" not in _cache:
        value = getattr(django_settings, "LOWLAT_MW", {}) or {}
        if not isinstance(value, dict):
            raise SettingsError("settings.LOWLAT_MW must be a dict of lowlat-mw settings")
        _cache["value"] = dict(value)
    return _cache["value"]


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "LOWLAT_MW":
        _cache.clear()
        _generation[0] += 1


setting_changed.connect(_on_setting_changed)


class _Options:
    """The kwargs of one ``as_asgi()`` call and the Settings resolved from them (cached)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.registry = options.pop("registry", None)
        self.options = options
        self.metrics: Metrics | None = None
        self._settings: tuple[int, Settings] | None = None
        self.store = MemorySessionStore()  # sessions waiting to be resumed, per as_asgi() app
        self.limiter: ConnectionLimiter | None = None

    def settings(self) -> Settings:
        if self._settings is None or self._settings[0] != _generation[0]:
            for name in django_settings_dict():
                if name not in Settings.names():
                    raise SettingsError(f"unknown setting {name!r} in settings.LOWLAT_MW")
            merged = {**django_settings_dict(), **self.options}
            self._settings = (_generation[0], Settings.load(merged, source="LowLatConsumer.as_asgi()"))
            s = self._settings[1]
            self.limiter = ConnectionLimiter(s.max_connections, s.max_connections_per_client)
            self.metrics = Metrics.for_registry(self.registry) if s.metrics else None
        return self._settings[1]

    def refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.inc("handshakes_refused", reason)


class LowLatConsumer(AsyncConsumer):
    """One instance per connection, created by ``LowLatConsumer.as_asgi(model=..., **settings)``."""

    model: ModelSpec | None = None

    def __init__(self, model: ModelSpec | Models | None = None, options: _Options | None = None) -> None:
        self.models = Models(model if model is not None else self.model)  # type: ignore[arg-type]
        self.config = options if options is not None else _Options({})
        self.session: AsyncServerSession | None = None
        self.client: str | None = None
        self.counted = False

    @classmethod
    def as_asgi(cls, **initkwargs: Any) -> Any:  # type: ignore[override]
        """An ASGI app making one consumer per connection; every kwarg but ``model`` and ``registry``
        (a prometheus_client CollectorRegistry, default the global one) is a setting.

        The settings are validated here, when the routing is imported, so a wrong key in
        ``settings.LOWLAT_MW`` or in the kwargs stops the server at startup with its name.
        """
        model = initkwargs.pop("model", cls.model)
        if model is None:
            raise TypeError("LowLatConsumer.as_asgi() needs model=<callable or 'module.callable'>")
        models = Models(model)
        config = _Options(initkwargs)
        config.settings()
        return super().as_asgi(model=models, options=config)

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        """Negotiate, check the Origin, accept and start the session (or refuse with 403)."""
        settings = self.config.settings()
        ok, subprotocol = check_scope(self.scope, settings)
        if not ok:
            self.config.refused("forbidden")
            await refuse(self.base_send)
            raise StopConsumer
        await self.base_send({"type": "websocket.accept", "subprotocol": subprotocol})
        self.client = client_address(self.scope)
        assert self.config.limiter is not None
        refused = self.config.limiter.acquire(self.client)
        if refused is not None:
            self.config.refused("limit")
            await self._send({"type": "websocket.close", "code": 1013, "reason": refused[:120]})
            raise StopConsumer
        self.counted = True
        self.session = asgi_session(
            self.scope, self._send, model=self.models, settings=settings, subprotocol=subprotocol,
            store=self.config.store, metrics=self.config.metrics,
        )
        self.session.start()

    async def _send(self, message: dict[str, Any]) -> None:
        # daphne (autobahn) refuses close codes other than 1000 and 3000-4999: send 1xxx as 41xx.
        if message["type"] == "websocket.close" and "code" in message:
            message = {**message, "code": app_close_code(message["code"])}
        await self.base_send(message)

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        """One frame from the client."""
        if self.session is not None:
            data = message.get("bytes")
            await self.session.receive(data if data is not None else message.get("text") or "")

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        """The client went away: stop the models and timers."""
        if self.session is not None:
            await self.session.disconnected(message.get("code"))
        if self.counted and self.config.limiter is not None:
            self.counted = False
            self.config.limiter.release(self.client)
        raise StopConsumer


def metrics_view(request: HttpRequest, registry: Any = None) -> HttpResponse:
    """Django view answering a Prometheus scrape: ``path("metrics", metrics_view)`` in urls.py.

    `registry` (pass it with ``path(..., kwargs={"registry": r})``) defaults to the global one.
    """
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return HttpResponse(generate_latest(registry if registry is not None else REGISTRY),
                        content_type=CONTENT_TYPE_LATEST)


def client_view(request: HttpRequest, name: str = "", ws_path: str = "/ws") -> HttpResponse:
    """Django view serving the browser client's file `name` ("" or "demo.html": the demo page).

    Use :func:`client_urlpatterns` rather than routing it by hand. `ws_path` is the path of the
    WebSocket route the demo page connects to (in Channels it is set by the routing, not settings).
    """
    base = request.path[: len(request.path) - len(name)].rstrip("/")
    page = name in ("", static.DEMO_PAGE)
    found = static.asset(static.DEMO_PAGE, ws_path=ws_path, client_path=base) if page else static.asset(name)
    answer = static.respond(found, request.method or "GET", request.headers.get("If-None-Match"))
    response = HttpResponse(answer.body, status=answer.status)
    for key, value in answer.headers:
        response[key] = value
    return response


def client_urlpatterns(prefix: str = "lowlat/", ws_path: str = "/ws") -> list[Any]:
    """URL patterns serving the browser client under `prefix`: ``urlpatterns += client_urlpatterns()``.

    ``/lowlat/`` is the demo page (connecting to `ws_path`), ``/lowlat/lowlat.js`` the client module.
    """
    from django.urls import path

    prefix = prefix.strip("/") + "/"
    kwargs = {"ws_path": ws_path}
    return [path(prefix, client_view, kwargs=kwargs, name="lowlat_mw_client_demo"),
            path(prefix + "<path:name>", client_view, kwargs=kwargs, name="lowlat_mw_client")]
