"""Python client for lowlat-mw: async and sync, with multiplexed streams and reconnect.

    async with connect("ws://127.0.0.1:8000/ws") as client:
        async for chunk in client.stream("hello"):
            print(chunk, end="")

    with connect_sync("ws://127.0.0.1:8000/ws") as client:
        for chunk in client.stream("hello"):
            print(chunk, end="")

The client speaks Protobuf binary frames by default (``mode="json"`` for text frames), answers
the server's Pings, and when the connection has dropped (or was closed with a code that says
"reconnect") it reconnects with exponential backoff and full jitter before the next request.
Streams cut by a drop raise :class:`ConnectionClosed`; server errors raise :class:`StreamError`.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import ssl as ssl_module
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from ..drivers.timers import AsyncScheduler
from ..errors import (
    ClientError,
    CloseCode,
    ConnectionClosed,
    ErrorCode,
    ReconnectFailed,
    RemoteProtocolError,
    ResumeFailed,
    StreamError,
    close_code_reconnects,
)
from ..observability.metrics import STAGES
from ..protocol import events as ev
from ..protocol.codec import codec_for
from ..protocol.compression import CompressionSelector, available_codecs
from ..protocol.heartbeat import Heartbeat, HeartbeatAction
from ..settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO
from .backoff import Backoff

__all__ = ["AsyncClient", "Stream", "StreamTimings", "SyncClient", "connect", "connect_sync"]

_CLIENT_NAME = "lowlat-mw-python/0.1"


@dataclass(frozen=True, slots=True)
class StreamTimings:
    """Where a stream's time went, as seen by both ends (milliseconds).

    Client times run from sending the Request to the first Delta's / the End's arrival. Server
    times come from End.timings_ms: ``server_total_ms`` runs from the Request frame's arrival to
    the End, and ``server_stages_ms`` splits it into the stages of :data:`lowlat_mw.observability.metrics.STAGES`
    (they add up to it). ``network_ms`` is what the client saw beyond the server's total: the
    round trip plus both sides' framing.
    """

    first_delta_ms: float | None
    total_ms: float | None
    server_first_delta_ms: float | None
    server_total_ms: float | None
    server_stages_ms: Mapping[str, float]
    model_first_chunk_ms: float | None

    @property
    def network_ms(self) -> float | None:
        """Client total minus server total."""
        if self.total_ms is None or self.server_total_ms is None:
            return None
        return self.total_ms - self.server_total_ms


@dataclass(slots=True)
class _Closed:
    code: int | None
    reason: str


class Stream:
    """One streamed reply: an async iterator of chunks (str or bytes), plus its metadata.

    After iteration, `end` holds the server's End (timings_ms, usage) and
    `time_to_first_delta` the client-side latency in seconds.
    """

    def __init__(self, client: AsyncClient, request: ev.Request) -> None:
        self._client = client
        self.request = request
        self.stream_id = request.stream_id
        self.queue: asyncio.Queue[ev.Event | _Closed | BaseException] = asyncio.Queue()
        self.end: ev.End | None = None
        self.started_at = 0.0
        self.first_delta_at: float | None = None
        self.finished_at: float | None = None
        self.last_seq = 0       # seq of the last Delta handed to the caller
        self.received_seq = 0   # seq of the last Delta received (queued); resume asks for what follows
        self.acked_seq = 0
        self._unacked = 0
        self._resent = False
        self._resends = 0
        self._done = False
        self._sent = False

    @property
    def time_to_first_delta(self) -> float | None:
        """Seconds from sending the Request to the first Delta."""
        return None if self.first_delta_at is None else self.first_delta_at - self.started_at

    @property
    def total_time(self) -> float | None:
        """Seconds from sending the Request to its End."""
        return None if self.finished_at is None else self.finished_at - self.started_at

    @property
    def timings(self) -> StreamTimings:
        """Client-side and server-side timings of this stream (server ones once End arrived)."""
        server = dict(self.end.timings_ms) if self.end is not None else {}

        def ms(seconds: float | None) -> float | None:
            return None if seconds is None else seconds * 1000.0

        return StreamTimings(
            first_delta_ms=ms(self.time_to_first_delta), total_ms=ms(self.total_time),
            server_first_delta_ms=server.get("first_delta"), server_total_ms=server.get("total"),
            server_stages_ms={k: server[k] for k in STAGES if k in server},
            model_first_chunk_ms=server.get("model_first_chunk"),
        )

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> str | bytes:
        if self._done:
            raise StopAsyncIteration
        if not self._sent:
            await self._client._start(self)
        while True:
            item = await self.queue.get()
            if isinstance(item, ev.Delta):
                self.last_seq = item.seq
                await self._client._consumed(self, item)
                return item.chunk
            if (isinstance(item, ev.Error) and item.code is ErrorCode.RESUME_FAILED and item.retryable
                    and self.received_seq == 0 and self._resends < max(1, self._client.backoff.retries)):
                # The server never saw this request (lost in the drop): send it again, on the open
                # connection or the next one. The resend can be lost in another drop too; that
                # resume reports the stream unknown again.
                self._resends += 1
                await self._client._start(self)
                continue
            if (isinstance(item, ev.Error) and item.code is ErrorCode.DRAINING and item.retryable
                    and self.received_seq == 0 and not self._resent):
                # The server is shutting down: send the request again on the next connection.
                self._resent = True
                await self._client._wait_drained()
                await self._client._start(self)
                continue
            break
        self._done = True
        self._client._streams.pop(self.stream_id, None)
        if self.finished_at is None:
            self.finished_at = time.perf_counter()
        if isinstance(item, ev.End):
            self.end = item
            await self._client._consumed(self, item)
            raise StopAsyncIteration
        if isinstance(item, ev.Error):
            await self._client._consumed(self, item)
            cls = ResumeFailed if item.code is ErrorCode.RESUME_FAILED else StreamError
            raise cls(item.code, item.message, stream_id=item.stream_id, retryable=item.retryable)
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, _Closed)
        raise ConnectionClosed(item.code, item.reason or "connection lost during the stream")

    async def cancel(self) -> None:
        """Ask the server to stop this stream; iteration then ends quietly."""
        if self._sent and not self._done:
            await self._client._send(ev.Cancel(stream_id=self.stream_id))

    async def aclose(self) -> None:
        """Stop consuming: cancels the stream on the server if it is still running."""
        if self._sent and not self._done:
            self._done = True
            self._client._streams.pop(self.stream_id, None)
            try:
                await self._client._send(ev.Cancel(stream_id=self.stream_id))
            except ClientError:
                pass

    async def text(self) -> str:
        """Consume the whole stream and return the text."""
        parts = [c if isinstance(c, str) else c.decode() async for c in self]
        return "".join(parts)


class _ClientHeartbeat:
    """Client side of the heartbeat: the core's Heartbeat, driven by the loop's one scheduler.

    The client pings the server when the connection is quiet and closes it with 4001 when the
    server stops answering, so a dead server is noticed even without server Pings.
    """

    def __init__(self, client: AsyncClient, ws: ClientConnection, heartbeat: Heartbeat) -> None:
        self.client, self.ws, self.heartbeat = client, ws, heartbeat
        self.scheduler = AsyncScheduler.current()
        self.stopped = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.scheduler.schedule(self, heartbeat.deadline())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def received(self, event: ev.Event) -> None:
        now = time.monotonic()
        self.heartbeat.on_receive(now, application=not isinstance(event, ev.Ping | ev.Pong))
        if isinstance(event, ev.Pong):
            self.heartbeat.on_pong(event.id, now)

    def stop(self) -> None:
        self.stopped = True
        self.scheduler.cancel(self)

    def on_timer(self, now: float) -> float:
        if self.stopped:
            return math.inf
        action = self.heartbeat.poll(now)
        if action is HeartbeatAction.SEND_PING:
            self._spawn(self._send(self.client.codec.encode(ev.Ping(id=self.heartbeat.ping_id))))
        elif action is HeartbeatAction.PEER_DEAD:
            self.stopped = True
            self._spawn(self.ws.close(CloseCode.HEARTBEAT_TIMEOUT, "server did not answer"))
            return math.inf
        return self.heartbeat.deadline()

    async def _send(self, frame: bytes | str) -> None:
        try:
            await self.ws.send(frame)
        except websockets.exceptions.ConnectionClosed:
            pass


class AsyncClient:
    """A lowlat-mw connection with many concurrent streams; reconnects between requests."""

    def __init__(
        self,
        url: str,
        *,
        mode: str = "proto",
        compression: Sequence[str] | None = None,
        backoff: Backoff | None = None,
        open_timeout: float = 10.0,
        max_frame_size: int = 16 * 1024 * 1024,
        max_decompressed_size: int = 16 * 1024 * 1024,
        headers: Mapping[str, str] | None = None,
        answer_pings: bool = True,
        heartbeat_timeout: float = 10.0,
        flow_window: int = 1024 * 1024,
        resume: bool = True,
        max_pending: int = 100,
        auth: str = "",
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        if mode not in ("proto", "json"):
            raise ValueError("mode must be 'proto' or 'json'")
        if ssl is not None and not url.startswith("wss://"):
            raise ValueError("ssl= needs a wss:// URL")
        self.url = url
        self.ssl = ssl  # TLS context for wss:// (None: the system trust store)
        self.mode = mode
        self.subprotocol = SUBPROTOCOL_PROTO if mode == "proto" else SUBPROTOCOL_JSON
        self.codec = codec_for(self.subprotocol)
        self.offered = tuple(available_codecs() if compression is None else compression) if mode == "proto" else ()
        self.backoff = backoff or Backoff()
        self.open_timeout = open_timeout
        self.max_frame_size = max_frame_size
        self.max_decompressed_size = max_decompressed_size
        self.headers = dict(headers or {})
        self.answer_pings = answer_pings
        self.heartbeat_timeout = heartbeat_timeout
        self.flow_window = flow_window
        self.resume_enabled = resume
        self.max_pending = max_pending
        self.auth = auth
        self.resumes = 0  # how many times a dropped session was resumed
        self._resuming: asyncio.Task[None] | None = None
        self._pending = 0
        self._heartbeat: _ClientHeartbeat | None = None
        self.welcome: ev.Welcome | None = None
        self.compressor: CompressionSelector | None = None
        self.connections = 0  # how many times a connection was opened
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._streams: dict[int, Stream] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._closed_final: ConnectionClosed | None = None
        self._user_closed = False
        self.last_close: _Closed | None = None
        self.last_error: ev.Error | None = None
        self.goaway: ev.GoAway | None = None
        self._pings: dict[int, asyncio.Future[float]] = {}
        self._ping_ids = itertools.count(1 << 31)  # apart from the heartbeat's own ids

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> AsyncClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def rtt(self) -> float | None:
        """Last measured round-trip time to the server in seconds (from the client's Pings)."""
        return self._heartbeat.heartbeat.rtt if self._heartbeat is not None else None

    async def ping(self, timeout: float = 5.0) -> float:
        """Send a Ping now and return the round-trip time to its Pong in seconds."""
        if not self.connected:
            await self.open()
        ping_id = next(self._ping_ids) & 0xFFFFFFFF
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pings[ping_id] = waiter
        try:
            sent = time.perf_counter()
            await self._send(ev.Ping(id=ping_id))
            async with asyncio.timeout(timeout):
                return await waiter - sent
        finally:
            self._pings.pop(ping_id, None)

    @property
    def connected(self) -> bool:
        """True while a WebSocket is open and welcomed."""
        return self._ws is not None and self._reader is not None and not self._reader.done()

    async def open(self) -> None:
        """Connect (with backoff retries) unless already connected; waits for a resume in progress.

        While streams are open on a session that can be resumed, reconnecting resumes it: a fresh
        session here would orphan those streams (their next resume would find them unknown).
        """
        while True:
            resuming = self._resuming
            if resuming is not None and not resuming.done():
                if self._pending >= self.max_pending:
                    raise ClientError(f"more than {self.max_pending} requests queued while reconnecting")
                self._pending += 1
                try:
                    await asyncio.shield(resuming)
                finally:
                    self._pending -= 1
            async with self._lock:
                if self.connected:
                    return
                if self._resuming is not None and not self._resuming.done():
                    continue  # another drop started another resume: wait for that one
                if self._user_closed:
                    raise ClientError("client is closed")
                if self._closed_final is not None:
                    raise self._closed_final
                resume = bool(self.resume_enabled and self._streams and self.welcome is not None
                              and self.welcome.resume_token)
                await self._connect_with_retries(resume=resume)
                return

    async def close(self) -> None:
        """Close the connection normally; running streams end with ConnectionClosed."""
        self._user_closed = True
        if self._resuming is not None and not self._resuming.done():
            self._resuming.cancel()
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()
        if self._reader is not None:
            try:
                await self._reader
            except Exception:
                pass

    async def _connect_with_retries(self, resume: bool = False) -> None:
        attempt = 0
        while True:
            try:
                await self._connect_once(resume=resume)
                if resume and self.welcome is not None and self.welcome.resumed:
                    self.resumes += 1
                return
            except (TimeoutError, OSError, websockets.exceptions.ConnectionClosed,
                    websockets.exceptions.InvalidMessage) as exc:
                error: Exception = exc
            except websockets.exceptions.InvalidStatus as exc:
                status = exc.response.status_code
                if status in (502, 503, 504):
                    error = exc
                else:
                    raise ConnectionClosed(None, f"handshake refused with HTTP {status}") from exc
            if attempt >= self.backoff.retries:
                raise ReconnectFailed(
                    f"could not connect to {self.url} after {attempt + 1} attempts: {error!r}"
                ) from error
            await asyncio.sleep(self.backoff.delay(attempt))
            attempt += 1

    async def _connect_once(self, resume: bool = False) -> None:
        ws = await ws_connect(
            self.url,
            subprotocols=[self.subprotocol],  # type: ignore[list-item]
            additional_headers=self.headers or None,
            open_timeout=self.open_timeout,
            max_size=self.max_frame_size,
            ping_interval=None,  # the protocol's own heartbeat replaces WebSocket pings
            compression=None,
            **({"ssl": self.ssl} if self.ssl is not None else {}),  # websockets refuses ssl= for ws://
        )
        try:
            if ws.subprotocol != self.subprotocol and not (self.mode == "json" and ws.subprotocol is None):
                raise ConnectionClosed(None, f"server chose subprotocol {ws.subprotocol!r}")
            hello = ev.Hello(client=_CLIENT_NAME, compression=self.offered, flow_window=self.flow_window,
                             auth=self.auth)
            if resume and self.welcome is not None:
                hello = ev.Hello(client=_CLIENT_NAME, compression=self.offered, flow_window=self.flow_window,
                                 auth=self.auth, resume_token=self.welcome.resume_token,
                                 last_seq={sid: st.received_seq for sid, st in self._streams.items()})
            await ws.send(self.codec.encode(hello))
            async with asyncio.timeout(self.open_timeout):
                frame = await ws.recv()
            welcome = self.codec.decode(frame, limit=self.max_decompressed_size, allowed=())
            if isinstance(welcome, ev.Error):
                raise StreamError(welcome.code, welcome.message)
            if not isinstance(welcome, ev.Welcome):
                raise ConnectionClosed(None, f"expected welcome, got {type(welcome).__name__}")
        except BaseException:
            await ws.close()
            raise
        self.welcome = welcome
        self.compressor = (
            CompressionSelector(welcome.compression) if welcome.compression else None
        )
        self._ws = ws
        self.connections += 1
        self.last_close = None
        self.goaway = None
        interval = (welcome.heartbeat_interval_ms or 30_000) / 1000
        self._heartbeat = _ClientHeartbeat(self, ws, Heartbeat(interval, 4 * interval, self.heartbeat_timeout,
                                                               time.monotonic()))
        self._reader = asyncio.get_running_loop().create_task(self._read_loop(ws))

    # ------------------------------------------------------------------ I/O
    async def _send(self, event: ev.Event) -> None:
        ws = self._ws
        if ws is None:
            raise ConnectionClosed(self.last_close.code if self.last_close else None, "not connected")
        try:
            await ws.send(self.codec.encode(event, self.compressor))
        except websockets.exceptions.ConnectionClosed as exc:
            raise ConnectionClosed(exc.rcvd.code if exc.rcvd else None, "connection closed") from exc

    async def _read_loop(self, ws: ClientConnection) -> None:
        allowed = self.welcome.compression if self.welcome else ()
        # Server pings at most every heartbeat_max_interval; silence well past that means it is gone.
        code: int | None = None
        reason = ""
        hb = self._heartbeat
        try:
            async for frame in ws:
                try:
                    event = self.codec.decode(frame, limit=self.max_decompressed_size, allowed=allowed)
                except RemoteProtocolError as exc:
                    await ws.close(exc.close_code or 1002, str(exc)[:120])
                    break
                if hb is not None:
                    hb.received(event)
                if isinstance(event, ev.Delta | ev.End | ev.Error) and event.stream_id:
                    stream = self._streams.get(event.stream_id)
                    if stream is not None:
                        if isinstance(event, ev.Delta):
                            if event.seq <= stream.received_seq:
                                continue  # already have it (replayed after a resume)
                            if event.seq != stream.received_seq + 1:
                                stream.queue.put_nowait(ClientError(
                                    f"stream {event.stream_id}: got seq {event.seq} after {stream.received_seq}"))
                                continue
                            stream.received_seq = event.seq
                            if stream.first_delta_at is None:
                                stream.first_delta_at = time.perf_counter()
                        else:
                            stream.finished_at = time.perf_counter()
                            # Its End/Error arrived: the stream is no longer open for a resume's last_seq
                            # (the caller still reads it from the queue).
                            self._streams.pop(event.stream_id, None)
                        stream.queue.put_nowait(event)
                elif isinstance(event, ev.Pong) and event.id in self._pings:
                    waiter = self._pings.pop(event.id)
                    if not waiter.done():
                        waiter.set_result(time.perf_counter())
                elif isinstance(event, ev.Ping):
                    if self.answer_pings:
                        await ws.send(self.codec.encode(event.response()))
                elif isinstance(event, ev.Error):
                    self.last_error = event
                elif isinstance(event, ev.GoAway):
                    self.goaway = event
        except websockets.exceptions.ConnectionClosed:
            pass
        finally:
            if hb is not None:
                hb.stop()
            if ws.close_code is not None:
                code, reason = ws.close_code, ws.close_reason or ""
            elif ws.protocol.close_rcvd is not None:
                code, reason = ws.protocol.close_rcvd.code, ws.protocol.close_rcvd.reason
            closed = _Closed(code, reason)
            self.last_close = closed
            if self._ws is ws:
                self._ws = None
            if not self._user_closed and not close_code_reconnects(code):
                self._closed_final = ConnectionClosed(code, reason)
            if (self.resume_enabled and not self._user_closed and self._closed_final is None and self._streams
                    and self.welcome is not None and self.welcome.resume_token):
                # Streams are open: reconnect in the background and resume them where they stopped.
                self._resuming = asyncio.get_running_loop().create_task(self._resume_loop())
            else:
                for stream in list(self._streams.values()):
                    stream.queue.put_nowait(closed)
                self._streams.clear()

    async def _resume_loop(self) -> None:
        """Reconnect with backoff and resume the open streams; fail them if that is impossible."""
        attempt = 0
        error: BaseException | None = None
        async with self._lock:
            while not self._user_closed:
                await asyncio.sleep(self.backoff.delay(attempt))
                try:
                    await self._connect_once(resume=True)
                except (TimeoutError, OSError, websockets.exceptions.ConnectionClosed,
                        websockets.exceptions.InvalidMessage, websockets.exceptions.InvalidStatus) as exc:
                    error = exc
                    attempt += 1
                    if attempt > self.backoff.retries:
                        break
                    continue
                except ClientError as exc:
                    error = exc
                    break
                if self.welcome is not None and self.welcome.resumed:
                    self.resumes += 1
                return
        failure = ReconnectFailed(f"could not resume the session at {self.url}: {error!r}")
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(failure)
        self._streams.clear()

    async def _consumed(self, stream: Stream, event: ev.Event) -> None:
        """Acknowledge what the caller consumed, opening the server's flow-control window."""
        window = self.welcome.flow_window if self.welcome is not None else 0
        if not window:
            return
        ack: ev.Ack | None = None
        if isinstance(event, ev.Delta):
            stream._unacked += len(event.chunk) + 64
            if stream._unacked >= window // 4:
                ack = ev.Ack(stream_id=stream.stream_id, seq=event.seq)
        else:
            ack = ev.Ack(stream_id=stream.stream_id, seq=stream.received_seq, done=True)
        if ack is not None and self.connected:
            stream._unacked = 0
            stream.acked_seq = ack.seq
            try:
                await self._send(ack)
            except ClientError:
                pass  # the connection dropped: the resume's last_seq acknowledges instead

    # ------------------------------------------------------------------ streams
    def stream(
        self,
        text: str | None = None,
        *,
        messages: Sequence[Mapping[str, str] | ev.ChatMessage] | None = None,
        data: bytes | None = None,
        model: str = "",
        params: Mapping[str, Any] | None = None,
    ) -> Stream:
        """Start a streamed request; iterate the result for chunks (str, or bytes for data)."""
        msgs = None
        if messages is not None:
            msgs = tuple(
                m if isinstance(m, ev.ChatMessage) else ev.ChatMessage(role=m["role"], content=m["content"])
                for m in messages
            )
        request = ev.Request(stream_id=next(self._ids), model=model, text=text, data=data,
                             messages=msgs, params=dict(params or {}))
        return Stream(self, request)

    async def complete(self, text: str | None = None, **kwargs: Any) -> str:
        """Run a request and return the whole reply as text."""
        return await self.stream(text, **kwargs).text()

    async def _wait_drained(self) -> None:
        """After a GoAway: wait until the server closes the draining connection."""
        reader = self._reader
        if self.goaway is not None and reader is not None and not reader.done():
            await asyncio.shield(reader)

    async def _resume_carries(self, stream: Stream) -> bool:
        """A send failed on a drop: whether the reconnect-and-resume carries `stream`.

        The reader task decides what a drop means (resume, or fail every stream). A send can
        notice the drop before the reader does: wait for that decision instead of failing early.
        """
        reader = self._reader
        if reader is not None and not reader.done():
            await asyncio.wait([reader], timeout=self.open_timeout)
        return self._streams.get(stream.stream_id) is stream and self._resuming is not None

    async def _start(self, stream: Stream) -> None:
        sid = stream.stream_id
        for attempt in range(2):
            if self.goaway is not None:
                await self._wait_drained()  # new streams go to the next connection
            if not self.connected:
                await self.open()
            stream._sent = True
            self._streams[sid] = stream
            stream.started_at = time.perf_counter()
            try:
                await self._send(stream.request)
                return
            except ConnectionClosed:
                if await self._resume_carries(stream):
                    return  # the resume lists this stream; the server asks us to resend if it missed it
                self._streams.pop(sid, None)
                if attempt or self._closed_final is not None:
                    stream._done = True
                    raise


def connect(url: str, **kwargs: Any) -> AsyncClient:
    """An :class:`AsyncClient` for `url`; use ``async with connect(url) as client``."""
    return AsyncClient(url, **kwargs)


# ================================================================================ sync
class SyncClient:
    """Blocking wrapper around :class:`AsyncClient`, running its event loop in a helper thread."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lowlat-mw-client", daemon=True)
        self._thread.start()
        self._client: AsyncClient = self._call_soon(self._make(url, kwargs))
        self.last_stream: Stream | None = None

    async def _make(self, url: str, kwargs: dict[str, Any]) -> AsyncClient:
        return AsyncClient(url, **kwargs)

    def _call_soon(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def client(self) -> AsyncClient:
        """The underlying async client."""
        return self._client

    def __enter__(self) -> SyncClient:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Connect (with retries)."""
        self._call_soon(self._client.open())

    def ping(self, timeout: float = 5.0) -> float:
        """Round-trip time of a Ping, in seconds."""
        return self._call_soon(self._client.ping(timeout))

    def close(self) -> None:
        """Close the connection and stop the helper thread."""
        if self._loop.is_closed():
            return
        try:
            self._call_soon(self._client.close(), timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def stream(self, text: str | None = None, **kwargs: Any) -> Iterator[str | bytes]:
        """Start a request and yield its chunks as they arrive."""
        stream = self._client.stream(text, **kwargs)
        try:
            while True:
                try:
                    chunk = self._call_soon(stream.__anext__())
                except StopAsyncIteration:
                    self.last_stream = stream
                    return
                yield chunk
        finally:
            if not stream._done:
                self._call_soon(stream.aclose(), timeout=10)

    def complete(self, text: str | None = None, **kwargs: Any) -> str:
        """Run a request and return the whole reply as text."""
        return "".join(c if isinstance(c, str) else c.decode() for c in self.stream(text, **kwargs))


def connect_sync(url: str, **kwargs: Any) -> SyncClient:
    """A :class:`SyncClient` for `url`; use ``with connect_sync(url) as client``."""
    return SyncClient(url, **kwargs)


__all__ += ["ErrorCode"]
