"""Helpers shared by the conformance tests: raw protocol clients and measurements."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from lowlat_mw.client import connect
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.wire import JsonCodec, ProtoCodec
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO

PROTO = SUBPROTOCOL_PROTO
JSON = SUBPROTOCOL_JSON
LIMIT = 64 * 1024 * 1024  # what the raw test clients accept after decompression
MODES = ("proto", "json")

# Settings of the "short timers" servers (as LOWLAT_* variables) and the same as numbers.
HEARTBEAT_INTERVAL, HEARTBEAT_MAX_INTERVAL, HEARTBEAT_TIMEOUT = 0.3, 0.6, 0.3
IDLE_TIMEOUT, HANDSHAKE_TIMEOUT = 1.0, 1.0
SHORT_TIMERS = {
    "LOWLAT_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL),
    "LOWLAT_HEARTBEAT_MAX_INTERVAL": str(HEARTBEAT_MAX_INTERVAL),
    "LOWLAT_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
    "LOWLAT_IDLE_TIMEOUT": str(IDLE_TIMEOUT),
    "LOWLAT_HANDSHAKE_TIMEOUT": str(HANDSHAKE_TIMEOUT),
}

# Filled by the tests, printed by conftest.pytest_terminal_summary.
STARTUP_TIMES: dict[str, list[float]] = {}
MEASUREMENTS: dict[str, str] = {}


class KnownBug(AssertionError):
    """Raised where a test observes the specific symptom of a known, described bug.

    Tests mark such cases ``xfail(strict=True, raises=KnownBug)``: any other failure still fails.
    """


def measure(name: str, value: str) -> None:
    """Record a measured number for the end-of-run summary (and print it for -s runs)."""
    MEASUREMENTS[name] = value
    print(f"{name}: {value}")


_MAXIMA: dict[str, float] = {}


def measure_max(name: str, seconds: float) -> None:
    """Record the largest of several timings under one name."""
    _MAXIMA[name] = max(seconds, _MAXIMA.get(name, 0.0))
    MEASUREMENTS[name] = f"{_MAXIMA[name] * 1000:.0f} ms"


def raw_connect(url: str, subprotocols: Iterable[str] | None = (PROTO,), **kwargs: Any) -> Any:
    """A plain `websockets` client (no keepalive pings, no permessage-deflate, no size limit)."""
    sp = list(subprotocols) if subprotocols is not None else None
    options: dict[str, Any] = {"ping_interval": None, "compression": None, "proxy": None, "open_timeout": 10,
                               "close_timeout": 3, "max_size": None}
    options.update(kwargs)
    return ws_connect(url, subprotocols=sp or None, **options)  # type: ignore[arg-type]


def codec_of(ws: ClientConnection) -> ProtoCodec | JsonCodec:
    """The codec for the subprotocol the server chose (none: JSON)."""
    return ProtoCodec() if ws.subprotocol == PROTO else JsonCodec()


async def recv_event(ws: ClientConnection, timeout: float = 5.0, allowed: Iterable[str] = ()) -> ev.Event:
    """The next message, decoded (bounded wait)."""
    async with asyncio.timeout(timeout):
        frame = await ws.recv()
    return codec_of(ws).decode(frame, limit=LIMIT, allowed=tuple(allowed))


async def hello(ws: ClientConnection, compression: Iterable[str] = ()) -> ev.Welcome:
    """Send Hello, return the Welcome."""
    await ws.send(codec_of(ws).encode(ev.Hello(client="conformance-raw", compression=tuple(compression))))
    welcome = await recv_event(ws)
    assert isinstance(welcome, ev.Welcome), welcome
    return welcome


@dataclass
class Outcome:
    """What a raw client saw until the server closed: events (with arrival times), the close code."""

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
    """Collect (and optionally answer Pings) until the server closes; fails after `timeout`."""
    codec = codec_of(ws)
    out = Outcome()
    start = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            while True:
                frame = await ws.recv()
                event = codec.decode(frame, limit=LIMIT, allowed=tuple(allowed))
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


async def assert_streams(url: str, mode: str = "proto", n: int = 3) -> None:
    """A well-behaved client can still stream a reply from the server at `url`."""
    async with asyncio.timeout(15):
        async with connect(url, mode=mode) as client:
            stream = client.stream("still alive?", model="agen", params={"n": n})
            chunks = [c async for c in stream]
            assert chunks == [f"a{i};" for i in range(n)]
            assert stream.end is not None and stream.end.last_seq == n


async def wait_for_file(path: Path, timeout: float) -> float:
    """Seconds until `path` exists; AssertionError after `timeout`."""
    start = time.monotonic()
    while not path.exists():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{path.name} did not appear within {timeout} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start
