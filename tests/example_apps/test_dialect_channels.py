"""A dialect on Django Channels: ``LowLatConsumer.as_asgi(model=..., dialect=NDJSON)`` routed by Channels' own
URLRouter, served by uvicorn on loopback, talked to by a plain websockets client (tests/support/ndjson.py)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_project.settings")
import django

django.setup()

from channels.routing import URLRouter  # noqa: E402
from django.urls import path  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from support.ndjson import NDJSON  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from lowlat_mw.adapters.channels import LowLatConsumer  # noqa: E402


async def shout(req: Any) -> str:
    return req.text.upper()


def test_a_channels_consumer_speaks_the_dialect_it_is_given(uvicorn_server: Any) -> None:
    app = URLRouter([path("ndjson", LowLatConsumer.as_asgi(model=shout, dialect=NDJSON,
                                                           registry=CollectorRegistry()))])
    srv = uvicorn_server(app, path="/ndjson")

    async def main() -> list[dict[str, Any]]:
        async with connect(srv.url) as ws:
            await ws.send(json.dumps({"model": "", "input": "channels"}))
            return [json.loads(await ws.recv()) for _ in range(2)]

    assert asyncio.run(main()) == [{"delta": "CHANNELS"}, {"done": True, "reason": "stop"}]
