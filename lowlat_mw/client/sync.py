"""The blocking Python client: :class:`SyncClient` runs an :class:`~lowlat_mw.client.aio.AsyncClient` on
its own event loop in a helper thread.

    with connect_sync("ws://127.0.0.1:8000/ws") as client:
        for chunk in client.stream("hello"):
            print(chunk, end="")
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar, overload

from ..errors import ClientError
from ..protocol import events as ev
from ..protocol.client import ClientProtocol, ClientStream
from ..protocol.context import ClientDocument
from ..protocol.events import ChatMessage, Delta, End, Push, ToolCall
from ..protocol.selector import CompressionSelector
from ..protocol.wire import WireCodec
from .aio import AsyncClient, Document, Stream, StreamTimings, _Closed, _text_of, parameters_of
from .backoff import Backoff

__all__ = ["SyncClient", "SyncDocument", "SyncStream", "connect_sync"]

_T = TypeVar("_T")


class _Mirror(Generic[_T]):
    """A public attribute of the async object a blocking one wraps (its ``_async``), read and written through: the
    blocking classes have the async ones' attributes (tests/test_client_api.py compares the two APIs)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Mirror[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...
    def __get__(self, obj: object, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj._async, self.name)  # type: ignore[attr-defined]

    def __set__(self, obj: object, value: _T) -> None:
        setattr(obj._async, self.name, value)  # type: ignore[attr-defined]  # (a read-only one: AttributeError)


class SyncStream:
    """A streamed reply of the blocking client: iterate it for its chunks (leaving the ``for`` loop early, or
    :meth:`close`, cancels it; ``next(stream)`` reads one chunk); :meth:`send`, :meth:`send_result` and
    :meth:`end_input` give a running model more input (protocol v1.3). The attributes and methods of
    :class:`~lowlat_mw.client.aio.Stream`, blocking (``close`` for ``aclose``)."""

    request = _Mirror[ev.Request]()
    stream_id = _Mirror[int]()
    tools = _Mirror[Mapping[str, Callable[..., Any]] | None]()
    state = _Mirror[ClientStream]()
    end = _Mirror[End | None]()
    started_at = _Mirror[float]()
    first_delta_at = _Mirror[float | None]()
    finished_at = _Mirror[float | None]()
    last_seq = _Mirror[int]()
    received_seq = _Mirror[int]()
    time_to_first_delta = _Mirror[float | None]()
    total_time = _Mirror[float | None]()
    timings = _Mirror[StreamTimings]()

    def __init__(self, client: SyncClient, stream: Stream) -> None:
        self._client = client
        self._async = self.stream = stream
        self._chunks: Iterator[str | bytes | ToolCall] | None = None  # what next(stream) reads from

    def __iter__(self) -> Iterator[str | bytes | ToolCall]:
        """The chunks as they arrive; leaving the loop early (break, an exception) cancels the stream."""
        return self._client._pump(self.stream, self.stream)

    def __next__(self) -> str | bytes | ToolCall:
        if self._chunks is None:
            self._chunks = iter(self)
        return next(self._chunks)

    def close(self) -> None:
        """Stop reading: the stream is cancelled if it still runs (returns once the Cancel is sent)."""
        self._client._stop(self.stream)
        if self._chunks is not None:
            self._chunks.close()

    def cancel(self) -> None:
        """Ask the server to stop the stream; reading on gives what was in flight, then the end (``cancelled``)."""
        self._client._call_soon(self.stream.cancel())

    def text(self) -> str:
        """Read the whole stream and return its text (an unanswered tool call: ClientError, and it is cancelled)."""
        return "".join(_text_of(c) for c in self)

    def events(self) -> Iterator[Delta | End]:
        """The stream as typed events: each Delta, then the End (:meth:`Stream.events
        <lowlat_mw.client.aio.Stream.events>`)."""
        return self._client._pump(self.stream, self.stream.events())

    def send(self, item: str | bytes, *, end: bool = False) -> None:
        """More input for the running model (text or bytes); `end`: the last of it."""
        self._client._call_soon(self.stream.send(item, end=end))

    def send_result(self, call: ToolCall | str, content: Any, *, is_error: bool = False, end: bool = False) -> None:
        """Answer the model's tool call `call` with `content` (a str, else JSON)."""
        self._client._call_soon(self.stream.send_result(call, content, is_error=is_error, end=end))

    def end_input(self) -> None:
        """No more input for this stream."""
        self._client._call_soon(self.stream.end_input())


