"""Flask adapter: an extension serving the lowlat-mw protocol on a WebSocket route.

    lowlat = LowLat(app, model=generate)            # or LowLat(model=...) + lowlat.init_app(app)
    lowlat = LowLat(blueprint, model=generate)      # or on a Blueprint: its routes under the blueprint's url_prefix
    app.config["LOWLAT_MW"] = {"idle_timeout": 60}  # or app.config["LOWLAT_IDLE_TIMEOUT"] = 60

Built on flask-sock's engine, simple-websocket (``simple_websocket.Server``), on any server
flask-sock supports (werkzeug's dev server with threads, gunicorn's gthread worker). We open the
``Server`` ourselves instead of using ``Sock.route`` because that builds it from one app-wide
``SOCK_SERVER_OPTIONS`` before any of our code runs: the core's admission must refuse a cross-origin
or wrong-subprotocol handshake with HTTP 403 first, and this route has limits of its own.
The connection's thread only reads; protocol, models and timers run in the core's thread driver.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request, session
from simple_websocket import ConnectionClosed, Server
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage, CloseConnection, TextMessage
from wsproto.frame_protocol import CloseReason

from lowlat_mw import static_files as static
from lowlat_mw.asyncapi import asyncapi_json
from lowlat_mw.endpoint import Endpoint, Refuse, settings_from_config
from lowlat_mw.model import ModelSpec
from lowlat_mw.runtime.shared import open_endpoint
from lowlat_mw.runtime.threads import SharedSocket, ThreadDriver, facts_from_environ
from lowlat_mw.servers.serving import too_big_message, transport_limit

__all__ = ["LowLat"]

_MAY_CLOSE = frozenset({ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING})  # wsproto sends a close only then
_PATHS = ("path", "metrics_path", "asyncapi_path", "health_path", "client_path")  # settings that are URL paths


class LowLat:
    """The Flask extension: ``LowLat(app, model=...)`` or ``init_app(app)`` later."""

    def __init__(self, app: Flask | Blueprint | None = None, *, model: ModelSpec | None = None, registry: Any = None,
                 **options: Any) -> None:
        """`registry`: prometheus_client CollectorRegistry for the metrics (default: the global one)."""
        self.model = model
        self.registry = registry
        self.options = options
        self.endpoint: Endpoint | None = None
        self._public: Any = None  # the settings with the paths as served (under a blueprint's url_prefix)
        if app is not None:
            self.init_app(app)

    @property
    def settings(self) -> Any:
        """The settings in force (None before init_app)."""
        return self.endpoint.settings if self.endpoint is not None else None

    def init_app(self, app: Flask | Blueprint, *, model: ModelSpec | None = None, **options: Any) -> None:
        """Validate the settings now (a bad key fails at startup) and register the route. On a Blueprint (as
        flask-sock's ``route(bp=...)``) that happens when the blueprint is registered on an app: its routes go under
        the blueprint's ``url_prefix``, its settings come from that app's config."""
        if model is not None:
            self.model = model
        self.options.update(options)
        if self.model is None:
            raise TypeError("LowLat needs model=<callable or 'module:callable'>")
        if isinstance(app, Blueprint):
            app.record_once(lambda state: self._mount(state.app, state.add_url_rule, state.url_prefix or ""))
        elif isinstance(app, Flask):
            self._mount(app, app.add_url_rule, "")
        else:
            raise TypeError(f"LowLat takes a Flask app or Blueprint, got {type(app).__name__}")

    def _mount(self, app: Flask, add_url_rule: Any, prefix: str) -> None:
        settings = settings_from_config(app.config, self.options, where="app.config")
        self.endpoint = open_endpoint(self.model, settings, registry=self.registry)
        self._public = settings.replace(**{name: prefix.rstrip("/") + value for name in _PATHS
                                           if (value := getattr(settings, name))}) if prefix else settings
        app.extensions["lowlat_mw"] = self
        add_url_rule(settings.path, "lowlat_mw", self._view, websocket=True)
        if settings.metrics_path:
            add_url_rule(settings.metrics_path, "lowlat_mw_metrics", self._metrics_view)
        if settings.asyncapi_path:
            add_url_rule(settings.asyncapi_path, "lowlat_mw_asyncapi", self._asyncapi_view)
        if settings.health_path:
            add_url_rule(settings.health_path, "lowlat_mw_health", self._health_view)
        if settings.client_path:  # the browser client and demo page (docs/browser.md)
            client = settings.client_path.rstrip("/")
            add_url_rule(client + "/", "lowlat_mw_client_demo", self._client_view, methods=["GET", "HEAD"])
            add_url_rule(client + "/<path:name>", "lowlat_mw_client", self._client_view, methods=["GET", "HEAD"])

    def _client_view(self, name: str = "") -> Response:
        found = static.lookup(f"{self._public.client_path.rstrip('/')}/{name}", self._public)  # (URLs as served)
        # werkzeug leaves the body out of HEAD responses itself
        answer = static.respond(found, "GET", request.headers.get("If-None-Match"))
        return Response(answer.body, status=answer.status, headers=list(answer.headers))

    def _health_view(self) -> Response:
        assert self.endpoint is not None
        status, report = self.endpoint.health()
        return Response(json.dumps(report), status=status, mimetype="application/json",
                        headers={"Cache-Control": "no-store"})

    def _asyncapi_view(self) -> Response:
        scheme = "wss" if request.scheme == "https" else "ws"
        body = asyncapi_json(self._public, f"{scheme}://{request.host}")
        return Response(body, mimetype="application/json", headers={"Access-Control-Allow-Origin": "*"})

    def _metrics_view(self) -> Response:
        metrics = self.endpoint.metrics if self.endpoint is not None else None
        if metrics is None:
            return Response("metrics are off (setting metrics=False)\n", status=404, mimetype="text/plain")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _view(self) -> Response:
        endpoint = self.endpoint
        assert endpoint is not None
        env = request.environ
        if env.get("HTTP_UPGRADE", "").lower() != "websocket":
            return Response("WebSocket endpoint (lowlat-mw)\n", status=426, headers={"Upgrade": "websocket"})
        offered = [p.strip() for p in env.get("HTTP_SEC_WEBSOCKET_PROTOCOL", "").split(",") if p.strip()]
        address = env.get("REMOTE_ADDR") or None
        answer = endpoint.admit(offered, env.get("HTTP_ORIGIN"), env.get("HTTP_HOST"), address)
        if type(answer) is Refuse and answer.status is not None:
            return Response(f"{answer.message}\n", status=answer.status, mimetype="text/plain")
        try:
            ws = self._server(env, answer.subprotocol)
        except BaseException:
            if type(answer) is not Refuse:
                endpoint.release(address)
            raise
        if type(answer) is Refuse:
            ws.close(answer.close_code, answer.message)
            _finish(ws, endpoint.settings.close_timeout)
            return _websocket_response(ws)
        return self._run(ws, endpoint, env, answer.subprotocol, address)

    def _server(self, env: dict[str, Any], subprotocol: str | None) -> _Server:
        """simple-websocket's server end of the handshake, with this route's limits."""
        return _Server(
            # Without the client's Sec-WebSocket-Extensions, simple-websocket does not accept permessage-deflate,
            # which it would inflate with no bound on the output (4 KiB read -> up to 4 MiB, before its size check).
            {k: v for k, v in env.items() if k != "HTTP_SEC_WEBSOCKET_EXTENSIONS"},
            subprotocols=[subprotocol] if subprotocol else None,
            # Just above our limit, so a message a little too big still reaches the core's own Error + 1009,
            # and a bigger one is closed with 1009 by simple-websocket before it is buffered whole.
            max_message_size=transport_limit(self.settings),
            ping_interval=None,  # the protocol's application-level heartbeat replaces it
        )

    def _run(self, ws: _Server, endpoint: Endpoint, env: dict[str, Any], subprotocol: str | None,
             address: str | None) -> Response:
        def close(code: int, reason: str) -> None:
            ws.lowlat_closing = True
            ws.close(code, reason)
            ws.event.set()  # wake receive() so the reading loop sees the close at once

        try:
            facts = facts_from_environ(env, request.path)
            facts["extra"]["flask_session"] = dict(session)  # (a copy: the request's session ends with the handshake)
            user = _login_user()  # (the app's user loader may fail: the slot is released, the socket closed)
            if user is not None:
                facts["user"] = user
            driver = ThreadDriver(endpoint, send=ws.send, close=close, subprotocol=subprotocol, address=address,
                                  sock=ws.sock, **facts)
        except BaseException:
            endpoint.release(address)
            close(1011, "internal error")
            _finish(ws, endpoint.settings.close_timeout)
            raise
        try:
            while not driver.closed:
                data = ws.receive()
                if data is None:
                    break
                driver.receive(data)
        except ConnectionClosed:
            pass
        finally:
            code = ws.close_reason if isinstance(ws.close_reason, int) and ws.close_reason != 1005 else None
            try:  # (first: the connection counts against the limits until its socket is closed)
                _finish(ws, endpoint.settings.close_timeout)
            finally:
                driver.disconnected(code)
        return _websocket_response(ws)


def _login_user() -> Any:
    """Flask-Login's ``current_user`` of the handshake request (its user object, anonymous included), where the
    app uses Flask-Login; else None (then ``REMOTE_USER``, as a WSGI server sets it, is the user)."""
    if getattr(current_app, "login_manager", None) is None:
        return None
    from flask_login import current_user

    return current_user._get_current_object()  # type: ignore[attr-defined]


class _Server(Server):
    """simple-websocket's server end, sending ``Error{0, message_too_big}`` before the 1009 close its reader
    thread answers a message over ``max_message_size`` with (docs/protocol.md 10.3); lowlat-mw's own
    closes (`lowlat_closing`) go out as they are.

    Frames reach the wire in the order wsproto made them, and none after the close frame: the driver's writes (send
    pool), simple-websocket's reader thread (Pongs, the answer to the peer's close) and the connection's thread
    (:func:`_finish`) all write at once. Each wsproto event is made and written under the lock of the connection's
    :class:`~lowlat_mw.runtime.threads.SharedSocket` (``sock``), which the driver's direct writes take too;
    simple-websocket wrote a frame after letting go of it, so frames made by two threads could go out in the other
    order: a Delta after the close frame. Its close is idempotent: a close once one went out (or came in and was
    answered) sends nothing; simple-websocket's own ``close`` raised wsproto's ``LocalProtocolError`` for the second
    one, or ``OSError`` once the reader thread had closed the socket.
    """

    lowlat_closing = False
    sock: SharedSocket

    def handshake(self) -> None:
        super().handshake()  # (before the reader thread starts: no message can be refused before the hook)
        wire = self.sock = SharedSocket(self.sock)  # (the 101 response went out above, before anything else)
        send, write = self.ws.send, wire.write_locked

        def send_once(event: Any) -> bytes:
            """Make the frame of `event` and write it, in one hold of the socket's lock (wsproto also checks its state
            and moves it in one send: one thread at a time); the caller's write then has nothing left to write."""
            with wire.lock:
                if isinstance(event, CloseConnection):
                    if self.ws.state not in _MAY_CLOSE:
                        return b""  # a close went out already: the one owner of the close is whoever sent it
                    data = b""
                    if event.code == 1009 and not self.lowlat_closing:
                        message = too_big_message(self.subprotocol)
                        data = send(TextMessage(data=message) if isinstance(message, str)
                                    else BytesMessage(data=message))
                    write(data + send(event), last=True)
                    return b""
                write(send(event))
                return b""

        self.ws.send = send_once  # type: ignore[method-assign]

    def close(self, reason: int | None = None, message: str | None = None) -> None:
        """Close with `reason` (default 1000), once, from any thread: later calls do nothing."""
        try:
            self.ws.send(CloseConnection(reason or CloseReason.NORMAL_CLOSURE, message))  # (written there)
        except OSError:  # the peer is gone, or the socket was shut down or closed meanwhile
            pass
        self.connected = False


def _finish(ws: _Server, close_timeout: float) -> None:
    """Close our side (unless it is closed) and make sure simple-websocket's reader thread ends: a peer that does not
    answer the close within the connection's `close_timeout` has its socket shut down (which ends the read)."""
    ws.close()
    ws.thread.join(timeout=close_timeout)
    if ws.thread.is_alive():
        ws.sock.shutdown(socket.SHUT_RDWR)


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
