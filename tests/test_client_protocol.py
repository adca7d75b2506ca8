"""ClientProtocol, the client's sans-IO machine, against the real ServerProtocol through a ConnectionPair.

The same protocol rules as tests/test_connection.py and tests/protocol/test_session.py, from the client's side:
the handshake and negotiation, streams, cancel, the heartbeat in both directions, flow-control Acks,
resume (duplicates dropped, gaps refused), GoAway mid-stream, and what the client does with a broken
server. No sockets and no sleeps: time is a number.
"""

from __future__ import annotations

from typing import Any

import pytest

from lowlat_mw.errors import CloseCode, ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.base import CloseConnection, Measured, SendFrame
from lowlat_mw.protocol.client import ClientProtocol, ClientStream, StreamBroken
from lowlat_mw.protocol.server import CancelStream, StartStream
from lowlat_mw.protocol.state import ConnState
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings
from lowlat_mw.testing import ConnectionPair
from lowlat_mw.testing.pair import T0

BOTH = [SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON]


def events_of(items: list[Any], kind: type) -> list[Any]:
    return [i for i in items if isinstance(i, kind)]


def started(pair: ConnectionPair, sid: int, text: str = "go") -> ClientStream:
    """The client machine starts stream `sid`; the server's answer must be StartStream."""
    st = ClientStream(ev.Request(stream_id=sid, text=text))
    [start] = pair.decode(pair.server.receive_data(pair.client.request(st), pair.now))
    assert isinstance(start, StartStream) and start.request == st.request
    return st


def model_says(pair: ConnectionPair, sid: int, *chunks: str) -> list[Any]:
    """The server's model produces `chunks`: what the client machine makes of the frames."""
    return pair.deliver([frame for chunk in chunks for frame in pair.server.send_chunk(sid, chunk, pair.now)])


# ================================================================================ handshake
@pytest.mark.parametrize("subprotocol", BOTH)
def test_hello_and_welcome_open_both_sides(subprotocol: str) -> None:
    pair = ConnectionPair(Settings(max_streams=3, heartbeat_interval=15, server_name="edge"), subprotocol,
                          flow_window=4096)
    assert pair.client.state is ConnState.CLOSED and pair.server.state is ConnState.AWAIT_HELLO
    [welcome] = pair.hello()
    assert isinstance(welcome, ev.Welcome) and welcome == pair.client.welcome
    assert pair.client.state is ConnState.OPEN and pair.server.state is ConnState.OPEN
    assert welcome.session_id == "sess-1" and welcome.max_streams == 3 and welcome.server == "edge"
    assert welcome.flow_window == 4096 and pair.client.connections == 1
    assert pair.client.heartbeat is not None and pair.client.heartbeat.interval == 15


@pytest.mark.parametrize(("offered", "served", "expected"), [
    (("snappy", "zstd"), ("zstd", "lz4", "snappy"), ("zstd", "snappy")),  # the server's order
    (("lz4",), ("zstd", "snappy"), ()),
    ((), ("zstd", "lz4", "snappy"), ()),
])
def test_both_sides_agree_on_the_compression(offered: tuple[str, ...], served: tuple[str, ...],
                                            expected: tuple[str, ...]) -> None:
    pair = ConnectionPair.ready(Settings(compression=served, compression_min_size=0), compression=offered)
    assert pair.client.compression == pair.server.compression == expected
    assert (pair.client.compressor is None) == (not expected)
    text = "the quick brown fox jumps over the lazy dog " * 300
    st = ClientStream(ev.Request(stream_id=1, text=text))
    frame = pair.client.request(st)
    assert (frame[0] & 0x0F != 0) == bool(expected)  # a big Request goes out compressed when negotiated
    assert isinstance(pair.decode(pair.server.receive_data(frame, T0))[0], StartStream)
    [delta] = model_says(pair, 1, text)
    assert delta.text == text


def test_json_offers_no_compression() -> None:
    client = ClientProtocol(SUBPROTOCOL_JSON, compression=("zstd",))
    assert client.offered == ()


