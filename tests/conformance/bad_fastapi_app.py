"""A FastAPI app adding LowLatMiddleware with a misspelt setting, or the mistakes in $BAD_SETTINGS (a JSON object):
startup must fail naming each."""

from __future__ import annotations

import json
import os

from fastapi import FastAPI

from lowlat_mw.adapters.starlette import LowLatMiddleware


async def model(req):
    return "unreachable"


app = FastAPI()
app.add_middleware(LowLatMiddleware, model=model, **json.loads(os.environ.get("BAD_SETTINGS", '{"idle_timout": 5}')))


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}
