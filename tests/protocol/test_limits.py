"""Sans-IO hardening pieces with a fake clock: TokenBucket, ConnectionLimiter, Handshake, the
authenticate hook runner, and ServerProtocol with rate_limit / max_request_size /
max_session_lifetime / authenticate settings."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat_mw.errors import CloseCode, ErrorCode
from lowlat_mw.model import SessionInfo
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.limits import ConnectionLimiter, TokenBucket
from lowlat_mw.protocol.server import (
    Authenticate,
    CloseConnection,
    ConnState,
    ResumeSession,
    StartStream,
    request_size,
)
from lowlat_mw.runtime.auth import run_authenticator
from lowlat_mw.security import Handshake, load_authenticator
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings
from lowlat_mw.testing import ConnectionPair

T0 = 1000.0
BOTH = [SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON]


# ================================================================================ TokenBucket
def test_bucket_starts_full_and_allows_exactly_the_burst() -> None:
    bucket = TokenBucket(rate=2, burst=5, now=T0)
    assert [bucket.take(T0) for _ in range(6)] == [True] * 5 + [False]
    assert not bucket.take(T0)  # still empty at the same instant


def test_bucket_refills_at_the_rate() -> None:
    bucket = TokenBucket(rate=2, burst=5, now=T0)
    for _ in range(5):
        assert bucket.take(T0)
    assert not bucket.take(T0 + 0.49)  # 0.98 tokens
    assert bucket.take(T0 + 0.5)  # 1 token after 1/rate s
    assert not bucket.take(T0 + 0.5)
    assert [bucket.take(T0 + 1.5) for _ in range(3)] == [True, True, False]  # 2 more after 1 s


def test_bucket_never_holds_more_than_the_burst() -> None:
    bucket = TokenBucket(rate=10, burst=3, now=T0)
    assert [bucket.take(T0 + 3600) for _ in range(4)] == [True, True, True, False]


def test_bucket_ignores_a_clock_going_backwards() -> None:
    bucket = TokenBucket(rate=1, burst=1, now=T0)
    assert bucket.take(T0)
    assert not bucket.take(T0 - 100)  # no tokens from negative time
    assert not bucket.take(T0 + 0.5)
    assert bucket.take(T0 + 1)


def test_bucket_cost_and_retry_after() -> None:
    bucket = TokenBucket(rate=4, burst=4, now=T0)
    assert bucket.take(T0, cost=3)
    assert not bucket.take(T0, cost=2)  # 1 token left
    assert bucket.retry_after(cost=2) == pytest.approx(0.25)
    assert bucket.take(T0 + 0.25, cost=2)
    assert bucket.retry_after() == pytest.approx(0.25)
    assert TokenBucket(rate=0, burst=1, now=T0).retry_after(cost=2) == math.inf


# ================================================================================ ConnectionLimiter
def test_limiter_total_limit() -> None:
    lim = ConnectionLimiter(max_total=2, max_per_client=0)
    assert lim.acquire("10.0.0.1") is None
    assert lim.acquire("10.0.0.2") is None
    refused = lim.acquire("10.0.0.3")
    assert refused is not None and "connection limit (2)" in refused
    assert lim.total == 2  # a refused connection is not counted
    lim.release("10.0.0.1")
    assert lim.acquire("10.0.0.3") is None


def test_limiter_per_client_limit() -> None:
    lim = ConnectionLimiter(max_total=100, max_per_client=2)
    assert lim.acquire("10.0.0.1") is None
    assert lim.acquire("10.0.0.1") is None
    refused = lim.acquire("10.0.0.1")
    assert refused is not None and "10.0.0.1" in refused and "limit 2" in refused
    assert lim.acquire("10.0.0.2") is None  # other clients are not affected
    assert lim.per_client == {"10.0.0.1": 2, "10.0.0.2": 1}
    lim.release("10.0.0.1")
    assert lim.acquire("10.0.0.1") is None


def test_limiter_forgets_clients_with_no_connection() -> None:
    lim = ConnectionLimiter(max_total=0, max_per_client=5)
    for i in range(100):
        assert lim.acquire(f"10.0.{i}.1") is None
        lim.release(f"10.0.{i}.1")
    assert lim.total == 0 and not lim.per_client  # no memory kept per address once it left


def test_limiter_zero_means_no_limit_and_unknown_address_counts_in_total_only() -> None:
    lim = ConnectionLimiter(max_total=0, max_per_client=0)
    for _ in range(1000):
        assert lim.acquire("10.0.0.1") is None
    lim = ConnectionLimiter(max_total=3, max_per_client=1)
    assert [lim.acquire(None) for _ in range(4)][:3] == [None, None, None]
    assert lim.total == 3 and not lim.per_client
    assert lim.acquire(None) is not None


def test_limiter_release_never_goes_negative() -> None:
    lim = ConnectionLimiter(max_total=1, max_per_client=1)
    lim.release("10.0.0.1")
    lim.release(None)
    assert lim.total == 0 and not lim.per_client
    assert lim.acquire("10.0.0.1") is None
    assert lim.acquire("10.0.0.2") is not None  # the total limit still holds


# ================================================================================ Handshake
def test_bearer_prefers_hello_auth_then_header_then_query() -> None:
    everything = Handshake(headers={"authorization": "Bearer from-header"}, query={"token": "from-query"},
                           token="from-hello")
    assert everything.bearer == "from-hello"
    assert Handshake(headers={"authorization": "Bearer from-header"}, query={"token": "q"}).bearer == "from-header"
    assert Handshake(query={"token": "from-query"}).bearer == "from-query"
    assert Handshake().bearer == ""


@pytest.mark.parametrize(("header", "expected"), [
    ("Bearer abc", "abc"), ("bearer abc", "abc"), ("BEARER  abc  ", "abc"),
    ("Basic dXNlcjpwYXNz", "from-query"),  # not a bearer token: falls through to the query
    ("Bearerabc", "from-query"), ("", "from-query"),
])
def test_bearer_header_parsing(header: str, expected: str) -> None:
    assert Handshake(headers={"authorization": header}, query={"token": "from-query"}).bearer == expected


def test_handshake_from_session_info_parses_the_query_and_keeps_the_token_out_of_repr() -> None:
    info = SessionInfo(session_id="s", subprotocol=SUBPROTOCOL_JSON, client=("10.0.0.1", 5555),
                       headers={"authorization": "Bearer h"}, user="django-user",
                       extra={"query_string": "token=q%2B1&x=y"})
    hs = Handshake.from_info(info, "secret-from-hello")
    assert hs.query == {"token": "q+1", "x": "y"}
    assert (hs.subprotocol, hs.client, hs.user, hs.headers) == (SUBPROTOCOL_JSON, ("10.0.0.1", 5555), "django-user",
                                                                {"authorization": "Bearer h"})
    assert hs.bearer == "secret-from-hello"
    assert "secret-from-hello" not in repr(hs)
    assert Handshake.from_info(SessionInfo(session_id="s"), "").query == {}


# ================================================================================ run_authenticator
def run(coro: Any) -> Any:
    return asyncio.run(coro)


HS = Handshake(headers={"authorization": "Bearer good"})


def sync_hook(hs: Handshake) -> str | None:
    return "alice" if hs.bearer == "good" else None


async def async_hook(hs: Handshake) -> str | None:
    await asyncio.sleep(0)
    return "alice" if hs.bearer == "good" else None


@pytest.mark.parametrize("hook", [sync_hook, async_hook], ids=["sync", "async"])
def test_hook_admits_with_its_principal_and_refuses_with_none(hook: Any) -> None:
    assert run(run_authenticator(hook, HS)) == ("alice", "")
    assert run(run_authenticator(hook, Handshake())) == (None, "authentication failed")


def test_sync_hook_runs_off_the_event_loop_in_the_given_executor() -> None:
    seen: list[str] = []

    def hook(hs: Handshake) -> str:
        seen.append(threading.current_thread().name)
        return "alice"

    with ThreadPoolExecutor(1, thread_name_prefix="auth-pool") as pool:
        assert run(run_authenticator(hook, HS, pool)) == ("alice", "")
    assert seen[0].startswith("auth-pool")


def test_sync_hook_returning_an_awaitable_is_awaited() -> None:
    def hook(hs: Handshake) -> Any:
        return async_hook(hs)

    assert run(run_authenticator(hook, HS)) == ("alice", "")


@pytest.mark.parametrize("result", [None, False])
def test_none_and_false_refuse(result: Any) -> None:
    assert run(run_authenticator(lambda hs: result, HS)) == (None, "authentication failed")


@pytest.mark.parametrize("principal", [True, 0, "", {"sub": "alice"}], ids=["true", "zero", "empty", "dict"])
def test_anything_else_admits_as_the_principal(principal: Any) -> None:
    assert run(run_authenticator(lambda hs: principal, HS)) == (principal, "")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_permission_error_refuses_with_its_message(kind: str) -> None:
    def hook(hs: Handshake) -> Any:
        raise PermissionError("token expired")

    async def ahook(hs: Handshake) -> Any:
        raise PermissionError("token expired")

    def bare(hs: Handshake) -> Any:
        raise PermissionError

    assert run(run_authenticator(hook if kind == "sync" else ahook, HS)) == (None, "token expired")
    assert run(run_authenticator(bare, HS)) == (None, "authentication failed")


@pytest.mark.parametrize("exc", [RuntimeError("db down: password=hunter2"), KeyError("x"), ValueError("bad")])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_broken_hook_fails_closed_and_leaks_nothing(kind: str, exc: Exception,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    def hook(hs: Handshake) -> Any:
        raise exc

    async def ahook(hs: Handshake) -> Any:
        raise exc

    with caplog.at_level(logging.ERROR, logger="lowlat_mw"):
        principal, reason = run(run_authenticator(hook if kind == "sync" else ahook, HS))
    assert (principal, reason) == (None, "authentication failed")  # the client learns nothing about the bug
    assert any("authenticate hook failed" in r.getMessage() and r.exc_info for r in caplog.records)


def test_load_authenticator_imports_a_dotted_path() -> None:
    assert load_authenticator("test_limits:sync_hook") is sync_hook
    with pytest.raises(ImportError):
        load_authenticator("test_limits:no_such_hook")


# ================================================================================ ServerProtocol
_SESSION_IDS = itertools.count(1)


class Client(ConnectionPair):
    """The ConnectionPair with shortcuts for these tests (each connection's fresh session id its own)."""

    def __init__(self, settings: Settings, subprotocol: str | None = SUBPROTOCOL_PROTO, now: float = T0) -> None:
        super().__init__(settings, subprotocol, now=now, session_id=f"sess-{next(_SESSION_IDS)}")

    def hello(self, **kw: Any) -> list[Any]:
        return self.send(ev.Hello(client="t", **kw))

    def request(self, sid: int, at: float | None = None, **kw: Any) -> list[Any]:  # type: ignore[override]
        kw.setdefault("model", "m")
        return self.send(ev.Request(stream_id=sid, **kw), at=at)


def opened(settings: Settings, subprotocol: str | None = SUBPROTOCOL_PROTO) -> Client:
    c = Client(settings, subprotocol)
    assert isinstance(c.hello()[0], ev.Welcome)
    return c


# ---------------------------------------------------------------- rate limit
@pytest.mark.parametrize("subprotocol", BOTH)
def test_requests_over_the_rate_get_a_retryable_rate_limited_error(subprotocol: str) -> None:
    c = opened(Settings(rate_limit=2, rate_burst=3, max_streams=100), subprotocol)
    for sid in (1, 2, 3):
        assert c.request(sid) == [StartStream(ev.Request(stream_id=sid, model="m"))]
    out = c.request(4)
    assert len(out) == 1 and out[0].stream_id == 4
    assert (out[0].code, out[0].retryable) == (ErrorCode.RATE_LIMITED, True)
    assert "retry in 0.50 s" in out[0].message
    assert 4 not in c.conn.streams and c.conn.state is ConnState.OPEN  # nothing started, connection open
    assert c.request(4, at=T0 + 0.25)[0].code is ErrorCode.RATE_LIMITED
    assert isinstance(c.request(4, at=T0 + 0.5)[0], StartStream)  # one token back after 1/rate


def test_only_requests_spend_tokens() -> None:
    c = opened(Settings(rate_limit=1, rate_burst=1))
    for i in range(1, 50):  # Pings, Pongs, Acks and Cancels are not rate limited
        assert c.send(ev.Ping(id=i)) == [ev.Pong(id=i)]
        assert c.send(ev.Cancel(stream_id=i)) == []
    assert isinstance(c.request(1)[0], StartStream)
    assert c.request(2)[0].code is ErrorCode.RATE_LIMITED


def test_rate_limit_zero_disables_the_bucket() -> None:
    c = opened(Settings(rate_limit=0, rate_burst=1, max_streams=1000))
    assert c.conn.bucket is None
    assert all(isinstance(c.request(sid)[0], StartStream) for sid in range(1, 500))


def test_a_rate_limited_request_registers_nothing() -> None:
    c = opened(Settings(rate_limit=1, rate_burst=1, max_streams=1))
    assert isinstance(c.request(1)[0], StartStream)
    assert c.request(2)[0].code is ErrorCode.RATE_LIMITED  # checked before max_streams
    assert list(c.conn.streams) == [1]
    c.decode(c.conn.finish_stream(1, T0))
    assert isinstance(c.request(2, at=T0 + 1)[0], StartStream)  # id 2 was never taken


# ---------------------------------------------------------------- max request size
@pytest.mark.parametrize("subprotocol", BOTH)
@pytest.mark.parametrize("field", ["text", "data", "messages", "params"])
def test_request_over_max_request_size_fails_only_that_stream(subprotocol: str, field: str) -> None:
    limit = 100
    c = opened(Settings(max_request_size=limit), subprotocol)
    model = "m"  # the model name counts too (1 byte)

    def payload(n: int) -> dict[str, Any]:
        if field == "text":
            return {"text": "é" * (n // 2) + "x" * (n % 2)}  # UTF-8 bytes, not characters
        if field == "data":
            return {"data": b"\0" * n}
        if field == "messages":
            return {"messages": (ev.ChatMessage(role="user", content="y" * (n - 4)),)}
        return {"params": {"k": "v" * (n - len('{"k": ""}'))}}

    assert isinstance(c.request(1, model=model, **payload(limit - 1))[0], StartStream)  # exactly at the limit
    out = c.request(2, model=model, **payload(limit))  # one byte over
    assert len(out) == 1
    assert (out[0].stream_id, out[0].code, out[0].retryable) == (2, ErrorCode.MESSAGE_TOO_BIG, False)
    assert "max_request_size" in out[0].message
    assert c.conn.open and 2 not in c.conn.streams
    assert isinstance(c.request(3, model=model, text="small")[0], StartStream)



@pytest.mark.parametrize("subprotocol", BOTH)
def test_params_sent_again_and_again_are_measured_as_the_first_time(subprotocol: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The Protobuf decoder keeps the size of params it has read (the connection's ParamsMemo.size): a Request
    that repeats them is held to max_request_size exactly as the first one was, at the limit and one byte over."""
    from lowlat_mw.protocol.wire import ParamsMemo

    kept: list[bool] = []
    size = ParamsMemo.size

    def counted(memo: ParamsMemo, params: Any) -> int:
        kept.append(params is memo.last)
        return size(memo, params)

    monkeypatch.setattr(ParamsMemo, "size", counted)
    limit = 100
    c = opened(Settings(max_request_size=limit, max_streams=64), subprotocol)
    at_limit = {"k": "v" * (limit - 2 - len('{"k": ""}')), "n": None}  # with the model name and the text: the
    at_limit["k"] = at_limit["k"][:len(at_limit["k"]) - len(', "n": null')]  # limit exactly
    over = {**at_limit, "k": at_limit["k"] + "v"}
    for sid in range(1, 13, 2):
        assert isinstance(c.request(sid, model="m", text="x", params=at_limit)[0], StartStream)
        out = c.request(sid + 1, model="m", text="x", params=over)
        assert (out[0].stream_id, out[0].code) == (sid + 1, ErrorCode.MESSAGE_TOO_BIG), out
    if subprotocol == SUBPROTOCOL_PROTO:  # (the JSON codec keeps nothing)
        assert kept == [True] * 12  # every size came from the decoder's memo
    else:
        assert kept and not any(kept)


def test_a_kept_params_size_is_used_once_and_only_for_the_dict_it_was_kept_for() -> None:
    from lowlat_mw.protocol.wire import ParamsMemo, to_protobuf
    from lowlat_mw.protocol.wire.fast import decode_request

    params = {"temperature": 0.5, "stop": "\n"}
    frame = to_protobuf(ev.Request(stream_id=1, text="x", params=params)).SerializeToString()
    memo = ParamsMemo()
    decode_request(frame, memo)  # (kept from now on)
    req = decode_request(frame, memo)
    assert isinstance(req, ev.Request)
    params_size = memo.size
    assert params_size(dict(req.params)) == len(json.dumps(params))  # an equal dict: measured
    assert params_size(req.params) == len(json.dumps(params))  # the kept size
    req.params["stop"] = "a much longer stop sequence"  # (a model may change its params)
    assert params_size(req.params) == len(json.dumps(req.params))  # used once: measured anew
    assert ParamsMemo().size(req.params) == len(json.dumps(req.params))  # another connection's: measured


_JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400),
                         st.floats(allow_nan=True, allow_infinity=True), st.text())
_PARAMS = st.dictionaries(st.text(), st.recursive(_JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(), inner, max_size=4)), max_leaves=12), max_size=6)


@settings(max_examples=300, deadline=None)
@given(params=_PARAMS)
def test_the_params_count_as_json_dumps_writes_them(params: dict[str, Any]) -> None:
    """request_size counts params as json.dumps(params, default=str) writes them: non-ASCII escaped,
    NaN and infinities spelled out, big whole numbers in full."""
    req = ev.Request(stream_id=1, model="", text="", params=params)
    assert request_size(req) == (len(json.dumps(params, default=str)) if params else 0)


# ---------------------------------------------------------------- max session lifetime
def test_session_lifetime_closes_an_idle_connection_with_4005() -> None:
    c = opened(Settings(max_session_lifetime=10, heartbeat_interval=60, heartbeat_max_interval=60))
    assert c.conn.next_deadline() == T0 + 10
    assert c.tick(T0 + 9.999) == []
    assert c.tick(T0 + 10) == [CloseConnection(CloseCode.SESSION_EXPIRED, "max_session_lifetime reached")]
    assert c.conn.closed and c.conn.next_deadline() == math.inf


def test_session_lifetime_waits_for_running_streams() -> None:
    c = opened(Settings(max_session_lifetime=10, heartbeat_interval=60, heartbeat_max_interval=60))
    assert isinstance(c.request(1, at=T0 + 5)[0], StartStream)
    assert c.conn.next_deadline() > T0 + 10  # a running stream is never cut
    c.decode(c.conn.send_chunk(1, "tok", T0 + 12))
    assert c.tick(T0 + 12) == []
    end = c.decode(c.conn.finish_stream(1, T0 + 14))
    assert isinstance(end[0], ev.End) and end[0].finish_reason == "stop"
    assert c.conn.next_deadline() == T0 + 10  # overdue: due at once
    assert c.tick(T0 + 14) == [CloseConnection(CloseCode.SESSION_EXPIRED, "max_session_lifetime reached")]


def test_session_lifetime_zero_never_expires() -> None:
    c = opened(Settings(max_session_lifetime=0, idle_timeout=1e6, heartbeat_interval=60,
                        heartbeat_max_interval=60))
    assert c.conn.next_deadline() == T0 + 60  # the heartbeat only
    assert CloseCode.SESSION_EXPIRED.reconnect  # clients reconnect (and re-authenticate) after 4005


# ---------------------------------------------------------------- authenticate
AUTH = Settings(authenticate="test_limits:sync_hook")


@pytest.mark.parametrize("subprotocol", BOTH)
def test_hello_asks_for_authentication_before_welcome(subprotocol: str) -> None:
    c = Client(AUTH, subprotocol)
    out = c.hello(auth="good")
    assert out == [Authenticate(ev.Hello(client="t", auth="good"))]
    assert out[0].hello.auth == "good"
    assert c.conn.state is ConnState.ADMITTING and c.conn.session is None
    welcome = c.decode(c.conn.authenticated("alice", T0 + 0.01))
    assert len(welcome) == 1 and isinstance(welcome[0], ev.Welcome)
    assert c.conn.open and c.conn.principal == "alice" and c.conn.session.principal == "alice"
    assert isinstance(c.request(1)[0], StartStream)


@pytest.mark.parametrize("subprotocol", BOTH)
def test_refusal_sends_unauthorized_then_closes_1008(subprotocol: str) -> None:
    c = Client(AUTH, subprotocol)
    c.hello(auth="bad")
    out = c.decode(c.conn.authenticated(None, T0, "token expired"))
    assert out == [ev.Error(stream_id=0, code=ErrorCode.UNAUTHORIZED, message="token expired", retryable=False),
                   CloseConnection(CloseCode.POLICY_VIOLATION, "unauthorized")]
    assert c.conn.closed and c.conn.session is None
    assert c.decode(c.conn.authenticated(None, T0)) == [] and c.decode(c.conn.authenticated("x", T0)) == []
    default = Client(AUTH, subprotocol)
    default.hello()
    assert default.decode(default.conn.authenticated(None, T0))[0].message == "authentication failed"


def test_no_stream_can_start_before_the_hook_admits() -> None:
    c = Client(AUTH)
    c.hello(auth="good")
    out = c.request(1)  # pipelined before the hook answered: the first message must be Hello, alone
    assert [type(a) for a in out] == [ev.Error, CloseConnection]
    assert out[0].code is ErrorCode.PROTOCOL_ERROR and out[1].code == CloseCode.PROTOCOL_ERROR
    assert not any(isinstance(a, StartStream) for a in out)
    assert c.decode(c.conn.authenticated("alice", T0)) == []  # too late: closed


def test_a_second_hello_while_authenticating_is_refused() -> None:
    c = Client(AUTH)
    c.hello(auth="good")
    out = c.hello(auth="other")
    assert [type(a) for a in out] == [ev.Error, CloseConnection] and out[1].code == CloseCode.PROTOCOL_ERROR


def test_a_hook_that_never_answers_cannot_hold_the_connection_past_the_handshake_timeout() -> None:
    c = Client(AUTH.replace(handshake_timeout=2))
    assert isinstance(c.hello(auth="good")[0], Authenticate)
    assert c.conn.next_deadline() == T0 + 2
    assert c.tick(T0 + 2) == [CloseConnection(CloseCode.HANDSHAKE_TIMEOUT, "no hello within handshake_timeout")]
    assert c.decode(c.conn.authenticated("alice", T0 + 3)) == []


def test_without_a_hook_hello_is_welcomed_at_once_and_principal_is_none() -> None:
    c = Client(Settings())
    out = c.hello(auth="ignored")
    assert isinstance(out[0], ev.Welcome) and c.conn.principal is None


def _session_of(principal: str) -> tuple[Any, str]:
    first = Client(AUTH)
    first.hello(auth="good")
    welcome = first.decode(first.conn.authenticated(principal, T0))[0]
    return first.conn.session, welcome.resume_token


def test_resume_runs_the_hook_again_and_keeps_the_session_for_the_same_principal() -> None:
    session, token = _session_of("alice")
    c = Client(AUTH)
    out = c.hello(auth="good", resume_token=token)
    assert isinstance(out[0], Authenticate)  # the hook runs on every resume too
    out = c.decode(c.conn.authenticated("alice", T0 + 1))
    assert out == [ResumeSession(token, session.session_id, {})]
    welcome = c.decode(c.conn.resume(session, T0 + 1))[0]
    assert welcome.resumed and welcome.session_id == session.session_id


def test_resume_token_of_another_principal_starts_a_new_session() -> None:
    session, token = _session_of("alice")
    c = Client(AUTH)
    c.hello(auth="good", resume_token=token, last_seq={1: 0})
    c.decode(c.conn.authenticated("mallory", T0 + 1))
    out = c.decode(c.conn.resume(session, T0 + 1))
    assert isinstance(out[0], ev.Welcome) and not out[0].resumed and out[0].session_id != session.session_id
    assert out[1] == ev.Error(stream_id=1, code=ErrorCode.RESUME_FAILED, message=out[1].message)
    assert c.conn.session.principal == "mallory"


# ---------------------------------------------------------------- control-message budget
@pytest.mark.parametrize("subprotocol", BOTH)
def test_messages_that_are_not_requests_have_a_budget_then_error_and_1008(subprotocol: str) -> None:
    c = opened(Settings(control_rate_limit=10, control_rate_burst=5), subprotocol)
    kinds = [ev.Ping(id=1), ev.Pong(id=9), ev.Cancel(stream_id=7), ev.Ack(stream_id=7, seq=1), ev.Error(stream_id=0)]
    for event in kinds:  # each kind counts (5 = the burst)
        assert c.send(event) in ([], [ev.Pong(id=1)])
    out = c.send(ev.Ping(id=2))
    assert out[0] == ev.Error(stream_id=0, code=ErrorCode.RATE_LIMITED, message=out[0].message)
    assert "more than 10 messages/s" in out[0].message
    assert out[1:] == [CloseConnection(CloseCode.POLICY_VIOLATION, "message flood")] and c.conn.closed


def test_the_control_budget_refills_and_spares_requests() -> None:
    c = opened(Settings(control_rate_limit=10, control_rate_burst=2, max_streams=100))
    assert c.send(ev.Ping(id=1)) == [ev.Pong(id=1)]
    assert c.send(ev.Ping(id=2)) == [ev.Pong(id=2)]
    for sid in range(1, 20):  # Requests spend rate_limit's tokens, not these
        assert isinstance(c.request(sid)[0], StartStream)
    assert c.send(ev.Ping(id=3), at=T0 + 0.1) == [ev.Pong(id=3)]  # one token back after 1/rate
    assert not c.conn.closed


def test_unknown_message_kinds_spend_the_control_budget() -> None:
    c = opened(Settings(control_rate_limit=1, control_rate_burst=3), SUBPROTOCOL_JSON)
    for _ in range(3):
        [error] = c.send_raw('{"type":"frobnicate"}')
        assert error.code is ErrorCode.UNSUPPORTED_MESSAGE and not c.conn.closed
    out = c.send_raw('{"type":"frobnicate"}')
    assert out[0].code is ErrorCode.RATE_LIMITED and c.conn.close_code == CloseCode.POLICY_VIOLATION


def test_control_rate_limit_zero_disables_the_budget() -> None:
    c = opened(Settings(control_rate_limit=0, control_rate_burst=1))
    assert c.conn.control is None
    assert all(c.send(ev.Ping(id=i)) == [ev.Pong(id=i)] for i in range(1, 5000))


def test_a_streams_own_messages_are_paid_by_its_request() -> None:
    """A client streaming short replies as fast as it can (rate_limit 0), each followed by Ack{done}, never
    meets the control budget: each Request brings the tokens of its stream's Ack and a Cancel."""
    c = opened(Settings(rate_limit=0, control_rate_limit=10, control_rate_burst=5, max_streams=10_000))
    for sid in range(1, 2001):  # all at one instant: no refill by time
        assert isinstance(c.request(sid)[0], StartStream)
        assert c.send(ev.Ack(stream_id=sid, seq=0, done=True)) == []
        assert not any(isinstance(a, ev.Error) for a in c.send(ev.Cancel(stream_id=sid)))  # (it cancels it)
    assert not c.conn.closed
    for i in range(1, 4):  # the burst (5), less the last stream's Ack and Cancel, is left for other messages
        assert c.send(ev.Ping(id=i)) == [ev.Pong(id=i)]
    assert c.send(ev.Ping(id=4))[0].code is ErrorCode.RATE_LIMITED
