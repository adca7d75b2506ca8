"""Helpers for the integration tests: raw protocol clients and frame recording."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

from support.raw import LIMIT, codec_of
from websockets.asyncio.client import ClientConnection

from lowlat_mw.client import AsyncClient
from lowlat_mw.protocol import events as ev


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

    def decode(self, frame: bytes | str, *, limit: int, allowed: Iterable[str] | None = (),
               params: Any = None) -> ev.Event:
        self.received.append(frame)
        return self.inner.decode(frame, limit=limit, allowed=allowed, params=params)

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
