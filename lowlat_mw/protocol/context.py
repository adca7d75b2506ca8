"""Sans-IO incremental context (protocol v1.3): a session's named documents and its kept turns.

A client creates a document once (``Context{base_version: 0, text}``) and then patches it
(``Context{base_version, patches}``: UTF-8 byte offsets, applied in order), each message naming the version it
makes and the SHA-256 of the text it results in; the server checks both and answers ``ContextAck``. A Request
names the documents its model gets (``Request.contexts``) and may continue an earlier stream of the session
(``Request.continues``): the model then gets that stream's turn and the turns it continued, as kept here.

Everything is bounded per session (settings ``max_contexts``, ``max_context_bytes``, ``history_size``); a
refused Context leaves the server without that document, so a client recovers by sending its whole text again
(docs/protocol.md section 19). Hashing the bytes given is all the I/O there is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ErrorCode
from ..settings import Settings
from . import events as ev

__all__ = ["MAX_CONTEXT_NAME", "ClientDocument", "ContextDocument", "SessionContext", "Turn", "sha256"]

MAX_CONTEXT_NAME = 200  # characters of a document's name
MAX_TURNS = 64  # turns kept per session, newest kept (history_size bounds their bytes)
MAX_PATCHES = 256  # patches kept for the model between two requests naming a document; past it: None (read .text)
MAX_PATCH_BYTES = 64 * 1024  # ... and their text's bytes
MAX_PATCHES_PER_CONTEXT = 1024  # patches in one Context message (each costs a move of the text's tail)


def sha256(data: bytes | bytearray | memoryview) -> bytes:
    """SHA-256 of `data` (a document's UTF-8 text), as Context.sha256 carries it."""
    return hashlib.sha256(data).digest()


@dataclass(frozen=True, slots=True)
class ContextDocument:
    """A context document as a model gets it (``req.context[name]``)."""

    name: str
    version: int
    text: str
    patches: tuple[ev.ContextPatch, ...] | None = None
    """The patches applied since the last request that named this document (UTF-8 byte offsets, in order), or
    None when its whole text was set since (or too many patches came: read ``text``)."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier stream of the session as a continued request's model gets it (``req.history``)."""

    stream_id: int
    output: str
    text: str | None = None
    messages: tuple[ev.ChatMessage, ...] | None = None
    data: bytes | None = None

    @property
    def prompt(self) -> str:
        """The turn's input as text: `text`, or the last message's content, or decoded `data`."""
        if self.text is not None:
            return self.text
        if self.messages:
            return self.messages[-1].content
        return self.data.decode("utf-8", "replace") if self.data is not None else ""


class _Document:
    __slots__ = ("data", "patched", "patched_bytes", "text", "version")

    def __init__(self, data: bytearray, version: int) -> None:
        self.data = data
        self.version = version
        self.text: str | None = None  # `data` decoded, until the next change
        self.patched: list[ev.ContextPatch] | None = None  # since the last request took it (None: set whole)
        self.patched_bytes = 0


class _Kept:
    __slots__ = ("parent", "serial", "size", "turn")

    def __init__(self, turn: Turn, serial: int, parent: tuple[int, int] | None, size: int) -> None:
        self.turn, self.serial, self.parent, self.size = turn, serial, parent, size


Given = tuple[Mapping[str, ContextDocument], tuple[Turn, ...], "tuple[int, int] | None"]


class SessionContext:
    """One session's context documents and kept turns (made on the session's first use of either)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.documents: dict[str, _Document] = {}
        self.size = 0  # UTF-8 bytes of every document
        self.turns: dict[int, _Kept] = {}  # by stream id, oldest first
        self.turns_size = 0
        self._serial = 0
        self.given: dict[int, Given] = {}  # what a started stream's model gets, until the driver takes it

    # ------------------------------------------------------------------ documents
    def versions(self) -> dict[str, int]:
        """Name -> version of every document held (Welcome.contexts)."""
        return {name: doc.version for name, doc in self.documents.items()}

    def text_of(self, name: str) -> str | None:
        """The current text of document `name` (None: not held)."""
        doc = self.documents.get(name)
        return None if doc is None else _text(doc)

    def _drop(self, name: str) -> None:
        doc = self.documents.pop(name, None)
        if doc is not None:
            self.size -= len(doc.data)

    def _refuse(self, msg: ev.Context, code: ErrorCode, message: str) -> ev.ContextAck:
        self._drop(msg.name)  # after a refusal the server holds no such document: the client sends it whole
        return ev.ContextAck(name=msg.name[:MAX_CONTEXT_NAME], version=msg.version, code=code, message=message)

    def apply(self, msg: ev.Context) -> ev.ContextAck:
        """Set, patch or drop a document as `msg` says: the ContextAck to send (refused: code and message)."""
        name = msg.name
        if not name or len(name) > MAX_CONTEXT_NAME or not name.isprintable():
            return self._refuse(msg, ErrorCode.BAD_REQUEST,
                                f"a context name is 1 to {MAX_CONTEXT_NAME} characters, no control characters")
        if msg.drop:
            self._drop(name)
            return ev.ContextAck(name=name, version=msg.version)
        if not msg.version:
            return self._refuse(msg, ErrorCode.BAD_REQUEST, "a Context's version is > 0")
        doc = self.documents.get(name)
        if not msg.base_version:  # the whole text
            return self._replace(msg, doc)
        return self._patch(msg, doc)

    def _replace(self, msg: ev.Context, doc: _Document | None) -> ev.ContextAck:
        """Set document `msg.name` to `msg`'s whole text (`doc`: the one held now), within the session's limits."""
        name, s = msg.name, self.settings
        if msg.patches:
            return self._refuse(msg, ErrorCode.BAD_REQUEST, "patches need the base_version they apply to")
        if doc is None and len(self.documents) >= s.max_contexts:
            return self._refuse(msg, ErrorCode.CONTEXT_LIMIT,
                                f"a session holds at most {s.max_contexts} context documents (max_contexts)")
        data = bytearray(msg.text.encode("utf-8"))
        held = self.size - (len(doc.data) if doc is not None else 0)
        if held + len(data) > s.max_context_bytes:
            return self._refuse(msg, ErrorCode.CONTEXT_LIMIT, f"context documents over {s.max_context_bytes} "
                                                              f"bytes in this session (max_context_bytes)")
        if msg.sha256 and sha256(data) != msg.sha256:
            return self._refuse(msg, ErrorCode.CONTEXT_MISMATCH, f"sha256 of {name!r} does not match its text")
        self._drop(name)
        self.documents[name] = _Document(data, msg.version)
        self.size += len(data)
        return ev.ContextAck(name=name, version=msg.version)

    def _patch(self, msg: ev.Context, doc: _Document | None) -> ev.ContextAck:
        """Apply `msg`'s patches to `doc` (the document held as `msg.name`), which must be at `msg.base_version`;
        a refused patch leaves no document (the client then sends the whole text)."""
        name, s = msg.name, self.settings
        if doc is None:
            return self._refuse(msg, ErrorCode.CONTEXT_MISMATCH, f"no context document {name!r} in this session: "
                                                                 f"send its whole text")
        if doc.version != msg.base_version:
            return self._refuse(msg, ErrorCode.CONTEXT_MISMATCH, f"{name!r} is at version {doc.version}, "
                                                                 f"not base_version {msg.base_version}")
        if msg.text:
            return self._refuse(msg, ErrorCode.BAD_REQUEST, "a Context carries text (base_version 0) or patches")
        if len(msg.patches) > MAX_PATCHES_PER_CONTEXT:
            return self._refuse(msg, ErrorCode.BAD_REQUEST, f"a Context carries at most {MAX_PATCHES_PER_CONTEXT} "
                                                            f"patches (send the whole text instead)")
        data = doc.data
        del self.documents[name]  # out while it changes: a refusal leaves it out (patched in place)
        self.size -= len(data)
        room = s.max_context_bytes - self.size
        for i, patch in enumerate(msg.patches):
            start, end, size = patch.offset, patch.offset + patch.length, len(data)
            if end > size:
                return self._refuse(msg, ErrorCode.BAD_REQUEST, f"patch {i} ({patch.offset}+{patch.length}) is "
                                                                f"outside the text of {size} bytes")
            if (start < size and data[start] & 0xC0 == 0x80) or (end < size and data[end] & 0xC0 == 0x80):
                return self._refuse(msg, ErrorCode.BAD_REQUEST, f"patch {i} splits a UTF-8 character")
            new = patch.text.encode("utf-8")
            if size - patch.length + len(new) > room:
                return self._refuse(msg, ErrorCode.CONTEXT_LIMIT, f"context documents over {s.max_context_bytes} "
                                                                  f"bytes in this session (max_context_bytes)")
            data[start:end] = new
            if doc.patched is not None:
                doc.patched.append(patch)
                doc.patched_bytes += len(new)
        if msg.sha256 and sha256(data) != msg.sha256:
            return self._refuse(msg, ErrorCode.CONTEXT_MISMATCH, f"sha256 of {name!r} does not match after the "
                                                                 f"patches")
        self.documents[name] = doc
        self.size += len(data)
        doc.version = msg.version
        doc.text = None
        if doc.patched is not None and (len(doc.patched) > MAX_PATCHES or doc.patched_bytes > MAX_PATCH_BYTES):
            doc.patched = None
        return ev.ContextAck(name=name, version=msg.version)

    # ------------------------------------------------------------------ requests
    def resolve(self, req: ev.Request, keeps_turns: bool) -> Given | ev.Error:
        """What `req`'s model gets (its documents, the turns it continues, the link to them), or the Error that
        refuses it (context_mismatch: a document not held, a turn not kept)."""
        sid = req.stream_id
        documents: dict[str, ContextDocument] = {}
        for name in req.contexts:
            doc = self.documents.get(name)
            if doc is None:
                return ev.Error(stream_id=sid, code=ErrorCode.CONTEXT_MISMATCH, retryable=True,
                                message=f"no context document {name[:MAX_CONTEXT_NAME]!r} in this session: "
                                        f"send its whole text, then the request again")
            patched = tuple(doc.patched) if doc.patched is not None else None
            documents[name] = ContextDocument(name=name, version=doc.version, text=_text(doc), patches=patched)
        history: tuple[Turn, ...] = ()
        parent = None
        if req.continues:
            if not keeps_turns:
                return ev.Error(stream_id=sid, code=ErrorCode.CONTEXT_MISMATCH,
                                message="this session keeps no turns (Hello.history; the server's history_size)")
            kept = self.turns.get(req.continues)
            if kept is None:
                return ev.Error(stream_id=sid, code=ErrorCode.CONTEXT_MISMATCH,
                                message=f"stream {req.continues} has no kept turn (unknown, not ended with stop, "
                                        f"not text, or dropped past history_size): send the conversation again")
            chain = [kept.turn]
            link = kept.parent
            while link is not None:
                older = self.turns.get(link[0])
                if older is None or older.serial != link[1]:
                    break  # dropped (history_size): the model gets the newest turns still kept
                chain.append(older.turn)
                link = older.parent
            history = tuple(reversed(chain))
            parent = (req.continues, kept.serial)
        return documents, history, parent

    def started(self, req: ev.Request, given: Given) -> None:
        """`req`'s stream started with `given` (from :meth:`resolve`): its model has them, and the patches the
        next request naming a document gets start from here."""
        self.given[req.stream_id] = given
        for name in req.contexts:
            doc = self.documents[name]
            doc.patched, doc.patched_bytes = [], 0

    def keep_turn(self, req: ev.Request, pieces: list[Any], parent: tuple[int, int] | None) -> None:
        """Keep a finished stream's turn (its input and text output) for a later Request.continues."""
        if not all(type(p) is str for p in pieces):
            return  # binary output: not a turn a model could read back
        output = "".join(pieces)
        size = len(output.encode("utf-8", "surrogatepass")) + len(req.text or "") + len(req.data or b"")
        size += sum(len(m.content) + len(m.role) for m in req.messages or ())
        sid = req.stream_id
        old = self.turns.pop(sid, None)
        if old is not None:
            self.turns_size -= old.size
        if size > self.settings.history_size:
            return
        self._serial += 1
        turn = Turn(stream_id=sid, output=output, text=req.text, messages=req.messages, data=req.data)
        self.turns[sid] = _Kept(turn, self._serial, parent, size)
        self.turns_size += size
        while self.turns_size > self.settings.history_size or len(self.turns) > MAX_TURNS:
            oldest = next(iter(self.turns))
            self.turns_size -= self.turns.pop(oldest).size


def _text(doc: _Document) -> str:
    text = doc.text
    if text is None:
        text = doc.text = doc.data.decode("utf-8")
    return text


class ClientDocument:
    """The client's side of one context document: its text and version, the Context messages that make them, and
    what to send again when the server refuses one or a new connection's Welcome does not list the version."""

    def __init__(self, name: str, text: str = "") -> None:
        if not name or len(name) > MAX_CONTEXT_NAME or not name.isprintable():
            raise ValueError(f"a context name is 1 to {MAX_CONTEXT_NAME} characters, no control characters")
        self.name = name
        self.text = text
        self.version = 0  # the last version made (0: none yet)
        self.acked = 0  # the highest version the server acknowledged
        self.resync = 0  # the version of the last whole text sent: refusals of older versions are stale
        self.refusal: ev.ContextAck | None = None  # the last refusal that was not stale
        self.failed: ev.ContextAck | None = None  # a refusal sending it again cannot cure (a limit, a bad name)
        self.full_sends = 0  # whole texts sent (the first, and every recovery)

    @property
    def synced(self) -> bool:
        """Whether the server acknowledged the current version."""
        return self.acked >= self.version > 0

    def set(self, text: str) -> ev.Context:
        """Replace the whole text: the Context that says so (UnicodeEncodeError for text that is not Unicode, such
        as a lone surrogate: nothing changes then)."""
        data = text.encode("utf-8")
        self.failed = None
        self.text = text
        self.version = self.resync = self.version + 1
        self.full_sends += 1
        return ev.Context(name=self.name, version=self.version, text=text, sha256=sha256(data))

    def patch(self, offset: int, length: int, text: str) -> ev.Context:
        """Replace `length` characters at character `offset` (Python string indices) with `text`: the Context
        that says so, in UTF-8 bytes. ValueError when the range is outside the text."""
        old = self.text
        if not (0 <= offset and 0 <= length and offset + length <= len(old)):
            raise ValueError(f"patch {offset}+{length} is outside the text of {len(old)} characters")
        head = old[:offset]
        cut = old[offset:offset + length]
        new = head + text + old[offset + length:]
        digest = sha256(new.encode("utf-8"))  # (first: text that is not Unicode raises before anything changes)
        byte_offset = len(head) if head.isascii() else len(head.encode("utf-8"))
        byte_length = len(cut) if cut.isascii() else len(cut.encode("utf-8"))
        self.text = new
        base, self.version = self.version, self.version + 1
        return ev.Context(name=self.name, version=self.version, base_version=base,
                          patches=(ev.ContextPatch(offset=byte_offset, length=byte_length, text=text),),
                          sha256=digest)

    def drop(self) -> ev.Context:
        """Forget the document: the Context that tells the server."""
        return ev.Context(name=self.name, version=self.version, drop=True)

    def answered(self, ack: ev.ContextAck) -> ev.Context | None:
        """The server's answer to one of this document's Contexts: the whole text to send again after a refusal
        (None: acknowledged, or a refusal of a version older than the last whole text, already recovered)."""
        if ack.code is ErrorCode.UNSPECIFIED:
            self.acked = max(self.acked, ack.version)
            return None
        if ack.version < self.resync:
            return None
        self.refusal = ack
        if ack.code is not ErrorCode.CONTEXT_MISMATCH or ack.version == self.resync:
            # A limit, a bad name, or the whole text itself refused: sending it again would be refused again.
            self.failed = ack
            return None
        return self.set(self.text)

    def welcomed(self, held: Mapping[str, int]) -> ev.Context | None:
        """A connection opened whose session holds documents `held` (Welcome.contexts): the whole text to send
        when the server does not hold this version (a new session, or Contexts lost in the drop)."""
        if self.version and held.get(self.name) == self.version:
            self.acked = self.version
            return None
        return self.set(self.text)
