"""Flask adapter: an extension serving the lowlat-mw protocol on a WebSocket route.

    lowlat = LowLat(app, model=generate)            # or LowLat(model=...) + lowlat.init_app(app)
    app.config["LOWLAT_MW"] = {"idle_timeout": 60}  # or app.config["LOWLAT_IDLE_TIMEOUT"] = 60

Built on flask-sock's engine, simple-websocket (``simple_websocket.Server``), on any server
flask-sock supports (werkzeug's dev server with threads, gunicorn's gthread worker). We open the
``Server`` ourselves instead of using ``Sock.route`` because that builds it from one app-wide
``SOCK_SERVER_OPTIONS`` before any of our code runs: we must refuse a cross-origin or
wrong-subprotocol handshake with HTTP 403 first and set this route's own limits.
The connection's thread only reads; protocol, models and timers run in the core's thread driver.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, request
from simple_websocket import ConnectionClosed, Server

from lowlat_mw import static_files as static
from lowlat_mw.drivers.threads import ThreadedSession
from lowlat_mw.errors import SettingsError
from lowlat_mw.model import Models, ModelSpec, SessionInfo
from lowlat_mw.observability.metrics import Metrics
from lowlat_mw.protocol.limits import ConnectionLimiter
from lowlat_mw.protocol.session import MemorySessionStore
from lowlat_mw.security import check_handshake
from lowlat_mw.servers.serving import transport_limit
from lowlat_mw.settings import ENV_PREFIX, Settings

__all__ = ["LowLat", "settings_from_config"]


def settings_from_config(config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from ``config["LOWLAT_MW"]`` and ``LOWLAT_<NAME>`` keys, under `overrides`.

    An unknown ``LOWLAT_*`` key is an error naming it, raised when the app starts.
    """
    values: dict[str, Any] = {}
    for key, value in config.items():
        if key == "LOWLAT_MW":
            if not isinstance(value, Mapping):
                raise SettingsError("app.config['LOWLAT_MW'] must be a dict of settings")
            for k, v in value.items():
                if k not in Settings.names():
                    raise SettingsError(f"unknown setting {k!r} in app.config['LOWLAT_MW']")
                values[k] = v
        elif key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX):].lower()
            if name not in Settings.names():
                raise SettingsError(f"unknown setting {name!r} in app.config[{key!r}]")
            values[name] = value
    values.update(overrides or {})
    return Settings.load(values, source="Flask config")


