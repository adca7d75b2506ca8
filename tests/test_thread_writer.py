"""The thread bridge's SocketWriter (lowlat_mw.drivers.threads): order, flow control, a failed socket."""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor

from lowlat_mw.drivers.threads import SocketWriter


def _read(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        data = sock.recv(n - len(got))
        assert data, f"EOF after {len(got)} of {n} bytes"
        got += data
    return got


async def test_writes_and_calls_go_out_in_order() -> None:
    ours, peer = socket.socketpair()
    peer.settimeout(10)
    with ours, peer, ThreadPoolExecutor(2) as pool:
        writer = SocketWriter(ours, asyncio.get_running_loop(), pool)
        writer.write(b"one,")
        writer.write(b"two,")
        assert await asyncio.wait_for(writer.call(ours.sendall, b"three,"), 10) is None
        writer.write(b"four")
        assert await asyncio.wait_for(asyncio.to_thread(_read, peer, 18), 10) == b"one,two,three,four"


async def test_not_writable_past_high_until_the_peer_reads() -> None:
    ours, peer = socket.socketpair()
    peer.settimeout(10)
    with ours, peer, ThreadPoolExecutor(2) as pool:
        writer = SocketWriter(ours, asyncio.get_running_loop(), pool, high=1024)
        block = b"x" * 1024
        total = 0
        while writer.is_writable():  # the socket's buffers fill, then the queue passes `high`
            writer.write(block)
            total += len(block)
            await asyncio.sleep(0)
            assert total < 64 * 1024 * 1024, "never held back"
        waiting = asyncio.ensure_future(writer.wait_writable())
        await asyncio.sleep(0)
        assert not waiting.done()
        assert await asyncio.wait_for(asyncio.to_thread(_read, peer, total), 30) == b"x" * total
        await asyncio.wait_for(waiting, 10)
        assert writer.is_writable() and not writer.is_closing()


async def test_a_failed_socket_makes_it_closing_and_calls_still_run() -> None:
    ours, peer = socket.socketpair()
    peer.close()
    with ours, ThreadPoolExecutor(2) as pool:
        writer = SocketWriter(ours, asyncio.get_running_loop(), pool)
        writer.write(b"lost")
        ran = await asyncio.wait_for(writer.call(lambda: "ran"), 10)  # after the failed write
        assert ran == "ran" and writer.closing and writer.is_closing()
        writer.write(b"dropped")  # no error: the driver reads `closing` and stops writing
        writer.lost()
        assert writer.is_writable()  # a writer waiting for room wakes and sees `closing`
