"""Scale-suite server: ``python -m benchmarks._scale_server bare|lowlat --fd N [options]``.

One uvicorn process on the listening socket inherited as file descriptor N (bound by the parent),
serving WebSockets at ``/ws`` in one of two apps:

* ``bare``: a plain Starlette WebSocket endpoint. It accepts (echoing the first offered
  subprotocol) and waits for messages; each message it gets is a streaming request ``"T Y D"`` (T
  tokens; Y=1 awaits ``asyncio.sleep(D)`` between tokens, D seconds, 0 if absent) answered with T
  pre-encoded protobuf Deltas and an End, the same frames the middleware sends, so both servers
  feed one client.
* ``lowlat``: the lowlat-mw Starlette middleware with the default settings except
  ``heartbeat_interval`` (``--heartbeat``), no connection limits (every benchmark client comes
  from 127.0.0.1) and a private metrics registry; its model streams the same tokens. With ``--ws lowlat``
  it runs as ``lowlat-mw serve`` does, with serve's garbage-collector settings too (``gc_freeze`` on,
  ``gc_threshold`` 50000; ``--serve-gc on|off`` overrides).

Both apps answer plain HTTP control requests (never on the WebSocket path):

* ``GET /cpu``: ``{"cpu", "user", "sys"}`` process CPU seconds (getrusage: all threads; "sys" is kernel time,
  e.g. socket system calls), ``"t"`` monotonic seconds, and per gc generation the collections so far
  (``"gc_n"``), their wall-clock seconds (``"gc_s"``) and the unreachable objects they freed (``"gc_freed"``);
  cheap, no gc.
* ``GET /mem``: ``gc.collect()``, then ``{"rss", "uss", "pss"}`` bytes (psutil), the number of
  open WebSockets the app serves, the gc-tracked object count and, with ``--tracemalloc``, the
  traced Python heap.
* ``GET /gc/types``: the gc-tracked objects alive, counted by type (for diagnosis).
* ``GET /prof/start`` and ``GET /prof/stop?path=FILE``: cProfile the interval (for diagnosis).
* ``GET /tm/base`` and ``GET /tm/diff``: (``--tracemalloc`` only) forget the traces so far, then the
  allocations made since and still alive, grouped by the innermost frame inside a server package
  (see :func:`_site`).

``--ws lowlat`` runs lowlat-mw's uvicorn WebSocket protocol
(``lowlat_mw.servers.uvicorn:WebSocketProtocol``, which ``lowlat-mw serve`` runs: direct reads and
writes); any other value is uvicorn's own (``websockets-sansio``: the ASGI path).
uvicorn's own WebSocket pings are off (``ws_ping_interval=None``) and permessage-deflate is off,
as in benchmarks._server. Raises RLIMIT_NOFILE to its hard limit. Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

WORDS = ("Hello! This is the lowlat-mw scale benchmark streaming one small token per delta over one "
         "persistent WebSocket, for many clients at once.").split(" ")
# (path marker, package) for tracemalloc attribution; the adapters folder installs as lowlat_mw.adapters.
PACKAGES = (("/lowlat_mw/", "lowlat_mw"), ("/adapters/", "lowlat_mw/adapters"), ("/starlette/", "starlette"),
            ("/uvicorn/", "uvicorn"), ("/websockets/", "websockets"), ("/wsproto/", "wsproto"),
            ("/benchmarks/", "benchmarks"))


def raise_nofile() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def die_with_parent() -> None:
    """Linux: be killed when the benchmark process dies, even by SIGKILL (its own cleanup cannot run then)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the harness's process-group kill still applies
        pass


def token(i: int) -> str:
    word = WORDS[i % len(WORDS)]
    return word if i == 0 else " " + word


async def scale_model(req: Any) -> AsyncIterator[str]:
    """``params["tokens"]`` tokens; with ``params["yield"]`` it awaits sleep(``params["delay"]``, default 0)
    between them (a paced model), else it never yields."""
    total = int(req.params.get("tokens", 30))
    cooperative = bool(req.params.get("yield", False))
    delay = float(req.params.get("delay", 0.0))
    for i in range(total):
        yield token(i)
        if cooperative and i + 1 < total:
            await asyncio.sleep(delay)


