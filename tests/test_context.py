"""Incremental context (protocol v1.3) without I/O: documents and their patches, versions, hashes and limits
(protocol/context.py), the client's side of a document, the messages in both codecs, the server machine's
answers (a v1.2 client, unknown documents and turns), kept turns, and in process through the Python client.
(Every server, 50 KB and 100 patches, a resume: tests/conformance/test_conformance_context.py.)"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest
from starlette.applications import Starlette

from lowlat_mw.adapters.starlette import LowLatMiddleware
from lowlat_mw.errors import ClientError, ErrorCode, StreamError
from lowlat_mw.model import ModelRequest
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.client import ClientStream
from lowlat_mw.protocol.context import ClientDocument, SessionContext, sha256
from lowlat_mw.protocol.server import StartStream
from lowlat_mw.protocol.wire import JSON_CODEC, PROTO_CODEC
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings
from lowlat_mw.testing.inprocess import AppClient
from lowlat_mw.testing.pair import ConnectionPair

CODECS = [PROTO_CODEC, JSON_CODEC]


def digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def full(name: str, version: int, text: str, **kw: Any) -> ev.Context:
    return ev.Context(name=name, version=version, text=text, sha256=digest(text), **kw)


def patch(name: str, base: int, offset: int, length: int, text: str, result: str | None = None) -> ev.Context:
    return ev.Context(name=name, version=base + 1, base_version=base,
                      patches=(ev.ContextPatch(offset=offset, length=length, text=text),),
                      sha256=digest(result) if result is not None else b"")


def ok(ack: ev.ContextAck) -> bool:
    return ack.code is ErrorCode.UNSPECIFIED


# ================================================================================ SessionContext.apply
def test_a_document_is_set_then_patched_in_utf8_bytes_and_checked_by_its_hash() -> None:
    ctx = SessionContext(Settings())
    assert ok(ctx.apply(full("a", 1, "héllo world")))
    # "héllo" is 6 bytes: replace "world" (bytes 7..12) with "wörld"
    assert ok(ctx.apply(patch("a", 1, 7, 5, "wörld", "héllo wörld")))
    assert ctx.text_of("a") == "héllo wörld" and ctx.versions() == {"a": 2}
    two = ev.Context(name="a", version=3, base_version=2, sha256=digest("X héllo wörld!"),
                     patches=(ev.ContextPatch(offset=0, length=0, text="X "),
                              ev.ContextPatch(offset=15, length=0, text="!")))  # in order: after the first
    assert ok(ctx.apply(two)) and ctx.text_of("a") == "X héllo wörld!"
    assert ctx.size == len("X héllo wörld!".encode())


@pytest.mark.parametrize(("message", "code", "words"), [
    (patch("a", 1, 4, 2, "x"), ErrorCode.BAD_REQUEST, "outside the text of 5 bytes"),
    (patch("a", 1, 6, 0, "x"), ErrorCode.BAD_REQUEST, "outside"),
    (patch("a", 1, 0xFFFFFFFF, 0xFFFFFFFF, "x"), ErrorCode.BAD_REQUEST, "outside"),
    (patch("a", 7, 0, 0, "x"), ErrorCode.CONTEXT_MISMATCH, "at version 1, not base_version 7"),
    (patch("a", 1, 0, 1, "x", "wrong"), ErrorCode.CONTEXT_MISMATCH, "sha256"),
    (ev.Context(name="a", version=2, text="new", sha256=b"\0" * 32), ErrorCode.CONTEXT_MISMATCH, "sha256"),
    (patch("b", 1, 0, 0, "x"), ErrorCode.CONTEXT_MISMATCH, "no context document 'b'"),
    (ev.Context(name="a", version=0, text="x"), ErrorCode.BAD_REQUEST, "version"),
    (ev.Context(name="", version=1, text="x"), ErrorCode.BAD_REQUEST, "name"),
    (ev.Context(name="a\n", version=1, text="x"), ErrorCode.BAD_REQUEST, "name"),
    (ev.Context(name="a", version=2, text="x", patches=(ev.ContextPatch(),)), ErrorCode.BAD_REQUEST, "base_version"),
    (ev.Context(name="a", version=2, base_version=1, text="x"), ErrorCode.BAD_REQUEST, "text"),
])
def test_a_bad_context_is_refused_clearly_and_the_document_is_gone(message: ev.Context, code: ErrorCode,
                                                                   words: str) -> None:
    ctx = SessionContext(Settings())
    assert ok(ctx.apply(full("a", 1, "hello")))
    ack = ctx.apply(message)
    assert ack.code is code and words in ack.message, ack
    assert ack.version == message.version
    assert "a" not in ctx.versions() or message.name != "a"  # refused: the server holds no such document
    assert ctx.size == sum(len(t.encode()) for t in [ctx.text_of(n) or "" for n in ctx.versions()])


def test_a_patch_that_splits_a_utf8_character_is_refused() -> None:
    ctx = SessionContext(Settings())
    assert ok(ctx.apply(full("a", 1, "é")))
    ack = ctx.apply(patch("a", 1, 1, 0, "x"))
    assert ack.code is ErrorCode.BAD_REQUEST and "splits a UTF-8 character" in ack.message


def test_documents_are_bounded_by_count_and_bytes() -> None:
    ctx = SessionContext(Settings(max_contexts=2, max_context_bytes=10))
    assert ok(ctx.apply(full("a", 1, "12345"))) and ok(ctx.apply(full("b", 1, "12345")))
    ack = ctx.apply(full("c", 1, "x"))
    assert ack.code is ErrorCode.CONTEXT_LIMIT and "max_contexts" in ack.message
    assert ok(ctx.apply(full("a", 2, "123")))  # replacing one is not one more
    ack = ctx.apply(patch("b", 1, 5, 0, "abc"))  # 3 + 8 > 10
    assert ack.code is ErrorCode.CONTEXT_LIMIT and "max_context_bytes" in ack.message
    assert ctx.versions() == {"a": 2} and ctx.size == 3
    assert ctx.apply(full("b", 1, "x" * 8)).code is ErrorCode.CONTEXT_LIMIT
    assert ok(ctx.apply(ev.Context(name="a", drop=True))) and ctx.size == 0 and ok(ctx.apply(full("b", 1, "x" * 10)))


def test_random_patches_keep_client_and_server_texts_identical() -> None:
    rng = random.Random(7)
    alphabet = "abc xyz\né€😀"
    client = ClientDocument("doc")
    ctx = SessionContext(Settings())
    assert ok(ctx.apply(client.set("".join(rng.choice(alphabet) for _ in range(2000)))))
    for _ in range(300):
        text = client.text
        offset = rng.randrange(len(text) + 1)
        length = rng.randrange(min(20, len(text) - offset) + 1)
        message = client.patch(offset, length, "".join(rng.choice(alphabet) for _ in range(rng.randrange(8))))
        assert ok(ctx.apply(message))
        assert ctx.text_of("doc") == client.text and message.sha256 == sha256(client.text.encode())


# ================================================================================ the client's document
def test_the_client_document_converts_character_offsets_and_recovers_after_a_refusal() -> None:
    doc = ClientDocument("d")
    first = doc.set("añb")
    assert first.version == 1 and first.base_version == 0 and first.sha256 == digest("añb")
    p = doc.patch(2, 1, "c")  # "ñ" is two bytes: the third character starts at byte 3
    assert p.patches == (ev.ContextPatch(offset=3, length=1, text="c"),) and doc.text == "añc"
    p3 = doc.patch(0, 0, "x")
    with pytest.raises(ValueError, match="outside"):
        doc.patch(3, 2, "")
    assert doc.answered(ev.ContextAck(name="d", version=2)) is None and doc.acked == 2 and not doc.synced
    again = doc.answered(ev.ContextAck(name="d", version=3, code=ErrorCode.CONTEXT_MISMATCH, message="m"))
    assert again is not None and again.base_version == 0 and again.text == "xañc" and again.version == 4
    assert p3.version == 3
    # a refusal of a version from before the whole text went out again is stale
    assert doc.answered(ev.ContextAck(name="d", version=3, code=ErrorCode.CONTEXT_MISMATCH)) is None
    assert doc.answered(ev.ContextAck(name="d", version=4)) is None and doc.synced
    assert doc.welcomed({"d": 4}) is None
    resent = doc.welcomed({})
    assert resent is not None and resent.text == "xañc" and resent.version == 5 and doc.full_sends == 3
    with pytest.raises(ValueError):
        ClientDocument("")


# ================================================================================ codecs
@pytest.mark.parametrize("codec", CODECS, ids=["proto", "json"])
@pytest.mark.parametrize("event", [
    ev.Context(name="a", version=1, text="héllo", sha256=b"\x01" * 32),
    ev.Context(name="a", version=3, base_version=2, sha256=b"\x02" * 32,
               patches=(ev.ContextPatch(offset=1, length=2, text="é"), ev.ContextPatch(offset=0, length=0, text=""))),
    ev.Context(name="a", version=3, drop=True),
    ev.ContextAck(name="a", version=2),
    ev.ContextAck(name="a", version=2, code=ErrorCode.CONTEXT_LIMIT, message="too big"),
    ev.Request(stream_id=4, text="q", contexts=("a", "b"), continues=3),
    ev.Request(stream_id=4, messages=(ev.ChatMessage(role="user", content="q"),), continues=1),
    ev.Hello(revision=3, history=True),
    ev.Welcome(session_id="s", revision=3, contexts={"a": 7, "b": 1}),
])
def test_v1_3_messages_round_trip_in_both_codecs(codec: Any, event: ev.Event) -> None:
    assert codec.decode(codec.encode(event), limit=1 << 20) == event


def test_json_writes_only_what_a_context_needs() -> None:
    assert JSON_CODEC.encode(patch("a", 1, 2, 0, "x")) == (
        '{"type":"context","name":"a","version":2,"base_version":1,'
        '"patches":[{"offset":2,"length":0,"text":"x"}]}')
    plain = '{"type":"request","stream_id":1,"model":"","text":"q"}'  # (no v1.3 member unless used)
    assert JSON_CODEC.encode(ev.Request(stream_id=1, text="q")) == plain


@pytest.mark.parametrize("frame", [
    '{"type":"context","name":"a","patches":[1]}',
    '{"type":"context","name":"a","patches":[{"offset":-1}]}',
    '{"type":"context","name":"a","patches":{"offset":1}}',
    '{"type":"context","name":"a","sha256":"not base64!"}',
    '{"type":"context","name":"a","version":1.5}',
    '{"type":"request","stream_id":1,"contexts":"a"}',
    '{"type":"request","stream_id":1,"continues":-1}',
    '{"type":"welcome","session_id":"s","contexts":{"a":"1"}}',
])
def test_malformed_json_context_fields_are_invalid_payload(frame: str) -> None:
    pair = ConnectionPair.ready(subprotocol=SUBPROTOCOL_JSON)
    out = pair.send_raw(frame)
    errors = [e for e in out if isinstance(e, ev.Error)]
    assert errors and errors[0].code is ErrorCode.INVALID_PAYLOAD, out


# ================================================================================ the server machine
def ready(subprotocol: str = SUBPROTOCOL_PROTO, settings: Settings | None = None, **client: Any) -> ConnectionPair:
    return ConnectionPair.ready(settings, subprotocol, **client)


@pytest.mark.parametrize("subprotocol", [SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON])
def test_a_context_from_a_v1_2_client_is_an_unsupported_message_and_the_connection_stays(subprotocol: str) -> None:
    pair = ConnectionPair(Settings(), subprotocol)
    pair.server.receive_data(pair.codec.encode(ev.Hello(revision=2)), pair.now)
    out = pair.send(full("a", 1, "x"))
    assert [(e.stream_id, e.code) for e in out] == [(0, ErrorCode.UNSUPPORTED_MESSAGE)]
    assert "v1.3" in out[0].message and not pair.server.closed
    assert pair.server.session.context is None


@pytest.mark.parametrize("subprotocol", [SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON])
def test_the_server_acks_contexts_and_hands_the_documents_to_the_request(subprotocol: str) -> None:
    pair = ready(subprotocol)
    assert pair.send(full("a", 1, "hello")) == [ev.ContextAck(name="a", version=1)]
    assert pair.send(patch("a", 1, 0, 1, "j", "jello")) == [ev.ContextAck(name="a", version=2)]
    out = pair.send(ev.Request(stream_id=1, text="q", contexts=("a",)))
    assert [type(a) for a in out] == [StartStream]
    documents, history, _ = pair.server.session.context.given[1]
    assert documents["a"].text == "jello" and documents["a"].version == 2 and history == ()
    assert documents["a"].patches is None  # set whole since the last request that named it
    pair.send(patch("a", 2, 5, 0, "!", "jello!"))
    pair.send(ev.Request(stream_id=2, text="q", contexts=("a",)))
    assert pair.server.session.context.given[2][0]["a"].patches == (ev.ContextPatch(offset=5, length=0, text="!"),)
    pair.finish(1)
    assert 1 not in pair.server.session.context.given  # (the driver took it, or the stream ended: not kept)


def test_a_request_refused_at_its_start_leaves_the_patches_for_the_next_one() -> None:
    pair = ready(settings=Settings(max_streams=1))
    pair.send(full("a", 1, "hello"))
    pair.send(ev.Request(stream_id=1, text="q", contexts=("a",)))  # running: the next one is refused
    pair.send(patch("a", 1, 0, 1, "j", "jello"))
    refused = pair.send(ev.Request(stream_id=2, text="q", contexts=("a",)))
    assert [e.code for e in refused] == [ErrorCode.TOO_MANY_STREAMS]
    pair.finish(1)
    pair.send(ev.Request(stream_id=3, text="q", contexts=("a",)))
    assert pair.server.session.context.given[3][0]["a"].patches == (ev.ContextPatch(offset=0, length=1, text="j"),)


def test_a_request_naming_an_unknown_document_or_turn_fails_its_stream_clearly() -> None:
    pair = ready(history=True)
    out = pair.send(ev.Request(stream_id=1, text="q", contexts=("nope",)))
    assert [(e.stream_id, e.code, e.retryable) for e in out] == [(1, ErrorCode.CONTEXT_MISMATCH, True)]
    out = pair.send(ev.Request(stream_id=2, text="q", continues=9))
    assert [(e.stream_id, e.code) for e in out] == [(2, ErrorCode.CONTEXT_MISMATCH)]
    assert "stream 9 has no kept turn" in out[0].message and not pair.server.session.running
    no_history = ready()
    out = no_history.send(ev.Request(stream_id=1, text="q", continues=1))
    assert out[0].code is ErrorCode.CONTEXT_MISMATCH and "keeps no turns" in out[0].message


def test_turns_are_kept_for_a_client_that_asked_and_chained_by_continues() -> None:
    pair = ready(history=True)
    pair.send(ev.Request(stream_id=1, text="hi"))
    pair.chunk(1, "hel")
    pair.chunk(1, "lo")
    pair.finish(1)
    pair.send(ev.Request(stream_id=2, text="more", continues=1))
    assert [(t.prompt, t.output) for t in pair.server.session.context.given[2][1]] == [("hi", "hello")]
    pair.chunk(2, "sure")
    pair.finish(2)
    pair.send(ev.Request(stream_id=1, text="again", continues=2))  # stream id 1 reused: its old turn still counts
    assert [t.output for t in pair.server.session.context.given[1][1]] == ["hello", "sure"]
    pair.send(ev.Request(stream_id=3, text="x"))
    pair.finish(3, reason="cancelled")
    assert pair.send(ev.Request(stream_id=4, text="x", continues=3))[0].code is ErrorCode.CONTEXT_MISMATCH


def test_kept_turns_are_bounded_by_history_size() -> None:
    pair = ready(settings=Settings(history_size=100), history=True)
    for sid in (1, 2, 3):
        pair.send(ev.Request(stream_id=sid, text="q", continues=sid - 1 if sid > 1 else 0))
        pair.chunk(sid, "x" * 40)
        pair.finish(sid)
    context = pair.server.session.context
    assert list(context.turns) == [2, 3] and context.turns_size <= 100
    pair.send(ev.Request(stream_id=4, text="q", continues=3))
    assert [t.stream_id for t in context.given[4][1]] == [2, 3]  # the oldest went first


def test_a_resumed_session_keeps_its_documents_and_says_so_in_welcome() -> None:
    pair = ready()
    pair.send(full("a", 1, "text"))
    pair.request(ClientStream(ev.Request(stream_id=1, text="q")))  # (an open stream: the client resumes)
    session = pair.server.session
    pair.server.connection_lost()
    session.detach(pair.now)
    again = pair.reconnect()
    welcome = next(e for e in again.hello(resume=True, session=session) if isinstance(e, ev.Welcome))
    assert welcome.resumed and welcome.contexts == {"a": 1}


# ================================================================================ in process, the Python client
async def context_model(req: ModelRequest) -> Any:
    for name, doc in sorted(req.context.items()):
        yield f"{name}={hashlib.sha256(doc.text.encode()).hexdigest()};"
    for turn in req.history:
        yield f"[{turn.prompt}>{turn.output}]"


def app() -> Starlette:
    application = Starlette()
    application.add_middleware(LowLatMiddleware, model=context_model, path="/ws")
    return application


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_the_client_patches_a_document_and_continues_a_stream(mode: str) -> None:
    async with AppClient(app(), "/ws", mode=mode, history=True) as client:
        doc = await client.context("notes.md", "# Notes\n")
        await doc.patch(8, 0, "- ünïcode\n")
        await doc.replace("Notes", "Todo")
        await doc.wait_synced()
        assert doc.text == "# Todo\n- ünïcode\n" and doc.version == 3
        first = client.stream("q", context=[doc])
        assert await first.text() == f"notes.md={hashlib.sha256(doc.text.encode()).hexdigest()};"
        second = client.stream("next", continues=first)
        assert await second.text() == f"[q>notes.md={hashlib.sha256(doc.text.encode()).hexdigest()};]"
        with pytest.raises(StreamError) as info:
            await client.stream("x", continues=12345).text()
        assert info.value.code is ErrorCode.CONTEXT_MISMATCH


async def test_the_client_sends_the_whole_text_again_when_the_server_lost_the_document() -> None:
    async with AppClient(app(), "/ws") as client:
        doc = await client.context("a", "one two")
        await doc.wait_synced()
        # The server forgets the document (as a resume on a process without it would): the next patch is refused,
        # the client sends the whole text again by itself, and a request then sees the client's text.
        servers = [c for c in _sessions(client)]
        assert servers, "no server session found"
        servers[0].context.documents.clear()
        servers[0].context.size = 0
        await doc.patch(0, 3, "1")
        await doc.wait_synced()
        assert doc.state.full_sends == 2 and doc.state.refusal is not None
        assert doc.state.refusal.code is ErrorCode.CONTEXT_MISMATCH
        assert await client.stream("q", context=[doc]).text() == f"a={hashlib.sha256(b'1 two').hexdigest()};"


def _sessions(client: AppClient) -> list[Any]:
    """The server sessions of the in-process app (its Endpoint's session store and live connections)."""
    from lowlat_mw.endpoint import Endpoint

    found = []
    for endpoint in list(Endpoint.instances):
        for conn in list(getattr(endpoint, "connections", ())):
            session = getattr(getattr(conn, "protocol", None), "session", None)
            if session is not None and session.context is not None and session.session_id == client.welcome.session_id:
                found.append(session)
    return found


def test_the_sync_client_edits_a_document_and_continues_a_stream() -> None:
    from prometheus_client import CollectorRegistry

    from lowlat_mw.client.sync import connect_sync
    from lowlat_mw.runtime.asgi import LowLatASGI
    from lowlat_mw.testing.pytest_plugin import RunningServer

    server = RunningServer(LowLatASGI(context_model, registry=CollectorRegistry()), path="/").start()
    try:
        with connect_sync(server.url, history=True) as client:
            doc = client.context("s.txt", "abc")
            doc.patch(1, 1, "ü")
            doc.replace("c", "cd")
            doc.wait_synced()
            assert (doc.text, doc.version) == ("aücd", 3)
            first = "".join(client.stream("q", context=[doc]))  # type: ignore[arg-type]
            assert first == f"s.txt={hashlib.sha256('aücd'.encode()).hexdigest()};"
            continued = client.complete("next", continues=client.last_stream)
            assert continued == f"[q>{first}]"
            doc.drop()
            with pytest.raises(StreamError) as gone:
                client.complete("q", context=["s.txt"])
            assert gone.value.code is ErrorCode.CONTEXT_MISMATCH
    finally:
        server.stop()


async def test_against_a_v1_2_server_the_client_sends_no_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """A v1.2 server would answer a Context with unsupported_message and run a Request's model without the
    documents: the client checks the Welcome's revision first, and again where each Request is sent."""
    monkeypatch.setattr(ev, "REVISION", 2)  # what a v1.2 server says in its Welcome
    async with AppClient(app(), "/ws", history=True) as client:
        assert client.welcome is not None and client.welcome.revision == 2
        with pytest.raises(ClientError, match=r"older than protocol v1\.3"):
            await client.context("a", "text")
        with pytest.raises(ClientError, match=r"older than protocol v1\.3"):
            await client.complete("q", context=["a"])
        with pytest.raises(ClientError, match=r"older than protocol v1\.3"):
            await client.complete("q", continues=1)
        assert await client.complete("q") == ""  # (the model got no context and no history: it says nothing)
        assert client.last_error is None  # no Context reached the server (it would answer unsupported_message)


# ---------------------------------------------------------------- found by a review (each failed before its fix)
def app_with(**settings: Any) -> Starlette:
    from prometheus_client import CollectorRegistry

    application = Starlette()
    application.add_middleware(LowLatMiddleware, model=context_model, path="/ws", settings=Settings(**settings),
                               registry=CollectorRegistry())
    return application


async def test_a_document_refused_for_a_limit_is_not_sent_again_and_waiting_on_it_says_why() -> None:
    """A context_limit refusal is the same however often the text is sent: the client does not loop resending it."""
    async with AppClient(app_with(max_contexts=1, max_context_bytes=10), "/ws") as client:
        a = await client.context("a", "12345")
        await a.wait_synced()
        b = await client.context("b", "two")
        with pytest.raises(StreamError) as refused:
            await b.wait_synced()
        assert refused.value.code is ErrorCode.CONTEXT_LIMIT and b.state.full_sends == 1
        await a.patch(5, 0, "678901")  # past max_context_bytes
        with pytest.raises(StreamError) as refused:
            await a.wait_synced()
        assert refused.value.code is ErrorCode.CONTEXT_LIMIT and a.state.full_sends == 1
        await a.set("ok")  # a change that fits is sent, and taken
        await a.wait_synced()


async def test_a_dropped_documents_answer_does_not_mark_a_new_one_of_its_name_synced() -> None:
    async with AppClient(app_with(), "/ws") as client:
        a = await client.context("a", "x")
        for _ in range(5):
            await a.patch(0, 0, "y")
        await a.wait_synced()
        await a.drop()
        b = await client.context("a", "new")
        assert b.version > 6  # (counted on past the dropped one's)
        await b.wait_synced()
        assert b.state.acked == b.version
        assert await client.complete("q", context=[b]) == f"a={hashlib.sha256(b'new').hexdigest()};"


def test_a_patch_that_is_not_unicode_changes_nothing_on_the_client() -> None:
    doc = ClientDocument("a")
    doc.set("hello")
    with pytest.raises(UnicodeEncodeError):
        doc.patch(0, 0, "\ud800")
    with pytest.raises(UnicodeEncodeError):
        doc.set("\ud800")
    assert (doc.text, doc.version) == ("hello", 1)


def test_a_context_with_too_many_patches_is_refused() -> None:
    ctx = SessionContext(Settings())
    assert ctx.apply(full("a", 1, "a" * 100)).code is ErrorCode.UNSPECIFIED
    many = tuple(ev.ContextPatch(offset=50, length=0, text="b") for _ in range(1025))
    ack = ctx.apply(ev.Context(name="a", version=2, base_version=1, patches=many))
    assert ack.code is ErrorCode.BAD_REQUEST and "at most 1024 patches" in ack.message


def test_a_long_reply_is_not_held_for_a_turn_past_history_size() -> None:
    pair = ConnectionPair.ready(Settings(history_size=1000), SUBPROTOCOL_PROTO, history=True)
    pair.send(ev.Request(stream_id=1, text="q"))
    st = pair.server.session.streams[1]
    for i in range(20):
        pair.chunk(1, "x" * 100)
        pair.send(ev.Ack(stream_id=1, seq=i + 1))
    assert st.turn is None  # 2,000 bytes of output: not a turn history_size keeps, so not held meanwhile


def test_a_session_holding_documents_is_kept_the_whole_resume_window() -> None:
    pair = ConnectionPair.ready(Settings(resume_window=120))
    pair.send(ev.Context(name="a", version=1, text="x" * 1000))
    session = pair.server.session
    session.detach(pair.now)
    assert session.window == 120
