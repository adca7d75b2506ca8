"""The transport suite's server: ``python -m benchmarks._transport_server --fd N [--certfile F --keyfile F]``.

One Starlette app under uvicorn (uvloop and httptools when installed, as ``uvicorn[standard]`` runs)
on the listening socket inherited as file descriptor N, over TLS when a certificate is given:

- ``POST /sse``: body ``{"text": ..., "params": {...}}``; streams the demo model's tokens as
  Server-Sent Events (``text/event-stream``, one ``data: <JSON string>`` event per token, then
  ``data: [DONE]``) through a plain StreamingResponse: the cheapest HTTP streaming one could write.
- ``/ws``: the lowlat-mw Starlette middleware serving the same demo model (default settings but
  ``rate_limit=0``, so back-to-back benchmark requests are never rate limited).
- ``GET /health``: ``ok``.

Stops on SIGTERM/SIGINT, or when its standard input closes (the parent went away).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
from typing import Any


def make_app() -> Any:
    from prometheus_client import CollectorRegistry
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    from lowlat_mw.adapters.starlette import LowLatMiddleware
    from lowlat_mw.demo import demo_model
    from lowlat_mw.model import ModelRequest, SessionInfo

    session = SessionInfo(session_id="sse")

    async def sse(request: Request) -> StreamingResponse:
        body = await request.json()
        req = ModelRequest(stream_id=1, text=str(body.get("text", "")), params=dict(body.get("params") or {}),
                           session=session)

        async def events() -> Any:
            async for chunk in demo_model(req):
                yield "data: " + json.dumps(chunk) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    lowlat = Middleware(LowLatMiddleware, model=demo_model, registry=CollectorRegistry(), rate_limit=0)
    return Starlette(routes=[Route("/sse", sse, methods=["POST"]), Route("/health", health)], middleware=[lowlat])


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m benchmarks._transport_server")
    parser.add_argument("--fd", type=int, required=True, help="inherited listening TCP socket")
    parser.add_argument("--certfile", help="PEM certificate chain: serve HTTPS / WSS")
    parser.add_argument("--keyfile", help="PEM private key of --certfile")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    tls: dict[str, Any] = {"ssl_certfile": args.certfile, "ssl_keyfile": args.keyfile} if args.certfile else {}
    config = uvicorn.Config(make_app(), ws="websockets-sansio", ws_ping_interval=None, ws_per_message_deflate=False,
                            log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2,
                            **tls)
    server = uvicorn.Server(config)

    def lifeline() -> None:  # the parent holds our stdin open while it wants us
        sys.stdin.buffer.read()
        server.should_exit = True

    threading.Thread(target=lifeline, name="lifeline", daemon=True).start()
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