class _Frames:
    """Pre-encoded protobuf Deltas and End for the bare endpoint (stream id 1)."""

    def __init__(self) -> None:
        self.cache: dict[int, tuple[list[bytes], bytes]] = {}

    def get(self, tokens: int) -> tuple[list[bytes], bytes]:
        if tokens not in self.cache:
            from lowlat_mw.protocol import events as ev
            from lowlat_mw.protocol.wire import codec_for
            from lowlat_mw.settings import SUBPROTOCOL_PROTO

            codec = codec_for(SUBPROTOCOL_PROTO)
            deltas = [codec.encode(ev.Delta(stream_id=1, seq=i + 1, text=token(i))) for i in range(tokens)]
            end = codec.encode(ev.End(stream_id=1, last_seq=tokens, finish_reason="stop"))
            self.cache[tokens] = (deltas, end)
        return self.cache[tokens]


def _site(tb: tracemalloc.Traceback) -> str:
    """Where an allocation belongs: the innermost frame of `tb` in a server package, as ``package/file:line``.

    asyncio and other stdlib frames are skipped, so a Lock or Task is charged to the code that made it;
    an allocation with no package frame is charged to its innermost frame.
    """
    for frame in reversed(tb):  # tracemalloc orders a traceback oldest frame first
        name = frame.filename.replace("\\", "/")
        for marker, pkg in PACKAGES:
            if marker in name:
                return f"{pkg}/{name.rsplit(marker, 1)[1]}:{frame.lineno}"
    frame = tb[-1]
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"


