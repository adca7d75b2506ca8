"""lowlat-mw: serve any AI model over a low-latency persistent WebSocket.

The core is framework-free: the wire protocol as sans-IO machines (:mod:`lowlat_mw.protocol`), the
Endpoint that admits connections (:mod:`lowlat_mw.endpoint`), the drivers that run them
(:mod:`lowlat_mw.runtime`), observability, the Python client (:mod:`lowlat_mw.client`) and what runs
servers (:mod:`lowlat_mw.servers`); adapters for Starlette/FastAPI, Django Channels and Flask live in
:mod:`lowlat_mw.adapters`. See README.md, docs/architecture.md and docs/.
"""

from __future__ import annotations

from ._version import __version__
from .client import AsyncClient, Backoff, Stream, StreamTimings, SyncClient, connect, connect_sync
from .errors import (
    ClientError,
    CloseCode,
    ConnectionClosed,
    ErrorCode,
    HandshakeRefused,
    LocalProtocolError,
    LowLatError,
    NotDelivered,
    ProtocolError,
    ReconnectFailed,
    RemoteProtocolError,
    ResumeFailed,
    SettingsError,
    StreamError,
)
from .model import InputEnded, Inputs, ModelRequest, SessionInfo
from .observability.metrics import Metrics
from .observability.timing import STAGES
from .protocol.events import Delta, End, Push, ToolCall, ToolResult
from .runtime.push import PublishError, apublish, join, leave, publish
from .servers import eager as _eager
from .settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings

_eager.install()  # (on Python 3.11: the eager model start, behind lowlat_mw.runtime.eager's seam)

__all__ = [
    "STAGES",
    "SUBPROTOCOL_JSON",
    "SUBPROTOCOL_PROTO",
    "AsyncClient",
    "Backoff",
    "ClientError",
    "CloseCode",
    "ConnectionClosed",
    "Delta",
    "End",
    "ErrorCode",
    "HandshakeRefused",
    "InputEnded",
    "Inputs",
    "LocalProtocolError",
    "LowLatError",
    "Metrics",
    "ModelRequest",
    "NotDelivered",
    "ProtocolError",
    "PublishError",
    "Push",
    "ReconnectFailed",
    "RemoteProtocolError",
    "ResumeFailed",
    "SessionInfo",
    "Settings",
    "SettingsError",
    "Stream",
    "StreamError",
    "StreamTimings",
    "SyncClient",
    "ToolCall",
    "ToolResult",
    "__version__",
    "apublish",
    "connect",
    "connect_sync",
    "join",
    "leave",
    "publish",
]
