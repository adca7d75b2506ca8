"""The blocking client has the async client's public API (issue 38, item 17: ``SyncClient`` lacked ``welcome``).

Each blocking class is compared with the async class it wraps: the same public names (a few listed extras aside)
and, for methods, the same parameters. A public name added to one side only fails here, so the two cannot drift.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from lowlat_mw.client import AsyncClient, Backoff, SyncClient
from lowlat_mw.client.aio import Document
from lowlat_mw.client.sync import SyncDocument, SyncStream
from lowlat_mw.client.websocket import _nothing_listens, _refused_everywhere
from lowlat_mw.errors import ConnectionClosed, HandshakeRefused, ReconnectFailed, refusal_hint
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


@pytest.fixture
def closed_ports() -> Iterator[tuple[int, int]]:
    """Two loopback ports bound but not listening for the whole test: connecting to either is refused."""
    socks = [socket.socket(), socket.socket()]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        yield socks[0].getsockname()[1], socks[1].getsockname()[1]
    finally:
        for sock in socks:
            sock.close()


def resolving(monkeypatch: pytest.MonkeyPatch, addresses: list[tuple[str, int]]) -> None:
    """The running loop resolves every name to `addresses` (IPv4, in this order): a name with several addresses
    without touching anything but 127.0.0.1 (asyncio and the client both resolve through the loop)."""
    loop = asyncio.get_running_loop()

    async def getaddrinfo(host: Any, port: Any, **kwargs: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", address) for address in addresses]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)


async def test_a_first_connection_refused_at_every_address_fails_at_once(
        closed_ports: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    # A name with two addresses, both refused: asyncio raises one OSError joining both (no errno, only text). The
    # client decided from that text; it now tries the addresses again itself.
    resolving(monkeypatch, [("127.0.0.1", port) for port in closed_ports])
    client = AsyncClient("ws://several.invalid/ws", backoff=Backoff(base=10, retries=5))  # (a retry: a 10 s wait)
    async with asyncio.timeout(10):
        with pytest.raises(ReconnectFailed, match="connection refused \\(nothing listens there") as info:
            async with client:
                pass
    cause = info.value.__cause__
    assert type(cause) is OSError and cause.errno is None and "Multiple exceptions" in str(cause), repr(cause)


@pytest.mark.parametrize(("outcomes", "refused"), [
    (["refused", "refused"], True),
    (["refused"], True),
    (["refused", "unavailable"], False),  # (an address this host cannot use: not "nothing listens")
    (["refused", "answers"], False),  # a server there after all (or now): retried
    (["refused", "slow"], False),
    ([], False),
])
async def test_refused_everywhere_asks_every_address(outcomes: list[str], refused: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    resolving(monkeypatch, [("127.0.0.1", 1000 + i) for i in range(len(outcomes))])
    tried: list[int] = []

    async def sock_connect(sock: socket.socket, address: tuple[str, int]) -> None:
        tried.append(address[1])
        outcome = outcomes[address[1] - 1000]
        if outcome == "refused":
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        if outcome == "unavailable":
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
        if outcome == "slow":
            await asyncio.sleep(3600)

    monkeypatch.setattr(asyncio.get_running_loop(), "sock_connect", sock_connect)
    assert await _refused_everywhere("several.invalid", 80, 0.5) is refused
    assert tried == [1000 + i for i in range(len(outcomes))]
    # and what the client reads from its connection's error: the joined one (no errno) asks the addresses
    joined = OSError("Multiple exceptions: Connect call failed")  # (no "[Errno N]" in it: the text is not read)
    assert await _nothing_listens(joined, "ws://several.invalid:80/ws", 0.5) is refused


@pytest.mark.parametrize(("error", "refused"), [
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('127.0.0.1', 9)"), True),
    (TimeoutError(), False),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), False),  # (a link coming back: retried)
])
async def test_nothing_listens_from_one_error(error: BaseException, refused: bool) -> None:
    assert await _nothing_listens(error, URL, 0.5) is refused
