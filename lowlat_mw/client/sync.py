"""The blocking Python client: :class:`SyncClient` runs an :class:`~lowlat_mw.client.aio.AsyncClient` on
its own event loop in a helper thread.

    with connect_sync("ws://127.0.0.1:8000/ws") as client:
        for chunk in client.stream("hello"):
            print(chunk, end="")
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

from ..protocol.events import Delta, End, Push, ToolCall
from .aio import AsyncClient, Document, Stream, _text_of, parameters_of

__all__ = ["SyncClient", "SyncDocument", "SyncStream", "connect_sync"]

_T = TypeVar("_T")


class SyncStream(Iterator["str | bytes | ToolCall"]):
    """A streamed reply of the blocking client: iterate it for its chunks (stopping early, or :meth:`close`,
    cancels it); :meth:`send`, :meth:`send_result` and :meth:`end_input` give a running model more input
    (protocol v1.3: :class:`~lowlat_mw.client.aio.Stream`'s methods of those names)."""

    def __init__(self, client: SyncClient, stream: Stream) -> None:
        self._client = client
        self.stream = stream
        self._chunks = client._pump(stream, stream)

    def __iter__(self) -> SyncStream:
        return self

    def __next__(self) -> str | bytes | ToolCall:
        return next(self._chunks)

    def close(self) -> None:
        """Stop reading: the stream is cancelled if it still runs."""
        self._chunks.close()

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
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()  # (interrupted, e.g. Ctrl-C, or timed out: the coroutine does not run on unattended)
            raise

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
        return self._call_soon(self._client.ping(timeout))  # type: ignore[no-any-return]

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

    def stream(self, text: str | None = None, **kwargs: Any) -> SyncStream:
        """Start a request and yield its chunks as they arrive (a :class:`SyncStream`, which also takes input;
        ``last_stream`` is it, once it ended: pass it as ``continues=`` to continue it)."""
        return SyncStream(self, self._client.stream(text, **_unwrapped(kwargs)))

    def events(self, text: str | None = None, **kwargs: Any) -> Iterator[Delta | End]:
        """Start a request and yield its typed events as they arrive: each Delta, then the End
        (:meth:`Stream.events <lowlat_mw.client.aio.Stream.events>`)."""
        stream = self._client.stream(text, **_unwrapped(kwargs))
        return self._pump(stream, stream.events())

    def _pump(self, stream: Stream, source: AsyncIterator[_T]) -> Iterator[_T]:
        """`source`'s items (of `stream`), each awaited on the client's loop; stopping early cancels the stream."""
        try:
            while True:
                try:
                    item = self._call_soon(source.__anext__())
                except StopAsyncIteration:
                    self.last_stream = stream
                    return
                yield item
        finally:
            try:
                if source is not stream:
                    self._call_soon(source.aclose(), timeout=10)  # type: ignore[attr-defined]
            except RuntimeError:  # interrupted inside it: "asynchronous generator is already running"
                pass
            finally:
                if not stream._done:
                    self._call_soon(stream.aclose(), timeout=10)

    def complete(self, text: str | None = None, **kwargs: Any) -> str:
        """Run a request and return the whole reply as text."""
        return "".join(_text_of(c) for c in self.stream(text, **kwargs))

    def warmup(self, text: str | None = None, **kwargs: Any) -> End | None:
        """Have the server warm the model up for this input and wait until it has (:meth:`AsyncClient.warmup
        <lowlat_mw.client.aio.AsyncClient.warmup>`): its End, or None against a server older than protocol v1.2."""
        return self._call_soon(self._client.warmup(text, **kwargs))  # type: ignore[no-any-return]

    def context(self, name: str, text: str = "") -> SyncDocument:
        """The session's context document `name` with `text` as its whole text (:meth:`AsyncClient.context
        <lowlat_mw.client.aio.AsyncClient.context>`); pass it to ``stream(..., context=[doc])``."""
        return SyncDocument(self, self._call_soon(self._client.context(name, text)))

    def subscribe(self, group: str, timeout: float = 10.0) -> None:
        """Join push group `group` (:meth:`AsyncClient.subscribe <lowlat_mw.client.aio.AsyncClient.subscribe>`)."""
        self._call_soon(self._client.subscribe(group, timeout))

    def unsubscribe(self, group: str, timeout: float = 10.0) -> None:
        """Leave push group `group`."""
        self._call_soon(self._client.unsubscribe(group, timeout))

    def next_push(self, timeout: float | None = None) -> Push:
        """The next push, waiting up to `timeout` seconds (:meth:`AsyncClient.next_push
        <lowlat_mw.client.aio.AsyncClient.next_push>`)."""
        return self._call_soon(self._client.next_push(timeout))  # type: ignore[no-any-return]

    def pushes(self) -> Iterator[Push]:
        """Every push, as it arrives (blocking between them)."""
        while True:
            yield self.next_push()


class SyncDocument:
    """A context document of a :class:`SyncClient` (:class:`~lowlat_mw.client.aio.Document`, blocking)."""

    def __init__(self, client: SyncClient, doc: Document) -> None:
        self._client = client
        self.document = doc

    @property
    def name(self) -> str:
        """The document's name in the session."""
        return self.document.name

    @property
    def text(self) -> str:
        """The current text."""
        return self.document.text

    @property
    def version(self) -> int:
        """The current version."""
        return self.document.version

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


def _unwrapped(kwargs: dict[str, Any]) -> dict[str, Any]:
    """stream() options with SyncDocuments as the Documents they wrap."""
    if kwargs.get("context"):
        kwargs["context"] = [d.document if isinstance(d, SyncDocument) else d for d in kwargs["context"]]
    return kwargs


@parameters_of(AsyncClient)
def connect_sync(url: str, **options: Any) -> SyncClient:
    """A :class:`SyncClient` for `url` (the same keyword options as :func:`~lowlat_mw.client.connect`); use
    ``with connect_sync(url) as client``."""
    return SyncClient(url, **options)
