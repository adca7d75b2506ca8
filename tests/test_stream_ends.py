"""How a stream ends when its model does not end by itself, driven directly (no server): issue 38, items 7 and 8.

A stream ends normally (End "stop", or End "cancelled" for the client's own Cancel) only when its model ended or
its client asked. A model the server stopped for a reason of its own (its task cancelled by a forced shutdown or
the loop ending, its thread pool shut down, its batch call cancelled) ends with a retryable Error ``internal``, never
an End: the client must not take the cut output for the whole (docs/protocol.md 13.1). A
model that returns or yields what no Delta carries (a dict streamed its keys) fails with a TypeError naming it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from driver_support import Peer, endpoint_for
from prometheus_client import CollectorRegistry
from support import wait_until as wait_for  # (named as before: the call sites stay as they were)

from lowlat_mw.errors import ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.client import ClientProtocol, ClientStream
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.runtime.asgi import LowLatASGI
from lowlat_mw.runtime.batch import batcher_for
from lowlat_mw.settings import SUBPROTOCOL_JSON

BOUND = 10.0  # seconds any wait below may take on a loaded machine (each ends at an event, long before)


def terminal(peer: Peer, sid: int = 1) -> ev.End | ev.Error | None:
    found = [e for e in peer.events if isinstance(e, ev.End | ev.Error) and e.stream_id == sid]
    assert len(found) <= 1, found
    return found[0] if found else None


def interrupted(error: Any) -> bool:
    return (isinstance(error, ev.Error) and error.code is ErrorCode.INTERNAL and error.retryable
            and "incomplete" in error.message)


def waiting_model(started: asyncio.Event) -> Any:
    async def model(req: Any) -> Any:
        yield "a;"
        started.set()
        await asyncio.sleep(3600)
        yield "never;"
    return model


# ================================================================================ item 7: cut streams
async def test_a_model_task_cancelled_by_the_server_ends_with_a_retryable_error_never_an_end() -> None:
    # What a forced shutdown does (a second Ctrl-C under uvicorn: asyncio.run cancels every task, the connection
    # still open): before, the client got End{finish_reason: "cancelled"} and its `async for` ended quietly.
    started = asyncio.Event()
    peer = Peer(endpoint_for(waiting_model(started)))
    await peer.hello_and_request()
    await asyncio.wait_for(started.wait(), BOUND)
    peer.driver.runner.tasks[1].cancel()  # not the client's Cancel
    await wait_for(lambda: terminal(peer) is not None)
    assert peer.texts() == ["a;"]
    assert interrupted(terminal(peer)), peer.events
    assert peer.closed is None  # the connection goes on (it is the server's to close)
    await peer.gone()


class AsgiConnection:
    """One WebSocket through the ASGI app (LowLatASGI.serve), in process: what a server's connection task runs."""

    def __init__(self, model: Any) -> None:
        self.app = LowLatASGI(model, registry=CollectorRegistry())
        self.codec = codec_for(SUBPROTOCOL_JSON)
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.events: list[ev.Event] = []
        scope = {"type": "websocket", "path": "/ws", "subprotocols": [SUBPROTOCOL_JSON], "headers": [],
                 "client": ("127.0.0.1", 50000), "query_string": b""}
        self.inbox.put_nowait({"type": "websocket.connect"})
        for event in (ev.Hello(), ev.Request(stream_id=1, text="x")):
            self.inbox.put_nowait({"type": "websocket.receive", "text": self.codec.encode(event)})
        self.task = asyncio.get_running_loop().create_task(self.app(scope, self.inbox.get, self._send))

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "websocket.send":
            self.events.append(self.codec.decode(message.get("text") or message["bytes"], limit=1 << 20))

    def terminal(self) -> ev.End | ev.Error | None:
        found = [e for e in self.events if isinstance(e, ev.End | ev.Error)]
        assert len(found) <= 1, found
        return found[0] if found else None


