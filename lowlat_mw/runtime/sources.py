"""Where a stream's chunks come from, and how they are shaped before they go out.

A stream is one pipeline (:meth:`ModelRunner._run <lowlat_mw.runtime.streams.ModelRunner._run>`): its
*source* (a reply the result cache kept, its batch's reply, or the model: an async generator iterated as it
is, an awaited coroutine, a sync model through :func:`~lowlat_mw.model.stream_model`), optionally recorded
for the result cache, then its *shape* (plain, or text chunks merged into fewer Deltas: ``merge_deltas``),
then the runner's one emit. Each stage here is an async iterator of chunks or a function that makes one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..cache import CHUNK_OVERHEAD, ResultCache, merged
from ..model import DONE, WAIT, WHOLE_REPLY, ModelRequest, chunks_of, step_now, stream_model
from .batch import batcher_for

if TYPE_CHECKING:
    from ..observability.metrics import Metrics
    from ..observability.timing import StreamTimer
    from ..protocol.session import StreamState
    from ..settings import Settings

__all__ = ["TOO_BIG", "cached_reply", "each", "keep_chunk", "keep_reply", "merged_deltas", "model_chunks", "recorded",
           "reply_chunks"]

TOO_BIG = object()  # (in a recorded reply: it grew past what the cache keeps, so it is not kept)


async def cached_reply(cache: ResultCache, shared: Any, metrics: Metrics | None, key: bytes, label: str,
                       now: Callable[[], float]) -> list[Any] | None:
    """The reply the result cache kept for the request of `key` (a source: the model does not run), or None: the
    local tier, then the shared one (`shared`: what another process kept, kept here too from now on). The lookup
    is counted, a hit or a miss."""
    cached = cache.get(key, now())
    if cached is None and shared is not None:
        cached = await shared.cache_get(key)
        if cached is not None:
            cache.put(key, cached, now())
    if metrics is not None:
        metrics.inc("cache_lookups", label, "miss" if cached is None else "hit")
    return cached


def keep_reply(cache: ResultCache, shared: Any, st: StreamState | None, key: bytes, chunks: list[Any],
               now: float) -> None:
    """A deterministic model's reply (`chunks`, recorded) ended normally: keep it for the same request (the result
    cache, and the shared tier if the local one took it), unless it grew too big to keep (TOO_BIG), or its stream
    (`st`) was cancelled (the client's Cancel, even if the model went on)."""
    if (chunks and chunks[0] is TOO_BIG) or (st is not None and st.cancelling):
        return
    if cache.put(key, chunks, now) and shared is not None:
        shared.cache_put(key, merged(chunks))


def model_chunks(fn: Any, mreq: ModelRequest, kind: str, timer: StreamTimer | None, settings: Settings,
                 executor: Any) -> Any:
    """The model's source: its chunks as an async iterator, or the call to await for its reply (then
    :func:`reply_chunks`). A micro-batched model (batch.is_batched) answers from its batch; an async generator is
    iterated as it is and an async function awaited by the caller (no wrapper generator per chunk, no coroutine in
    between: see stream_model); anything else, and an async function whose output is merged, goes through
    stream_model.

    Where the model's code starts, the timer's queue wait ends (StreamTimer.model_running; a batch's wait counts
    as the model's time)."""
    if getattr(fn, "batch", False):
        if timer is not None:
            timer.model_running()
        return batcher_for(fn, executor, settings.max_batch_size, settings.max_batch_wait).reply(mreq)
    if kind == "asyncgen" or (kind == "async" and not settings.merge_deltas):
        if timer is not None:
            timer.model_running()
        return fn(mreq)
    return stream_model(fn, mreq, executor, timer.model_running if timer is not None else None, kind)


def reply_chunks(result: Any, executor: Any, fn: Any) -> Any:
    """An awaited model's reply as a source: the whole reply itself (one chunk: WHOLE_REPLY), or its chunks (a
    list, a generator... returned) as an async iterator."""
    return result if isinstance(result, WHOLE_REPLY) else chunks_of(result, executor, None, fn)


async def each(chunks: Iterable[Any]) -> AsyncIterator[Any]:
    """`chunks` (a reply the result cache kept, a whole reply) as a source: an async iterator."""
    for chunk in chunks:
        yield chunk


def _kept(chunk: Any) -> Any:
    """A chunk as the result cache keeps it: a mutable buffer copied, as it is when it comes."""
    return bytes(chunk) if isinstance(chunk, bytearray | memoryview) else chunk


def keep_chunk(chunk: Any, kept: list[Any], limit: int, size: int = 0) -> int:
    """Put `chunk` in `kept` (copied if mutable), a reply for the result cache that holds `size` bytes so far,
    recorded up to about `limit` bytes (past it, `kept` holds only TOO_BIG); returns its size now."""
    if size <= limit:
        sized = isinstance(chunk, str | bytes | bytearray | memoryview)
        size += len(chunk) + CHUNK_OVERHEAD if sized else limit + 1
        if size <= limit:
            kept.append(_kept(chunk))
        else:
            kept[:] = [TOO_BIG]
    return size


async def recorded(agen: Any, kept: list[Any], limit: int) -> AsyncIterator[Any]:
    """`agen`'s chunks, each also put in `kept` (:func:`keep_chunk`). Closed, it closes `agen` at once."""
    size = 0
    try:
        async for chunk in agen:
            size = keep_chunk(chunk, kept, limit, size)
            yield chunk
    finally:
        await agen.aclose()


async def merged_deltas(agen: Any, timer: StreamTimer | None, settings: Settings) -> AsyncIterator[Any]:
    """`agen`'s chunks with text chunks it yields back to back merged into one (merge_deltas): fewer Deltas.

    A chunk joins the batch only if the model produced it without waiting and its previous step
    was quick too; the batch goes out when the model waits, a chunk of another kind comes, it
    would pass a quarter of the frame limit, or its first chunk is merge_max_delay old. The
    stream's first chunk always goes out at once (time to first delta is not traded away). What
    the model yielded before it failed still goes out. Closed, it closes `agen`.
    """
    clock = time.perf_counter
    max_delay = settings.merge_max_delay
    budget = min(16384, (settings.max_frame_size - 32) // 4)  # chars: never needs a split
    parts: list[str] = []
    size = 0
    since = 0.0
    quick = False  # the previous step produced its chunk without waiting, within max_delay

    def joined() -> str:
        """The batch as one chunk; the batch starts again empty."""
        nonlocal parts, size
        text = "".join(parts)
        parts, size = [], 0
        return text

    try:
        while True:
            began = clock()
            try:
                kind, chunk = step_now(agen)
            except Exception:
                if parts:
                    yield joined()
                raise
            if kind == WAIT:
                if parts:
                    yield joined()
                try:
                    chunk = await chunk
                except StopAsyncIteration:
                    break
                quick = False
            elif kind == DONE:
                break
            else:
                now = clock()
                was_quick, quick = quick, now - began < max_delay
                if type(chunk) is str and was_quick and quick:
                    if timer is not None:
                        timer.chunk()
                    if parts and (size + len(chunk) > budget or now - since > max_delay):
                        yield joined()
                    if not parts:
                        since = now
                    parts.append(chunk)
                    size += len(chunk)
                    continue
            if timer is not None:
                timer.chunk()
            if parts:
                yield joined()
            yield chunk
        if parts:
            yield joined()
    finally:
        await agen.aclose()
