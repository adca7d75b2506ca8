"""Model adapter: wraps any user callable into one async stream of str/bytes chunks.

Accepted callables, each taking a :class:`ModelRequest`:

* ``def f(req) -> str | bytes``              runs in a worker thread
* ``async def f(req) -> str | bytes``        awaited on the event loop
* ``def f(req): yield chunk``                each ``next()`` runs in a worker thread, so a blocking
                                             generator never stalls the loop and every chunk leaves
                                             as its own Delta as soon as it is yielded
* ``async def f(req): yield chunk``          iterated on the event loop

A sync function may also return an iterable or awaitable; it is handled like the matching kind.
``None`` is an empty reply. Anything else (a number, a mapping, whose iteration would stream its keys, a
set, in no set order) and any chunk other than str or bytes (or a :class:`ToolCall`) is a ``TypeError``
naming the model: the stream fails with ``model_error``, as for any exception of the model.
Cancelling the consuming task closes the generator (``aclose()`` / ``close()``).

Full-duplex streams (protocol v1.3): a model may read what the client sends while it runs from
``req.inputs`` (:class:`Inputs`), and yield a :class:`ToolCall` (``req.tool_call(name, args)``) to ask
the client to run a tool, then wait for its answer with ``await req.inputs.result(call)``.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import importlib
import inspect
import itertools
import json
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Set
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .protocol.context import ContextDocument, Turn
from .protocol.events import ChatMessage, ToolCall, ToolResult

__all__ = [
    "InputEnded",
    "Inputs",
    "ModelFn",
    "ModelInterrupted",
    "ModelRequest",
    "ModelSpec",
    "Models",
    "SessionInfo",
    "ToolCall",
    "ToolResult",
    "load_callable",
    "model_name",
    "reply_type_error",
    "shared_executor",
    "step_now",
    "stream_model",
    "warm_up",
]

ModelFn = Callable[["ModelRequest"], Any]


class _NoContext(Mapping[str, ContextDocument]):
    """The empty, immutable ``ModelRequest.context`` of a request that names no document (one for all)."""

    def __getitem__(self, name: str) -> ContextDocument:
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0


_NO_CONTEXT = _NoContext()


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionInfo:
    """Who is asking: connection facts a model may use (user, headers, client address)."""

    session_id: str
    subprotocol: str | None = None
    client: tuple[str, int] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    user: Any = None
    """The framework's authenticated user (e.g. Django's ``scope["user"]``), if any."""
    principal: Any = None
    """What the ``authenticate`` hook returned for this connection, if one is configured."""
    extra: Mapping[str, Any] = field(default_factory=dict)


class ModelInterrupted(Exception):
    """The server stopped a model before it finished, for a reason of its own, not the model's failure nor the
    client's Cancel: its thread pool was shut down (the process is exiting), the batch call it waited for was
    cancelled. The stream ends with a retryable Error (``internal``), never a normal End
    (docs/protocol.md 13.1)."""


class InputEnded(EOFError):
    """The client ended a stream's input (or the stream ended) before what a model waited for came."""


_CALL_IDS = itertools.count(1)


