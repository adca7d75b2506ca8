"""Model adapter: wraps any user callable into one async stream of str/bytes chunks.

Accepted callables, each taking a :class:`ModelRequest`:

* ``def f(req) -> str | bytes``              runs in a worker thread
* ``async def f(req) -> str | bytes``        awaited on the event loop
* ``def f(req): yield chunk``                each ``next()`` runs in a worker thread, so a blocking
                                             generator never stalls the loop and every chunk leaves
                                             as its own Delta as soon as it is yielded
* ``async def f(req): yield chunk``          iterated on the event loop

A sync function may also return an iterable or awaitable; it is handled like the matching kind.
Cancelling the consuming task closes the generator (``aclose()`` / ``close()``).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from .events import ChatMessage

__all__ = ["ModelFn", "ModelRequest", "SessionInfo", "load_callable", "stream_model"]

ModelFn = Callable[["ModelRequest"], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionInfo:
    """Who is asking: connection facts a model may use (user, headers, client address)."""

    session_id: str
    subprotocol: str | None = None
    client: tuple[str, int] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    user: Any = None
    """The framework's authenticated user (e.g. Django's ``scope["user"]``), if any."""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """What a model callable receives."""

    stream_id: int
    model: str = ""
    text: str | None = None
    data: bytes | None = None
    messages: tuple[ChatMessage, ...] | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    session: SessionInfo

    @property
    def prompt(self) -> str:
        """The input as text: `text`, or the last message's content, or decoded `data`."""
        if self.text is not None:
            return self.text
        if self.messages:
            return self.messages[-1].content
        if self.data is not None:
            return self.data.decode("utf-8", "replace")
        return ""


_DONE = object()


def _next_or_done(it: Iterator[Any]) -> Any:
    try:
        return next(it)
    except StopIteration:
        return _DONE


def _close_quietly(close: Callable[[], Any]) -> None:
    try:
        close()
    except ValueError:  # "generator already executing": it stops at its next yield instead
        pass


async def _iterate_sync(it: Iterator[Any], executor: Executor | None) -> AsyncIterator[Any]:
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[Any] | None = None
    try:
        while True:
            pending = loop.run_in_executor(executor, _next_or_done, it)
            item = await pending
            pending = None
            if item is _DONE:
                return
            yield item
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            if pending is not None and not pending.done():
                # Cancelled while next() runs in its thread: close the generator as soon as that
                # chunk is produced, so it stops at its next yield and runs its cleanup.
                pending.add_done_callback(lambda _f: loop.run_in_executor(executor, _close_quietly, close))
            else:
                loop.run_in_executor(executor, _close_quietly, close)


async def _from_result(result: Any, executor: Executor | None) -> AsyncIterator[Any]:
    """Turn whatever a call returned into chunks."""
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, str | bytes | bytearray | memoryview):
        yield result
        return
    if result is None:
        return
    if hasattr(result, "__aiter__"):
        agen = result.__aiter__()
        try:
            async for chunk in agen:
                yield chunk
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                await aclose()
        return
    if hasattr(result, "__iter__"):
        async for chunk in _iterate_sync(iter(result), executor):
            yield chunk
        return
    raise TypeError(
        f"model returned {type(result).__name__}; expected str, bytes, or an (async) iterable of them"
    )


def _kind(fn: Callable[..., Any]) -> str:
    target = fn
    if not inspect.isfunction(fn) and not inspect.ismethod(fn) and not hasattr(fn, "func"):
        call = type(fn).__dict__.get("__call__") or getattr(type(fn), "__call__", None)  # noqa: B004
        if call is not None and not inspect.isbuiltin(fn):
            target = call
    if inspect.isasyncgenfunction(target):
        return "asyncgen"
    if inspect.iscoroutinefunction(target):
        return "async"
    if inspect.isgeneratorfunction(target):
        return "gen"
    return "sync"


async def stream_model(
    fn: ModelFn, request: ModelRequest, executor: Executor | None = None
) -> AsyncIterator[Any]:
    """Run `fn` for `request` and yield its chunks without ever blocking the event loop.

    Sync code runs on `executor` (default: the loop's default executor).
    """
    kind = _kind(fn)
    if kind == "asyncgen" or kind == "async":
        result = fn(request)
    elif kind == "gen":
        result = fn(request)  # creating a generator runs none of its body
    else:
        result = await asyncio.get_running_loop().run_in_executor(executor, fn, request)
    async for chunk in _from_result(result, executor):
        yield chunk


def load_callable(spec: str | ModelFn) -> ModelFn:
    """Resolve ``"package.module:attr"`` or ``"package.module.attr"`` to a callable."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"model must be a callable or a dotted path, got {spec!r}")
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
    else:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"model path {spec!r} must look like 'package.module:callable'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import model module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TypeError(f"model {spec!r} is not callable")
    return obj
