"""How a user tests a Django Channels project with lowlat-mw: the ASGI application in process, or served."""

from __future__ import annotations

import json
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


def test_the_guides_asyncapi_view():
    from django.test import RequestFactory
    from guide_support import guide_block

    namespace: dict = {}
    exec(guide_block("django.md", "# views.py (route it in urls.py: path(\"asyncapi.json\", views.asyncapi))"),
         namespace)
    response = namespace["asyncapi"](RequestFactory().get("/asyncapi.json", HTTP_HOST="127.0.0.1:8000"))
    doc = json.loads(response.content)
    assert response.status_code == 200 and doc["asyncapi"] == "3.0.0"
    assert doc["servers"]["default"]["host"] == "127.0.0.1:8000"
    assert doc["info"]["x-lowlat-limits"]["max_streams"] == 16  # the example's LOWLAT_MW
