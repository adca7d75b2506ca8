"""A small wire protocol on lowlat-mw's engine: the worked example of docs/architecture.md, "Adding a dialect".

ndjson: one JSON object per WebSocket text message, one stream at a time per connection, no handshake::

    client: {"model": "echo", "input": "hi", "params": {...}}     start a stream (params optional)
    client: {"cancel": true}                                      stop the running stream
    server: {"delta": "..."}  (bytes: {"data": base64})           its output, one message per model chunk
    server: {"done": true, "reason": "stop"}                      its end ("cancelled" after a cancel)
    server: {"error": {"code": "...", "message": "..."}, "done": true}   it failed (or could not start)
    server: {"error": {...}} and close 1003 / 1007 / 1009         a binary / non-JSON-object / too big message

No resume, no Acks, no heartbeat: an idle connection (no stream, no message for ``idle_timeout``) is closed with
4000. The machine reads no clock and does no I/O: `now` and the ids come in, frames and actions go out.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from lowlat_mw.errors import CloseCode, ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.actions import CancelStream, StartStream
from lowlat_mw.protocol.base import FrameStats, SendFrame
from lowlat_mw.protocol.dialect import Dialect, ServerMachine
from lowlat_mw.protocol.heartbeat import IdleReaper
from lowlat_mw.protocol.session import Session, normalize_chunk
from lowlat_mw.protocol.state import ConnState
from lowlat_mw.settings import Settings

__all__ = ["NDJSON", "NdjsonMachine"]


class NdjsonMachine(ServerMachine):
    """The server side of one ndjson connection (the lowlat.v1-only members are ServerMachine's defaults)."""

    def __init__(self, settings: Settings, *, subprotocol: str | None, now: float, session_id: str, secret: str,
                 **_: Any) -> None:
        self.settings = settings
        self.state = ConnState.OPEN  # no handshake: the first message is a request
        self.session_id = session_id
        self.session = Session(settings, now=now, session_id=session_id, secret=secret)
        self.subprotocol = subprotocol
        self.stats = FrameStats("ndjson")
        self.close_code: int | None = None
        self.close_reason = ""
        self.deadline_moved = False
        self.reaper = IdleReaper(settings.idle_timeout, now)
        self.running: int | None = None  # the stream running now (one at a time)
        self.last_id = 0
        self.draining = False

    # ------------------------------------------------------------------ from the client
    def receive_data(self, data: bytes | str, now: float) -> list[Any]:
        if self.state is ConnState.CLOSED:
            return []
        self.stats.count_received(len(data))
        if type(data) is not str:
            return self._refuse(ErrorCode.BAD_REQUEST, "ndjson messages are text", CloseCode.UNSUPPORTED_DATA)
        if len(data) > self.settings.max_frame_size:
            return self._refuse(ErrorCode.MESSAGE_TOO_BIG, "message exceeds max_frame_size", CloseCode.MESSAGE_TOO_BIG)
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            return self._refuse(ErrorCode.INVALID_PAYLOAD, "a message is one JSON object", CloseCode.INVALID_PAYLOAD)
        self.reaper.touch(now)
        if msg.get("cancel") is True:
            st = self.session.streams.get(self.running) if self.running is not None else None  # type: ignore[union-attr]
            return [CancelStream(st.stream_id)] if st is not None and st.move("cancel") else []
        return self._request(msg, now)

    def _request(self, msg: Mapping[str, Any], now: float) -> list[Any]:
        model, text, params = msg.get("model"), msg.get("input", ""), msg.get("params", {})
        if not isinstance(model, str) or not isinstance(text, str) or not isinstance(params, dict):
            return [self._error(ev.Error(stream_id=0, code=ErrorCode.BAD_REQUEST,
                                         message='a request is {"model": str, "input": str, "params"?: object}'))]
        if self.draining or self.running is not None:
            why = "server draining" if self.draining else "a stream is running: cancel it or wait for done"
            code = ErrorCode.DRAINING if self.draining else ErrorCode.BAD_REQUEST
            return [self._error(ev.Error(stream_id=0, code=code, message=why))]
        self.last_id += 1
        request = ev.Request(stream_id=self.last_id, model=model, text=text, params=params)
        error = self.session.start(request, now)  # type: ignore[union-attr]
        if error is not None:
            return [self._error(error)]
        self.running = request.stream_id
        return [StartStream(request)]

    # ------------------------------------------------------------------ from the engine
    def send_chunk(self, stream_id: int, chunk: Any, now: float) -> list[bytes | str]:
        session = self.session
        st = session.streams.get(stream_id)  # type: ignore[union-attr]
        if self.state is not ConnState.OPEN or st is None or st.terminal is not None:
            return []  # (no resume: output after the close is dropped)
        chunk = normalize_chunk(chunk)  # (ChunkTypeError for what no line carries: the model's failure)
        if type(chunk) is str:
            line: dict[str, Any] = {"delta": chunk}
        elif type(chunk) is bytes:
            line = {"data": base64.b64encode(chunk).decode()}
        else:
            line = {"tool_call": {"id": chunk.id, "name": chunk.name, "arguments": chunk.arguments}}
        session.record(stream_id, chunk, now)  # type: ignore[union-attr]  # (numbered; End's usage and timings)
        return [self._line(line)]

    def finish_stream(self, stream_id: int, now: float, *, reason: str = "stop",
                      timings_ms: Mapping[str, float] | None = None,
                      error: ev.Error | ev.End | None = None) -> list[Any]:
        session = self.session
        st = session.streams.get(stream_id)  # type: ignore[union-attr]
        end = session.finish(stream_id, now, reason=reason, timings_ms=timings_ms, error=error)  # type: ignore[union-attr]
        if end is None or st is None:
            return []
        session.ack(stream_id, st.seq, done=True)  # type: ignore[union-attr]  # (no resume: nothing kept for it)
        if self.running == stream_id:
            self.running = None
        self.reaper.touch(now)
        self.deadline_moved = True  # idle from now: the reaper's deadline comes before the timer's (inf)
        if self.state is not ConnState.OPEN:
            return []
        if type(end) is ev.Error:
            return [self._error(end, done=True)]
        return [SendFrame(self._line({"done": True, "reason": end.finish_reason}))]  # type: ignore[union-attr]

    # ------------------------------------------------------------------ time and teardown
    def next_deadline(self, answered: bool = False) -> float:
        if self.state is ConnState.CLOSED:
            return float("inf")
        return self.reaper.deadline(self.session.active)  # type: ignore[union-attr]

    def tick(self, now: float) -> list[Any]:
        if self.state is ConnState.OPEN and self.reaper.expired(now, self.session.active):  # type: ignore[union-attr]
            return self.close(CloseCode.IDLE_TIMEOUT, "idle")
        return []

    def drain(self, reconnect_after_ms: int = 0) -> list[Any]:
        self.draining = True  # (new requests are refused; the running one finishes, then the driver closes 4002)
        return []

    # ------------------------------------------------------------------ framing
    def _line(self, obj: Mapping[str, Any]) -> str:
        data = json.dumps(obj, separators=(",", ":"))
        self.stats.count_sent(0, len(data), len(data))
        return data

    def _error(self, error: ev.Error, done: bool = False) -> SendFrame:
        line: dict[str, Any] = {"error": {"code": error.code.wire_name, "message": error.message}}
        if done:
            line["done"] = True
        return SendFrame(self._line(line), error)  # (the driver counts and logs the Error)

    def _refuse(self, code: ErrorCode, message: str, close: int) -> list[Any]:
        return [self._error(ev.Error(stream_id=0, code=code, message=message)), *self.close(close, message)]


NDJSON = Dialect("ndjson", NdjsonMachine, subprotocols=("ndjson",))
"""The dialect's record: route it with ``LowLatASGI(model, dialects={"/ndjson": NDJSON})``."""
