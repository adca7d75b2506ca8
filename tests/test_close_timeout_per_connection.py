"""Each connection's close is bounded by its own endpoint's close_timeout, on our uvicorn shims and daphne runner.

The servers drop a connection whose peer does not take its close within close_timeout. They took the shortest
close_timeout of every endpoint alive in the process, on every connection: one app with a short one (or a test's
endpoint not yet collected) cut every other app's closes short, and in-process tests depended on their order. The
driver now tells the server its own as it takes the connection (``close_within``, docs/protocol.md 12); what no
driver took (a refused handshake) keeps the process's bound.

The daphne runner's abort after a gentle drop is also cancelled as the connection goes: its timer held the transport
and the protocol for close_timeout after every close.
"""

from __future__ import annotations

import asyncio
import struct
import time
from types import SimpleNamespace
from typing import Any

import pytest
from uvicorn_support import WAIT, InProcessServer, client_frame

from lowlat_mw.endpoint import Endpoint
from lowlat_mw.settings import Settings

SHORT, LONG = 0.2, 30.0  # two apps' close_timeout (s)
QUIET = 1.0  # seconds the long one's peer is watched for an abort that must not come (5x the short bound)


async def _server_closes(server: InProcessServer) -> Any:
    """A connection to `server` that the server closes (a message that is no protocol message: 1007) and whose
    close the client does not answer; returns it once the close frame is read."""
    conn, _ = await server.connect()
    conn.writer.write(client_frame(b"\xff\xff not a message"))
    while True:
        opcode, _payload = await conn.frame()
        if opcode == 0x8:
            return conn


async def _gone(conn: Any) -> bool:
    """Whether the server dropped the connection (EOF or reset) while the client says nothing."""
    try:
        return await conn.reader.read(1) == b""
    except ConnectionError:
        return True


async def test_two_apps_in_one_process_each_bound_their_own_closes() -> None:
    async with asyncio.timeout(4 * WAIT), InProcessServer(close_timeout=SHORT) as short, \
            InProcessServer(close_timeout=LONG) as long:
        # The long app's connection: its unanswered close is not cut at the other app's bound.
        conn = await _server_closes(long)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_gone(conn), QUIET)
        conn.writer.write(client_frame(struct.pack("!H", 1000), 0x8))  # answered now: the server closes
        assert await asyncio.wait_for(_gone(conn), WAIT)
        conn.drop()
        # The short app's: dropped at its own bound.
        conn = await _server_closes(short)
        start = time.monotonic()
        assert await asyncio.wait_for(_gone(conn), WAIT)
        print(f"\nunanswered close dropped after {time.monotonic() - start:.2f} s (close_timeout {SHORT} s)")
        conn.drop()


# ================================================================================ the daphne runner
@pytest.fixture
def daphne(monkeypatch: pytest.MonkeyPatch) -> Any:
    """lowlat_mw.servers.daphne with a Twisted Clock for its reactor, and a way to make connected protocols."""
    pytest.importorskip("daphne")
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    import lowlat_mw.servers.daphne as module

    clock = Clock()
    monkeypatch.setattr(module, "reactor", clock)
    server = SimpleNamespace(protocol_connected=lambda p: None, protocol_disconnected=lambda p: None,
                             log_action=lambda *a: None, root_path="")
    factory = module.ClosingWebSocketFactory(server_class=server)
    factory.setProtocolOptions()

    def connected() -> Any:
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        transport.registerProducer(SimpleNamespace(), True)  # (daphne's HTTP channel, replaced by the flow)
        protocol.makeConnection(transport)
        protocol.server, protocol.muted, protocol.client_addr = server, False, None  # (what onConnect sets)
        protocol.request = SimpleNamespace(path="/ws")
        protocol.state = protocol.STATE_OPEN
        return protocol

    return SimpleNamespace(module=module, clock=clock, connected=connected)


def _lost(protocol: Any) -> None:
    from twisted.internet.error import ConnectionDone
    from twisted.python.failure import Failure

    protocol.connectionLost(Failure(ConnectionDone()))


def test_daphne_bounds_each_connections_close_by_its_own_close_timeout(daphne) -> None:
    keep = [Endpoint(lambda req: "", Settings(close_timeout=SHORT))]  # (another app of the process, shorter)
    rounding = daphne.module.BATCHED_TIMER_ROUNDING
    for timeout in (LONG, 2.0):
        protocol = daphne.connected()
        daphne.module.DaphneDirect(protocol).close_within(timeout)  # what the driver does as it takes it
        assert protocol.closeHandshakeTimeout == timeout + rounding  # our close, unanswered: autobahn's abort
        protocol.dropConnection(abort=False)  # the peer's close, answered: ours
        [call] = daphne.clock.getDelayedCalls()
        assert call.getTime() == timeout
        _lost(protocol)
    del keep


def test_daphne_cancels_the_abort_of_a_connection_that_closed(daphne) -> None:
    """A graceful drop arms an abort for a peer that never reads; once the connection is gone it is cancelled, not
    left to hold the transport and the protocol for close_timeout."""
    protocols = [daphne.connected() for _ in range(3)]
    for protocol in protocols:
        protocol.dropConnection(abort=False)
    assert len(daphne.clock.getDelayedCalls()) == 3
    for protocol in protocols:
        _lost(protocol)
    assert daphne.clock.getDelayedCalls() == []
    protocol = daphne.connected()  # a peer that never reads: the abort still comes
    protocol.dropConnection(abort=False)
    transport = protocol.transport
    transport.connected = True  # (StringTransport: what the abort looks at)
    aborted = []
    transport.abortConnection = lambda: aborted.append(True)
    daphne.clock.advance(daphne.module.app_timeout("close_timeout"))
    assert aborted == [True]
