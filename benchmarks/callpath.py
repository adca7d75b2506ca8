"""The path of one request through lowlat-mw's server code, counted with ``sys.setprofile``.

    .venv/bin/python -m benchmarks.callpath            # the table: functions, files, hand-offs
    .venv/bin/python -m benchmarks.callpath --walk     # and every call between two of our files, in order

One WebSocket on the Starlette middleware, driven in process through ASGI (no server, no socket):
Hello -> Welcome, one Request -> 3 Deltas -> End, then the client's disconnect. A first connection
runs unprofiled (first-use set-up such as the loop's timer scheduler or a metric's first child is
not the request's path); the second is counted, twice: **the request** from ``websocket.connect``
until the End is handed to the server's ``send``, and **the connection** on to the end of the
disconnect's teardown. The client's
frames are encoded before the profiler starts and the frames the server sends are only collected,
so everything counted is server-side work. Counted are Python functions of lowlat-mw (the
``lowlat_mw`` package and its adapters) only:

* functions: distinct functions entered;
* calls: every entry into one of them (a coroutine or generator resuming counts as an entry);
* hand-offs: entries whose caller is another of our files (the reader's jumps between files).

Counts depend on the code only (not on timing or load); docs/architecture.md shows them (run it in a
fresh process: an OpenTelemetry SDK installed by something else would add the spans' work). No test holds
them to a budget any more (issue 39): a budget rewarded inlining, and saw the ASGI path only. The gate is
on behaviour: tests/conformance/test_conformance_equivalence.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOTS = tuple(str(p) for p in (Path(__file__).resolve().parents[1] / "lowlat_mw",
                                Path(__file__).resolve().parents[1] / "adapters"))
TOKENS = ("one ", "two ", "three")


async def tokens(req: Any) -> Any:
    """The model: three tokens, as an async generator (the common shape of a streaming model)."""
    for t in TOKENS:
        yield t


def _ours(filename: str) -> bool:
    return filename.startswith(ROOTS)


def _short(filename: str) -> str:
    for root in ROOTS:
        if filename.startswith(root):
            base = Path(root).name
            rel = filename[len(root) + 1:]
            return f"{'lowlat_mw/adapters' if base == 'adapters' else 'lowlat_mw'}/{rel}"
    return filename


@dataclass
class Path_:
    """What the profiler saw."""

    functions: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    handoffs: list[tuple[str, str, str]] = field(default_factory=list)  # (from file, to file, function)

    @property
    def files(self) -> set[str]:
        return {f for f, _, _ in self.functions}

    @property
    def calls(self) -> int:
        return sum(self.functions.values())


def measure(subprotocol: str = "lowlat.v1.proto", *, through_disconnect: bool = False, **settings: Any) -> Path_:
    """Profile one Hello -> Request -> 3 Deltas -> End (and the disconnect, if `through_disconnect`) on the
    Starlette middleware."""
    from lowlat_mw.adapters.starlette import LowLatMiddleware

    try:
        from lowlat_mw.protocol import events as ev
        from lowlat_mw.protocol.wire import codec_for
    except ImportError:  # the layout before lowlat_mw/protocol (to measure an older checkout the same way)
        from lowlat_mw import events as ev  # type: ignore[no-redef]
        from lowlat_mw.codec import codec_for  # type: ignore[no-redef]

    codec = codec_for(subprotocol)
    frames_in = [codec.encode(ev.Hello(client="callpath")), codec.encode(ev.Request(stream_id=1, text="go"))]
    expected_out = 1 + len(TOKENS) + 1  # Welcome, Deltas, End

    async def not_found(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the request must not reach the app")

    app = LowLatMiddleware(not_found, model=tokens, registry=_registry(), **settings)
    seen = Path_()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not _ours(code.co_filename):
            return
        seen.functions[(_short(code.co_filename), code.co_firstlineno, code.co_name)] += 1
        back = frame.f_back
        if back is not None and _ours(back.f_code.co_filename) and back.f_code.co_filename != code.co_filename:
            seen.handoffs.append((_short(back.f_code.co_filename), _short(code.co_filename), code.co_name))

    async def run() -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        sent: list[dict[str, Any]] = []
        done = asyncio.Event()

        async def receive() -> dict[str, Any]:
            return await inbox.get()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if sum(m["type"] == "websocket.send" for m in sent) == expected_out:
                if not through_disconnect:
                    sys.setprofile(None)  # the End is out: the request's path ends here
                done.set()

        scope = {"type": "websocket", "path": "/ws", "root_path": "", "query_string": b"",
                 "headers": [(b"host", b"127.0.0.1:8000")], "subprotocols": [subprotocol],
                 "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "asgi": {"version": "3.0"}}
        key = "bytes" if isinstance(frames_in[0], bytes) else "text"
        for profiled in (False, True):  # a warm-up connection first: first-use set-up is not the request's path
            sent.clear()
            done.clear()
            inbox.put_nowait({"type": "websocket.connect"})
            inbox.put_nowait({"type": "websocket.receive", key: frames_in[0]})
            inbox.put_nowait({"type": "websocket.receive", key: frames_in[1]})
            if profiled:
                sys.setprofile(profile)
            try:
                task = asyncio.get_running_loop().create_task(app(scope, receive, send))
                await asyncio.wait_for(done.wait(), 10)
                inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
                await asyncio.wait_for(task, 10)
            finally:
                sys.setprofile(None)
            kinds = [m["type"] for m in sent]
            assert kinds == ["websocket.accept", *["websocket.send"] * expected_out], kinds

    asyncio.run(run())
    return seen


def _registry() -> Any:
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


def table(seen: Path_) -> str:
    """Markdown: the counts, then functions per file."""
    per_file = Counter(f for f, _, _ in seen.functions)
    lines = [
        "| what | count |", "| --- | ---: |",
        f"| functions entered | {len(seen.functions)} |",
        f"| files | {len(seen.files)} |",
        f"| calls (entries, resumptions included) | {seen.calls} |",
        f"| hand-offs between files | {len(seen.handoffs)} |",
        "", "| file | functions |", "| --- | ---: |",
    ]
    lines += [f"| {f} | {n} |" for f, n in sorted(per_file.items(), key=lambda x: (-x[1], x[0]))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.callpath", description=__doc__.split("\n")[0])
    parser.add_argument("--walk", action="store_true", help="print every hand-off between files, in order")
    parser.add_argument("--functions", action="store_true", help="print every function entered, with its count")
    parser.add_argument("--json", action="store_true", help="the JSON subprotocol instead of Protobuf")
    parser.add_argument("--connection", action="store_true", help="count on through the disconnect's teardown")
    parser.add_argument("--counts", action="store_true", help="only the counts, as one JSON object")
    args = parser.parse_args(argv)
    seen = measure("lowlat.v1.json" if args.json else "lowlat.v1.proto", through_disconnect=args.connection)
    if args.counts:
        print(json.dumps({"functions": len(seen.functions), "files": len(seen.files), "calls": seen.calls,
                          "handoffs": len(seen.handoffs)}))
        return 0
    print(table(seen))
    if args.functions:
        print()
        for (f, line, name), n in sorted(seen.functions.items()):
            print(f"{n:4d}  {f}:{line} {name}")
    if args.walk:
        print()
        for i, (a, b, name) in enumerate(seen.handoffs, 1):
            print(f"{i:4d}  {a} -> {b}:{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
