"""How a user tests a Django Channels project with lowlat-mw: the ASGI application in process, or served."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_project.settings")
from examples.django_project.asgi import application
from lowlat_mw.testing import AppClient


@pytest.fixture
def lowlat_app():
    return application


async def test_a_reply_in_process():
    async with AppClient(application) as client:
        reply = await client.complete("hello")
    assert reply == "You said: hello "


def test_a_reply_through_uvicorn(lowlat_client):
    assert lowlat_client.complete("hello") == "You said: hello "
