"""The blocking client has the async client's public API (issue 38, item 17: ``SyncClient`` lacked ``welcome``).

Each blocking class is compared with the async class it wraps: the same public names (a few listed extras aside)
and, for methods, the same parameters. A public name added to one side only fails here, so the two cannot drift.
"""

from __future__ import annotations

import errno
import inspect
from typing import Any

import pytest

from lowlat_mw.client import AsyncClient, SyncClient
from lowlat_mw.client.aio import Document, _nothing_listens
from lowlat_mw.client.sync import SyncDocument, SyncStream
from lowlat_mw.errors import ConnectionClosed, HandshakeRefused, refusal_hint
from lowlat_mw.protocol.context import ClientDocument

URL = "ws://127.0.0.1:9/ws"  # never connected to


def public(obj: Any) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def parameters(function: Any) -> list[tuple[str, Any, Any]]:
    """A method's parameters without their annotations (the blocking side's types differ: SyncDocument...)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.fixture
def pairs() -> Any:
    """(async object, blocking object, the blocking side's extras, renamed methods) for each wrapped class."""
    aclient = AsyncClient(URL)
    sclient = SyncClient(URL)
    stream = aclient.stream("x")
    doc = Document(aclient, ClientDocument("main.py"))
    try:
        yield [
            # client: the AsyncClient it runs; the last finished stream (for continues=); stream(...).events() at once
            (aclient, sclient, {"client", "last_stream", "events"}, {}),
            (stream, SyncStream(sclient, stream), {"stream"}, {"aclose": "close"}),  # stream: the async Stream
            (doc, SyncDocument(sclient, doc), {"document"}, {}),  # document: the async Document
        ]
    finally:
        sclient.close()


def test_the_blocking_classes_have_the_async_ones_public_names(pairs: Any) -> None:
    for asynchronous, blocking, extras, renamed in pairs:
        expected = {renamed.get(name, name) for name in public(asynchronous)} | extras
        assert public(blocking) == expected, type(blocking).__name__


def test_their_methods_take_the_same_parameters_and_their_attributes_read_through(pairs: Any) -> None:
    for asynchronous, blocking, _, renamed in pairs:
        inner = blocking._async
        for name in public(asynchronous):
            value = getattr(type(asynchronous), name, None)
            if inspect.isfunction(value):
                theirs = getattr(type(blocking), renamed.get(name, name))
                assert parameters(theirs) == parameters(value), f"{type(blocking).__name__}.{name}"
            else:
                assert getattr(blocking, name) == getattr(inner, name), f"{type(blocking).__name__}.{name}"


def test_sync_client_state_is_the_async_clients() -> None:
    client = SyncClient(URL, mode="json", auth="token")
    try:
        assert client.welcome is None and client.connected is False and client.connections == 0
        assert (client.mode, client.auth, client.url) == ("json", "token", URL)
        client.open_timeout = 2.5  # options write through, as on the async client
        assert client.client.open_timeout == 2.5
        with pytest.raises(AttributeError):
            client.welcome = None  # type: ignore[misc]  # (read-only there too)
    finally:
        client.close()


# ----------------------------------------------------------------------------- what the client errors say
def test_a_refused_handshake_says_its_status_and_the_servers_reason_else_a_hint() -> None:
    origin = HandshakeRefused(403, "lowlat-mw: cross-origin WebSocket refused: ...", path="/ws")
    assert isinstance(origin, ConnectionClosed) and origin.status == 403 and origin.code is None
    assert str(origin) == "handshake refused with HTTP 403: lowlat-mw: cross-origin WebSocket refused: ..."
    hint = refusal_hint(403, "/wrong")
    assert str(HandshakeRefused(403, path="/wrong")) == f"handshake refused with HTTP 403: {hint}"
    assert "no WebSocket route at /wrong" in refusal_hint(403, "/wrong")
    assert refusal_hint(404, "/wrong").startswith("no WebSocket endpoint at /wrong: check the URL's path")
    assert len({refusal_hint(status, "/x") for status in (401, 403, 404, 500)}) == 4


@pytest.mark.parametrize(("error", "refused"), [
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('127.0.0.1', 9)"), True),
    # asyncio's one error for every address of a name such as localhost
    (OSError("Multiple exceptions: [Errno 111] Connect call failed ('::1', 9, 0, 0), "
             "[Errno 111] Connect call failed ('127.0.0.1', 9)"), True),
    (OSError("Multiple exceptions: [Errno 99] Cannot assign requested address, "
             "[Errno 111] Connect call failed ('127.0.0.1', 9)"), False),
    (TimeoutError(), False),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), False),  # (a link coming back: retried)
])
def test_nothing_listens_means_refused_at_every_address(error: BaseException, refused: bool) -> None:
    assert _nothing_listens(error) is refused