class Inputs(collections.deque):  # type: ignore[type-arg]
    """(Protocol v1.3) What the client sends a running stream after its Request, in order: text (str), bytes,
    and :class:`ToolResult` answers to the model's tool calls. ``async for item in req.inputs`` reads them until
    the client ends the input; :meth:`result` waits for the answer to one tool call (several may wait at once:
    ``asyncio.gather`` of two results). Sync models (run in worker threads) use :meth:`get_sync` and
    :meth:`result_sync`. At most ``max_unread_inputs`` wait unread: past that the stream fails (Error
    bad_request), since the model is not reading them."""

    ended = False  # the client sent Input.end (or the stream is over): nothing more will come
    waiters: list[asyncio.Future[None]] | None = None  # the coroutines waiting on the loop for the next change
    cond: threading.Condition | None = None  # what worker threads wait on (made by the first sync wait)
    loop: asyncio.AbstractEventLoop | None = None  # (the stream's loop)

    def put(self, item: str | bytes | ToolResult | None, end: bool) -> None:
        """An Input arrived, or (`end`) the input or the stream is over: called by the driver, on the loop (the only
        place `cond` is made, so a worker thread waiting on it never misses an item)."""
        cond = self.cond
        if cond is not None:
            with cond:
                self._put(item, end)
                cond.notify_all()
        else:
            self._put(item, end)
        waiters = self.waiters
        if waiters:
            self.waiters = None
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _put(self, item: str | bytes | ToolResult | None, end: bool) -> None:
        if item is not None:
            self.append(item)
        if end:
            self.ended = True

    async def _wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        if self.waiters is None:
            self.waiters = []
        self.waiters.append(waiter)
        try:
            await waiter
        finally:
            waiters = self.waiters
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)

    async def get(self) -> str | bytes | ToolResult:
        """The next input; :class:`InputEnded` once the client has ended the input and all of it was read."""
        while not self:
            if self.ended:
                raise InputEnded("the client ended this stream's input")
            await self._wait()
        return self.popleft()

    def _take_result(self, call_id: str) -> ToolResult | None:
        for i, item in enumerate(self):
            if type(item) is ToolResult and (item.id == call_id or not call_id):
                del self[i]
                return item
        return None

    async def result(self, call: ToolCall | str) -> ToolResult:
        """The client's :class:`ToolResult` for `call` (a ToolCall the model yielded, or its id), taken out of
        the inputs; other inputs stay, in order. :class:`InputEnded` if the input ends first."""
        call_id = call.id if isinstance(call, ToolCall) else call
        while True:
            found = self._take_result(call_id)
            if found is not None:
                return found
            if self.ended:
                raise InputEnded(f"the client ended this stream's input without answering tool call {call_id!r}")
            await self._wait()

    def __aiter__(self) -> Inputs:
        return self

    async def __anext__(self) -> str | bytes | ToolResult:
        try:
            return await self.get()
        except InputEnded:
            raise StopAsyncIteration from None

    def get_sync(self, timeout: float | None = None) -> str | bytes | ToolResult:
        """:meth:`get` for a sync model in a worker thread (TimeoutError after `timeout` seconds, nothing taken)."""
        return self._sync(lambda: self.popleft() if self else None, "", timeout)

    def result_sync(self, call: ToolCall | str, timeout: float | None = None) -> ToolResult:
        """:meth:`result` for a sync model in a worker thread (TimeoutError after `timeout` seconds, nothing
        taken)."""
        call_id = call.id if isinstance(call, ToolCall) else call
        return self._sync(lambda: self._take_result(call_id), call_id, timeout)  # type: ignore[return-value]

    def _sync(self, take: Callable[[], Any], call_id: str, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        cond = self.cond
        if cond is None:  # made on the loop, where put() runs: from then on every put() takes it and notifies
            loop, made = self.loop, threading.Event()

            def make() -> None:
                if self.cond is None:
                    self.cond = threading.Condition()
                made.set()

            if loop is None:
                raise RuntimeError("this stream's inputs are read on its event loop")
            try:
                loop.call_soon_threadsafe(make)
            except RuntimeError:  # the loop is closed: the stream is over
                raise InputEnded("the stream is over") from None
            if not made.wait(timeout):
                raise TimeoutError(f"no input within {timeout} s")
            cond = self.cond
            assert cond is not None
        with cond:
            while True:
                found = take()
                if found is not None:
                    return found
                if self.ended:
                    raise InputEnded("the client ended this stream's input" + (
                        f" without answering tool call {call_id!r}" if call_id else ""))
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no input within {timeout} s")
                cond.wait(left)


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
    inputs: Inputs = field(default_factory=Inputs)
    """(v1.3) What the client sends while the model runs: see :class:`Inputs`."""
    context: Mapping[str, ContextDocument] = _NO_CONTEXT
    """Protocol v1.3: the session's context documents the request named, by name (``.text``, ``.version``,
    ``.patches`` since the last request that named it)."""
    history: tuple[Turn, ...] = ()
    """Protocol v1.3: the turns this request continues, oldest first (``.prompt``/``.messages``, ``.output``)."""

    @staticmethod
    def tool_call(name: str, arguments: Any = None) -> ToolCall:
        """A :class:`ToolCall` for the model to yield (it reaches the client as a Delta), with an id of its own;
        `arguments` are JSON-encoded unless already a string. Then ``await req.inputs.result(call)``."""
        args = arguments if isinstance(arguments, str) else json.dumps({} if arguments is None else arguments)
        return ToolCall(name, args, id=f"call_{next(_CALL_IDS)}")

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


def model_name(fn: Any) -> str:
    """How errors and logs name a model callable: ``module.qualname`` (a partial's function; an object's class)."""
    target = getattr(fn, "func", fn)  # functools.partial
    if not hasattr(target, "__qualname__"):
        target = type(target)
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", repr(target))
    return f"{module}.{name}" if module else name


def reply_type_error(fn: Any, value: Any, yielded: bool = False) -> TypeError:
    """The TypeError for model `fn` that returned (`yielded`: yielded) `value`, which no Delta carries."""
    kind = type(value).__name__
    hint = (" (a mapping would stream its keys, a set in no set order: return its text, e.g. json.dumps(it))"
            if isinstance(value, Mapping | Set) else "")
    return TypeError(f"model {'yielded' if yielded else 'returned'} {kind}, which no Delta carries: "
                     f"{model_name(fn) if fn is not None else 'a model'} must return str or bytes, or an (async) "
                     f"iterable of str or bytes chunks{hint}")


def _in_pool(loop: asyncio.AbstractEventLoop, executor: Executor | None, fn: Callable[..., Any],
             *args: Any) -> asyncio.Future[Any]:
    """``loop.run_in_executor``, a pool that takes no more work (shut down: the process is exiting) being the
    server's stop (ModelInterrupted), not the model's failure."""
    try:
        return loop.run_in_executor(executor, fn, *args)
    except RuntimeError as exc:  # "cannot schedule new futures after (interpreter) shutdown"
        raise ModelInterrupted(f"the model's thread pool is shut down: {exc}") from exc


def _close_quietly(close: Callable[[], Any]) -> None:
    try:
        close()
    except ValueError:  # "generator already executing": it stops at its next yield instead
        pass


class _SyncSteps:
    """A sync iterator stepped in worker threads. A close asked for while a step runs is done by that
    step's thread as soon as the step returns, so the model's cleanup runs then, not whenever the
    garbage collector gets to it. A step still waiting for a worker when the close is asked (its
    cancel withdraws it from the pool, or it starts later) does not count as running: the close is
    a pool job of its own, and a step that starts after it does nothing."""

    __slots__ = ("close_asked", "it", "lock", "on_run", "running")

    def __init__(self, it: Iterator[Any], on_run: Callable[[], None] | None) -> None:
        self.it = it
        self.on_run = on_run
        self.lock = threading.Lock()
        self.running = False  # set by a step's worker as it starts, under `lock`
        self.close_asked = False

    def step(self) -> Any:
        with self.lock:
            if self.close_asked:  # started after the close was asked: the close job has the iterator
                return _DONE
            self.running = True
        try:
            if self.on_run is not None:
                self.on_run()
            return _next_or_done(self.it)
        finally:
            with self.lock:
                self.running = False
                close = self.close_asked
            if close:
                _close_quietly(self.it.close)  # type: ignore[attr-defined]

    def close(self, loop: asyncio.AbstractEventLoop, executor: Executor | None) -> None:
        if getattr(self.it, "close", None) is None:
            return
        with self.lock:
            self.close_asked = True
            if self.running:
                return
        try:
            loop.run_in_executor(executor, _close_quietly, self.it.close)  # type: ignore[attr-defined]
        except RuntimeError:  # the pool is shut down (the process is exiting): the garbage collector closes it
            pass


async def _iterate_sync(it: Iterator[Any], executor: Executor | None,
                        on_run: Callable[[], None] | None = None) -> AsyncIterator[Any]:
    loop = asyncio.get_running_loop()
    steps = _SyncSteps(it, on_run)
    try:
        while True:
            item = await _in_pool(loop, executor, steps.step)
            if item is _DONE:
                return
            yield item
    finally:
        # Cancelled while next() runs in its thread: the generator is closed as soon as that chunk is
        # produced, so it stops at its next yield and runs its cleanup.
        steps.close(loop, executor)


WHOLE_REPLY = (str, bytes, bytearray, memoryview)  # what a model may return as its whole reply, one chunk


async def chunks_of(result: Any, executor: Executor | None,
                    on_run: Callable[[], None] | None = None, fn: Any = None) -> AsyncIterator[Any]:
    """Turn whatever model `fn` returned into chunks (`on_run`: see stream_model)."""
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, WHOLE_REPLY):
        yield result
        return
    if result is None:
        return
    if isinstance(result, Mapping | Set):  # iterable, but its items are not the reply
        raise reply_type_error(fn, result)
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
        async for chunk in _iterate_sync(iter(result), executor, on_run):
            yield chunk
        return
    raise reply_type_error(fn, result)