def test_an_error_instead_of_welcome_is_a_refusal() -> None:
    client = ClientProtocol(SUBPROTOCOL_JSON)
    client.connect(T0)
    refusal = ev.Error(code=ErrorCode.UNAUTHORIZED, message="no")
    assert client.receive_data(client.codec.encode(refusal), T0) == [refusal]
    assert client.closed


@pytest.mark.parametrize("subprotocol", BOTH)
def test_anything_else_before_welcome_closes_with_1002(subprotocol: str) -> None:
    client = ClientProtocol(subprotocol)
    client.connect(T0)
    out = client.receive_data(client.codec.encode(ev.Delta(stream_id=1, seq=1, text="x")), T0)
    assert out == [CloseConnection(CloseCode.PROTOCOL_ERROR, "expected welcome, got Delta")]
    assert client.closed and client.receive_data(client.codec.encode(ev.Ping(id=1)), T0) == []


@pytest.mark.parametrize(("subprotocol", "garbage", "code"), [
    (SUBPROTOCOL_PROTO, b"\x10\xff\xff", CloseCode.INVALID_PAYLOAD),
    (SUBPROTOCOL_PROTO, '{"type":"ping"}', CloseCode.UNSUPPORTED_DATA),
    (SUBPROTOCOL_JSON, "{not json", CloseCode.INVALID_PAYLOAD),
])
def test_a_bad_frame_from_the_server_closes_with_its_code(subprotocol: str, garbage: bytes | str, code: int) -> None:
    pair = ConnectionPair.ready(subprotocol=subprotocol)
    [close] = pair.client.receive_data(garbage, T0)
    assert isinstance(close, CloseConnection) and close.code == code and pair.client.closed


def test_a_frame_over_the_clients_limit_closes_with_1009() -> None:
    pair = ConnectionPair.ready(subprotocol=SUBPROTOCOL_JSON, max_frame_size=1000)
    started(pair, 1)
    [close] = model_says(pair, 1, "x" * 2000)
    assert close == CloseConnection(CloseCode.MESSAGE_TOO_BIG, "frame of 2048 bytes exceeds max_frame_size")


# ================================================================================ streams
@pytest.mark.parametrize("subprotocol", BOTH)
def test_streams_deliver_deltas_in_order_then_end(subprotocol: str) -> None:
    pair = ConnectionPair.ready(subprotocol=subprotocol)
    one, two = started(pair, 1), started(pair, 2)
    got = model_says(pair, 1, "a", "b") + model_says(pair, 2, "x") + model_says(pair, 1, "c")
    assert [(d.stream_id, d.seq, d.chunk) for d in got] == [(1, 1, "a"), (1, 2, "b"), (2, 1, "x"), (1, 3, "c")]
    assert (one.received_seq, two.received_seq) == (3, 1)
    [end] = pair.deliver(pair.server.finish_stream(1, T0))
    assert isinstance(end, ev.End) and end.last_seq == 3
    assert set(pair.client.streams) == {2}  # ended: no longer open (a resume would not list it)
    [error] = pair.deliver(pair.server.fail_stream(2, T0, ErrorCode.MODEL_ERROR, "model failed (KeyError)"))
    assert error == ev.Error(stream_id=2, code=ErrorCode.MODEL_ERROR, message="model failed (KeyError)")
    assert pair.client.streams == {}


@pytest.mark.parametrize("subprotocol", BOTH)
def test_cancel_reaches_the_model_and_the_stream_ends_cancelled(subprotocol: str) -> None:
    pair = ConnectionPair.ready(subprotocol=subprotocol)
    started(pair, 4)
    model_says(pair, 4, "a")
    assert pair.client_says(pair.client.cancel(4)) == [CancelStream(4)]
    [end] = pair.deliver(pair.server.finish_stream(4, T0, reason="cancelled"))
    assert (end.finish_reason, end.last_seq) == ("cancelled", 1)


def test_events_of_streams_the_client_gave_up_are_dropped() -> None:
    pair = ConnectionPair.ready()
    started(pair, 1)
    pair.client.forget(1)
    assert model_says(pair, 1, "late") == []
    assert pair.deliver(pair.server.finish_stream(1, T0)) == []


