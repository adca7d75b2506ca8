"""lowlat-mw: serve any AI model over a low-latency persistent WebSocket.

The core is framework-free and sans-IO where it is a state machine; adapters for Starlette/FastAPI,
Django Channels and Flask live in :mod:`lowlat_mw.adapters`. See README.md and docs/.
"""

from __future__ import annotations

from .client import AsyncClient, Stream, StreamTimings, SyncClient, connect, connect_sync
from .client.backoff import Backoff
from .errors import (
    ClientError,
    CloseCode,
    ConnectionClosed,
    ErrorCode,
    LocalProtocolError,
    LowLatError,
    ProtocolError,
    ReconnectFailed,
    RemoteProtocolError,
    ResumeFailed,
    SettingsError,
    StreamError,
)
from .model import ModelRequest, SessionInfo
from .observability.metrics import STAGES, Metrics
from .settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings

__version__ = "0.1.0"

__all__ = [
    "STAGES",
    "SUBPROTOCOL_JSON",
    "SUBPROTOCOL_PROTO",
    "AsyncClient",
    "Backoff",
    "ClientError",
    "CloseCode",
    "ConnectionClosed",
    "ErrorCode",
    "LocalProtocolError",
    "LowLatError",
    "Metrics",
    "ModelRequest",
    "ProtocolError",
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
    "__version__",
    "connect",
    "connect_sync",
]