def _kind(fn: Callable[..., Any]) -> str:
    if type(fn) is types.FunctionType:  # a plain function (the common case, asked per request): its flags
        flags = fn.__code__.co_flags
        if flags & inspect.CO_ASYNC_GENERATOR:
            return "asyncgen"
        if flags & inspect.CO_COROUTINE:
            return "async"
        return "gen" if flags & inspect.CO_GENERATOR else "sync"
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


def stream_model(
    fn: ModelFn, request: ModelRequest, executor: Executor | None = None,
    on_run: Callable[[], None] | None = None, kind: str | None = None,
) -> AsyncIterator[Any]:
    """Run `fn` for `request` and yield its chunks without ever blocking the event loop.

    Sync code runs on `executor` (default: the loop's default executor). `on_run` is called
    where and when the model's code is about to run (in the worker thread for sync code, once
    per chunk for sync generators), so the wait for a worker can be told apart from model time.
    An async generator model is returned as it is (no wrapper generator per chunk); close the
    result with ``aclose()`` either way. `kind`: what :meth:`Models.resolve` found `fn` to be, if known.
    """
    if (kind or _kind(fn)) == "asyncgen":
        if on_run is not None:
            on_run()
        return fn(request)  # type: ignore[no-any-return]
    return _stream_model(fn, request, executor, on_run)


