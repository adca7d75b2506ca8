"""The daphne runner's abort after a gentle drop is cancelled as the connection goes: its timer held the transport
and the protocol for close_timeout after every close.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest


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
