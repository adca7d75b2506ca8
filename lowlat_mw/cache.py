"""The result cache: whole replies of deterministic models, replayed at once for the same request.

Opt-in twice: the ``cache_size`` setting (bytes, 0: off) turns the cache on, and only models marked
deterministic (``generate.deterministic = True``: the reply depends on the request alone, not on the user,
the time or chance) are cached. A reply is kept when its stream ended normally ("stop"); a later request
with the same model, input and params (the key: :func:`request_key`) gets the same chunks as its Deltas at
once, then its End, without the model running. Bounded by bytes (least recently used first out) and by
``cache_ttl`` seconds. One cache per endpoint, in process memory, shared by its connections' threads.
With the Redis session store (``session_store``), a second tier in Redis is shared by every process
(runtime/shared.py): a reply one process kept, another finds there; its replies travel as :func:`pack_reply`
bytes.

Time is passed in (``now``): the cache reads no clock.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .protocol import events as ev

__all__ = ["ResultCache", "is_deterministic", "pack_reply", "request_key", "unpack_reply"]

ENTRY_OVERHEAD = 200  # bytes charged per entry beyond its chunks (the key, the tuple, the dict's slot)
CHUNK_OVERHEAD = 56  # bytes charged per chunk beyond its content (a str or bytes object's header, its slot)
MERGE_TEXT = 32 * 1024  # adjacent text chunks are kept joined up to this many characters: fewer, larger Deltas


def is_deterministic(fn: Any) -> bool:
    """Whether model callable `fn` is marked deterministic (its ``deterministic`` attribute is true)."""
    return bool(getattr(fn, "deterministic", False))


def request_key(req: ev.Request) -> bytes:
    """What identifies a reply of a deterministic model: model name, input and params, as a SHA-256 digest. Params
    by value, key order aside: 1 and 1.0 are different requests, as the model may tell them apart (JSON frames keep
    1.0 a float, Protobuf makes whole numbers ints)."""
    text = req.text
    if text is not None and not req.params:  # a prompt alone (the common case): no JSON, lengths keep it unambiguous
        model = req.model
        return hashlib.sha256(f"t{len(model)}:{model}{text}".encode("utf-8", "surrogatepass")).digest()
    doc = {"model": req.model, "text": req.text, "params": req.params,
           "data": req.data.hex() if req.data is not None else None,
           "messages": [[m.role, m.content] for m in req.messages] if req.messages is not None else None}
    canon = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canon.encode("utf-8", "surrogatepass")).digest()


def _size(chunks: Sequence[str | bytes]) -> int:
    """What keeping `chunks` costs, about (Python objects included, not only their bytes)."""
    return ENTRY_OVERHEAD + sum(CHUNK_OVERHEAD + (len(c) if isinstance(c, bytes) else len(c.encode("utf-8",
                                "surrogatepass"))) for c in chunks)


def merged(chunks: Sequence[str | bytes]) -> list[str | bytes]:
    """`chunks` with runs of adjacent text joined (up to MERGE_TEXT characters each): a hit then goes out in
    a few Deltas, not one per token, and costs less to keep. Binary chunks keep their boundaries."""
    out: list[str | bytes] = []
    run: list[str] = []
    size = 0
    for chunk in chunks:
        if isinstance(chunk, str) and size + len(chunk) <= MERGE_TEXT:
            run.append(chunk)
            size += len(chunk)
            continue
        if run:
            out.append("".join(run))
            run, size = [], 0
        if isinstance(chunk, str):
            run, size = [chunk], len(chunk)
        else:
            out.append(chunk)
    if run:
        out.append("".join(run))
    return out


def pack_reply(chunks: Sequence[str | bytes]) -> bytes:
    """A kept reply as bytes (for the Redis tier): per chunk, a kind byte (t: text, b: bytes), its length (4 bytes,
    big-endian), its bytes."""
    out = []
    for chunk in chunks:
        data = chunk.encode("utf-8", "surrogatepass") if isinstance(chunk, str) else bytes(chunk)
        out.append((b"t" if isinstance(chunk, str) else b"b") + len(data).to_bytes(4, "big") + data)
    return b"".join(out)


def unpack_reply(data: bytes) -> tuple[str | bytes, ...] | None:
    """The chunks :func:`pack_reply` packed; None if `data` is not such bytes (another writer's, or cut short)."""
    chunks: list[str | bytes] = []
    i, end = 0, len(data)
    try:
        while i < end:
            kind, n = data[i:i + 1], int.from_bytes(data[i + 1:i + 5], "big")
            body = data[i + 5:i + 5 + n]
            if len(body) != n or kind not in (b"t", b"b"):
                return None
            chunks.append(body.decode("utf-8", "surrogatepass") if kind == b"t" else bytes(body))
            i += 5 + n
    except UnicodeDecodeError:
        return None
    return tuple(chunks)


class ResultCache:
    """Whole replies by key, at most `capacity` bytes (least recently used out first), each for `ttl` seconds."""

    def __init__(self, capacity: int, ttl: float) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self.max_entry = max(1, capacity // 4)  # one reply never takes more than a quarter of the cache
        self.bytes = 0
        self._entries: OrderedDict[bytes, tuple[float, int, tuple[str | bytes, ...]]] = OrderedDict()
        self._lock = threading.Lock()  # (Flask's connections run on one loop, but publish-style callers may not)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float) -> tuple[str | bytes, ...] | None:
        """The chunks kept for `key`, if any and not expired."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires, size, chunks = entry
            if now >= expires:
                del self._entries[key]
                self.bytes -= size
                return None
            self._entries.move_to_end(key)
            return chunks

    def put(self, key: bytes, chunks: Sequence[str | bytes], now: float) -> bool:
        """Keep `chunks` (text runs joined: :func:`merged`) as the reply for `key` (False: too big for the cache)."""
        chunks = merged(chunks)
        size = _size(chunks)
        if size > self.max_entry:
            return False
        with self._lock:
            entries = self._entries
            old = entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            while entries:  # expired entries at the least recently used end go now, not when next looked up
                oldest = next(iter(entries.values()))
                if now < oldest[0]:
                    break
                entries.popitem(last=False)
                self.bytes -= oldest[1]
            entries[key] = (now + self.ttl, size, tuple(chunks))
            self.bytes += size
            while self.bytes > self.capacity:
                _, (_, dropped, _) = entries.popitem(last=False)
                self.bytes -= dropped
        return True
