"""A fault the FaultProxy has no knob for: a half-open drop (client side gone, server side silent).

``FaultProxy.cut_all()`` resets both sides of each link, so the server learns at once that the
connection is gone. After a NAT timeout or a network switch the server's socket often stays
ESTABLISHED and silent instead: the server still has the session attached to the old connection
when the client resumes on a new one (the "takeover" path of a resume). ``drop_client_sides``
produces exactly that on loopback, through the proxy's own event loop.

It uses the proxy's internals (``_links``, ``_call``, each link's ``cw``/``uw`` writers and
``closed`` flag, see lowlat_mw/testing/proxy.py): marking a link closed first keeps its pumps
from closing or half-closing the upstream socket when the client side goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from lowlat_mw.testing import FaultProxy


def drop_client_sides(proxy: FaultProxy) -> Callable[[], None]:
    """Reset the client side of every open link and leave the server side open and unread.

    Returns ``release()``, which closes the server sides (call it before the proxy closes).
    """

    async def drop() -> list[asyncio.StreamWriter]:
        upstreams = []
        for link in list(proxy._links):
            if link.closed or link.uw is None:
                continue
            link.closed = True  # the pumps stop without write_eof() / abort() on the upstream
            link.cw.transport.abort()
            upstreams.append(link.uw)
        return upstreams

    upstreams: list[asyncio.StreamWriter] = proxy._call(drop())
    assert upstreams, "no open link to drop"

    def release() -> None:
        async def close() -> None:
            for writer in upstreams:
                writer.transport.abort()

        if not proxy._loop.is_closed():
            proxy._call(close())

    return release