class SyncClient:
    """Blocking wrapper around :class:`AsyncClient`, running its event loop in a helper thread: the same public
    attributes and methods, blocking (tests/test_client_api.py compares the two), plus :attr:`client`,
    :attr:`last_stream` and :meth:`events`."""

    # AsyncClient's attributes, read through (its options, and the connection's state: welcome, rtt, ...)
    url = _Mirror[str]()
    ssl = _Mirror[ssl_module.SSLContext | None]()
    mode = _Mirror[Literal["proto", "json"]]()
    subprotocol = _Mirror[str]()
    protocol = _Mirror[ClientProtocol]()
    codec = _Mirror[WireCodec]()
    offered = _Mirror[tuple[str, ...]]()
    backoff = _Mirror[Backoff]()
    open_timeout = _Mirror[float]()
    max_frame_size = _Mirror[int]()
    max_decompressed_size = _Mirror[int]()
    headers = _Mirror[dict[str, str]]()
    answer_pings = _Mirror[bool]()
    heartbeat_timeout = _Mirror[float]()
    flow_window = _Mirror[int]()
    resume_enabled = _Mirror[bool]()
    max_pending = _Mirror[int]()
    max_pushes = _Mirror[int]()
    auth = _Mirror[str]()
    resumes = _Mirror[int]()
    last_close = _Mirror[_Closed | None]()
    groups = _Mirror[set[str]]()
    pushes_dropped = _Mirror[int]()
    warmup_request = _Mirror[Mapping[str, Any] | None]()
    warmups = _Mirror[int]()
    welcome = _Mirror[ev.Welcome | None]()
    goaway = _Mirror[ev.GoAway | None]()
    last_error = _Mirror[ev.Error | None]()
    compressor = _Mirror[CompressionSelector | None]()
    connections = _Mirror[int]()
    rtt = _Mirror[float | None]()
    connected = _Mirror[bool]()

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lowlat-mw-client", daemon=True)
        self._thread.start()
        self._async: AsyncClient = self._call_soon(self._make(url, kwargs))
        self.last_stream: Stream | None = None

    async def _make(self, url: str, kwargs: dict[str, Any]) -> AsyncClient:
        return AsyncClient(url, **kwargs)

    def _call_soon(self, coro: Any, timeout: float | None = None) -> Any:
        if self._loop.is_closed():
            coro.close()
            raise ClientError("client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()  # (interrupted, e.g. Ctrl-C, or timed out: the coroutine does not run on unattended)
            raise

    @property
    def client(self) -> AsyncClient:
        """The underlying async client."""
        return self._async

    def __enter__(self) -> SyncClient:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Connect (with retries)."""
        self._call_soon(self._async.open())

    def ping(self, timeout: float = 5.0) -> float:
        """Round-trip time of a Ping, in seconds."""
        return self._call_soon(self._async.ping(timeout))  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the connection (streams still open end with ConnectionClosed), then stop the helper thread: in this
        order, so that nothing is left to run on the closed loop (a stream's iterator dropped later touches nothing)."""
        if self._loop.is_closed():
            return
        try:
            self._call_soon(self._async.close(), timeout=10)
            self._call_soon(self._loop.shutdown_asyncgens(), timeout=10)  # (Stream.events() left unfinished)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def stream(
        self,
        text: str | None = None,
        *,
        messages: Sequence[Mapping[str, str] | ChatMessage] | None = None,
        data: bytes | None = None,
        model: str = "",
        params: Mapping[str, Any] | None = None,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        context: Sequence[SyncDocument | Document | str] = (),
        continues: SyncStream | Stream | int = 0,
    ) -> SyncStream:
        """Start a request (:meth:`AsyncClient.stream <lowlat_mw.client.aio.AsyncClient.stream>`) and return it as a
        :class:`SyncStream`: iterate it for its chunks as they arrive (leaving the loop early cancels it); it also
        takes input. ``last_stream`` is it once it ended (pass it as ``continues=`` to continue it)."""
        return SyncStream(self, self._stream(text, messages=messages, data=data, model=model, params=params,
                                             tools=tools, context=context, continues=continues))

    def _stream(self, text: str | None, **kwargs: Any) -> Stream:
        docs = kwargs["context"]
        kwargs["context"] = [d.document if isinstance(d, SyncDocument) else d for d in docs]
        if isinstance(kwargs["continues"], SyncStream):
            kwargs["continues"] = kwargs["continues"].stream
        return self._async.stream(text, **kwargs)

    def events(self, text: str | None = None, **kwargs: Any) -> Iterator[Delta | End]:
        """Start a request and yield its typed events as they arrive: each Delta, then the End
        (:meth:`Stream.events <lowlat_mw.client.aio.Stream.events>`; ``stream(...)`` options)."""
        return self.stream(text, **kwargs).events()

    def _pump(self, stream: Stream, source: AsyncIterator[_T]) -> Iterator[_T]:
        """`source`'s items (of `stream`), each awaited on the client's loop; left early (the generator closed or
        dropped), the stream is cancelled without waiting: a finalizer may run this, after :meth:`close`."""
        try:
            while True:
                try:
                    item = self._call_soon(source.__anext__())
                except StopAsyncIteration:
                    self.last_stream = stream
                    return
                yield item
        finally:
            stream._abandon_soon()

    def _stop(self, stream: Stream) -> None:
        """Stop reading `stream`: its Cancel is sent if it still runs (returns once it is)."""
        if not stream._done and not self._loop.is_closed():
            self._call_soon(stream.aclose(), timeout=10)

    def complete(self, text: str | None = None, **kwargs: Any) -> str:
        """Run a request and return the whole reply as text (:meth:`stream`'s options)."""
        return self.stream(text, **kwargs).text()

    def warmup(
        self,
        text: str | None = None,
        *,
        messages: Sequence[Mapping[str, str] | ChatMessage] | None = None,
        data: bytes | None = None,
        model: str = "",
        params: Mapping[str, Any] | None = None,
    ) -> End | None:
        """Have the server warm the model up for this input and wait until it has (:meth:`AsyncClient.warmup
        <lowlat_mw.client.aio.AsyncClient.warmup>`): its End, or None against a server older than protocol v1.2."""
        return self._call_soon(  # type: ignore[no-any-return]
            self._async.warmup(text, messages=messages, data=data, model=model, params=params))

    def context(self, name: str, text: str = "") -> SyncDocument:
        """The session's context document `name` with `text` as its whole text (:meth:`AsyncClient.context
        <lowlat_mw.client.aio.AsyncClient.context>`); pass it to ``stream(..., context=[doc])``."""
        return SyncDocument(self, self._call_soon(self._async.context(name, text)))

    def subscribe(self, group: str, timeout: float = 10.0) -> None:
        """Join push group `group` (:meth:`AsyncClient.subscribe <lowlat_mw.client.aio.AsyncClient.subscribe>`)."""
        self._call_soon(self._async.subscribe(group, timeout))

    def unsubscribe(self, group: str, timeout: float = 10.0) -> None:
        """Leave push group `group`."""
        self._call_soon(self._async.unsubscribe(group, timeout))

    def next_push(self, timeout: float | None = None) -> Push:
        """The next push, waiting up to `timeout` seconds (:meth:`AsyncClient.next_push
        <lowlat_mw.client.aio.AsyncClient.next_push>`)."""
        return self._call_soon(self._async.next_push(timeout))  # type: ignore[no-any-return]

    def pushes(self) -> Iterator[Push]:
        """Every push, as it arrives (blocking between them)."""
        while True:
            yield self.next_push()


