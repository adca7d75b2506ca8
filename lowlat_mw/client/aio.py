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
import ssl as ssl_module
import time
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

import websockets
from websockets.asyncio.client import ClientConnection

from ..errors import ClientError, ConnectionClosed, ErrorCode
from ..observability.timing import STAGES
from ..protocol import events as ev
from ..protocol.base import CloseConnection, SendFrame
from ..protocol.client import ClientProtocol, ClientStream, StreamBroken
from ..protocol.selector import CompressionSelector
from ..runtime.timers import cpu_clock
from ..settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO
from .backoff import Backoff
from .documents import ContextDocuments, Document
from .push import PushGroups
from .reconnect import Reconnecting
from .websocket import _close_ws, _Closed, _keep_running

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


class AsyncClient(Reconnecting, PushGroups, ContextDocuments):
    """A lowlat-mw connection with many concurrent streams; reconnects between requests and resumes. (Its connection
    lifecycle is :class:`~lowlat_mw.client.reconnect.Reconnecting`, its push groups
    :class:`~lowlat_mw.client.push.PushGroups`, its context documents
    :class:`~lowlat_mw.client.documents.ContextDocuments`.)"""

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
        self._init_connection(url, ssl=ssl, headers=headers, backoff=backoff, open_timeout=open_timeout,
                              resume=resume, max_pending=max_pending)
        self.mode = mode
        self.subprotocol = SUBPROTOCOL_PROTO if mode == "proto" else SUBPROTOCOL_JSON
        self.protocol = ClientProtocol(
            self.subprotocol, compression=None if compression is None else tuple(compression), flow_window=flow_window,
            max_frame_size=max_frame_size, max_decompressed_size=max_decompressed_size,
            heartbeat_timeout=heartbeat_timeout, answer_pings=answer_pings, auth=auth, meter=cpu_clock,
            history=history)
        self.codec = self.protocol.codec
        self.offered = self.protocol.offered
        self.max_frame_size = max_frame_size
        self.max_decompressed_size = max_decompressed_size
        self.answer_pings = answer_pings
        self.heartbeat_timeout = heartbeat_timeout
        self.flow_window = flow_window
        self.auth = auth
        self._init_pushes(max_pushes)
        self._streams: dict[int, Stream] = {}  # streams waiting for their events, by id
        self._ids = itertools.count(1)
        self._pings: dict[int, asyncio.Future[float]] = {}
        self._ping_ids = itertools.count(1 << 31)  # apart from the heartbeat's own ids
        self._io_tasks: set[asyncio.Task[Any]] = set()
        # Sent as a warm-up request (see warmup()) when a connection starts a new session: its arguments, checked
        # here (a wrong name or a bad combination is this call's TypeError or LocalProtocolError, not a failure later).
        self.warmup_request: Mapping[str, Any] | None = None if warmup is None else dict(warmup)
        if self.warmup_request is not None:
            _check_warmup(self.warmup_request)
        self.warmups = 0  # warm-up requests the server ran
        self._init_documents()

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
            proto.deadline_seen()
            timer.scheduler.schedule(timer, proto.next_deadline())

    def _drop(self, stream: Stream) -> None:
        """`stream` is over for this client: no resume will ask for it."""
        if self._streams.get(stream.stream_id) is stream:
            del self._streams[stream.stream_id]
            self.protocol.forget(stream.stream_id)

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
