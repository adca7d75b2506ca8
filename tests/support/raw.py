"""A raw WebSocket client for the protocol tests: plain `websockets`, frames encoded and decoded by hand.

Used where a test must send what our client never would (bad frames, no Hello, no Acks) or see every frame the
server sends; the Python client (lowlat_mw.client) is for everything else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import JsonCodec, ProtoCodec
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO
from support.time import seconds

__all__ = ["JSON", "LIMIT", "PROTO", "Outcome", "codec_of", "hello", "raw_connect", "read_until_closed",
           "recv_event"]

PROTO = SUBPROTOCOL_PROTO
JSON = SUBPROTOCOL_JSON
LIMIT = 64 * 1024 * 1024  # what the raw test clients accept after decompression


def raw_connect(url: str, subprotocols: Iterable[str] | None = (PROTO,), **kwargs: Any) -> Any:
    """A plain `websockets` client (no keepalive pings, no permessage-deflate, no size limit); `kwargs` override."""
    sp = list(subprotocols) if subprotocols is not None else None
    options: dict[str, Any] = {"ping_interval": None, "compression": None, "proxy": None,
                               "open_timeout": seconds(10), "close_timeout": seconds(3), "max_size": None}
    options.update(kwargs)
    return ws_connect(url, subprotocols=sp or None, **options)  # type: ignore[arg-type]


def codec_of(ws: ClientConnection) -> ProtoCodec | JsonCodec:
    """The codec for the subprotocol the server chose (none: JSON)."""
    return ProtoCodec() if ws.subprotocol == PROTO else JsonCodec()


async def recv_event(ws: ClientConnection, timeout: float = 5.0, allowed: Iterable[str] = ()) -> ev.Event:
    """The next message, decoded (bounded wait)."""
    async with asyncio.timeout(seconds(timeout)):
        frame = await ws.recv()
    return codec_of(ws).decode(frame, limit=LIMIT, allowed=tuple(allowed))


async def hello(ws: ClientConnection, compression: Iterable[str] = (), client: str = "raw-test") -> ev.Welcome:
    """Send Hello, return the Welcome."""
    await ws.send(codec_of(ws).encode(ev.Hello(client=client, compression=tuple(compression))))
    welcome = await recv_event(ws)
    assert isinstance(welcome, ev.Welcome), welcome
    return welcome


@dataclass
class Outcome:
    """What a raw client saw until the server closed: frames, events (with arrival times), the close code."""

    frames: list[bytes | str] = field(default_factory=list)
    events: list[ev.Event] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    close_code: int | None = None
    closed: bool = False
    elapsed: float = 0.0

    @property
    def errors(self) -> list[ev.Error]:
        return [e for e in self.events if isinstance(e, ev.Error)]


async def read_until_closed(ws: ClientConnection, *, timeout: float = 5.0, answer_pings: bool = False,
                            allowed: Iterable[str] = ()) -> Outcome:
    """Collect (and optionally answer Pings) until the server closes; AssertionError after `timeout`."""
    codec = codec_of(ws)
    out = Outcome()
    start = time.monotonic()
    try:
        async with asyncio.timeout(seconds(timeout)):
            while True:
                frame = await ws.recv()
                event = codec.decode(frame, limit=LIMIT, allowed=tuple(allowed))
                out.frames.append(frame)
                out.events.append(event)
                out.times.append(time.monotonic() - start)
                if answer_pings and isinstance(event, ev.Ping):
                    await ws.send(codec.encode(event.response()))
    except ConnectionClosed as exc:
        out.closed = True
        out.close_code = exc.rcvd.code if exc.rcvd is not None else None
    except TimeoutError:
        raise AssertionError(f"server did not close within {timeout} s; saw {out.events!r}") from None
    out.elapsed = time.monotonic() - start
    return out