async def _stream_model(
    fn: ModelFn, request: ModelRequest, executor: Executor | None, on_run: Callable[[], None] | None,
) -> AsyncIterator[Any]:
    kind = _kind(fn)
    if kind == "asyncgen" or kind == "async":
        if on_run is not None:
            on_run()
        result = fn(request)
    elif kind == "gen":
        result = fn(request)  # creating a generator runs none of its body
    else:
        call = fn if on_run is None else _announced(fn, on_run)
        result = await _in_pool(asyncio.get_running_loop(), executor, call, request)
    async for chunk in chunks_of(result, executor, on_run if kind != "asyncgen" and kind != "async" else None, fn):
        yield chunk


async def warm_up(fn: ModelFn, request: ModelRequest, executor: Executor | None = None) -> bool:
    """Run `fn`'s warm-up hook for `request` (a Request with ``warmup`` set, protocol v1.2): its ``warmup``
    attribute, a callable taking the request, sync (run on `executor`, it may block: loading weights,
    filling a cache) or async. False when `fn` has none: a warm-up then does nothing."""
    hook = getattr(fn, "warmup", None)
    if hook is None:
        return False
    if not callable(hook):
        raise TypeError(f"the model's warmup attribute is not callable: {hook!r}")
    if _kind(hook) == "async":
        result = hook(request)
    else:
        context = contextvars.copy_context()  # (what the model would see: the stream's context)
        result = await _in_pool(asyncio.get_running_loop(), executor, context.run, hook, request)
    if inspect.isawaitable(result):
        await result
    return True


READY, WAIT, DONE = 0, 1, 2  # what step_now found


def step_now(agen: AsyncIterator[Any]) -> tuple[int, Any]:
    """Advance `agen` as far as it goes without waiting for the event loop.

    Returns ``(READY, chunk)`` when it produced a chunk without suspending, ``(DONE, None)`` when it
    ended, and ``(WAIT, awaitable)`` when it is waiting for something (I/O, a timer, a thread): await
    the awaitable (in the same task) for its next chunk; it raises StopAsyncIteration at the end.
    This is how merging tells a model that yields back to back from one that pauses between chunks.
    Exceptions of the model propagate.
    """
    aw = agen.__anext__()
    try:
        pending = aw.send(None)  # type: ignore[attr-defined]
    except StopIteration as stop:
        return READY, stop.value
    except StopAsyncIteration:
        return DONE, None
    return WAIT, _Resume(aw, pending)


class _Resume:
    """Awaits a coroutine that was already stepped once and is suspended on `pending`.

    The running task waits on `pending` (the future, or None for a bare yield) as if the coroutine
    itself had yielded it, then resumes the coroutine; cancellation is thrown into the coroutine,
    so the model sees it exactly as it would under a plain ``await``.
    """

    __slots__ = ("coro", "pending")

    def __init__(self, coro: Any, pending: Any) -> None:
        self.coro, self.pending = coro, pending

    def __await__(self) -> Any:
        coro, pending = self.coro, self.pending
        while True:
            try:
                yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation (or another throw) goes to the model
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                pending = coro.send(None)
            except StopIteration as stop:
                return stop.value


def _announced(fn: Callable[[Any], Any], on_run: Callable[[], None]) -> Callable[[Any], Any]:
    def call(arg: Any) -> Any:
        on_run()
        return fn(arg)
    return call


_EXECUTORS: dict[int, ThreadPoolExecutor] = {}
_EXECUTORS_LOCK = threading.Lock()


