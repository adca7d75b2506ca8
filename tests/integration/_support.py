"""Helpers for the integration tests: raw protocol clients and frame recording."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from lowlat_mw.client import AsyncClient
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import JsonCodec, ProtoCodec
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO

PROTO = SUBPROTOCOL_PROTO
JSON = SUBPROTOCOL_JSON
LIMIT = 64 * 1024 * 1024  # what the raw test clients accept after decompression


def raw_connect(url: str, subprotocols: Iterable[str] | None = (PROTO,), **kwargs: Any) -> Any:
    """A plain `websockets` client connection (no keepalive pings, no permessage-deflate)."""
    sp = list(subprotocols) if subprotocols is not None else None
    return ws_connect(url, subprotocols=sp or None, ping_interval=None, compression=None, proxy=None,
                      open_timeout=5, close_timeout=2, max_size=None, **kwargs)


def codec_of(ws: ClientConnection) -> ProtoCodec | JsonCodec:
    """The codec for the subprotocol the server chose (none: JSON)."""
    return ProtoCodec() if ws.subprotocol == PROTO else JsonCodec()


async def hello(ws: ClientConnection, compression: Iterable[str] = ()) -> ev.Welcome:
    """Send Hello and return the server's Welcome."""
    codec = codec_of(ws)
    await ws.send(codec.encode(ev.Hello(client="raw-test", compression=tuple(compression))))
    async with asyncio.timeout(5):
        frame = await ws.recv()
    welcome = codec.decode(frame, limit=LIMIT, allowed=())
    assert isinstance(welcome, ev.Welcome), welcome
    return welcome


@dataclass
class Outcome:
    """What a raw client saw after sending something: frames, events, and the close code if closed."""

    frames: list[bytes | str] = field(default_factory=list)
    events: list[ev.Event] = field(default_factory=list)
    close_code: int | None = None
    closed: bool = False
    elapsed: float = 0.0

    @property
    def errors(self) -> list[ev.Error]:
        return [e for e in self.events if isinstance(e, ev.Error)]


async def read_until_closed(
    ws: ClientConnection, *, allowed: Iterable[str] = (), timeout: float = 5.0
) -> Outcome:
    """Collect every frame until the server closes the connection (bounded by `timeout`)."""
    codec = codec_of(ws)
    out = Outcome()
    start = time.monotonic()
    async with asyncio.timeout(timeout):
        try:
            while True:
                frame = await ws.recv()
                out.frames.append(frame)
                out.events.append(codec.decode(frame, limit=LIMIT, allowed=tuple(allowed)))
        except ConnectionClosed as exc:
            out.closed = True
            out.close_code = exc.rcvd.code if exc.rcvd is not None else None
    out.elapsed = time.monotonic() - start
    return out


async def read_stream(ws: ClientConnection, stream_id: int, *, allowed: Iterable[str] = (),
                      timeout: float = 5.0) -> tuple[list[bytes | str], list[ev.Event]]:
    """Read frames until stream `stream_id` ends (End or Error); return (raw frames, events)."""
    codec = codec_of(ws)
    frames: list[bytes | str] = []
    events: list[ev.Event] = []
    async with asyncio.timeout(timeout):
        while True:
            frame = await ws.recv()
            event = codec.decode(frame, limit=LIMIT, allowed=tuple(allowed))
            if isinstance(event, ev.Ping):
                await ws.send(codec.encode(event.response()))
                continue
            frames.append(frame)
            events.append(event)
            if isinstance(event, ev.End | ev.Error) and event.stream_id == stream_id:
                return frames, events


async def raw_request(ws: ClientConnection, text: str, stream_id: int, *, allowed: Iterable[str] = ()) -> str:
    """Send a Request on a raw connection and return the streamed text (asserting a clean End)."""
    codec = codec_of(ws)
    await ws.send(codec.encode(ev.Request(stream_id=stream_id, text=text)))
    _, events = await read_stream(ws, stream_id, allowed=allowed)
    assert isinstance(events[-1], ev.End), events[-1]
    return "".join(e.text or "" for e in events if isinstance(e, ev.Delta) and e.stream_id == stream_id)


class RecordingCodec:
    """Wraps a client's codec and records every frame it decodes (i.e. every frame received)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.binary = inner.binary
        self.received: list[bytes | str] = []
        self.sent: list[bytes | str] = []

    def encode(self, event: ev.Event, compressor: Any = None) -> bytes | str:
        data = self.inner.encode(event, compressor)
        self.sent.append(data)
        return data

    def encode_frame(self, event: ev.Event, compressor: Any = None) -> tuple[bytes | str, int, int]:
        frame = self.inner.encode_frame(event, compressor)
        self.sent.append(frame[0])
        return frame  # type: ignore[no-any-return]

    def decode(self, frame: bytes | str, *, limit: int, allowed: Iterable[str] | None = ()) -> ev.Event:
        self.received.append(frame)
        return self.inner.decode(frame, limit=limit, allowed=allowed)

    def received_events(self) -> list[tuple[bytes | str, ev.Event]]:
        """(frame, event) pairs of everything received (decoded again, without limits)."""
        return [(f, self.inner.decode(f, limit=LIMIT, allowed=None)) for f in self.received]


def record_frames(client: AsyncClient) -> RecordingCodec:
    """Make `client` record the frames it receives and sends; call before it connects."""
    rec = RecordingCodec(client.protocol.codec)
    client.protocol.codec = rec  # type: ignore[assignment]
    return rec


def json_frame(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


async def wait_for(predicate: Any, timeout: float = 5.0, interval: float = 0.01) -> float:
    """Poll `predicate()` until true; return the seconds it took (AssertionError on timeout)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)
    return time.monotonic() - start
