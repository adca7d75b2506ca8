"""One end-to-end benchmark server: ``python -m benchmarks._server on|off --fd N``.

Serves the demo model (``params={"delay": 0, "tokens": N}``) under uvicorn with the Starlette
middleware on the listening socket inherited as file descriptor N (the parent bound it, so it knows
the port and clients queue in its backlog until this process accepts). ``on`` is the default
observability (metrics into a private registry, End stage timings, tracing: non-recording spans
when only opentelemetry-api is installed); ``off`` turns metrics, stage timings and tracing off.
Both allow unlimited requests per second so a benchmark's bursts are never rate limited.
``GET /cpu`` answers the process's CPU time in seconds (time.process_time), so a benchmark can
charge the server's own CPU per delta, which other load on the machine does not inflate.
Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import socket
import time
from typing import Any


def make_app(observability: bool) -> Any:
    from prometheus_client import CollectorRegistry
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from lowlat_mw.adapters.starlette import LowLatMiddleware
    from lowlat_mw.demo import demo_model

    async def cpu(request: Request) -> PlainTextResponse:
        return PlainTextResponse(repr(time.process_time()))

    switches: dict[str, Any] = {} if observability else {"metrics": False, "stage_timings": False, "tracing": False}
    lowlat = Middleware(LowLatMiddleware, model=demo_model, registry=CollectorRegistry(), rate_limit=0, **switches)
    return Starlette(routes=[Route("/cpu", cpu)], middleware=[lowlat])


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m benchmarks._server")
    parser.add_argument("observability", choices=("on", "off"))
    parser.add_argument("--fd", type=int, required=True, help="inherited listening TCP socket")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    config = uvicorn.Config(make_app(args.observability == "on"), ws="websockets-sansio", ws_ping_interval=None,
                            ws_per_message_deflate=False, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=3)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
