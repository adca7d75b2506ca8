"""The thread bridge's SocketWriter (lowlat_mw.runtime.threads): order, flow control, a failed socket."""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from lowlat_mw.runtime.threads import SocketWriter


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


class _GatedSocket:
    """A socket whose ``sendall`` takes the bytes, then blocks until `gate` is set (a peer that does not read)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.sending = threading.Event()
        self.sent: list[bytes] = []

    def setsockopt(self, *args: object) -> None:
        raise OSError("not TCP")

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)
        self.sending.set()
        if not self.gate.wait(10):
            raise OSError("gate never opened")


async def test_not_writable_past_high_until_the_queue_drains() -> None:
    sock = _GatedSocket()
    with ThreadPoolExecutor(2) as pool:
        writer = SocketWriter(sock, asyncio.get_running_loop(), pool, high=1024)  # type: ignore[arg-type]
        writer.write(b"x" * 512)
        assert writer.is_writable()
        assert await asyncio.to_thread(sock.sending.wait, 10)  # the pool job is in sendall, blocked
        writer.write(b"y" * 512)  # 1024 bytes queued or being written: held back
        assert not writer.is_writable()
        waiting = asyncio.ensure_future(writer.wait_writable())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # (the gate is shut: nothing can drain)
        sock.gate.set()
        await asyncio.wait_for(waiting, 10)
        assert writer.is_writable() and not writer.is_closing()
        for _ in range(1000):  # the pool job writes what was queued meanwhile, then ends
            if b"".join(sock.sent) == b"x" * 512 + b"y" * 512:
                break
            await asyncio.sleep(0.01)
        assert b"".join(sock.sent) == b"x" * 512 + b"y" * 512


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