def test_a_gap_in_seqs_breaks_the_stream() -> None:
    pair = ConnectionPair.ready()
    st = started(pair, 1)
    frames = [f for chunk in ("a", "b", "c") for f in pair.server.send_chunk(1, chunk, T0)]
    assert pair.deliver(frames[:1])[0].seq == 1
    assert pair.deliver(frames[2:]) == [StreamBroken(1, "stream 1: got seq 3 after 1")]
    assert st.received_seq == 1


def test_a_connection_level_error_is_kept() -> None:
    pair = ConnectionPair.ready()
    [error] = pair.send_raw(b"\x10")  # an empty envelope: the server answers on stream 0
    pair.deliver([pair.codec.encode(error)])
    assert pair.client.last_error == error and error.stream_id == 0


# ================================================================================ heartbeat
@pytest.mark.parametrize("subprotocol", BOTH)
def test_server_pings_are_answered_by_the_client_machine(subprotocol: str) -> None:
    pair = ConnectionPair.ready(subprotocol=subprotocol)
    [ping] = pair.tick(T0 + 30)
    assert isinstance(ping, ev.Ping)
    reply = pair.deliver([pair.codec.encode(ping)], at=T0 + 30.04)
    assert [type(r) for r in reply] == [SendFrame]  # the Pong, sent back by the pair
    assert pair.server.heartbeat.rtt == pytest.approx(0.04)


def test_a_client_that_does_not_answer_pings_is_closed_with_4001() -> None:
    pair = ConnectionPair.ready(answer_pings=False)
    [ping] = pair.tick(T0 + 30)
    assert pair.deliver([pair.codec.encode(ping)]) == []
    assert pair.tick(T0 + 40) == [CloseConnection(CloseCode.HEARTBEAT_TIMEOUT, "no pong within heartbeat_timeout")]


def test_the_client_pings_a_quiet_server_and_measures_the_round_trip() -> None:
    pair = ConnectionPair.ready(Settings(heartbeat_interval=20))
    client = pair.client
    assert client.next_deadline() == T0 + 20
    [ping] = client.tick(T0 + 20)
    assert isinstance(ping, SendFrame)
    [pong] = pair.decode(pair.server.receive_data(ping.data, T0 + 20))
    out = client.receive_data(pair.codec.encode(pong), T0 + 20.25)
    assert out == [Measured("heartbeat_rtt_seconds", 0.25), pong] and client.heartbeat.rtt == pytest.approx(0.25)


def test_a_server_that_stops_answering_is_closed_with_4001() -> None:
    pair = ConnectionPair.ready(Settings(heartbeat_interval=20), heartbeat_timeout=5)
    assert [type(a) for a in pair.client.tick(T0 + 20)] == [SendFrame]  # the Ping, never answered
    assert pair.client.next_deadline() == T0 + 25
    assert pair.client.tick(T0 + 24.9) == []
    assert pair.client.tick(T0 + 25) == [CloseConnection(CloseCode.HEARTBEAT_TIMEOUT, "server did not answer")]
    assert pair.client.closed and pair.client.tick(T0 + 1000) == []


def test_pings_of_the_client_get_their_pong() -> None:
    pair = ConnectionPair.ready()
    [pong] = pair.client_says(pair.client.ping(77))
    assert pair.deliver([pair.codec.encode(pong)]) == [ev.Pong(id=77)]


# ================================================================================ flow control
@pytest.mark.parametrize("subprotocol", BOTH)
def test_acks_open_the_servers_window_and_done_forgets_the_stream(subprotocol: str) -> None:
    pair = ConnectionPair.ready(Settings(flow_window=1000), subprotocol, flow_window=1000)
    assert pair.client.welcome.flow_window == 1000
    st = started(pair, 1)
    session = pair.server.session
    acks = []
    while not session.blocked:
        for delta in model_says(pair, 1, "x" * 36):  # 100 bytes each, counted alike on both sides
            acks.append(pair.client.consumed(st, delta))
    assert session.blocked and sum(a is not None for a in acks) >= 3  # an Ack per quarter of the window
    sent = [a for a in acks if a is not None]
    for ack in sent:
        pair.client_says(ack)
    assert not session.blocked and session.streams[1].acked == st.acked_seq > 0
    [end] = pair.deliver(pair.server.finish_stream(1, T0))
    pair.client_says(pair.client.consumed(st, end))  # the End is acknowledged at once, done
    assert 1 not in session.streams


