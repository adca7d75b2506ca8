"""The asyncio Python client: a driver over :class:`~lowlat_mw.protocol.client.ClientProtocol`.

    async with connect("ws://127.0.0.1:8000/ws") as client:
        async for chunk in client.stream("hello"):
            print(chunk, end="")

The protocol (Hello and resume, seq checks and duplicate drops, Ping answers, the heartbeat, GoAway,
flow-control Acks, which Errors mean "send the Request again") is the machine's; this module owns
the WebSocket (the ``websockets`` library), the clock, the tasks, reconnecting with exponential
backoff and full jitter, and the deques that hand each stream its chunks. Protobuf binary frames by
default (``mode="json"`` for text frames). Streams cut by a drop that cannot be resumed raise
:class:`ConnectionClosed`; server errors raise :class:`StreamError`.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
import math
import socket
import ssl as ssl_module
import time
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, ParamSpec, TypeVar
from urllib.parse import urlsplit

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.frames import Frame, Opcode

from ..errors import (
    ClientError,
    ConnectionClosed,
    ErrorCode,
    HandshakeRefused,
    ReconnectFailed,
    StreamError,
    close_code_reconnects,
)
from ..observability.timing import STAGES
from ..protocol import events as ev
from ..protocol.base import CloseConnection, SendFrame
from ..protocol.client import ClientProtocol, ClientStream, StreamBroken
from ..protocol.context import ClientDocument
from ..protocol.selector import CompressionSelector
from ..runtime.direct import message_limit, next_message, parser_idle, watch_parser
from ..runtime.timers import AsyncScheduler, cpu_clock
from ..settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO
from .backoff import Backoff

__all__ = ["AsyncClient", "Document", "Stream", "StreamTimings", "connect"]

log = logging.getLogger("lowlat_mw.client")


@dataclass(frozen=True, slots=True)
class StreamTimings:
    """Where a stream's time went, as seen by both ends, in seconds (as every time in the Python API:
    ``ping()``, ``rtt``, ``time_to_first_delta``, the settings; only the wire's ``End.timings_ms`` is in ms).

    Client times run from sending the Request to the first Delta's / the End's arrival. Server
    times come from End.timings_ms: ``server_total`` runs from the Request frame's arrival to
    the End, and ``server_stages`` splits it into the stages of
    :data:`lowlat_mw.observability.timing.STAGES` (they add up to it). ``network`` is what the
    client saw beyond the server's total: the round trip plus both sides' framing.
    """

    first_delta: float | None
    total: float | None
    server_first_delta: float | None
    server_total: float | None
    server_stages: Mapping[str, float]
    model_first_chunk: float | None

    @property
    def network(self) -> float | None:
        """Client total minus server total."""
        if self.total is None or self.server_total is None:
            return None
        return self.total - self.server_total

    # The millisecond names of 0.1.0, kept working (deprecated: the same times, in ms).
    first_delta_ms = property(lambda self: _ms_of(self, "first_delta"))
    total_ms = property(lambda self: _ms_of(self, "total"))
    server_first_delta_ms = property(lambda self: _ms_of(self, "server_first_delta"))
    server_total_ms = property(lambda self: _ms_of(self, "server_total"))
    model_first_chunk_ms = property(lambda self: _ms_of(self, "model_first_chunk"))
    network_ms = property(lambda self: _ms_of(self, "network"))

    @property
    def server_stages_ms(self) -> Mapping[str, float]:
        _deprecated_ms("server_stages", 3)
        return {k: v * 1000.0 for k, v in self.server_stages.items()}


def _deprecated_ms(name: str, stacklevel: int) -> None:
    warnings.warn(f"StreamTimings.{name}_ms is deprecated: use .{name} (seconds)", DeprecationWarning,
                  stacklevel=stacklevel)


def _ms_of(timings: StreamTimings, name: str) -> float | None:
    _deprecated_ms(name, 4)  # (the caller of the property's lambda)
    seconds = getattr(timings, name)
    return None if seconds is None else seconds * 1000.0


@dataclass(slots=True)
class _Closed:
    code: int | None
    reason: str


class Stream:
    """One streamed reply: an async iterator of chunks (str or bytes), plus its metadata.

    After iteration, `end` holds the server's End (timings_ms, usage) and
    `time_to_first_delta` the client-side latency in seconds.
    """

    def __init__(self, client: AsyncClient, request: ev.Request,
                 tools: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self._client = client
        self.tools = tools  # (v1.3) tool name -> function: the stream answers the model's calls of these itself
        self.request = request
        self.stream_id = request.stream_id
        self.state = ClientStream(request)  # what the protocol machine knows of it (seqs, Acks, resends)
        # What the reader delivered and the caller has not taken yet, and the caller's wait for more
        # (one future at a time, only while the deque is empty: no queue machinery per Delta).
        self._items: deque[ev.Event | _Closed | BaseException] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.end: ev.End | None = None
        self.started_at = 0.0
        self.first_delta_at: float | None = None
        self.finished_at: float | None = None
        self.last_seq = 0  # seq of the last Delta handed to the caller
        self._done = False
        self._sent = False

    @property
    def received_seq(self) -> int:
        """Seq of the last Delta received (queued); a resume asks for what follows."""
        return self.state.received_seq

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
        server = {k: v / 1000.0 for k, v in self.end.timings_ms.items()} if self.end is not None else {}
        return StreamTimings(
            first_delta=self.time_to_first_delta, total=self.total_time,
            server_first_delta=server.get("first_delta"), server_total=server.get("total"),
            server_stages={k: server[k] for k in STAGES if k in server},
            model_first_chunk=server.get("model_first_chunk"),
        )

    def _put(self, item: ev.Event | _Closed | BaseException) -> None:
        """The reader delivers `item` (a Delta, the End or Error, or why the connection ended)."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def __aiter__(self) -> _Chunks:
        """The chunks, for ``async for``: leaving the loop early (break, an exception, the iterator dropped, its
        ``aclose()``) cancels the stream. (``anext(stream)`` reads one chunk without that.)"""
        return _Chunks(self)

    async def __anext__(self) -> str | bytes | ev.ToolCall:
        while True:
            item = await self._next()
            if type(item) is not ev.Delta:
                raise StopAsyncIteration
            if item.tool_call is None or self.tools is None or item.tool_call.name not in self.tools:
                return item.chunk
            _keep_running(self._client._io_tasks, self._run_tool(item.tool_call))

    # ------------------------------------------------------------------ full-duplex (protocol v1.3)
    async def send(self, item: str | bytes, *, end: bool = False) -> None:
        """Send the running model more input (text or bytes; it reads ``req.inputs``); `end`: the last of it.
        Kept until the stream ends: after a dropped connection the resume sends again what the server lacks.
        LocalProtocolError if the server is older than protocol v1.3."""
        if isinstance(item, str):
            await self._input(text=item, end=end)
        else:
            await self._input(data=bytes(item), end=end)

    async def send_result(self, call: ev.ToolCall | str, content: Any, *, is_error: bool = False,
                          end: bool = False) -> None:
        """Answer the model's tool call `call` (or its id) with `content` (a str, else sent as JSON text);
        `is_error`: the tool failed and `content` says how."""
        call_id = call.id if isinstance(call, ev.ToolCall) else call
        text = content if isinstance(content, str) else json.dumps(content)
        await self._input(tool_result=ev.ToolResult(id=call_id, content=text, is_error=is_error), end=end)

    async def end_input(self) -> None:
        """No more input for this stream (the model's ``async for item in req.inputs`` ends)."""
        await self._input(end=True)

    async def _input(self, **item: Any) -> None:
        client = self._client
        if not self._sent:
            await client._start(self)
        if self._done or self.state.stream_id not in client.protocol.streams:
            raise ClientError(f"stream {self.stream_id} has ended: it takes no more input")
        client.protocol.add_input(self.state, **item)
        await client._flush_inputs(self)

    async def _run_tool(self, call: ev.ToolCall) -> None:
        """Answer `call` with the stream's own tool (the `tools` given to ``client.stream``)."""
        fn = self.tools[call.name]  # type: ignore[index]
        try:
            args = call.args
            args = args if isinstance(args, dict) else {} if args is None else {"arguments": args}
            result = await fn(**args) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, **args)
            content, failed = result, False
        except Exception as exc:  # the tool failed: the model is told, and decides
            content, failed = f"{type(exc).__name__}: {exc}", True
        try:
            await self.send_result(call, content, is_error=failed)
        except ClientError as exc:  # the stream ended meanwhile
            log.debug("tool result for %s not sent: %s", call.id, exc)

    async def events(self) -> AsyncIterator[ev.Delta | ev.End]:
        """The stream as typed events: each :class:`~lowlat_mw.Delta` (``seq``, ``text`` or ``data``), then the
        :class:`~lowlat_mw.End` (``finish_reason``, ``usage``, ``timings_ms``); errors raise as when iterating
        the chunks. ``async for event in client.stream("hi").events(): ...``"""
        try:
            while (item := await self._next()) is not None:
                yield item
                if type(item) is ev.End:
                    return
        finally:
            self._abandon_soon()  # (left early: cancelled; a finalizer may run this, in any thread)

    async def _next(self) -> ev.Delta | ev.End | None:
        """The next Delta, else the End (once; None after it), or raise the error that ended the stream."""
        if self._done:
            return None
        client = self._client
        if not self._sent:
            await client._start(self)
        items = self._items
        while True:
            while not items:
                waiter = self._waiter = asyncio.get_running_loop().create_future()
                await waiter
            item = items.popleft()
            if type(item) is ev.Delta:
                self.last_seq = item.seq
                ack = client.protocol.consumed(self.state, item)  # (client._consumed: no coroutine per Delta)
                if ack is not None:
                    await client._send_ack(ack)
                return item
            if isinstance(item, ev.Error):
                # The machine says whether it means "send the Request again": the server never saw it
                # (lost in a drop; the resend can be lost in another drop too), or it was draining.
                retry = client.protocol.retry(self.state, item, client.backoff.retries)
                if retry is not None:
                    if retry == "after_drain":
                        await client._wait_drained()
                    await client._start(self)
                    continue
            break
        self._done = True
        client._drop(self)
        if self.finished_at is None:
            self.finished_at = time.perf_counter()
        if isinstance(item, ev.End):
            self.end = item
            await client._consumed(self, item)
            return item
        if isinstance(item, ev.Error):
            await client._consumed(self, item)
            raise client.protocol.failure(self.state, item)
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, _Closed)
        raise ConnectionClosed(item.code, item.reason or "connection lost during the stream")

    async def cancel(self) -> None:
        """Ask the server to stop this stream; iteration then ends quietly."""
        if self._sent and not self._done:
            await self._client._send(self._client.protocol.cancel(self.stream_id))

    async def aclose(self) -> None:
        """Stop consuming: cancels the stream on the server if it is still running."""
        if self._stop_reading():
            await self._send_cancel()

    def _abandon(self) -> None:
        """The caller left the stream before its end: as :meth:`aclose`, but never waits (the Cancel goes out from a
        task of the client's loop, which this runs on)."""
        if self._stop_reading():
            _keep_running(self._client._io_tasks, self._send_cancel())

    def _abandon_soon(self) -> None:
        """:meth:`_abandon` from any thread or finalizer: on the client's loop, unless nothing is left to cancel or
        the loop is closed (then so is the connection)."""
        reader = self._client._reader  # (a stream was sent on a connection: this task reads it, or read the last)
        if self._done or not self._sent or self._client._streams.get(self.stream_id) is not self or reader is None:
            return
        loop = reader.get_loop()
        try:
            if _running_loop() is loop:
                self._abandon()
            else:
                loop.call_soon_threadsafe(self._abandon)
        except RuntimeError:
            pass  # the loop closed meanwhile

    def _stop_reading(self) -> bool:
        """The stream is over for the caller; True if the server may still run it (a Cancel is due)."""
        if not self._sent or self._done:
            return False
        self._done = True
        client = self._client
        running = client._streams.get(self.stream_id) is self  # (its End or Error did not arrive yet)
        client._drop(self)
        return running

    async def _send_cancel(self) -> None:
        try:
            await self._client._send(self._client.protocol.cancel(self.stream_id))
        except ClientError:
            pass  # no connection: the resume leaves the stream out, which cancels it

    async def text(self) -> str:
        """Consume the whole stream and return the text (a tool call nobody answers: ClientError, and the stream
        is cancelled, so the model does not wait for the answer for ever)."""
        try:
            parts = [_text_of(c) async for c in self]
        except ClientError:
            await self.aclose()
            raise
        return "".join(parts)


