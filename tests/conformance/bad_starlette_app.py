"""A Starlette app passing a misspelt setting to LowLatMiddleware, or the mistakes in $BAD_SETTINGS (a JSON object):
startup must fail naming each."""

from __future__ import annotations

import json
import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from lowlat_mw.adapters.starlette import LowLatMiddleware


async def model(req):
    return "unreachable"


async def health(request):
    return PlainTextResponse("ok")


app = Starlette(routes=[Route("/health", health)],
                middleware=[Middleware(LowLatMiddleware, model=model,
                                       **json.loads(os.environ.get("BAD_SETTINGS", '{"idle_timout": 5}')))])
