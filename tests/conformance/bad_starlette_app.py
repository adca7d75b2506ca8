"""A Starlette app passing a misspelt setting to LowLatMiddleware (startup must fail naming it)."""

from __future__ import annotations

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
                middleware=[Middleware(LowLatMiddleware, model=model, idle_timout=5)])
