"""The server options lowlat_mw.serving derives from the settings, and the shims they name."""

from __future__ import annotations

import pytest

from lowlat_mw.serving import UVICORN_WS, UVICORN_WSPROTO, daphne_args, transport_limit, uvicorn_args, uvicorn_options
from lowlat_mw.settings import Settings


def test_uvicorn_runs_the_hardened_protocol_of_either_implementation():
    settings = Settings(max_frame_size=200_000)
    assert uvicorn_options(settings)["ws"] == UVICORN_WS
    assert uvicorn_options(settings, ws="wsproto")["ws"] == UVICORN_WSPROTO
    assert uvicorn_options(settings, ws="websockets")["ws"] == "websockets"  # no shim for the legacy one
    args = uvicorn_args(settings, ws="wsproto")
    assert args[args.index("--ws") + 1] == UVICORN_WSPROTO
    assert args[args.index("--ws-max-size") + 1] == str(transport_limit(settings)) == "201024"


@pytest.mark.parametrize("name", [UVICORN_WS, UVICORN_WSPROTO, "lowlat_mw.adapters.uvicorn:Http"])
def test_the_uvicorn_shims_import(name):
    from uvicorn.importer import import_from_string

    assert isinstance(import_from_string(name), type)


def test_daphne_open_handshake_timeout_is_never_shorter_than_asked():
    """autobahn arms it on txaio's batched timer, which rounds the deadline down to a whole second: with
    the option as given, a handshake that straddles a second boundary was dropped milliseconds in."""
    pytest.importorskip("daphne")
    from lowlat_mw.adapters.daphne import ClosingWebSocketFactory

    args = daphne_args(Settings(handshake_timeout=1.0))
    assert args[args.index("--websocket_connect_timeout") + 1] == "1"
    factory = ClosingWebSocketFactory(server_class=None)
    factory.setProtocolOptions(openHandshakeTimeout=1, maxMessagePayloadSize=10)
    assert factory.openHandshakeTimeout == 2
    assert factory.failByDrop is False
    assert factory.maxMessagePayloadSize == 10
