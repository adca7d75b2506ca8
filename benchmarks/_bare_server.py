"""The bare-vs-lowlat-mw benchmark server: ``python -m benchmarks._bare_server --fd N [--profile]``.

One uvicorn (lowlat-mw's WebSocket protocol, ``lowlat_mw.servers.uvicorn:WebSocketProtocol``: uvicorn's
websockets-sansio one offering direct writes, as ``lowlat-mw serve`` runs it; ``--ws websockets-sansio``
for uvicorn's own) serving, on the listening socket inherited as file descriptor N, one Starlette app with:

* ``/echo``: a bare Starlette ``WebSocketRoute`` that sends every message back (text or bytes);
* ``/stream``: a bare ``WebSocketRoute`` that answers a text message ``"stream N"`` with N text
  frames of :data:`~benchmarks._bare_models.TOKEN` and then the text frame ``"end"`` (yielding to
  the loop every 64 frames, as the lowlat-mw model does);
* ``/ws``: ``LowLatMiddleware`` with its default settings (metrics into a private registry, End
  stage timings, tracing) but no rate limit and the result cache on (16 MiB: it keeps only the replies of
  the ``cached`` model, the one marked deterministic), serving :data:`~benchmarks._bare_models.MODELS`;
* ``/ws-lean``: the same with metrics, stage timings and tracing off;
* ``/ws-send``: the same as ``/ws`` with ``direct_writes`` off: every frame through ASGI ``send``;
* ``GET /cpu``: the process's CPU seconds so far (``time.process_time``);
* with ``--profile DIR``: cProfile (timed by the thread's CPU clock) runs on the event-loop thread, and
  ``GET /profile?save=NAME`` writes its stats to DIR/NAME.prof and starts a fresh profile.

Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import socket
import time
from pathlib import Path
from typing import Any

from ._bare_models import MODELS, TOKEN, YIELD_EVERY

_profiler: cProfile.Profile | None = None
_profile_dir: Path | None = None


def _new_profiler() -> cProfile.Profile:
    """cProfile timed by this thread's CPU clock: time the loop thread spends descheduled (the 2-CPU
    machine also runs the clients) is not charged to whatever function was running."""
    return cProfile.Profile(time.thread_time)


def make_app() -> Any:
    from prometheus_client import CollectorRegistry
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket

    from lowlat_mw.adapters.starlette import LowLatMiddleware

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is not None:
                await websocket.send_text(text)
            else:
                await websocket.send_bytes(message.get("bytes") or b"")

    async def stream(websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            n = int((message.get("text") or "stream 0").split()[1])
            for i in range(n):
                await websocket.send_text(TOKEN)
                if i % YIELD_EVERY == YIELD_EVERY - 1:
                    await asyncio.sleep(0)
            await websocket.send_text("end")

    async def cpu(request: Request) -> PlainTextResponse:
        return PlainTextResponse(repr(time.process_time()))

    async def profile(request: Request) -> PlainTextResponse:
        global _profiler
        if _profiler is None or _profile_dir is None:
            return PlainTextResponse("not profiling (start with --profile DIR)\n", status_code=404)
        name = request.query_params.get("save", "")
        if not name.replace("-", "").replace("_", "").isalnum():
            return PlainTextResponse("save=NAME: letters, digits, - and _ only\n", status_code=400)
        _profiler.disable()
        _profiler.dump_stats(_profile_dir / f"{name}.prof")
        _profiler = _new_profiler()
        _profiler.enable()
        return PlainTextResponse("saved\n")

    lean = {"metrics": False, "stage_timings": False, "tracing": False}
    return Starlette(
        routes=[WebSocketRoute("/echo", echo), WebSocketRoute("/stream", stream), Route("/cpu", cpu),
                Route("/profile", profile)],
        middleware=[
            Middleware(LowLatMiddleware, model=MODELS, path="/ws", registry=CollectorRegistry(), rate_limit=0,
                       cache_size=16 * 1024 * 1024),
            Middleware(LowLatMiddleware, model=MODELS, path="/ws-lean", registry=CollectorRegistry(), rate_limit=0,
                       **lean),
            Middleware(LowLatMiddleware, model=MODELS, path="/ws-merge", registry=CollectorRegistry(), rate_limit=0,
                       merge_deltas=True),
            Middleware(LowLatMiddleware, model=MODELS, path="/ws-send", registry=CollectorRegistry(), rate_limit=0,
                       direct_writes=False),
        ],
    )


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    global _profiler, _profile_dir
    parser = argparse.ArgumentParser(prog="python -m benchmarks._bare_server")
    parser.add_argument("--fd", type=int, required=True, help="inherited listening TCP socket")
    parser.add_argument("--profile", metavar="DIR", help="run cProfile; GET /profile?save=NAME writes DIR/NAME.prof")
    parser.add_argument("--ws", choices=("lowlat", "websockets-sansio"), default="lowlat",
                        help="WebSocket protocol: lowlat-mw's (direct writes offered) or uvicorn's own")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    ws: Any = args.ws
    if ws == "lowlat":
        from lowlat_mw.servers.uvicorn import WebSocketProtocol as ws
    config = uvicorn.Config(make_app(), ws=ws, ws_ping_interval=None, ws_per_message_deflate=False,
                            log_level="warning", lifespan="off", timeout_graceful_shutdown=3)
    if args.profile:
        _profile_dir = Path(args.profile)
        _profiler = _new_profiler()
        _profiler.enable()
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if _profiler is not None:
            _profiler.disable()


if __name__ == "__main__":
    main()
