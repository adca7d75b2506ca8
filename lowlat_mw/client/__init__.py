"""The Python client for lowlat-mw: async and sync, with multiplexed streams, reconnect and resume.

    async with connect("ws://127.0.0.1:8000/ws") as client:
        async for chunk in client.stream("hello"):
            print(chunk, end="")

    with connect_sync("ws://127.0.0.1:8000/ws") as client:
        for chunk in client.stream("hello"):
            print(chunk, end="")

Both are drivers over the sans-IO :class:`~lowlat_mw.protocol.client.ClientProtocol`
(:mod:`~lowlat_mw.client.aio`, :mod:`~lowlat_mw.client.sync`); :class:`Backoff` is the reconnect policy.
The client layer: it may import the drivers' timer scheduler, observability, the protocol and the base.
"""

from __future__ import annotations

from ..errors import ErrorCode
from .aio import AsyncClient, Stream, StreamTimings, connect
from .backoff import Backoff
from .sync import SyncClient, connect_sync

__all__ = ["AsyncClient", "Backoff", "ErrorCode", "Stream", "StreamTimings", "SyncClient", "connect", "connect_sync"]