class LowLat:
    """The Flask extension: ``LowLat(app, model=...)`` or ``init_app(app)`` later."""

    def __init__(self, app: Flask | None = None, *, model: ModelSpec | None = None, registry: Any = None,
                 **options: Any) -> None:
        """`registry`: prometheus_client CollectorRegistry for the metrics (default: the global one)."""
        self.model = model
        self.registry = registry
        self.options = options
        self.settings: Settings | None = None
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask, *, model: ModelSpec | None = None, **options: Any) -> None:
        """Validate the settings now (a bad key fails at startup) and register the route."""
        if model is not None:
            self.model = model
        self.options.update(options)
        if self.model is None:
            raise TypeError("LowLat needs model=<callable or 'module:callable'>")
        self.settings = settings_from_config(app.config, self.options)
        self._model = Models(self.model)
        self.store = MemorySessionStore()  # sessions waiting to be resumed, per extension
        self.limiter = ConnectionLimiter(self.settings.max_connections, self.settings.max_connections_per_client)
        self._limiter_lock = threading.Lock()
        self.metrics = Metrics.for_registry(self.registry) if self.settings.metrics else None
        app.extensions["lowlat_mw"] = self
        app.add_url_rule(self.settings.path, "lowlat_mw", self._view, websocket=True)
        if self.settings.metrics_path:
            app.add_url_rule(self.settings.metrics_path, "lowlat_mw_metrics", self._metrics_view)
        if self.settings.client_path:  # the browser client and demo page (docs/browser.md)
            prefix = self.settings.client_path.rstrip("/")
            app.add_url_rule(prefix + "/", "lowlat_mw_client_demo", self._client_view, methods=["GET", "HEAD"])
            app.add_url_rule(prefix + "/<path:name>", "lowlat_mw_client", self._client_view, methods=["GET", "HEAD"])

    def _client_view(self, name: str = "") -> Response:
        assert self.settings is not None
        found = static.lookup(f"{self.settings.client_path.rstrip('/')}/{name}", self.settings)
        # werkzeug leaves the body out of HEAD responses itself
        answer = static.respond(found, "GET", request.headers.get("If-None-Match"))
        return Response(answer.body, status=answer.status, headers=list(answer.headers))

    def _metrics_view(self) -> Response:
        if self.metrics is None:
            return Response("metrics are off (setting metrics=False)\n", status=404, mimetype="text/plain")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.inc("handshakes_refused", reason)

    def _view(self) -> Response:
        settings = self.settings
        assert settings is not None
        env = request.environ
        if env.get("HTTP_UPGRADE", "").lower() != "websocket":
            return Response("WebSocket endpoint (lowlat-mw)\n", status=426, headers={"Upgrade": "websocket"})
        offered = [p.strip() for p in env.get("HTTP_SEC_WEBSOCKET_PROTOCOL", "").split(",") if p.strip()]
        ok, subprotocol = check_handshake(offered, env.get("HTTP_ORIGIN"), env.get("HTTP_HOST"), settings)
        if not ok:
            self._refused("forbidden")
            return Response("forbidden\n", status=403)
        ws = Server(
            # Without the client's Sec-WebSocket-Extensions, simple-websocket does not accept permessage-deflate,
            # which it would inflate with no bound on the output (4 KiB read -> up to 4 MiB, before its size check).
            {k: v for k, v in env.items() if k != "HTTP_SEC_WEBSOCKET_EXTENSIONS"},
            subprotocols=[subprotocol] if subprotocol else None,
            # Just above our limit, so a message a little too big still reaches the core's own Error + 1009,
            # and a bigger one is closed with 1009 by simple-websocket before it is buffered whole.
            max_message_size=transport_limit(settings),
            ping_interval=None,  # the protocol's application-level heartbeat replaces it
        )

        client_ip = env.get("REMOTE_ADDR") or None
        with self._limiter_lock:
            refused = self.limiter.acquire(client_ip)
        if refused is not None:
            self._refused("limit")
            try:
                ws.close(1013, refused[:120])
            except ConnectionClosed:
                pass
            _finish(ws)
            return _websocket_response(ws)
        try:
            return self._run(ws, env, settings, subprotocol)
        finally:
            with self._limiter_lock:
                self.limiter.release(client_ip)

    def _run(self, ws: Server, env: dict[str, Any], settings: Settings, subprotocol: str | None) -> Response:
        def close(code: int, reason: str) -> None:
            try:
                ws.close(code, reason)
            except ConnectionClosed:
                pass
            ws.event.set()  # wake receive() so the reading loop sees the close at once

        client = (env.get("REMOTE_ADDR", ""), int(env.get("REMOTE_PORT") or 0))
        headers = {k[5:].replace("_", "-").lower(): v for k, v in env.items() if k.startswith("HTTP_")}

        session = ThreadedSession(
            model=self._model, settings=settings, send=ws.send, close=close, subprotocol=subprotocol,
            info=lambda sid: SessionInfo(session_id=sid, subprotocol=subprotocol, client=client, headers=headers,
                                         user=env.get("REMOTE_USER"),
                                         extra={"path": request.path, "query_string": env.get("QUERY_STRING", "")}),
            store=self.store, metrics=self.metrics,
        )
        try:
            while not session.closed:
                data = ws.receive()
                if data is None:
                    break
                session.receive(data)
        except ConnectionClosed:
            pass
        finally:
            code = ws.close_reason if isinstance(ws.close_reason, int) and ws.close_reason != 1005 else None
            session.disconnected(code)
            _finish(ws)
        return _websocket_response(ws)


def _finish(ws: Server) -> None:
    """Close our side and make sure simple-websocket's reader thread ends (even for a dead peer)."""
    if ws.connected:
        try:
            ws.close()
        except ConnectionClosed:
            pass
    ws.thread.join(timeout=2.0)
    if ws.thread.is_alive():
        try:
            ws.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _websocket_response(ws: Server) -> Response:
    """The WSGI response after a WebSocket ended, per server (as flask-sock does it)."""

    class WebSocketResponse(Response):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if ws.mode == "gunicorn":
                raise StopIteration()
            if ws.mode == "werkzeug":
                return super().__call__(*args, **kwargs)
            return []

    return WebSocketResponse()
