"""A raw ASGI application serving the lowlat-mw protocol on WebSocket scopes.

ASGI is a specification, not a framework: this module imports none. The Starlette/FastAPI
middleware mounts it at a path; any ASGI server or router can mount it directly.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .aio import AsyncServerSession
from .connection import negotiate_subprotocol
from .errors import CloseCode
from .model import ModelFn, SessionInfo, load_callable
from .security import origin_allowed
from .settings import Settings

__all__ = ["LowLatASGI", "session_info_from_scope"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("lowlat_mw")


def session_info_from_scope(scope: Scope, session_id: str, subprotocol: str | None) -> SessionInfo:
    """Connection facts for the model from an ASGI websocket scope."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    client = scope.get("client")
    return SessionInfo(
        session_id=session_id,
        subprotocol=subprotocol,
        client=tuple(client) if client else None,  # type: ignore[arg-type]
        headers=headers,
        user=scope.get("user"),
        extra={"path": scope.get("path", ""), "query_string": scope.get("query_string", b"").decode("latin-1")},
    )


class LowLatASGI:
    """ASGI app: accepts the WebSocket, negotiates the subprotocol and runs a session."""

    def __init__(self, model: ModelFn | str, *, settings: Settings | None = None, **options: Any) -> None:
        self.model = load_callable(model)
        self.settings = settings.replace(**options) if settings is not None else Settings.load(options)
        self.executor = ThreadPoolExecutor(
            max_workers=self.settings.model_threads, thread_name_prefix="lowlat-model"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await send({"type": "http.response.start", "status": 426,
                        "headers": [(b"content-type", b"text/plain"), (b"upgrade", b"websocket")]})
            await send({"type": "http.response.body", "body": b"WebSocket endpoint (lowlat-mw)\n"})
            return
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        ok, subprotocol = negotiate_subprotocol(scope.get("subprotocols") or (), self.settings)
        headers = dict(scope.get("headers") or ())
        origin = headers.get(b"origin")
        host = headers.get(b"host")
        if ok and not origin_allowed(
            origin.decode("latin-1") if origin is not None else None,
            host.decode("latin-1") if host is not None else None,
            self.settings.allowed_origins,
        ):
            log.warning("refused cross-origin WebSocket from %s", origin)
            ok = False
        if not ok:
            # Refused before accept: the server answers the handshake with HTTP 403.
            await send({"type": "websocket.close", "code": CloseCode.POLICY_VIOLATION})
            return
        await send({"type": "websocket.accept", "subprotocol": subprotocol})

        async def send_frame(data: bytes | str) -> None:
            if isinstance(data, bytes):
                await send({"type": "websocket.send", "bytes": data})
            else:
                await send({"type": "websocket.send", "text": data})

        async def close(code: int, reason: str) -> None:
            await send({"type": "websocket.close", "code": code, "reason": reason})

        session = AsyncServerSession(
            model=self.model, settings=self.settings, send=send_frame, close=close,
            subprotocol=subprotocol, executor=self.executor,
        )
        session.info = session_info_from_scope(scope, session.conn.session_id, subprotocol)
        session.start()
        try:
            while True:
                message = await receive()
                kind = message["type"]
                if kind == "websocket.receive":
                    data = message.get("bytes")
                    await session.receive(data if data is not None else message.get("text") or "")
                elif kind == "websocket.disconnect":
                    break
        finally:
            await session.disconnected()