async def test_a_connection_its_server_cancels_in_a_shutdown_cuts_its_streams_first() -> None:
    # uvicorn's forced shutdown (a second Ctrl-C, its graceful timeout) cancels the tasks in an order of its own. The
    # model's first: its Error goes out. The connection's first (here): before, the disconnect kept the running
    # stream for a resume the exiting process never serves, the client saw only a dropped connection, and which of
    # the two it got changed from run to run and server to server.
    started = asyncio.Event()
    conn = AsgiConnection(waiting_model(started))
    await asyncio.wait_for(started.wait(), BOUND)
    conn.app.endpoint.draining = True  # (the shutdown's drain began: the first Ctrl-C)
    conn.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(conn.task, BOUND)
    assert [e.text for e in conn.events if isinstance(e, ev.Delta)] == ["a;"]
    assert interrupted(conn.terminal()), conn.events


async def test_a_connection_cancelled_outside_a_shutdown_keeps_its_streams_for_the_resume() -> None:
    started = asyncio.Event()
    conn = AsgiConnection(waiting_model(started))
    await asyncio.wait_for(started.wait(), BOUND)
    conn.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(conn.task, BOUND)
    assert conn.terminal() is None  # nothing cut: detached, the stream runs on for its client's resume
    [runner] = list(conn.app.endpoint.store.values())  # type: ignore[attr-defined]
    assert runner.driver is None and 1 in runner.tasks
    runner.destroy()


class SlowEndPeer(Peer):
    """A peer whose socket takes the End only once `gate` is set (a transport past its high-water mark)."""

    def __init__(self, endpoint: Any) -> None:
        super().__init__(endpoint)
        self.gate = asyncio.Event()

    async def _send(self, message: Any) -> None:
        if message["type"] == "websocket.send" and '"type":"end"' in str(message.get("text")):
            await self.gate.wait()
        await super()._send(message)


async def test_a_stream_that_ends_in_its_first_step_but_waits_to_send_its_end_is_let_go() -> None:
    # The model's task runs its first step at once (runtime/eager.py). Here that step ends the stream and then waits
    # to write the End. Before (issue 39), the task was registered in runner.tasks after that step, past the point
    # where the stream takes it out: it stayed for good, and every later drain of the connection waited the whole
    # drain_grace for a stream that had ended (seen under daphne and the Flask bridge, with 30 KB Deltas).
    async def quick(req: Any) -> Any:
        return "done"

    peer = SlowEndPeer(endpoint_for(quick))
    await peer.hello_and_request()
    runner = peer.driver.runner  # type: ignore[union-attr]
    assert runner is not None and peer.texts() == ["done"] and terminal(peer) is None  # the End waits
    peer.gate.set()
    await wait_for(lambda: terminal(peer) is not None)
    await wait_for(lambda: all(task.done() for task in runner.tasks.values()))
    assert runner.tasks == {} and not runner.models_running()
    await asyncio.wait_for(peer.driver.drain(grace=3600), BOUND)  # type: ignore[union-attr]  # no stream to wait for
    assert peer.closed == 4002
    await peer.gone()


async def test_the_clients_cancel_still_ends_with_end_cancelled() -> None:
    started = asyncio.Event()
    peer = Peer(endpoint_for(waiting_model(started)))
    await peer.hello_and_request()
    await asyncio.wait_for(started.wait(), BOUND)
    await peer.receive(ev.Cancel(stream_id=1))
    await wait_for(lambda: terminal(peer) is not None)
    end = terminal(peer)
    assert isinstance(end, ev.End) and end.finish_reason == "cancelled" and end.last_seq == 1
    await peer.gone()


async def test_a_cancel_from_another_process_is_the_clients_cancel() -> None:
    # (shared sessions: the client cancelled on the process that relays the stream; push.HUB._cancel calls this)
    started = asyncio.Event()
    peer = Peer(endpoint_for(waiting_model(started)))
    await peer.hello_and_request()
    await asyncio.wait_for(started.wait(), BOUND)
    peer.driver.runner.cancel(1)
    await wait_for(lambda: terminal(peer) is not None)
    end = terminal(peer)
    assert isinstance(end, ev.End) and end.finish_reason == "cancelled"
    await peer.gone()


