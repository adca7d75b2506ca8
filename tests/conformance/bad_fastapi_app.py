"""A FastAPI app adding LowLatMiddleware with a misspelt setting (startup must fail naming it)."""

from __future__ import annotations

from fastapi import FastAPI

from lowlat_mw.adapters.starlette import LowLatMiddleware


async def model(req):
    return "unreachable"


app = FastAPI()
app.add_middleware(LowLatMiddleware, model=model, idle_timout=5)


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}
