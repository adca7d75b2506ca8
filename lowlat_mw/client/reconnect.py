"""The client's connection lifecycle: open it (with backoff retries), shake hands and restore the session's state
on it (documents, groups, inputs, the warm-up), read it, and after a drop reconnect and resume the open streams,
or fail them. :class:`~lowlat_mw.client.aio.AsyncClient` is built on it."""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import time
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from ..errors import ClientError, ConnectionClosed, ReconnectFailed, StreamError, close_code_reconnects
from ..protocol import events as ev
from ..protocol.base import CloseConnection
from .backoff import Backoff
from .websocket import _close_ws, _Closed, _Connection, _keep_running, _nothing_listens, _refusal, _Timer

if TYPE_CHECKING:
    from .aio import Stream


class Reconnecting:
    """The part of :class:`~lowlat_mw.client.aio.AsyncClient` that owns its WebSocket: opening, reading, closing,
    and reconnecting to resume after a drop (the protocol machine decides what a resume asks for)."""

    def _init_connection(self, url: str, *, ssl: ssl_module.SSLContext | None, headers: Mapping[str, str] | None,
                         backoff: Backoff | None, open_timeout: float, resume: bool, max_pending: int) -> None:
        """The connection's options (the client's of the same names) and its state before the first one opens."""
        self.url = url
        self.ssl = ssl  # TLS context for wss:// (None: the system trust store)
        self.headers = dict(headers or {})
        self.backoff = backoff or Backoff()
        self.open_timeout = open_timeout
        self.resume_enabled = resume
        self.max_pending = max_pending
        self.resumes = 0  # how many times a dropped session was resumed
        self._resuming: asyncio.Task[None] | None = None
        self._pending = 0
        self._timer: _Timer | None = None
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closed_final: ConnectionClosed | None = None
        self._user_closed = False
        self.last_close: _Closed | None = None

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
        """Connect, retrying with backoff what may pass (a timeout, a reset, a 502/503/504); a refusal, or nothing
        listening at a first connection, fails at once."""
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
        """Open one connection, shake hands (resuming the session if `resume`) and restore on it what the client
        keeps for its session: documents, inputs, the warm-up of a new session, push groups."""
        ws = await self._open_ws()
        proto = self.protocol
        first = await self._handshake(ws, resume)
        sent = await self._documents_welcomed(ws, first)
        self._ws = ws
        self._documents_changed_since(sent)
        self.last_close = None
        self._timer = _Timer(self, ws)
        self._reader = asyncio.get_running_loop().create_task(self._read_loop(ws))
        for stream in list(self._streams.values()):  # (v1.3) the Inputs the server lacks (Welcome.input_seq)
            if stream.state.inputs:
                _keep_running(self._io_tasks, self._flush_inputs(stream))
        if self.warmup_request is not None and not (first.resumed and resume):  # a new session: maybe a new process
            _keep_running(self._io_tasks, self._warm_new_session())
        if self.groups and proto.pushes:  # a new session is in none; a resumed one may have lost the last one
            self._rejoin_groups(ws)

    async def _handshake(self, ws: ClientConnection, resume: bool) -> ev.Welcome:
        """Send the Hello on the just opened `ws` and return the server's Welcome; anything else closes `ws` and
        raises (an Error as StreamError, no Welcome as ConnectionClosed)."""
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
        return first

    async def _read_loop(self, ws: ClientConnection) -> None:
        """Hand each message of `ws` to the client until it closes; then resume in the background or fail what
        waits on it (streams, Subscribes, a reader of pushes)."""
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
        """End every waiting stream, and the pushes, with `why` (the connection is over for good)."""
        for stream in list(self._streams.values()):
            stream._put(why)
            self._drop(stream)
        if self.groups or self._push_waiter is not None:  # a reader of pushes learns the connection is over
            self._pushed(why if isinstance(why, BaseException) else ConnectionClosed(why.code, why.reason))

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