async def test_a_model_that_catches_its_cancellation_and_returns_is_still_cut() -> None:
    started = asyncio.Event()

    async def model(req: Any) -> Any:
        yield "a;"
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return  # (swallowed: its task still says it was cancelled)
        yield "never;"

    peer = Peer(endpoint_for(model))
    await peer.hello_and_request()
    await asyncio.wait_for(started.wait(), BOUND)
    peer.driver.runner.tasks[1].cancel()
    await wait_for(lambda: terminal(peer) is not None)
    assert interrupted(terminal(peer)), peer.events
    await peer.gone()


async def test_a_model_task_cancelled_while_detached_keeps_the_error_for_the_resume() -> None:
    started = asyncio.Event()
    peer = Peer(endpoint_for(waiting_model(started)))
    await peer.hello_and_request()
    await asyncio.wait_for(started.wait(), BOUND)
    runner = peer.driver.runner
    await peer.driver.disconnected(1006)  # dropped: the session waits for a resume
    runner.tasks[1].cancel()  # (the process ending: its loop cancels what runs)
    await wait_for(lambda: not runner.tasks)
    assert interrupted(runner.session.streams[1].terminal), runner.session.streams[1].terminal
    runner.destroy()


async def test_a_cancelled_error_the_model_raises_itself_is_its_failure() -> None:
    async def model(req: Any) -> Any:
        yield "a;"
        inner = asyncio.get_running_loop().create_future()
        inner.cancel()
        await inner  # raises CancelledError into the model, whose own task nobody cancelled

    peer = Peer(endpoint_for(model))
    await peer.hello_and_request()
    await wait_for(lambda: terminal(peer) is not None)
    assert terminal(peer) == ev.Error(stream_id=1, code=ErrorCode.MODEL_ERROR, message="model failed (CancelledError)")
    await peer.gone()


async def test_a_shut_down_thread_pool_is_the_servers_stop_not_the_models_failure(caplog: Any) -> None:
    # (a process exiting shuts its pools down while the loop may still run, as the thread bridge's does)
    def model(req: Any) -> Any:
        yield "a;"
        yield "b;"

    endpoint = endpoint_for(model)
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    endpoint.executor = pool
    peer = Peer(endpoint)
    with caplog.at_level(logging.ERROR, logger="lowlat_mw"):
        await peer.hello_and_request()
        await wait_for(lambda: terminal(peer) is not None)
    assert interrupted(terminal(peer)), peer.events  # before: Error model_error "model failed (RuntimeError)"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no model failure logged
    await peer.gone()


async def test_a_cancelled_batch_call_is_the_servers_stop_not_the_models_failure() -> None:
    called = asyncio.Event()

    async def model(reqs: Any) -> Any:
        called.set()
        await asyncio.sleep(3600)
        return ["never" for _ in reqs]

    model.batch = True  # type: ignore[attr-defined]
    endpoint = endpoint_for(model, max_batch_size=1, max_batch_wait=30.0)
    peer = Peer(endpoint)
    await peer.hello_and_request()
    await asyncio.wait_for(called.wait(), BOUND)
    batcher = batcher_for(model, endpoint.executor, 1, 30.0)
    assert len(batcher._tasks) == 1
    for task in batcher._tasks:
        task.cancel()  # (the loop ending cancels it as it does every task)
    await wait_for(lambda: terminal(peer) is not None)
    assert interrupted(terminal(peer)), peer.events  # before: model_error "model failed (RuntimeError)"
    await peer.gone()


async def test_a_relay_cut_by_anything_but_the_clients_cancel_sends_nothing() -> None:
    # (shared sessions: a stream another process runs, relayed here; cut here, it runs on there, and the client
    # resumes it from another process once this connection is gone)
    peer = Peer(endpoint_for(lambda req: "x"))
    await peer.receive(ev.Hello())
    runner_session = peer.driver.protocol.session
    from lowlat_mw.runtime.streams import ModelRunner

    runner = peer.driver.runner = ModelRunner(runner_session, peer.driver)
    relaying = asyncio.Event()

    async def source() -> Any:
        relaying.set()
        await asyncio.sleep(3600)
        yield "never;"

    for sid in (5, 7):
        assert runner_session.start(ev.Request(stream_id=sid), time.monotonic()) is None
        runner.follow(sid, source())
    await asyncio.wait_for(relaying.wait(), BOUND)
    runner.tasks[5].cancel()  # not the client's
    await peer.receive(ev.Cancel(stream_id=7))  # the client's
    await wait_for(lambda: not runner.tasks)
    assert terminal(peer, 5) is None and runner_session.streams[5].terminal is None  # left for the resume
    end = terminal(peer, 7)
    assert isinstance(end, ev.End) and end.finish_reason == "cancelled"
    await peer.gone()


