"""Django Channels adapter: a consumer serving the lowlat-mw protocol.

    # routing.py
    websocket_urlpatterns = [path("ws/ai/", LowLatConsumer.as_asgi(model="myapp.models.generate"))]
    # settings.py
    LOWLAT_MW = {"idle_timeout": 300, "allowed_origins": ["https://app.example.com"]}

Settings come from ``settings.LOWLAT_MW`` (read lazily, re-read on ``setting_changed``), under
keyword arguments to ``as_asgi``. It composes with ``AllowedHostsOriginValidator`` and
``AuthMiddlewareStack``; the authenticated ``scope["user"]`` reaches the model as
``req.session.user``. Admission and the connection are the core's (:func:`lowlat_mw.runtime.asgi.accept`);
this consumer hands Channels' messages to them.
"""

from __future__ import annotations

from typing import Any

from channels.consumer import AsyncConsumer
from channels.exceptions import StopConsumer
from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.http import HttpRequest, HttpResponse

from lowlat_mw import static_files as static
from lowlat_mw.endpoint import Endpoint, settings_from_config
from lowlat_mw.errors import app_close_code
from lowlat_mw.model import Models, ModelSpec
from lowlat_mw.protocol.dialect import Dialect
from lowlat_mw.runtime.asgi import accept
from lowlat_mw.runtime.connection import ConnectionDriver
from lowlat_mw.runtime.shared import open_endpoint
from lowlat_mw.servers.serving import daphne_runserver

__all__ = ["LowLatConsumer", "client_urlpatterns", "client_view", "metrics_view"]

daphne_runserver()  # under daphne's `manage.py runserver`, which imports the application: lowlat-mw's daphne runner

_generation = [0]  # bumped when settings.LOWLAT_MW changes


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "LOWLAT_MW":
        _generation[0] += 1


setting_changed.connect(_on_setting_changed)


class _App:
    """What one ``as_asgi()`` call serves: its Endpoint, re-configured when ``settings.LOWLAT_MW`` changes."""

    def __init__(self, models: Models, options: dict[str, Any], dialect: Dialect | None = None) -> None:
        registry = options.pop("registry", None)
        self.dialects = (dialect,) if dialect is not None else ()  # (none: lowlat.v1)
        self.options = options
        self.generation = _generation[0]
        self.endpoint = open_endpoint(models, self._settings(), registry=registry)

    def _settings(self) -> Any:
        config = {"LOWLAT_MW": getattr(django_settings, "LOWLAT_MW", None) or {}}
        return settings_from_config(config, self.options, where="settings")

    def current(self) -> Endpoint:
        """The endpoint, with the settings as they are now."""
        if self.generation != _generation[0]:
            self.generation = _generation[0]
            self.endpoint.configure(self._settings())
        return self.endpoint


class LowLatConsumer(AsyncConsumer):
    """One instance per connection, created by ``LowLatConsumer.as_asgi(model=..., **settings)``."""

    model: ModelSpec | None = None

    def __init__(self, app: _App | None = None) -> None:
        self.app = app if app is not None else _App(Models(self.model), {})  # type: ignore[arg-type]
        self.driver: ConnectionDriver | None = None

    @classmethod
    def as_asgi(cls, **initkwargs: Any) -> Any:  # type: ignore[override]
        """An ASGI app making one consumer per connection; every kwarg but ``model``, ``registry``
        (a prometheus_client CollectorRegistry, default the global one) and ``dialect`` (the wire protocol its
        connections speak, default lowlat.v1: docs/architecture.md, "Adding a dialect") is a setting.

        The settings are validated here, when the routing is imported, so a wrong key in
        ``settings.LOWLAT_MW`` or in the kwargs stops the server at startup with its name.
        """
        model = initkwargs.pop("model", cls.model)
        if model is None:
            raise TypeError("LowLatConsumer.as_asgi() needs model=<callable or 'module.callable'>")
        dialect = initkwargs.pop("dialect", None)
        return super().as_asgi(app=_App(Models(model), initkwargs, dialect))

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint this consumer's connection belongs to."""
        return self.app.endpoint

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        """Admission (HTTP 403; or accept, then the refusal's close code; or accept and start the connection)."""
        self.driver = await accept(self.app.current(), self.scope, self._send, self.app.dialects)
        if self.driver is None:
            raise StopConsumer

    async def _send(self, message: dict[str, Any]) -> None:
        # daphne (autobahn) refuses close codes other than 1000 and 3000-4999: send 1xxx as 41xx.
        if message["type"] == "websocket.close" and "code" in message:
            message = {**message, "code": app_close_code(message["code"])}
        await self.base_send(message)

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        """One frame from the client."""
        if self.driver is not None:
            data = message.get("bytes")
            await self.driver.receive(data if data is not None else message.get("text") or "")

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        """The client went away: keep the session for a resume or stop its models."""
        if self.driver is not None:
            await self.driver.disconnected(message.get("code"))
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