class _Chunks:
    """A stream's chunks for one ``async for``: the loop left early (this iterator dropped, or closed) cancels it."""

    __slots__ = ("stream",)

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def __aiter__(self) -> _Chunks:
        return self

    def __anext__(self) -> Coroutine[Any, Any, str | bytes | ev.ToolCall]:
        return self.stream.__anext__()

    async def aclose(self) -> None:
        """Stop reading: cancels the stream if it still runs."""
        await self.stream.aclose()

    def __del__(self) -> None:
        self.stream._abandon_soon()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _text_of(chunk: str | bytes | ev.ToolCall) -> str:
    """A chunk as text; a tool call nobody answers is the caller's error (the model would wait for it)."""
    if isinstance(chunk, str):
        return chunk
    if type(chunk) is ev.ToolCall:
        raise ClientError(f"the model asked for tool {chunk.name!r}: pass tools={{{chunk.name!r}: ...}} to "
                          "answer it, or iterate the stream and answer with send_result()")
    return chunk.decode()  # type: ignore[union-attr]
class Document:
    """A context document of the client's session (protocol v1.3): made by :meth:`AsyncClient.context`, changed
    with :meth:`set`, :meth:`patch` and :meth:`replace`, named by ``client.stream(..., context=[doc])``.

    Each change is sent at once as a patch (offsets in characters here, UTF-8 bytes on the wire) with the
    SHA-256 of the whole text; the server checks both. When it refuses one, or a connection's session does not
    hold this version (a new session, patches lost in a drop), the client sends the whole text again by itself.
    """

    def __init__(self, client: AsyncClient, state: ClientDocument) -> None:
        self._client = client
        self.state = state
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def name(self) -> str:
        """The document's name in the session."""
        return self.state.name

    @property
    def text(self) -> str:
        """The current text (as the server has it once :attr:`synced`)."""
        return self.state.text

    @property
    def version(self) -> int:
        """The current version (each change makes the next)."""
        return self.state.version

    @property
    def synced(self) -> bool:
        """Whether the server acknowledged the current version."""
        return self.state.synced

    async def set(self, text: str) -> None:
        """Replace the whole text."""
        await self._client._send_context(self, self.state.set(text))

    async def patch(self, offset: int, length: int, text: str) -> None:
        """Replace `length` characters at character `offset` with `text` (ValueError outside the text)."""
        await self._client._send_context(self, self.state.patch(offset, length, text))

    async def replace(self, old: str, new: str) -> None:
        """Replace the first occurrence of `old` with `new` (ValueError if it does not occur)."""
        at = self.state.text.find(old)
        if at < 0:
            raise ValueError(f"{old!r} is not in document {self.name!r}")
        await self.patch(at, len(old), new)

    async def drop(self) -> None:
        """Forget the document here and on the server."""
        self._client._documents.pop(self.name, None)
        self._client._dropped[self.name] = self.state.version  # (a new document of this name counts on from it)
        await self._client._send_context(self, self.state.drop())

    async def wait_synced(self, timeout: float | None = 10.0) -> None:
        """Wait until the server acknowledged the current version (TimeoutError past `timeout`; StreamError if the
        server refused it for good: over max_contexts or max_context_bytes, say)."""
        async with asyncio.timeout(timeout):
            while not self.state.synced:
                failed = self.state.failed
                if failed is not None:
                    raise StreamError(failed.code, f"context document {self.name!r}: {failed.message}")
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter

    def _answered(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


async def _close_ws(ws: ClientConnection, code: int = 1000, reason: str = "") -> None:
    """websockets' close of `ws`, bounded. It writes the close frame and waits for its write buffer to drain before
    its own close_timeout (10 s) starts, and a server that stopped reading never lets it drain: the close (and the
    socket) would wait for good. Past twice close_timeout (the drain, then the closing handshake) it is aborted."""
    timeout = ws.close_timeout if ws.close_timeout is not None else 10.0
    try:
        async with asyncio.timeout(2 * timeout):
            await ws.close(code, reason)
    except TimeoutError:
        ws.transport.abort()  # (connection_lost follows: the reader and every blocked send end)


def _keep_running(tasks: set[asyncio.Task[Any]], coro: Any) -> None:
    """Run `coro` (a Pong or Ping to send, a close) in a task of its own, kept in `tasks` until it is done."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


class _Timer:
    """One connection's heartbeat, driven by the loop's one scheduler: the machine's Pings and its 4001.

    The client pings the server when the connection is quiet and closes it with 4001 when the
    server stops answering, so a dead server is noticed even without server Pings.
    """

    def __init__(self, client: AsyncClient, ws: ClientConnection) -> None:
        self.client, self.ws = client, ws
        self.scheduler = AsyncScheduler.current()
        self.stopped = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.scheduler.schedule(self, client.protocol.next_deadline())

    def stop(self) -> None:
        self.stopped = True
        self.scheduler.cancel(self)

    def on_timer(self, now: float) -> float:
        if self.stopped:
            return math.inf
        proto = self.client.protocol
        for action in proto.tick(now):
            if isinstance(action, SendFrame):
                _keep_running(self._tasks, self.client._send_quietly(self.ws, action.data))
            elif isinstance(action, CloseConnection):
                self.stopped = True
                _keep_running(self._tasks, _close_ws(self.ws, action.code, action.reason))
                return math.inf
        proto.deadline_moved = False
        return proto.next_deadline()


class _Connection(ClientConnection):
    """websockets' client connection, handing each whole message straight to the client from its
    ``data_received`` (`deliver`, set once the connection is open) instead of queueing it for a reader
    task to wake up for: one task switch less per message. Only while nothing is queued (order holds),
    and never again once a message comes fragmented (websockets reassembles those); control frames,
    bad UTF-8 and the close are websockets' own business as before."""

    deliver: Callable[[bytes | str], None] | None = None

    def __init__(self, protocol: Any, **kwargs: Any) -> None:
        super().__init__(protocol, **kwargs)
        watch_parser(protocol)  # (parser_idle: made before the connection reads anything)

    def data_received(self, data: bytes) -> None:
        """Messages that are one whole frame each (most are) are read here (lowlat_mw.runtime.direct.next_message)
        while websockets' parser waits between messages with nothing buffered or queued; from the first
        frame that is not one (a control frame, a fragment, a partial frame), websockets' parser reads on."""
        deliver = self.deliver
        if deliver is not None:
            proto = self.protocol
            if not len(self.recv_messages.frames) and parser_idle(proto):
                limit = message_limit(proto)
                pos = 0
                while True:
                    found = next_message(data, pos, False, limit)
                    if found is None:
                        break
                    message, pos = found
                    deliver(message)
                    if self.deliver is not deliver:
                        break
                if pos:
                    if pos == len(data):
                        return
                    data = data[pos:]
        super().data_received(data)

    def process_event(self, event: Any) -> None:
        deliver = self.deliver
        if deliver is not None and type(event) is Frame and self.response is not None:
            opcode = event.opcode
            if opcode is Opcode.BINARY or opcode is Opcode.TEXT:
                if not event.fin:
                    self.deliver = None  # a fragmented message: from here on through websockets' queue
                elif not len(self.recv_messages.frames):
                    if opcode is Opcode.BINARY:
                        deliver(bytes(event.data))
                        return
                    try:
                        text = bytes(event.data).decode()
                    except UnicodeDecodeError:
                        pass  # websockets closes with 1007
                    else:
                        deliver(text)
                        return
            elif opcode is Opcode.CONT:
                self.deliver = None
        super().process_event(event)


class AsyncClient:
    """A lowlat-mw connection with many concurrent streams; reconnects between requests and resumes."""

    def __init__(
        self,
        url: str,
        *,
        mode: Literal["proto", "json"] = "proto",
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
        max_pushes: int = 1000,
        warmup: Mapping[str, Any] | None = None,
        history: bool = False,
    ) -> None:
        if mode not in ("proto", "json"):
            raise ValueError("mode must be 'proto' or 'json'")
        if ssl is not None and not url.startswith("wss://"):
            raise ValueError("ssl= needs a wss:// URL")
        self.url = url
        self.ssl = ssl  # TLS context for wss:// (None: the system trust store)
        self.mode = mode
        self.subprotocol = SUBPROTOCOL_PROTO if mode == "proto" else SUBPROTOCOL_JSON
        self.protocol = ClientProtocol(
            self.subprotocol, compression=None if compression is None else tuple(compression), flow_window=flow_window,
            max_frame_size=max_frame_size, max_decompressed_size=max_decompressed_size,
            heartbeat_timeout=heartbeat_timeout, answer_pings=answer_pings, auth=auth, meter=cpu_clock,
            history=history)
        self.codec = self.protocol.codec
        self.offered = self.protocol.offered
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
        self.max_pushes = max_pushes  # pushes kept unread; past it the oldest is dropped (pushes_dropped)
        self.auth = auth
        self.resumes = 0  # how many times a dropped session was resumed
        self._resuming: asyncio.Task[None] | None = None
        self._pending = 0
        self._timer: _Timer | None = None
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._streams: dict[int, Stream] = {}  # streams waiting for their events, by id
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._closed_final: ConnectionClosed | None = None
        self._user_closed = False
        self.last_close: _Closed | None = None
        self._pings: dict[int, asyncio.Future[float]] = {}
        self._ping_ids = itertools.count(1 << 31)  # apart from the heartbeat's own ids
        self._io_tasks: set[asyncio.Task[Any]] = set()
        self.groups: set[str] = set()  # push groups joined: joined again on a connection of a new session
        self._subscribing: dict[int, asyncio.Future[ev.Subscribed]] = {}
        self._rejoining: dict[int, str] = {}  # Subscribes sent again on a new session, by id
        self._sub_ids = itertools.count(1)
        self._pushes: deque[ev.Push | BaseException] = deque()
        self._push_waiter: asyncio.Future[None] | None = None
        self.pushes_dropped = 0  # pushes dropped because max_pushes were waiting unread
        # Sent as a warm-up request (see warmup()) when a connection starts a new session: its arguments, checked
        # here (a wrong name or a bad combination is this call's TypeError or LocalProtocolError, not a failure later).
        self.warmup_request: Mapping[str, Any] | None = None if warmup is None else dict(warmup)
        if self.warmup_request is not None:
            _check_warmup(self.warmup_request)
        self.warmups = 0  # warm-up requests the server ran
        self._documents: dict[str, Document] = {}  # context documents (v1.3): sent again to a session without them
        self._dropped: dict[str, int] = {}  # the last version of each document dropped, by name

    # ------------------------------------------------------------------ state (the machine's)
    @property
    def welcome(self) -> ev.Welcome | None:
        """The last Welcome (session id, resume token, negotiated limits)."""
        return self.protocol.welcome

    @property
    def goaway(self) -> ev.GoAway | None:
        """The GoAway of the current connection, if the server is draining it."""
        return self.protocol.goaway

    @property
    def last_error(self) -> ev.Error | None:
        """The last connection-level Error (stream 0) from the server."""
        return self.protocol.last_error

    @property
    def compressor(self) -> CompressionSelector | None:
        """The compressor of the current connection's Requests (None without negotiated compression)."""
        return self.protocol.compressor

    @property
    def connections(self) -> int:
        """How many times a connection was opened and welcomed."""
        return self.protocol.connections

    @property
    def rtt(self) -> float | None:
        """Last measured round-trip time to the server in seconds (from the client's Pings)."""
        hb = self.protocol.heartbeat
        return hb.rtt if hb is not None else None

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> AsyncClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def ping(self, timeout: float = 5.0) -> float:
        """Send a Ping now and return the round-trip time to its Pong in seconds."""
        if not self.connected:
            await self.open()
        ping_id = next(self._ping_ids) & 0xFFFFFFFF
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pings[ping_id] = waiter
        try:
            sent = time.perf_counter()
            await self._send(self.protocol.ping(ping_id))
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
                await self._connect_with_retries(resume=self.resume_enabled and self.protocol.can_resume)
                return

    async def close(self) -> None:
        """Close the connection normally; running streams end with ConnectionClosed."""
        self._user_closed = True
        if self._resuming is not None and not self._resuming.done():
            self._resuming.cancel()
        ws, self._ws = self._ws, None
        if ws is not None:
            await _close_ws(ws)
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
                if not self.protocol.connections and await _nothing_listens(exc, self.url, self.open_timeout):
                    # (a reconnect waits for a restart)
                    raise ReconnectFailed(f"could not connect to {self.url}: connection refused (nothing listens "
                                          "there: is the server running, on this port?)") from exc
            except websockets.exceptions.InvalidStatus as exc:
                status = exc.response.status_code
                if status in (502, 503, 504):
                    error = exc
                else:
                    raise _refusal(exc.response, self.url) from exc
            if attempt >= self.backoff.retries:
                raise ReconnectFailed(
                    f"could not connect to {self.url} after {attempt + 1} attempts: {error!r}"
                ) from error
            await asyncio.sleep(self.backoff.delay(attempt))
            attempt += 1

    async def _open_ws(self) -> ClientConnection:
        """The WebSocket to the server, opened (lowlat_mw.testing's in-process client opens one to an ASGI app)."""
        return await ws_connect(
            self.url,
            subprotocols=[self.subprotocol],  # type: ignore[list-item]
            additional_headers=self.headers or None,
            open_timeout=self.open_timeout,
            max_size=self.max_frame_size,
            ping_interval=None,  # the protocol's own heartbeat replaces WebSocket pings
            compression=None,
            create_connection=_Connection,
            **({"ssl": self.ssl} if self.ssl is not None else {}),  # websockets refuses ssl= for ws://
        )

    async def _connect_once(self, resume: bool = False) -> None:
        ws = await self._open_ws()
        proto = self.protocol
        try:
            if ws.subprotocol != self.subprotocol and not (self.mode == "json" and ws.subprotocol is None):
                raise ConnectionClosed(None, f"server chose subprotocol {ws.subprotocol!r}")
            await ws.send(proto.connect(time.monotonic(), resume=resume))
            async with asyncio.timeout(self.open_timeout):
                frame = await ws.recv()
            first = next(iter(proto.receive_data(frame, time.monotonic())), None)
            if isinstance(first, ev.Error):
                raise StreamError(first.code, first.message)
            if not isinstance(first, ev.Welcome):
                reason = first.reason if isinstance(first, CloseConnection) else "no welcome"
                raise ConnectionClosed(None, reason)
        except BaseException:
            proto.connection_lost()
            await _close_ws(ws)
            raise
        sent: dict[str, int] = {}
        if self._documents and proto.contexts:  # (v1.3) a session without a document's version gets its whole text
            held = first.contexts if first.resumed else {}
            for doc in list(self._documents.values()):
                message = doc.state.welcomed(held)
                if message is not None:
                    await self._send_quietly(ws, proto.context(message))
                sent[doc.name] = doc.state.version
        self._ws = ws
        for doc in list(self._documents.values()):  # (changed while the above went out, not connected yet: its
            if sent.get(doc.name, doc.state.version) != doc.state.version:  # change was not sent, so its whole text)
                _keep_running(self._io_tasks, self._send_context(doc, doc.state.set(doc.state.text)))
        self.last_close = None
        self._timer = _Timer(self, ws)
        self._reader = asyncio.get_running_loop().create_task(self._read_loop(ws))
        for stream in list(self._streams.values()):  # (v1.3) the Inputs the server lacks (Welcome.input_seq)
            if stream.state.inputs:
                _keep_running(self._io_tasks, self._flush_inputs(stream))
        if self.warmup_request is not None and not (first.resumed and resume):  # a new session: maybe a new process
            _keep_running(self._io_tasks, self._warm_new_session())
        if self.groups and proto.pushes:  # a new session is in none; a resumed one may have lost the last one
            self._rejoining.clear()  # (written to Redis 10 ms after it was answered): joining again changes nothing
            for group in sorted(self.groups):
                sub_id = next(self._sub_ids) & 0xFFFFFFFF
                self._rejoining[sub_id] = group
                _keep_running(self._io_tasks, self._send_quietly(ws, proto.subscribe(sub_id, group)))

    # ------------------------------------------------------------------ I/O
    async def _send(self, frame: bytes | str) -> None:
        ws = self._ws
        if ws is None:
            raise ConnectionClosed(self.last_close.code if self.last_close else None, "not connected")
        try:
            await ws.send(frame)
        except websockets.exceptions.ConnectionClosed as exc:
            raise ConnectionClosed(exc.rcvd.code if exc.rcvd else None, "connection closed") from exc

    async def _flush_inputs(self, stream: Stream) -> None:
        """(v1.3) Send `stream`'s Inputs the server does not have yet, in order, one sender at a time: the same
        loop goes on over a new connection if this one drops under it (a resume resets what it has)."""
        st = stream.state
        if st.flushing:
            return
        st.flushing = True
        try:
            while True:
                ws = self._ws
                if ws is None or stream._done or st.sent_inputs >= len(st.inputs):
                    return
                inp = st.inputs[st.sent_inputs]
                st.sent_inputs += 1
                try:
                    await ws.send(self.protocol.input_frame(inp))
                except websockets.exceptions.ConnectionClosed:
                    if self._ws is ws or self._ws is None:
                        return  # the resume sends the rest
        finally:
            st.flushing = False

    async def _send_quietly(self, ws: ClientConnection, frame: bytes | str) -> None:
        try:
            await ws.send(frame)
        except websockets.exceptions.ConnectionClosed:
            pass

    def _handle(self, ws: ClientConnection, frame: bytes | str) -> None:
        """One message from the server: the machine reads it, the streams get what is theirs. Called by
        the reader task, or straight from the connection's data_received (:class:`_Connection`)."""
        proto = self.protocol
        streams = self._streams
        for item in proto.receive_data(frame, time.monotonic()):
            kind = type(item)
            if kind is ev.Delta:
                stream = streams.get(item.stream_id)
                if stream is not None:
                    if stream.first_delta_at is None:
                        stream.first_delta_at = time.perf_counter()
                    stream._put(item)
            elif kind is ev.End or (kind is ev.Error and item.stream_id):
                # Ended: no longer waiting on this connection, nor on a resume (the caller still reads it).
                stream = streams.pop(item.stream_id, None)
                if stream is not None:
                    stream.finished_at = time.perf_counter()
                    stream._put(item)
            elif kind is SendFrame:
                _keep_running(self._io_tasks, self._send_quietly(ws, item.data))
            elif kind is ev.Push:
                self._pushed(item)
            elif kind is ev.Subscribed:
                answer = self._subscribing.pop(item.id, None)
                if answer is not None and not answer.done():
                    answer.set_result(item)
                elif self._rejoining.pop(item.id, None) is not None and item.code is not ErrorCode.UNSPECIFIED:
                    self.groups.discard(item.group)  # refused now (the server's push_groups changed): not in it
                    proto.listening = bool(self.groups)
                    log.warning("push group %r not joined again on the new session: %s %s", item.group,
                                item.code.wire_name, item.message)
            elif kind is ev.ContextAck:
                doc = self._documents.get(item.name)
                if doc is not None:
                    again = doc.state.answered(item)
                    if again is not None:
                        log.info("context %r refused (%s: %s): its whole text is sent again", item.name,
                                 item.code.wire_name, item.message)
                        _keep_running(self._io_tasks, self._send_quietly(ws, proto.context(again)))
                    doc._answered()
            elif kind is ev.Pong:
                waiter = self._pings.pop(item.id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(time.perf_counter())
            elif kind is StreamBroken:
                stream = streams.get(item.stream_id)
                if stream is not None:
                    stream._put(ClientError(item.message))
            elif kind is CloseConnection:
                _keep_running(self._io_tasks, _close_ws(ws, item.code, item.reason))
        timer = self._timer
        if proto.deadline_moved and timer is not None:
            proto.deadline_moved = False
            timer.scheduler.schedule(timer, proto.next_deadline())

    async def _read_loop(self, ws: ClientConnection) -> None:
        proto = self.protocol
        code: int | None = None
        reason = ""
        timer = self._timer
        handle = self._handle
        try:
            if isinstance(ws, _Connection):
                ws.deliver = partial(handle, ws)  # from now on, messages come without this task's wake-up
            async for frame in ws:  # (messages queued before that, or while direct delivery is off)
                handle(ws, frame)
        except websockets.exceptions.ConnectionClosed:
            pass
        finally:
            if isinstance(ws, _Connection):
                ws.deliver = None
            if timer is not None:
                timer.stop()
            proto.connection_lost()
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
            for answer in self._subscribing.values():
                if not answer.done():
                    answer.set_exception(ConnectionClosed(code, reason or "closed before the Subscribe was answered"))
            self._subscribing.clear()
            if (self.resume_enabled and not self._user_closed and self._closed_final is None
                    and ((self._streams and proto.can_resume) or self.groups or self._push_waiter is not None)):
                # Streams are open: reconnect in the background and resume them where they stopped. In push
                # groups, or someone waiting for a push: reconnect too, to go on listening.
                self._resuming = asyncio.get_running_loop().create_task(self._resume_loop())
            else:
                self._fail_all(closed)

    def _fail_all(self, why: _Closed | BaseException) -> None:
        for stream in list(self._streams.values()):
            stream._put(why)
            self._drop(stream)
        if self.groups or self._push_waiter is not None:  # a reader of pushes learns the connection is over
            self._pushed(why if isinstance(why, BaseException) else ConnectionClosed(why.code, why.reason))

    def _drop(self, stream: Stream) -> None:
        """`stream` is over for this client: no resume will ask for it."""
        if self._streams.get(stream.stream_id) is stream:
            del self._streams[stream.stream_id]
            self.protocol.forget(stream.stream_id)

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
        self._fail_all(ReconnectFailed(f"could not resume the session at {self.url}: {error!r}"))

    async def _consumed(self, stream: Stream, event: ev.Event) -> None:
        """Acknowledge what the caller consumed, opening the server's flow-control window."""
        ack = self.protocol.consumed(stream.state, event)
        if ack is not None:
            await self._send_ack(ack)

    async def _send_ack(self, ack: bytes | str) -> None:
        if self.connected:
            try:
                await self._send(ack)
            except ClientError:
                pass  # the connection dropped: the resume's last_seq acknowledges instead

    # ------------------------------------------------------------------ push (protocol v1.1)
    async def subscribe(self, group: str, timeout: float = 10.0) -> None:
        """Join push group `group`: once this returns, what the server publishes to ``group:<name>`` arrives in
        :meth:`pushes`. The client joins its groups again whenever it reconnects to a new session, and it
        reconnects on its own after a drop while it is in a group. StreamError if the server refuses
        (unauthorized: not in its ``push_groups``; bad_request), ClientError if it speaks protocol v1.0."""
        await self._membership(group, False, timeout)
        self.groups.add(group)
        self.protocol.listening = True

    async def unsubscribe(self, group: str, timeout: float = 10.0) -> None:
        """Leave push group `group` (not connected, with no session to resume: only forgotten, the next session
        is in no group)."""
        self.groups.discard(group)
        if self.connected or (self.protocol.can_resume and not self._user_closed):
            self.protocol.listening = bool(self.groups)
            await self._membership(group, True, timeout)

    async def _membership(self, group: str, leave: bool, timeout: float) -> None:
        if not self.connected:
            await self.open()
        if not self.protocol.pushes:
            raise ClientError(f"the server at {self.url} speaks protocol v1.0: it has no push groups")
        sub_id = next(self._sub_ids) & 0xFFFFFFFF
        answer: asyncio.Future[ev.Subscribed] = asyncio.get_running_loop().create_future()
        self._subscribing[sub_id] = answer
        try:
            await self._send(self.protocol.subscribe(sub_id, group, leave=leave))
            async with asyncio.timeout(timeout):
                subscribed = await answer
        finally:
            self._subscribing.pop(sub_id, None)
        if subscribed.code is not ErrorCode.UNSPECIFIED:
            raise StreamError(subscribed.code, subscribed.message)

    def _pushed(self, item: ev.Push | BaseException) -> None:
        pushes = self._pushes
        if type(item) is ev.Push and pushes and len(pushes) >= self.max_pushes:
            pushes.popleft()
            self.pushes_dropped += 1
        pushes.append(item)
        waiter = self._push_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_push(self, timeout: float | None = None) -> ev.Push:
        """The next push (its ``topic`` and ``body``: text or bytes), waiting up to `timeout` seconds (None: no
        limit; TimeoutError past it). Raises what ended the connection for good (ConnectionClosed,
        ReconnectFailed) once the pushes that came before are read."""
        async with asyncio.timeout(timeout):
            while not self._pushes:
                if self._push_waiter is not None:
                    raise ClientError("another task is already waiting for the next push")
                self._push_waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._push_waiter
                finally:
                    self._push_waiter = None
        item = self._pushes.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    async def pushes(self) -> AsyncIterator[ev.Push]:
        """Every push, as it arrives: ``async for push in client.pushes(): ...`` (ends with what ends the
        connection for good, see :meth:`next_push`)."""
        while True:
            yield await self.next_push()

    # ------------------------------------------------------------------ context documents (protocol v1.3)
    async def context(self, name: str, text: str = "") -> Document:
        """The session's context document `name`, with `text` as its whole text (sent now; connects first if need
        be). A request names it with ``stream(..., context=[doc])``; the model gets ``req.context[name].text``.
        ClientError if the server is older than protocol v1.3."""
        if not self.connected:
            await self.open()
        if not self.protocol.contexts:
            raise ClientError(f"the server at {self.url} is older than protocol v1.3: it has no context documents")
        doc = self._documents.get(name)
        if doc is None:
            state = ClientDocument(name)
            state.version = self._dropped.pop(name, 0)  # (versions go on past a dropped one: its answers are old)
            doc = self._documents[name] = Document(self, state)
        await doc.set(text)
        return doc

    async def _send_context(self, doc: Document, message: ev.Context) -> None:
        """Send a document's change; without a connection it waits: the next Welcome decides what to resend."""
        if self.connected and self.protocol.contexts:
            try:
                await self._send(self.protocol.context(message))
            except ConnectionClosed:
                pass

    # ------------------------------------------------------------------ streams
    def stream(
        self,
        text: str | None = None,
        *,
        messages: Sequence[Mapping[str, str] | ev.ChatMessage] | None = None,
        data: bytes | None = None,
        model: str = "",
        params: Mapping[str, Any] | None = None,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        context: Sequence[Document | str] = (),
        continues: Stream | int = 0,
    ) -> Stream:
        """Start a streamed request; iterate the result for chunks (str, or bytes for data; a
        :class:`~lowlat_mw.ToolCall` when the model asks for a tool, v1.3). Protocol v1.3: `tools`: name ->
        function (sync or async, called with the call's JSON arguments as keywords) that the stream runs itself to
        answer the model's calls of that name (the stream's :meth:`Stream.send` and :meth:`Stream.send_result` send
        input); `context` names documents (:meth:`context`) the model gets as ``req.context``; `continues` an
        earlier stream of this session (connect with ``history=True``) whose turns the model gets as
        ``req.history``."""
        request = self._request(text, messages, data, model, params, False)
        if context or continues:
            if continues and not self.protocol.history:
                raise ValueError("continues= needs a client made with history=True (the server keeps no turns else)")
            names = tuple(d.name if isinstance(d, Document) else d for d in context)
            sid = continues.stream_id if isinstance(continues, Stream) else continues
            request = ev.Request(stream_id=request.stream_id, model=model, text=request.text, data=data,
                                 messages=request.messages, params=request.params, contexts=names, continues=sid)
        return Stream(self, request, tools)

    def _request(self, text: str | None, messages: Sequence[Mapping[str, str] | ev.ChatMessage] | None,
                 data: bytes | None, model: str, params: Mapping[str, Any] | None, warmup: bool) -> ev.Request:
        return ev.Request(stream_id=next(self._ids), model=model, text=text, data=data,
                          messages=_chat(messages), params=dict(params or {}), warmup=warmup)

    async def complete(self, text: str | None = None, **kwargs: Any) -> str:
        """Run a request and return the whole reply as text."""
        return await self.stream(text, **kwargs).text()

    async def warmup(
        self,
        text: str | None = None,
        *,
        messages: Sequence[Mapping[str, str] | ev.ChatMessage] | None = None,
        data: bytes | None = None,
        model: str = "",
        params: Mapping[str, Any] | None = None,
    ) -> ev.End | None:
        """Have the server run the model's warm-up hook for this input (load it, fill its caches) and wait
        until it has, so that a later request finds the model ready; connects first if need be. Returns the
        server's End (``finish_reason`` "warmup", no Delta before it; ``timings_ms`` says how long it took).
        Protocol v1.2: against an older server nothing is sent and this returns None (such a server would run
        the model as a plain request). The hook's failure raises :class:`StreamError` (``model_error``)."""
        if not self.connected:
            await self.open()
        if not self._speaks_warmup():
            return None
        stream = Stream(self, self._request(text, messages, data, model, params, True))
        try:
            await stream.text()  # (no Delta: the server sends End("warmup") at once when the hook returns)
        except _NoWarmup:  # the Request was to be sent again, on a connection to an older server
            return None
        end = stream.end
        if end is None or end.finish_reason != "warmup":
            return None
        self.warmups += 1
        return end

    def _speaks_warmup(self) -> bool:
        welcome = self.welcome
        return welcome is not None and welcome.revision >= ev.WARMUP_REVISION

    async def _warm_new_session(self) -> None:
        """The ``warmup=`` option: a warm-up request on a new session, in the background (the caller goes on)."""
        try:
            await self.warmup(**self.warmup_request)  # type: ignore[arg-type]
        except Exception as exc:  # only a hint: requests work without it
            if not self._user_closed:
                log.warning("warm-up request failed: %s: %s", type(exc).__name__, exc)

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
            if stream.request.warmup and not self._speaks_warmup():  # (a resend may meet an older server)
                stream._done = True
                self._drop(stream)
                raise _NoWarmup(f"the server at {self.url} speaks protocol revision "
                                f"{self.welcome.revision if self.welcome else 0}: it has no warm-up")
            if (stream.request.contexts or stream.request.continues) and not self.protocol.contexts:
                stream._done = True  # (v1.3; checked at each send: a resend may meet an older server)
                self._drop(stream)
                raise ClientError(f"the server at {self.url} is older than protocol v1.3: no context, no continues")
            stream._sent = True
            self._streams[sid] = stream
            stream.started_at = time.perf_counter()
            try:
                await self._send(self.protocol.request(stream.state))
                if stream.state.inputs:  # sent again (the server never saw it): so is its input
                    stream.state.sent_inputs = 0
                    await self._flush_inputs(stream)
                return
            except ConnectionClosed:
                if await self._resume_carries(stream):
                    return  # the resume lists this stream; the server asks us to resend if it missed it
                self._drop(stream)
                if attempt or self._closed_final is not None:
                    stream._done = True
                    raise


async def _nothing_listens(exc: BaseException, url: str, timeout: float) -> bool:
    """Whether a connection attempt to `url` was refused at every address of its host (a closed port): a first
    connection fails at once, no retry would find a server there. One address refused: ConnectionRefusedError.
    Several (``localhost`` may be ::1 and 127.0.0.1): asyncio joins their failures into one OSError that keeps only
    their text (no errno; Python 3.12's ``all_errors`` is not on every loop), so each address is tried again here."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    if type(exc) is not OSError or exc.errno is not None:  # (a timeout, an unreachable network: retried)
        return False
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme in ("wss", "https") else 80)
    except ValueError:
        return False
    return await _refused_everywhere(parts.hostname or "", port, timeout)


async def _refused_everywhere(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to `port` is refused at every address `host` resolves to (False at the first that
    answers, fails otherwise or takes longer than `timeout` seconds)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError):
        return False
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:
            return False
        try:
            sock.setblocking(False)
            async with asyncio.timeout(timeout):
                await loop.sock_connect(sock, address)
        except ConnectionRefusedError:
            continue
        except (OSError, TimeoutError):
            return False
        finally:
            sock.close()
        return False  # something listens there (now)
    return bool(infos)


def _refusal(response: Any, url: str) -> HandshakeRefused:
    """The error of a handshake answered with an HTTP status: the answer's text where it is short plain text (what
    lowlat-mw sends: which check refused), else a hint for the status."""
    body = bytes(response.body or b"")
    text = ""
    if response.headers.get("Content-Type", "").startswith("text/plain") and len(body) <= 500:
        text = body.decode(errors="replace").strip()
    return HandshakeRefused(response.status_code, text, path=urlsplit(url).path or "/")


class _NoWarmup(ClientError):
    """A warm-up request met a server older than protocol v1.2 (see AsyncClient.warmup)."""


def _check_warmup(options: Mapping[str, Any]) -> None:
    """The ``warmup=`` option as :meth:`AsyncClient.warmup`'s arguments: TypeError for an unknown name, and the
    Request they make must be valid (LocalProtocolError: more than one of text, messages, data)."""
    unknown = set(options) - {"text", "messages", "data", "model", "params"}
    if unknown:
        raise TypeError(f"warmup= takes text, messages, data, model and params, not {', '.join(sorted(unknown))}")
    ev.Request(stream_id=1, text=options.get("text"), data=options.get("data"), model=options.get("model", ""),
               params=dict(options.get("params") or {}), warmup=True, messages=_chat(options.get("messages")))


def _chat(messages: Sequence[Mapping[str, str] | ev.ChatMessage] | None) -> tuple[ev.ChatMessage, ...] | None:
    """Chat messages as a Request carries them (dicts with role and content, or ChatMessages)."""
    if messages is None:
        return None
    return tuple(m if isinstance(m, ev.ChatMessage) else ev.ChatMessage(role=m["role"], content=m["content"])
                 for m in messages)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def parameters_of(cls: Callable[_P, Any]) -> Callable[[Callable[..., _R]], Callable[_P, _R]]:
    """Give the decorated function `cls`'s parameters, for type checkers (a ParamSpec) and for ``help()`` and
    editors (its ``__signature__``): ``connect(url, *, mode=..., backoff=...)`` is checked like the class itself."""
    def decorate(function: Callable[..., _R]) -> Callable[_P, _R]:
        signature = inspect.signature(cls)
        function.__signature__ = signature.replace(  # type: ignore[attr-defined]
            return_annotation=inspect.signature(function).return_annotation)
        return function
    return decorate


@parameters_of(AsyncClient)
def connect(url: str, **options: Any) -> AsyncClient:
    """An :class:`AsyncClient` for `url` (its keyword options); use ``async with connect(url) as client``."""
    return AsyncClient(url, **options)
