"""The warm-up benchmark's server: ``python -m benchmarks._warmup_server --fd N --load-ms MS``.

Serves :func:`model` under uvicorn on lowlat-mw's own protocol (as ``lowlat-mw serve`` runs it) with the
Starlette middleware, on the listening socket inherited as file descriptor N. The model stands for one
that must prepare per input before it can answer (load an adapter, fill a prefix cache for a system
prompt): the first request for a ``params["key"]`` waits ``--load-ms`` (an awaited load, as fetching
weights or a remote cache), later ones do not; its ``warmup`` hook does that preparation alone, which is
what a warm-up request (protocol v1.2) runs. It also serves the batch suite's two models, ``single`` and
``batched`` (:func:`single`, :func:`batched`): each call costs ``--call-ms`` plus ``--item-ms`` per request it
holds, one call at a time (as one forward pass on one accelerator). Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

LOAD_S = 0.1
_ready: dict[str, asyncio.Future[None]] = {}  # key -> its preparation (done: ready)


async def _prepare(key: str) -> None:
    """The per-input preparation, once per key (concurrent callers share it)."""
    ready = _ready.get(key)
    if ready is None:
        ready = _ready[key] = asyncio.get_running_loop().create_future()
        await asyncio.sleep(LOAD_S)
        ready.set_result(None)
    await ready


async def model(req: Any) -> AsyncIterator[str]:
    await _prepare(str(req.params.get("key", "")))
    yield "ready"


async def _warmup(req: Any) -> None:
    await _prepare(str(req.params.get("key", "")))


model.warmup = _warmup  # type: ignore[attr-defined]

CALL_S = 0.01
ITEM_S = 0.0005
_device = asyncio.Lock()  # one call at a time


async def _forward(n: int) -> None:
    async with _device:
        await asyncio.sleep(CALL_S + ITEM_S * n)


async def single(req: Any) -> AsyncIterator[str]:
    """One call per request."""
    await _forward(1)
    yield f"{req.prompt}:done"


async def batched(reqs: list[Any]) -> list[str]:
    """One call per batch: a fixed cost and a cost per request (marked batch-capable)."""
    await _forward(len(reqs))
    return [f"{req.prompt}:done" for req in reqs]


batched.batch = True  # type: ignore[attr-defined]


def make_app() -> Any:
    from prometheus_client import CollectorRegistry
    from starlette.applications import Starlette
    from starlette.middleware import Middleware

    from lowlat_mw.adapters.starlette import LowLatMiddleware

    models = {"default": model, "single": single, "batched": batched}
    return Starlette(middleware=[Middleware(LowLatMiddleware, model=models, registry=CollectorRegistry(), rate_limit=0,
                                            max_streams=256)])


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from lowlat_mw.servers.uvicorn import WebSocketProtocol

    global LOAD_S, CALL_S, ITEM_S
    parser = argparse.ArgumentParser(prog="python -m benchmarks._warmup_server")
    parser.add_argument("--fd", type=int, required=True, help="inherited listening TCP socket")
    parser.add_argument("--load-ms", type=float, default=100.0, help="the model's preparation per key")
    parser.add_argument("--call-ms", type=float, default=10.0, help="the batch suite's fixed cost of a model call")
    parser.add_argument("--item-ms", type=float, default=0.5, help="and its cost per request in the call")
    args = parser.parse_args(argv)
    LOAD_S, CALL_S, ITEM_S = args.load_ms / 1000, args.call_ms / 1000, args.item_ms / 1000
    sock = socket.socket(fileno=args.fd)
    config = uvicorn.Config(make_app(), ws=WebSocketProtocol, ws_ping_interval=None, ws_per_message_deflate=False,
                            log_level="warning", lifespan="off", timeout_graceful_shutdown=3)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
