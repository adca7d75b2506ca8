"""The client's context documents (protocol v1.3): :class:`Document`, and the part of the client that makes them
and sends their changes (:class:`ContextDocuments`, which :class:`~lowlat_mw.client.aio.AsyncClient` is built on).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..errors import ClientError, ConnectionClosed, StreamError
from ..protocol import events as ev
from ..protocol.context import ClientDocument
from .websocket import _keep_running

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from .aio import AsyncClient


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


class ContextDocuments:
    """The part of :class:`~lowlat_mw.client.aio.AsyncClient` that holds the session's context documents and sends
    their changes (the connection sends them again to a session without them: :mod:`lowlat_mw.client.reconnect`)."""

    def _init_documents(self) -> None:
        """No document yet."""
        self._documents: dict[str, Document] = {}  # context documents (v1.3): sent again to a session without them
        self._dropped: dict[str, int] = {}  # the last version of each document dropped, by name

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

    async def _documents_welcomed(self, ws: ClientConnection, welcome: ev.Welcome) -> dict[str, int]:
        """Send on the new connection `ws` each document its session lacks (a new session holds none, a resumed one
        the versions its Welcome lists) before anything else; return the version each was sent at."""
        sent: dict[str, int] = {}
        proto = self.protocol
        if self._documents and proto.contexts:  # (v1.3) a session without a document's version gets its whole text
            held = welcome.contexts if welcome.resumed else {}
            for doc in list(self._documents.values()):
                message = doc.state.welcomed(held)
                if message is not None:
                    await self._send_quietly(ws, proto.context(message))
                sent[doc.name] = doc.state.version
        return sent

    def _documents_changed_since(self, sent: dict[str, int]) -> None:
        """Send the whole text of each document changed while :meth:`_documents_welcomed` sent (not connected yet
        then, so its change was not sent)."""
        for doc in list(self._documents.values()):  # (changed while the above went out, not connected yet: its
            if sent.get(doc.name, doc.state.version) != doc.state.version:  # change was not sent, so its whole text)
                _keep_running(self._io_tasks, self._send_context(doc, doc.state.set(doc.state.text)))