def make_app(kind: str, heartbeat: float, serve_gc: bool = False) -> Any:
    import psutil
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket

    proc = psutil.Process()
    state: dict[str, Any] = {"open": 0}
    endpoint: Any = None

    gc_time = [0.0, 0.0, 0.0]  # seconds spent in collections of each generation
    gc_count = [0, 0, 0]
    gc_collected = [0, 0, 0]  # unreachable objects freed (reference cycles)
    gc_began = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_began[0] = time.perf_counter()
        else:
            gen = info["generation"]
            gc_time[gen] += time.perf_counter() - gc_began[0]
            gc_count[gen] += 1
            gc_collected[gen] += info["collected"]

    gc.callbacks.append(on_gc)

    async def cpu(request: Request) -> JSONResponse:
        usage = resource.getrusage(resource.RUSAGE_SELF)  # µs resolution (os.times has clock ticks)
        return JSONResponse({"cpu": usage.ru_utime + usage.ru_stime, "user": usage.ru_utime, "sys": usage.ru_stime,
                             "t": time.monotonic(), "gc_s": gc_time, "gc_n": gc_count,
                             "gc_freed": gc_collected})

    async def mem(request: Request) -> JSONResponse:
        gc.collect()
        gc.collect()
        info = proc.memory_full_info()
        if endpoint is not None:  # sessions of closed connections may linger in the timer heap: not counted
            open_ws = sum(1 for s in list(endpoint.connections) if not s.protocol.closed)
        else:
            open_ws = state["open"]
        out = {"rss": info.rss, "uss": info.uss, "pss": getattr(info, "pss", info.uss), "open": open_ws,
               "objects": len(gc.get_objects()), "t": time.monotonic()}
        if tracemalloc.is_tracing():
            out["traced"] = tracemalloc.get_traced_memory()[0]
        return JSONResponse(out)

    async def gc_types(request: Request) -> JSONResponse:
        """Diagnosis: the gc-tracked objects alive now, counted by type (no collection first)."""
        counts: dict[str, int] = {}
        for obj in gc.get_objects():
            name = type(obj).__qualname__
            counts[name] = counts.get(name, 0) + 1
        return JSONResponse(counts)

    async def tm_base(request: Request) -> JSONResponse:
        gc.collect()
        tracemalloc.clear_traces()  # from now on only new allocations are traced: small, quick snapshots
        return JSONResponse({"ok": True})

    async def tm_diff(request: Request) -> JSONResponse:
        gc.collect()
        snap = tracemalloc.take_snapshot()
        by_site: dict[str, list[int]] = {}
        for stat in snap.statistics("traceback"):
            cell = by_site.setdefault(_site(stat.traceback), [0, 0])
            cell[0] += stat.size
            cell[1] += stat.count
        return JSONResponse({"sites": by_site})

    async def prof(request: Request) -> JSONResponse:
        """Diagnosis: ``/prof/start``, then ``/prof/stop?path=FILE`` dumps cProfile stats of the interval."""
        import cProfile

        if request.path_params["action"] == "start":
            state["prof"] = cProfile.Profile()
            state["prof"].enable()
        else:
            state["prof"].disable()
            state["prof"].dump_stats(request.query_params["path"])
        return JSONResponse({"ok": True})

    routes: list[Any] = [Route("/cpu", cpu), Route("/mem", mem), Route("/tm/base", tm_base),
                         Route("/tm/diff", tm_diff), Route("/prof/{action}", prof),
                         Route("/gc/types", gc_types)]
    if kind == "bare":
        frames = _Frames()

        async def ws(websocket: WebSocket) -> None:
            offered = websocket.scope.get("subprotocols") or []
            await websocket.accept(subprotocol=offered[0] if offered else None)
            state["open"] += 1
            try:
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        break
                    tokens, cooperative, *rest = (message.get("text") or "0 0").split()
                    delay = float(rest[0]) if rest else 0.0
                    deltas, end = frames.get(int(tokens))
                    for i, frame in enumerate(deltas):
                        await websocket.send_bytes(frame)
                        if cooperative == "1" and i + 1 < len(deltas):
                            await asyncio.sleep(delay)
                    await websocket.send_bytes(end)
            finally:
                state["open"] -= 1

        return Starlette(routes=[*routes, WebSocketRoute("/ws", ws)])

    from prometheus_client import CollectorRegistry
    from starlette.middleware import Middleware

    from lowlat_mw.adapters.starlette import LowLatMiddleware
    from lowlat_mw.servers.cli import SERVE_GC_THRESHOLD

    app = Starlette(routes=routes, middleware=[Middleware(
        LowLatMiddleware, model=scale_model, registry=CollectorRegistry(), heartbeat_interval=heartbeat,
        max_connections=0, max_connections_per_client=0,
        **({"gc_freeze": True, "gc_threshold": SERVE_GC_THRESHOLD} if serve_gc else {}))])
    app.middleware_stack = app.build_middleware_stack()  # now, so /mem can count the endpoint's connections
    stack: Any = app.middleware_stack
    while stack is not None and not hasattr(stack, "endpoint"):
        stack = getattr(stack, "app", None)
    if stack is None:
        raise RuntimeError("LowLatMiddleware not found in the middleware stack")
    endpoint = stack.endpoint
    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m benchmarks._scale_server")
    parser.add_argument("kind", choices=("bare", "lowlat"))
    parser.add_argument("--fd", type=int, required=True, help="inherited listening TCP socket")
    parser.add_argument("--ws", default="websockets-sansio",
                        help="uvicorn WebSocket implementation; lowlat: lowlat-mw's (direct reads and writes)")
    parser.add_argument("--heartbeat", type=float, default=30.0, help="lowlat heartbeat_interval, seconds")
    parser.add_argument("--ws-ping", type=float, default=0.0, metavar="S",
                        help="uvicorn's own WebSocket ping interval (0: off, the default here)")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES", help="trace allocations")
    parser.add_argument("--serve-gc", choices=("auto", "on", "off"), default="auto",
                        help="lowlat settings gc_freeze and gc_threshold as `lowlat-mw serve` sets them; auto: with "
                             "--ws lowlat")
    args = parser.parse_args(argv)
    die_with_parent()
    raise_nofile()
    sock = socket.socket(fileno=args.fd)
    app = make_app(args.kind, args.heartbeat,
                   serve_gc=args.serve_gc == "on" or (args.serve_gc == "auto" and args.ws == "lowlat"))
    if args.tracemalloc:  # after the imports: far fewer traces, so snapshots stay quick
        tracemalloc.start(args.tracemalloc)
    ws: Any = args.ws
    if ws == "lowlat":
        from lowlat_mw.servers.uvicorn import WebSocketProtocol as ws
    config = uvicorn.Config(app, ws=ws, ws_ping_interval=args.ws_ping or None, ws_per_message_deflate=False,
                            log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