def shared_executor(threads: int) -> ThreadPoolExecutor:
    """The process-wide worker pool for sync model code with `threads` workers."""
    with _EXECUTORS_LOCK:
        pool = _EXECUTORS.get(threads)
        if pool is None:
            pool = _EXECUTORS[threads] = ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix="lowlat-model"
            )
        return pool


ModelSpec = ModelFn | str | Mapping[str, ModelFn | str]


class Models:
    """The model callables an endpoint serves, picked per request by ``Request.model``.

    One callable serves every model name (the name reaches it as ``req.model``). A mapping
    serves its names; an empty name picks the ``"default"`` entry, or else the first one.
    """

    def __init__(self, spec: ModelSpec | Models) -> None:
        self._resolved: dict[str, tuple[ModelFn | None, str, str, str]] = {}
        if isinstance(spec, Models):
            self.single, self.by_name, self.default = spec.single, spec.by_name, spec.default
            return
        self.single: ModelFn | None = None
        self.by_name: dict[str, ModelFn] = {}
        self.default: ModelFn | None = None
        if isinstance(spec, str):
            obj = _import_path(spec)
            if isinstance(obj, Mapping):
                spec = obj
        if isinstance(spec, Mapping):
            if not spec:
                raise ValueError("the model mapping is empty")
            self.by_name = {str(name): _one_request(load_callable(fn), fn) for name, fn in spec.items()}
            self.default = self.by_name.get("default") or next(iter(self.by_name.values()))
        else:
            self.single = _one_request(load_callable(spec), spec)

    def resolve(self, name: str) -> tuple[ModelFn | None, str, str, str]:
        """(callable, metrics label, kind, its name) for model `name`, the kind (asyncgen, async, gen, sync) and
        the name (:func:`model_name`) found once per callable. The callable is None when this endpoint does not
        serve `name`."""
        found = self._resolved.get(name)
        if found is None:
            fn = self.get(name)
            found = (fn, self.label(name), _kind(fn) if fn is not None else "",
                     model_name(fn) if fn is not None else "")
            if len(self._resolved) < 256:  # names clients invent are not kept
                self._resolved[name] = found
        return found

    def get(self, name: str) -> ModelFn | None:
        """The callable for model `name`, or None when this endpoint does not serve it."""
        if self.single is not None:
            return self.single
        if not name:
            return self.default
        return self.by_name.get(name)

    def names(self) -> tuple[str, ...]:
        """The model names served (empty for a single catch-all callable)."""
        return tuple(self.by_name)

    def label(self, name: str) -> str:
        """A bounded metrics label for a requested model name: a served name, "default" or "unknown".

        Never the client's string itself unless it is served, so clients cannot mint label values.
        """
        if name in self.by_name:
            return name
        if not name or self.single is not None:
            return "default"
        return "unknown"


def _one_request(fn: ModelFn, spec: Any) -> ModelFn:
    """`fn`, if it can be called with one argument (the request); else a TypeError when the app starts, not a
    model error on every request. An ASGI or WSGI app passed as the model (``lowlat-mw serve myapp:app``) is named."""
    try:
        signature = inspect.signature(fn)
        signature.bind(None)
        return fn
    except ValueError:  # no signature to read (some builtins): called as it is
        return fn
    except TypeError:
        pass
    required = [p.name for p in signature.parameters.values() if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    app = {("scope", "receive", "send"): "ASGI", ("environ", "start_response"): "WSGI"}.get(tuple(required))
    what = f"an {app} application" if app == "ASGI" else f"a {app} application" if app else \
        f"a callable of {len(required)} required arguments ({', '.join(required)})"
    name = spec if isinstance(spec, str) else getattr(fn, "__qualname__", None) or type(fn).__qualname__
    hint = " An app that mounts lowlat-mw runs in its own server: see the framework's guide, \"Run\"." if app else ""
    raise TypeError(f"model {name!r} is {what}, not a model callable: a model takes one argument, the request "
                    f"(def generate(req): ...).{hint}")


def _import_path(spec: str) -> Any:
    """Import ``"package.module:attr"`` or ``"package.module.attr"``."""
    if not spec:
        raise ValueError("model path is empty")
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
    return obj


def load_callable(spec: str | ModelFn) -> ModelFn:
    """Resolve ``"package.module:attr"`` or ``"package.module.attr"`` to a callable."""
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"model must be a callable or a dotted path, got {spec!r}")
    obj = _import_path(spec)
    if not callable(obj):
        raise TypeError(f"model {spec!r} is not callable")
    return obj