def test_without_a_window_the_client_sends_no_acks() -> None:
    pair = ConnectionPair.ready(flow_window=0)
    st = started(pair, 1)
    [delta] = model_says(pair, 1, "x")
    assert pair.client.welcome.flow_window == 0 and pair.client.consumed(st, delta) is None


# ================================================================================ resume
def dropped_with_output(subprotocol: str) -> tuple[ConnectionPair, ClientStream, list[bytes | str]]:
    """Stream 1 produced 5 Deltas; the client got 3 before the connection dropped. Returns the old pair,
    the client's stream and the 5 Delta frames the server sent."""
    pair = ConnectionPair.ready(subprotocol=subprotocol)
    st = started(pair, 1)
    frames = [f for i in range(5) for f in pair.server.send_chunk(1, f"t{i};", T0)]
    assert [d.seq for d in pair.deliver(frames[:3])] == [1, 2, 3]
    pair.server.connection_lost()
    pair.server.session.detach(T0)
    return pair, st, frames


@pytest.mark.parametrize("subprotocol", BOTH)
def test_resume_replays_what_was_missed_and_drops_duplicates(subprotocol: str) -> None:
    old, st, frames = dropped_with_output(subprotocol)
    assert old.client.can_resume and old.client.last_seq() == {1: 3}
    new = old.reconnect()
    out = new.hello(resume=True, session=old.server.session)
    welcome, *replayed = out
    assert isinstance(welcome, ev.Welcome) and welcome.resumed and welcome.session_id == "sess-1"
    assert [(d.seq, d.chunk) for d in replayed] == [(4, "t3;"), (5, "t4;")]
    assert st.received_seq == 5
    # The old connection's frames, or a replay that overlaps what arrived: every one a duplicate, dropped.
    assert new.deliver(frames) == []
    # Live output continues where the session stopped, on the new connection.
    [live] = model_says(new, 1, "t5;")
    assert (live.seq, live.chunk) == (6, "t5;")
    [end] = new.deliver(new.server.finish_stream(1, T0))
    assert end.last_seq == 6 and new.client.streams == {}


def test_resume_of_a_stream_whose_end_was_missed_delivers_the_end() -> None:
    old, st, _ = dropped_with_output(SUBPROTOCOL_PROTO)
    old.server.session.finish(1, T0)  # the model ended while no connection was attached
    new = old.reconnect()
    out = new.hello(resume=True, session=old.server.session)
    assert [type(e) for e in out] == [ev.Welcome, ev.Delta, ev.Delta, ev.End]
    assert new.client.streams == {} and st.received_seq == 5


def test_resume_of_an_unknown_session_fails_the_streams() -> None:
    old, st, _ = dropped_with_output(SUBPROTOCOL_JSON)
    new = old.reconnect()
    welcome, error = new.hello(resume=True, session=None)  # expired on the server
    assert isinstance(welcome, ev.Welcome) and not welcome.resumed and welcome.session_id == "sess-2"
    assert (error.stream_id, error.code, error.retryable) == (1, ErrorCode.RESUME_FAILED, False)
    assert new.client.retry(st, error, retries=5) is None  # it had output: the stream fails
    assert new.client.streams == {}


def test_a_request_lost_in_the_drop_is_sent_again_when_the_resume_finds_it_unknown() -> None:
    pair = ConnectionPair.ready()
    st = ClientStream(ev.Request(stream_id=9, text="lost"))
    pair.client.request(st)  # sent into the drop
    pair.server.connection_lost()
    pair.server.session.detach(T0)
    new = pair.reconnect()
    welcome, error = new.hello(resume=True, session=pair.server.session)
    assert welcome.resumed and (error.stream_id, error.code, error.retryable) == (9, ErrorCode.RESUME_FAILED, True)
    assert new.client.retry(st, error, retries=0) == "now"  # at least once
    [start] = new.decode(new.server.receive_data(new.client.request(st), T0))
    assert isinstance(start, StartStream) and start.request.text == "lost"
    assert new.client.retry(st, error, retries=0) is None  # and not forever


