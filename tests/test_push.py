"""Server push (protocol v1.1): the messages, the server machine's rules, publish()'s checks, and delivery with the
in-process store through an app in this loop (lowlat_mw.testing.AppClient). Across processes through Redis:
tests/integration/test_shared_sessions.py; on every server: tests/conformance/test_conformance_push.py."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware

import lowlat_mw
from lowlat_mw import Backoff, ClientError, StreamError
from lowlat_mw.adapters.starlette import LowLatMiddleware
from lowlat_mw.errors import CloseCode, ErrorCode
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.base import CloseConnection, SendFrame
from lowlat_mw.protocol.server import Membership, ServerProtocol
from lowlat_mw.protocol.wire import JSON_CODEC, PROTO_CODEC
from lowlat_mw.runtime import push
from lowlat_mw.runtime.push import MAX_PUSH, principal_name
from lowlat_mw.settings import SUBPROTOCOL_JSON, Settings
from lowlat_mw.testing import AppClient, FaultProxy
from lowlat_mw.testing.pytest_plugin import RunningServer

WAIT = 30.0

MESSAGES = [
    ev.Push(topic="group:news", text="héllo"),
    ev.Push(topic="session:abc", data=b"\x00\xff"),
    ev.Subscribe(id=7, group="news"),
    ev.Subscribe(id=8, group="news", leave=True),
    ev.Subscribed(id=7, group="news"),
    ev.Subscribed(id=9, group="x", code=ErrorCode.UNAUTHORIZED, message="no"),
    ev.Hello(client="c", revision=1),
    ev.Welcome(session_id="s", revision=1),
]


@pytest.mark.parametrize("codec", [PROTO_CODEC, JSON_CODEC], ids=["proto", "json"])
@pytest.mark.parametrize("event", MESSAGES, ids=lambda e: type(e).__name__)
def test_the_v1_1_messages_round_trip(codec, event) -> None:
    assert codec.decode(codec.encode(event), limit=1 << 20) == event


def test_a_v1_0_hello_is_revision_0_and_a_push_needs_a_body() -> None:
    assert JSON_CODEC.decode('{"type":"hello"}', limit=1000).revision == 0
    with pytest.raises(lowlat_mw.RemoteProtocolError, match="exactly one of text, data"):
        JSON_CODEC.decode('{"type":"push","topic":"group:a"}', limit=1000)
    with pytest.raises(lowlat_mw.RemoteProtocolError, match="Push without text or data"):
        PROTO_CODEC.decode(b"\x10" + bytes([0x72, 3, 0x0A, 1, 0x61]), limit=1000)  # Envelope{push{topic "a"}}


# ------------------------------------------------------------------------------ the server machine
def opened(revision: int = 1, **settings) -> ServerProtocol:
    proto = ServerProtocol(Settings(**settings), subprotocol=SUBPROTOCOL_JSON, now=0.0, session_id="s1", secret="x")
    proto.receive_data(JSON_CODEC.encode(ev.Hello(revision=revision)), 0.0)
    return proto


def subscribe(proto: ServerProtocol, group: str, *, leave: bool = False, sub_id: int = 1) -> list:
    return proto.receive_data(JSON_CODEC.encode(ev.Subscribe(id=sub_id, group=group, leave=leave)), 1.0)


def answer(actions: list) -> ev.Subscribed:
    (frame,) = [a for a in actions if isinstance(a, SendFrame)]
    return JSON_CODEC.decode(frame.data, limit=1 << 20)


def test_welcome_says_revision_1_and_subscribe_joins_then_answers() -> None:
    proto = opened()
    actions = subscribe(proto, "news")
    assert actions[0] == Membership("news", True)  # indexed before the answer goes out
    assert answer(actions) == ev.Subscribed(id=1, group="news")
    assert proto.session.groups == {"news"}
    assert answer(subscribe(proto, "news", sub_id=2)) == ev.Subscribed(id=2, group="news")  # again: no change
    actions = subscribe(proto, "news", leave=True, sub_id=3)
    assert actions[0] == Membership("news", False)
    assert answer(actions) == ev.Subscribed(id=3, group="news", leave=True)
    assert proto.session.groups == frozenset()


@pytest.mark.parametrize(("group", "code", "why"), [
    ("", ErrorCode.BAD_REQUEST, "1 to 200 characters"),
    ("x" * 201, ErrorCode.BAD_REQUEST, "1 to 200 characters"),
    ("a\nb", ErrorCode.BAD_REQUEST, "control characters"),
    ("admin", ErrorCode.UNAUTHORIZED, "push_groups"),
])
def test_a_subscribe_outside_the_rules_is_refused_and_changes_nothing(group, code, why) -> None:
    proto = opened(push_groups=("news", "team-*"))
    actions = subscribe(proto, group)
    refused = answer(actions)
    assert len(actions) == 1 and refused.code is code and why in refused.message and refused.id == 1
    assert proto.session.groups == frozenset() and proto.state.value == "open"
    assert answer(subscribe(proto, "team-7")).code is ErrorCode.UNSPECIFIED  # a pattern


def test_a_session_joins_at_most_max_groups() -> None:
    proto = opened(max_groups=2)
    assert [answer(subscribe(proto, g)).code for g in ("a", "b", "c")] == [ErrorCode.UNSPECIFIED] * 2 + [
        ErrorCode.BAD_REQUEST]
    assert "max_groups" in answer(subscribe(proto, "c")).message
    proto.join("c", True, 2.0)  # the server's own join is not bounded by what clients may do
    assert proto.session.groups == {"a", "b", "c"}


def test_pushes_go_only_to_open_v1_1_clients() -> None:
    old = opened(revision=0)
    assert old.push("group:a", "x") is None  # never a kind a v1.0 client does not know
    (error,) = subscribe(old, "news")  # nor a Subscribed: what a v1.0 server answers
    assert JSON_CODEC.decode(error.data, limit=1000).code is ErrorCode.UNSUPPORTED_MESSAGE
    assert old.session.groups == frozenset() and old.state.value == "open"
    proto = opened()
    frame = proto.push("group:a", b"\x01")
    assert JSON_CODEC.decode(frame.data, limit=1000) == ev.Push(topic="group:a", data=b"\x01")
    proto.connection_lost()
    assert proto.push("group:a", "x") is None


def test_a_session_in_a_group_is_listening_not_idle() -> None:
    proto = opened(idle_timeout=10.0)
    subscribe(proto, "news")
    later = 10.0 + 1.0
    assert not [a for a in proto.tick(later) if isinstance(a, CloseConnection)]
    assert proto.next_deadline() < later + 60  # its heartbeat still runs
    proto.receive_data(JSON_CODEC.encode(ev.Subscribe(id=2, group="news", leave=True)), later)
    assert proto.deadline_moved
    assert not [a for a in proto.tick(later + 1) if isinstance(a, CloseConnection)]  # idle from the leave on
    closes = [a for a in proto.tick(later + 10.0) if isinstance(a, CloseConnection)]
    assert closes and closes[0].code == CloseCode.IDLE_TIMEOUT


# ------------------------------------------------------------------------------ publish's checks
@pytest.mark.parametrize("target", ["news", "group:", "topic:x", "group:" + "x" * 201, 5])
def test_publish_names_what_a_target_is(target) -> None:
    with pytest.raises((ValueError, TypeError), match="push target"):
        lowlat_mw.publish(target, "x", store="memory")


def test_publish_refuses_what_a_push_cannot_carry() -> None:
    with pytest.raises(TypeError, match=r"json\.dumps"):
        lowlat_mw.publish("group:a", {"a": 1}, store="memory")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unpaired surrogate"):
        lowlat_mw.publish("group:a", "\ud800", store="memory")
    with pytest.raises(ValueError, match="at most"):
        lowlat_mw.publish("group:a", b"x" * (MAX_PUSH + 1), store="memory")
    with pytest.raises(ValueError, match="1 to 200"):
        lowlat_mw.join("user:a", "", store="memory")
    assert lowlat_mw.publish("group:nobody-here", "x", store="memory") == 0


def test_principal_name_is_the_users_key() -> None:
    assert principal_name("alice") == "alice" and principal_name(7) == "7"
    assert principal_name(None) is None and principal_name(True) is None and principal_name("") is None
    assert principal_name(SimpleNamespace(pk=3)) == "3" and principal_name(SimpleNamespace(id="u9")) == "u9"
    assert principal_name(SimpleNamespace(get_id=lambda: "flask-7")) == "flask-7"
    assert principal_name(object()) is None
    key = uuid.uuid4()
    assert principal_name(SimpleNamespace(pk=key)) == str(key)  # a Django user with a UUID primary key

    class Detached:
        @property
        def pk(self):
            raise RuntimeError("instance is not bound to a session")

    assert principal_name(Detached()) is None


def test_publish_with_redis_unreachable_raises_publish_error(tmp_path) -> None:
    from support.ports import free_port

    with pytest.raises(lowlat_mw.PublishError, match="unreachable"):
        lowlat_mw.publish("group:a", "x", store=f"redis://127.0.0.1:{free_port()}/0")


def test_a_process_without_an_app_publishes_where_its_settings_say_or_says_what_to_set() -> None:
    """A script knows no store: PublishError, not a push into the void. A Django management command or Celery task:
    the project's LOWLAT_MW["session_store"] (here a Redis nobody listens on, so "unreachable" proves it went there)."""
    from support.ports import free_port

    code = f"""
import lowlat_mw
try:
    lowlat_mw.publish("user:1", "x")
except lowlat_mw.PublishError as exc:
    print("script:", exc)
from django.conf import settings
settings.configure(LOWLAT_MW={{"session_store": "redis://127.0.0.1:{free_port()}/0"}})
try:
    lowlat_mw.publish("user:1", "x")
except lowlat_mw.PublishError as exc:
    print("django:", exc)
"""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("LOWLAT_", "DJANGO_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert "script: push not sent: this process serves no lowlat-mw app" in out.stdout, out
    assert "django: push not sent: the session store is unreachable" in out.stdout, out


# ------------------------------------------------------------------------------ in-process delivery
def who(handshake):
    return handshake.bearer or None


async def announce(req):
    """Publishes the prompt to params["target"] from inside a model (as a view or a worker would)."""
    yield str(await lowlat_mw.apublish(req.params["target"], req.prompt))


def app(**settings) -> Starlette:
    return Starlette(middleware=[Middleware(LowLatMiddleware, model=announce, path="/ws", authenticate=who,
                                            registry=CollectorRegistry(), **settings)])


async def test_session_user_and_group_pushes_reach_exactly_their_connections() -> None:
    served = app()
    async with (asyncio.timeout(WAIT), AppClient(served, auth="alice") as a1,
                AppClient(served, auth="alice", mode="json", lifespan=False) as a2,
                AppClient(served, auth="bob", lifespan=False) as b):
        await a1.subscribe("news")
        await b.subscribe("news")
        assert await a2.complete("to the group", params={"target": "group:news"}) == "2"
        assert await a1.complete("to alice", params={"target": "user:alice"}) == "2"
        assert lowlat_mw.publish(f"session:{b.welcome.session_id}", b"to bob", store="memory") == 1
        assert lowlat_mw.join("user:bob", "vip", store="memory") == 1
        assert lowlat_mw.publish("group:vip", "vip", store="memory") == 1
        await a1.unsubscribe("news")
        assert lowlat_mw.publish("group:news", "after a1 left", store="memory") == 1
        for client in (a1, a2, b):  # the end of what each gets: nothing else came before it
            lowlat_mw.publish(f"session:{client.welcome.session_id}", "end", store="memory")
        got = {name: [] for name in ("a1", "a2", "b")}
        for name, client in (("a1", a1), ("a2", a2), ("b", b)):
            while not got[name] or got[name][-1] != ("session", "end"):
                pushed = await client.next_push(WAIT)
                got[name].append((pushed.topic.partition(":")[0], pushed.body))
        assert got == {
            "a1": [("group", "to the group"), ("user", "to alice"), ("session", "end")],
            "a2": [("user", "to alice"), ("session", "end")],
            "b": [("group", "to the group"), ("session", b"to bob"), ("group", "vip"), ("group", "after a1 left"),
                  ("session", "end")],
        }


async def test_a_refused_subscribe_raises_and_pushes_end_with_the_connection() -> None:
    async with asyncio.timeout(WAIT), AppClient(app(push_groups=("news",)), auth="carol") as client:
        with pytest.raises(StreamError, match="unauthorized"):
            await client.subscribe("admin")
        assert client.groups == set()
        await client.subscribe("news")
        waiting = asyncio.ensure_future(client.next_push())
        await asyncio.sleep(0)
        with pytest.raises(ClientError, match="already waiting"):
            await client.next_push(1)
    with pytest.raises(ClientError):  # closed by the user: the waiting reader learns it
        await waiting


@contextlib.asynccontextmanager
async def client_through_a_proxy() -> AsyncIterator[tuple[lowlat_mw.AsyncClient, FaultProxy]]:
    """A client (user "erin") of the app served on a real socket in this process, through a proxy that can cut it."""
    server = RunningServer(app()).start()
    try:
        with FaultProxy(("127.0.0.1", server.port)) as proxy:
            async with asyncio.timeout(WAIT), lowlat_mw.connect(f"ws://127.0.0.1:{proxy.port}/ws", auth="erin",
                                                                backoff=Backoff(base=0.05, cap=0.2)) as client:
                yield client, proxy
    finally:
        server.stop()


async def next_body(client: lowlat_mw.AsyncClient) -> tuple[str, str | bytes]:
    push_ = await client.next_push(WAIT)
    return push_.topic, push_.body


async def test_a_client_in_a_group_reconnects_by_itself_and_resumes_its_groups() -> None:
    """No stream open, but in groups: after a drop the client reconnects on its own (it listens) and resumes its
    session, which is still in its groups, the server's own join included."""
    async with client_through_a_proxy() as (client, proxy):
        await client.subscribe("news")
        sid = client.welcome.session_id
        assert lowlat_mw.join(f"session:{sid}", "team-7", store="memory") == 1
        (first,) = push.HUB.members("group:news")
        while "team-7" not in first.protocol.session.groups:
            await asyncio.sleep(0.01)  # (bounded by WAIT) until the server's loop applied the join
        proxy.cut_all()
        while push.HUB.members("group:team-7") in ([], [first]):
            await asyncio.sleep(0.01)  # until the resumed connection is reachable by its groups
        assert client.welcome.resumed and client.welcome.session_id == sid and client.groups == {"news"}
        assert lowlat_mw.publish("group:team-7", "again", store="memory") == 1
        assert await next_body(client) == ("group:team-7", "again")


async def test_a_client_whose_session_ended_joins_its_groups_again() -> None:
    """The session is gone when the client comes back (ended on the server meanwhile); the new one is in the client's
    groups."""
    async with client_through_a_proxy() as (client, proxy):
        await client.subscribe("news")
        first = client.welcome.session_id
        (driver,) = push.HUB.members("group:news")
        ended = asyncio.Event()
        loop = asyncio.get_running_loop()
        driver.loop.call_soon_threadsafe(lambda: (driver.runner.destroy(), loop.call_soon_threadsafe(ended.set)))
        await ended.wait()
        proxy.cut_all()
        while not any(d.protocol.session_id != first for d in push.HUB.members("group:news")):
            await asyncio.sleep(0.01)  # (bounded by WAIT) until the new session's Subscribe is in
        assert client.welcome.session_id != first and not client.welcome.resumed
        assert lowlat_mw.publish("group:news", "again", store="memory") == 1
        assert await next_body(client) == ("group:news", "again")


async def test_with_redis_down_a_subscribe_is_answered_at_once_and_pushes_come_back_with_it() -> None:
    """The process's listener lost Redis: a Subscribe does not wait for it (it would hold the connection's input:
    heartbeat timeouts, reconnect loops); once Redis is back, pushes published through it arrive."""
    from redis_support import RedisServer, require_redis_server

    from lowlat_mw.runtime.connection import PUSH_LISTEN_WAIT

    require_redis_server()
    with RedisServer() as redis_server:
        url = redis_server.url
        server = RunningServer(app(session_store=url)).start()
        try:
            async with asyncio.timeout(WAIT), lowlat_mw.connect(server.url, auth="fay") as client:
                await client.subscribe("before")
                redis_server.stop()
                listener = push.HUB.listen(url)
                while not listener.failing:
                    await asyncio.sleep(0.01)  # (bounded by WAIT)
                started = asyncio.get_running_loop().time()
                await client.subscribe("during")
                assert asyncio.get_running_loop().time() - started < PUSH_LISTEN_WAIT  # (milliseconds, not 5 s)
                assert await client.ping() < PUSH_LISTEN_WAIT
                redis_server.start()
                while not listener.ready.is_set():
                    await asyncio.sleep(0.01)
                assert lowlat_mw.publish("group:during", "back", store=url) == 1
                push_ = await client.next_push(WAIT)
                assert (push_.topic, push_.body) == ("group:during", "back")
        finally:
            server.stop()


async def test_a_slow_client_is_pushed_in_order_up_to_the_backlog_and_the_rest_is_skipped() -> None:
    """Pushes waiting for a connection's output are bounded (PUSH_BACKLOG bytes): at most once, so a client that does
    not read loses the newest, in order and without unbounded memory, and gets pushes again once it reads."""
    from driver_support import Peer, endpoint_for

    from lowlat_mw.runtime.connection import PUSH_BACKLOG

    gate = asyncio.Event()

    class Slow(Peer):
        async def _send(self, message) -> None:
            if self.events:  # the Welcome went; everything after it waits for the gate
                await gate.wait()
            await super()._send(message)

    peer = Slow(endpoint_for(announce))
    await peer.receive(ev.Hello(revision=1))
    body = "x" * (MAX_PUSH - 8)
    for i in range(20):
        peer.driver.push("group:g", f"{i:08d}" + body)
    await asyncio.sleep(0)
    gate.set()
    size = len(JSON_CODEC.encode(ev.Push(topic="group:g", text=f"{0:08d}" + body)))
    kept = PUSH_BACKLOG // size
    async with asyncio.timeout(WAIT):
        while len(peer.events) < 1 + kept:
            await asyncio.sleep(0.01)
    peer.driver.push("group:g", "read again")
    async with asyncio.timeout(WAIT):
        while len(peer.events) < 2 + kept:
            await asyncio.sleep(0.01)
    pushes = [e.text[:8] if e.text != "read again" else e.text for e in peer.events[1:]]
    assert pushes == [f"{i:08d}" for i in range(kept)] + ["read again"]
    assert 2 <= kept < 20
    await peer.driver.close()
