"""How a user tests a Flask app with lowlat-mw: the plugin serves it in werkzeug's threaded server."""

from __future__ import annotations

import pytest

from examples.flask_app import app


@pytest.fixture
def lowlat_app():
    return app


def test_a_reply(lowlat_client):
    assert lowlat_client.complete("hello there").startswith("You said: hello there")


def test_health_and_the_socket_share_the_app(lowlat_server, lowlat_client):
    import urllib.request

    with urllib.request.urlopen(f"{lowlat_server.http_url}/health", timeout=10) as resp:
        assert resp.status == 200
    assert lowlat_client.ping() < 10  # seconds