def test_the_client_machine_reads_an_unasked_end_cancelled_as_a_cut_stream() -> None:
    # An older server (or one force-stopped before this fix) ends a stream it cut with End "cancelled": the client
    # never asked, so it is an Error to the caller, never a normal end (the Python and browser clients alike).
    client = ClientProtocol("lowlat.v1.json")
    asked, unasked = ClientStream(ev.Request(stream_id=1)), ClientStream(ev.Request(stream_id=2))
    client.request(asked)
    client.request(unasked)
    client.cancel(1)
    assert client._on_terminal(ev.End(stream_id=1, last_seq=3, finish_reason="cancelled"), 0.0) == [
        ev.End(stream_id=1, last_seq=3, finish_reason="cancelled")]
    [cut] = client._on_terminal(ev.End(stream_id=2, last_seq=56, finish_reason="cancelled"), 0.0)
    assert isinstance(cut, ev.Error) and cut.code is ErrorCode.INTERNAL and cut.retryable and "56" in cut.message
    assert client._on_terminal(ev.End(stream_id=2, last_seq=56, finish_reason="stop"), 0.0) == []  # (ended)


# ================================================================================ item 8: replies of a wrong type
async def returns_dict(req: Any) -> Any:
    return {"answer": 1}


def returns_set(req: Any) -> Any:
    return {"a", "b"}


async def returns_int(req: Any) -> Any:
    return 42


async def yields_dict(req: Any) -> Any:
    yield "a;"
    yield {"answer": 1}


def gen_yields_int(req: Any) -> Any:
    yield "a;"
    yield 42


@pytest.mark.parametrize(("model", "before", "what"), [
    (returns_int, [], "returned int"),
    (returns_dict, [], "returned dict"),
    (returns_set, [], "returned set"),
    (yields_dict, ["a;"], "yielded dict"),
    (gen_yields_int, ["a;"], "yielded int"),
], ids=["return-int", "return-dict", "return-set", "yield-dict", "sync-gen-yield-int"])
@pytest.mark.parametrize("merge", [False, True], ids=["plain", "merge_deltas"])
async def test_a_reply_of_a_wrong_type_fails_as_a_type_error_naming_the_model(
        model: Any, before: list[str], what: str, merge: bool, caplog: Any) -> None:
    # `return {"answer": 1}` streamed the text "answer" and ended with "stop", nothing logged; `return 42` got
    # model_error (TypeError). Every such reply now gets that same Error, and one log line naming model and type.
    peer = Peer(endpoint_for(model, merge_deltas=merge))
    with caplog.at_level(logging.ERROR, logger="lowlat_mw"):
        await peer.hello_and_request()
        await wait_for(lambda: terminal(peer) is not None)
    assert peer.texts() == before
    assert terminal(peer) == ev.Error(stream_id=1, code=ErrorCode.MODEL_ERROR, message="model failed (TypeError)")
    records = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(records) == 1, records  # logged once
    name = f"{__name__}.{model.__qualname__}"
    assert name in records[0].getMessage()
    error = records[0].exc_info[1]
    assert isinstance(error, TypeError) and what in str(error) and name in str(error), error
    assert peer.closed is None
    await peer.gone()


async def test_the_type_error_reaches_the_client_with_its_text_when_errors_are_exposed() -> None:
    peer = Peer(endpoint_for(returns_dict, expose_model_errors=True))
    await peer.hello_and_request()
    await wait_for(lambda: terminal(peer) is not None)
    error = terminal(peer)
    assert isinstance(error, ev.Error) and error.message.startswith("model failed (TypeError: model returned dict")
    assert "returns_dict" in error.message and "mapping" in error.message
    await peer.gone()
