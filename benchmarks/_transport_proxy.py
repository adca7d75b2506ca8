"""The transport suite's delaying proxies: ``python -m benchmarks._transport_proxy NAME=PORT:DELAY_MS ...``.

Starts one :class:`lowlat_mw.testing.FaultProxy` per argument, forwarding a free port on
127.0.0.1 to 127.0.0.1:PORT with DELAY_MS of one-way delay in each direction (and the TCP
handshake's round trip on each new connection), prints ``{"NAME": proxy_port, ...}`` as one JSON
line, then runs until its standard input closes (the parent went away) or SIGTERM. It is a
process of its own so that the proxies' Python work never competes for the benchmark client's GIL.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from lowlat_mw.testing import FaultProxy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._transport_proxy")
    parser.add_argument("links", nargs="+", metavar="NAME=PORT:DELAY_MS")
    args = parser.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    proxies: dict[str, FaultProxy] = {}
    try:
        for spec in args.links:
            name, _, rest = spec.partition("=")
            port, _, delay_ms = rest.partition(":")
            proxies[name] = FaultProxy(("127.0.0.1", int(port)), delay=float(delay_ms) / 1000)
        print(json.dumps({name: p.port for name, p in proxies.items()}), flush=True)

        def lifeline() -> None:
            sys.stdin.buffer.read()
            done.set()

        threading.Thread(target=lifeline, name="lifeline", daemon=True).start()
        while not done.wait(1.0):
            pass
    finally:
        for p in proxies.values():
            p.close()


if __name__ == "__main__":
    main()