class SyncDocument:
    """A context document of a :class:`SyncClient` (:class:`~lowlat_mw.client.aio.Document`, blocking)."""

    name = _Mirror[str]()
    text = _Mirror[str]()
    version = _Mirror[int]()
    synced = _Mirror[bool]()
    state = _Mirror[ClientDocument]()

    def __init__(self, client: SyncClient, doc: Document) -> None:
        self._client = client
        self._async = self.document = doc

    def set(self, text: str) -> None:
        """Replace the whole text."""
        self._client._call_soon(self.document.set(text))

    def patch(self, offset: int, length: int, text: str) -> None:
        """Replace `length` characters at character `offset` with `text`."""
        self._client._call_soon(self.document.patch(offset, length, text))

    def replace(self, old: str, new: str) -> None:
        """Replace the first occurrence of `old` with `new`."""
        self._client._call_soon(self.document.replace(old, new))

    def drop(self) -> None:
        """Forget the document here and on the server."""
        self._client._call_soon(self.document.drop())

    def wait_synced(self, timeout: float | None = 10.0) -> None:
        """Wait until the server acknowledged the current version."""
        self._client._call_soon(self.document.wait_synced(timeout))


@parameters_of(AsyncClient)
def connect_sync(url: str, **options: Any) -> SyncClient:
    """A :class:`SyncClient` for `url` (the same keyword options as :func:`~lowlat_mw.client.connect`); use
    ``with connect_sync(url) as client``."""
    return SyncClient(url, **options)
