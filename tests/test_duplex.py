"""Full-duplex streams (protocol v1.3) below the network: the server machine's Input rules (order, resends, end,
size, older clients), tool calls in the replay buffer and on a resume, the client machine's resend bookkeeping, and
the model's ``req.inputs``. (Every server, and dropped connections: tests/conformance/test_conformance_duplex.py.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from support import wait_until

from lowlat_mw.errors import ErrorCode, LocalProtocolError
from lowlat_mw.model import InputEnded, Inputs, ModelRequest, SessionInfo
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.client import ClientStream
from lowlat_mw.protocol.server import CancelStream, DeliverInput, StartStream
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings
from lowlat_mw.testing.pair import ConnectionPair

BOTH = [SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON]


def started(subprotocol: str = SUBPROTOCOL_PROTO, settings: Settings | None = None) -> ConnectionPair:
    pair = ConnectionPair.ready(settings, subprotocol)
    assert pair.request(ClientStream(ev.Request(stream_id=1, model="m", text="q"))) == [
        StartStream(ev.Request(stream_id=1, model="m", text="q"))]
    return pair


def inp(seq: int, **kw: object) -> ev.Input:
    return ev.Input(stream_id=1, seq=seq, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("subprotocol", BOTH)
def test_inputs_are_delivered_once_in_order_and_a_resend_is_ignored(subprotocol: str) -> None:
    pair = started(subprotocol)
    first = inp(1, tool_result=ev.ToolResult(id="c1", content="{}"))
    assert pair.send(first) == [DeliverInput(first)]
    assert pair.send(first) == []  # a resend after a resume: the server has it
    assert pair.send(inp(2, text="more")) == [DeliverInput(inp(2, text="more"))]
    assert pair.send(inp(3, data=b"\x00", end=True)) == [DeliverInput(inp(3, data=b"\x00", end=True))]
    assert pair.conn.session.streams[1].input_seq == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(("bad", "words"), [
    (inp(2, text="x"), "input seq 2 after 0"),  # a gap: one was lost by the client
])
def test_an_input_out_of_order_fails_its_stream_only(bad: ev.Input, words: str) -> None:
    pair = started()
    out = pair.send(bad)
    assert isinstance(out[0], ev.Error) and out[1] == CancelStream(1)
    assert (out[0].stream_id, out[0].code) == (1, ErrorCode.BAD_REQUEST) and words in out[0].message
    assert pair.send(ev.Ping(id=5)) == [ev.Pong(id=5)]  # the connection goes on
    assert pair.send(inp(3, text="late")) == []  # the stream is over: nothing delivered


def test_input_after_the_end_and_too_big_input_fail_the_stream() -> None:
    pair = started()
    assert pair.send(inp(1, end=True)) == [DeliverInput(inp(1, end=True))]
    out = pair.send(inp(2, text="x"))
    assert out[0].code is ErrorCode.BAD_REQUEST and "after the stream's input ended" in out[0].message
    pair = started(settings=Settings(max_request_size=10))
    out = pair.send(inp(1, text="x" * 11))
    assert out[0].code is ErrorCode.MESSAGE_TOO_BIG and out[1] == CancelStream(1)


def test_an_input_from_an_older_client_is_an_unsupported_message() -> None:
    pair = ConnectionPair(Settings())
    assert isinstance(pair.send(ev.Hello(client="old", revision=2))[0], ev.Welcome)
    out = pair.send(inp(1, text="x"))
    assert out[0].code is ErrorCode.UNSUPPORTED_MESSAGE and "v1.3" in out[0].message


def test_inputs_to_unknown_or_ended_streams_are_ignored() -> None:
    pair = started()
    assert pair.send(ev.Input(stream_id=9, seq=1, text="x")) == []
    pair.conn.finish_stream(1, pair.now)
    assert pair.send(inp(1, text="x")) == []


def test_a_tool_call_is_one_delta_kept_for_the_resume_and_refused_to_an_older_client() -> None:
    pair = started()
    call = ev.ToolCall("lookup", '{"q": 1}')
    out = pair.chunk(1, call)
    assert out == [ev.Delta(stream_id=1, seq=1, tool_call=ev.ToolCall("lookup", '{"q": 1}', id="call_1_1"))]
    assert pair.conn.session.buffered_deltas(1) == out  # type: ignore[union-attr]
    old = ConnectionPair(Settings())
    old.send(ev.Hello(client="old", revision=2))
    old.send(ev.Request(stream_id=1, model="m"))
    with pytest.raises(LocalProtocolError, match=r"needs v1\.3"):
        old.server.send_chunk(1, call, old.now)
    with pytest.raises(LocalProtocolError, match="does not fit max_frame_size"):
        started(settings=Settings(max_frame_size=1024)).server.send_chunk(1, ev.ToolCall("x", "[" + "1," * 600 + "1]"),
                                                                          0)


def test_a_resume_welcome_says_which_inputs_the_server_holds_and_the_client_sends_the_rest() -> None:
    pair = started()
    st = pair.client.streams[1]
    for text in ("a", "b", "c"):
        pair.client.add_input(st, text=text)
    for i in st.inputs[:2]:  # the third is lost in the drop
        assert pair.client_says(pair.client.input_frame(i)) == [DeliverInput(i)]
    st.sent_inputs = 3
    session = pair.conn.session
    pair.conn.connection_lost()
    pair.client.connection_lost()
    again = ConnectionPair(Settings(), client=pair.client, session_id="sess-2")
    welcome = again.hello(resume=True, session=session)[0]
    assert isinstance(welcome, ev.Welcome) and welcome.resumed and welcome.input_seq == {1: 2}
    assert st.sent_inputs == 2  # what to send again: st.inputs[2:]
    assert again.client_says(again.client.input_frame(st.inputs[2])) == [DeliverInput(st.inputs[2])]


def test_the_client_refuses_input_to_an_older_server() -> None:
    pair = ConnectionPair.ready()
    pair.client.welcome = ev.Welcome(session_id="s", revision=2)
    with pytest.raises(LocalProtocolError, match=r"needs v1\.3"):
        pair.client.add_input(ClientStream(ev.Request(stream_id=1)), text="x")


@pytest.mark.parametrize("bad", [dict(seq=0, text="x"), dict(seq=1), dict(seq=1, text="x", data=b"y")])
def test_an_input_must_be_numbered_and_carry_one_item_or_its_end(bad: dict[str, object]) -> None:
    with pytest.raises(LocalProtocolError):
        ev.Input(stream_id=1, **bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the model's side
async def test_inputs_wait_in_order_a_result_is_taken_by_its_id_and_the_end_ends_iteration() -> None:
    inputs = Inputs()
    inputs.loop = asyncio.get_running_loop()
    req = ModelRequest(stream_id=1, session=SessionInfo(session_id="s"), inputs=inputs)
    call = req.tool_call("lookup", {"q": 1})
    assert call.args == {"q": 1} and call.id.startswith("call_")
    waiting = asyncio.ensure_future(inputs.result(call))
    await asyncio.sleep(0)
    inputs.put("first", False)
    inputs.put(ev.ToolResult(id="other"), False)
    inputs.put(ev.ToolResult(id=call.id, content="r"), False)
    assert (await waiting).content == "r"
    inputs.put(b"last", True)
    assert [item async for item in inputs] == ["first", ev.ToolResult(id="other"), b"last"]
    with pytest.raises(InputEnded):
        await inputs.result("never")


async def test_a_sync_model_waits_for_input_from_its_worker_thread() -> None:
    inputs = Inputs()
    inputs.loop = asyncio.get_running_loop()
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(inputs.get_sync(timeout=10)))
    thread.start()
    # the thread's wait has begun (its condition is made on the loop)
    await wait_until(lambda: inputs.cond is not None, interval=0.001, what="the thread to wait")
    inputs.put("hi", False)
    await asyncio.to_thread(thread.join, 10)
    assert got == ["hi"]


# ---------------------------------------------------------------- the clients, in process
CANCELLED: list[str] = []  # prompts whose model was cancelled while it waited


async def _agent(req: ModelRequest) -> Any:
    yield "asking;"
    call = req.tool_call("lookup", {"q": req.prompt})
    yield call
    try:
        result = await req.inputs.result(call)
    except asyncio.CancelledError:
        CANCELLED.append(req.prompt)
        raise
    yield f"got:{result.content};"
    async for item in req.inputs:
        yield f"in:{item};"


def _app() -> Any:
    from starlette.applications import Starlette

    from lowlat_mw.adapters.starlette import LowLatMiddleware

    app = Starlette()
    app.add_middleware(LowLatMiddleware, model=_agent, path="/ws")
    return app


async def test_a_tool_call_nobody_answers_is_a_clear_client_error() -> None:
    from lowlat_mw.errors import ClientError
    from lowlat_mw.testing.inprocess import AppClient

    async with AppClient(_app(), "/ws") as client:
        with pytest.raises(ClientError, match="asked for tool 'lookup'"):
            await client.complete("x")
        # and its stream was cancelled: the model does not wait for ever
        await wait_until(lambda: "x" in CANCELLED, interval=0.01, what="the stream to be cancelled")
        # with the tool given, the same call completes; the tool gets the call's arguments as keywords
        stream = client.stream("rome", tools={"lookup": lambda q: q.upper()})
        got = []
        async for chunk in stream:
            got.append(chunk)
            if chunk.startswith("got:"):
                await stream.end_input()
        assert got == ["asking;", "got:ROME;"]


def test_the_sync_client_answers_and_sends_input() -> None:
    from lowlat_mw.client import connect_sync
    from lowlat_mw.testing.pytest_plugin import RunningServer

    server = RunningServer(_app()).start()
    try:
        with connect_sync(server.url) as client:
            stream = client.stream("oslo")
            got = []
            for chunk in stream:
                got.append(chunk)
                if isinstance(chunk, ev.ToolCall):
                    stream.send_result(chunk, "cold")
                    stream.send("bye", end=True)
            assert got[0] == "asking;" and isinstance(got[1], ev.ToolCall) and got[2:] == ["got:cold;", "in:bye;"]
    finally:
        server.stop()


async def test_several_waiters_are_all_woken_and_a_cancelled_one_leaves_the_others_waiting() -> None:
    """Parallel tool calls: gather() of two results, each answered; a cancelled waiter takes nothing and does not
    unhook the others; the end of the stream wakes everyone still waiting."""
    inputs = Inputs()
    inputs.loop = asyncio.get_running_loop()
    both = asyncio.gather(inputs.result("c1"), inputs.result("c2"))
    gone = asyncio.ensure_future(inputs.get())
    late = asyncio.ensure_future(inputs.get())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    inputs.put(ev.ToolResult(id="c2", content="two"), False)
    inputs.put(ev.ToolResult(id="c1", content="one"), False)
    assert [r.content for r in await both] == ["one", "two"]
    inputs.put("x", False)
    assert await late == "x"
    waiting = [asyncio.ensure_future(inputs.get()) for _ in range(2)]
    await asyncio.sleep(0)
    inputs.put(None, True)  # (what the driver does when the stream ends)
    for task in waiting:
        with pytest.raises(InputEnded):
            await task


async def test_a_sync_wait_that_times_out_takes_nothing_and_the_end_wakes_a_waiting_thread() -> None:
    inputs = Inputs()
    inputs.loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await asyncio.to_thread(inputs.result_sync, "c1", 0.05)
    with pytest.raises(TimeoutError):
        await asyncio.to_thread(inputs.get_sync, 0.05)
    inputs.put("hello", False)
    inputs.put(ev.ToolResult(id="c1", content="r"), False)
    assert await asyncio.to_thread(inputs.result_sync, "c1", 5) == ev.ToolResult(id="c1", content="r")
    assert await asyncio.to_thread(inputs.get_sync, 5) == "hello"  # nothing was lost to the timed-out waits
    waiting = asyncio.ensure_future(asyncio.to_thread(inputs.get_sync, 30))
    while inputs.cond is None:
        await asyncio.sleep(0.001)
    inputs.put(None, True)
    with pytest.raises(InputEnded):
        await waiting