def test_a_fresh_connection_without_open_streams_does_not_resume() -> None:
    pair = ConnectionPair.ready()
    assert not pair.client.can_resume
    new = pair.reconnect()
    [welcome] = new.hello(resume=True)
    assert not welcome.resumed and welcome.session_id == "sess-2"


# ================================================================================ GoAway
@pytest.mark.parametrize("subprotocol", BOTH)
def test_goaway_mid_stream_lets_the_stream_finish_and_moves_new_requests(subprotocol: str) -> None:
    pair = ConnectionPair.ready(subprotocol=subprotocol)
    running = started(pair, 1)
    model_says(pair, 1, "before;")
    [goaway] = pair.deliver(pair.server.drain(reconnect_after_ms=250))
    assert goaway == ev.GoAway(reason="server draining", reconnect_after_ms=250)
    assert pair.client.goaway == goaway and not pair.client.accepting
    # The running stream goes on to its End on the draining connection.
    assert [d.chunk for d in model_says(pair, 1, "after;")] == ["after;"]
    [end] = pair.deliver(pair.server.finish_stream(1, T0))
    assert isinstance(end, ev.End) and end.last_seq == 2 and running.received_seq == 2
    # A Request that crossed the GoAway is refused, retryable, and goes again on the next connection.
    crossing = ClientStream(ev.Request(stream_id=2, text="late"))
    [refused] = pair.decode(pair.server.receive_data(pair.client.request(crossing), T0))
    assert (refused.code, refused.retryable) == (ErrorCode.DRAINING, True)
    assert pair.deliver([pair.codec.encode(refused)]) == [refused]
    assert pair.client.retry(crossing, refused, retries=5) == "after_drain"
    assert pair.client.retry(crossing, refused, retries=5) is None  # once
    new = pair.reconnect()
    new.hello()
    assert new.client.accepting and new.client.goaway is None
    [start] = new.decode(new.server.receive_data(new.client.request(crossing), T0))
    assert isinstance(start, StartStream)


def test_a_request_lost_again_after_its_resends_fails_as_not_delivered_saying_why() -> None:
    # (issue 38, item 15: "ResumeFailed: stream 2 is unknown to this session" said nothing of the request)
    from lowlat_mw.errors import NotDelivered, ResumeFailed, StreamError

    pair = ConnectionPair.ready()
    big = ClientStream(ev.Request(stream_id=9, text="x" * 2_000_000))  # over the Welcome's max_frame_size (1 MiB)
    small = ClientStream(ev.Request(stream_id=11, text="lost"))
    for st in (big, small):
        pair.client.request(st)
    unknown = ev.Error(stream_id=9, code=ErrorCode.RESUME_FAILED, message="stream 9 is unknown", retryable=True)
    assert pair.client.retry(big, unknown, retries=1) == "now"
    assert pair.client.retry(big, unknown, retries=1) is None  # resent once: lost again
    failed = pair.client.failure(big, unknown)
    assert type(failed) is NotDelivered and isinstance(failed, ResumeFailed) and failed.retryable
    assert "stream 9: the request was not delivered: the server never received it, though it was sent 2 times" \
        in failed.message
    assert "over the server's max_frame_size of 1048576: send less" in failed.message
    lost = pair.client.failure(small, ev.Error(stream_id=11, code=ErrorCode.RESUME_FAILED, message="m",
                                               retryable=True))
    assert type(lost) is NotDelivered and "a server or proxy that refuses a message that big" in lost.message
    # the others as before: a stream that had output and could not be resumed, any other Error
    small.received_seq = 3
    assert type(pair.client.failure(small, ev.Error(stream_id=11, code=ErrorCode.RESUME_FAILED, message="m",
                                                    retryable=True))) is ResumeFailed
    model = pair.client.failure(small, ev.Error(stream_id=11, code=ErrorCode.MODEL_ERROR, message="model failed"))
    assert type(model) is StreamError and model.code is ErrorCode.MODEL_ERROR and not model.retryable
