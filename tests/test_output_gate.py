"""The ASGI send path's one-writer gate (Writer.write): a write's frames stay together, writes go
out in the order they came, a writer cancelled while it waits gives its turn to the next, and a close goes
after everything written before it. (It replaced an asyncio.Lock per connection: same guarantees, no
lock calls per frame.)"""

from __future__ import annotations

import asyncio
from typing import Any

from lowlat_mw.endpoint import Endpoint
from lowlat_mw.runtime.connection import ConnectionDriver
from lowlat_mw.runtime.writer import Writer
from lowlat_mw.settings import SUBPROTOCOL_JSON, Settings


class BlockingSend:
    """An ASGI send that blocks on the frames named in `hold` until released."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.hold: dict[str, asyncio.Event] = {}
        self.entered: dict[str, asyncio.Event] = {}

    def block(self, text: str) -> None:
        self.hold[text] = asyncio.Event()
        self.entered[text] = asyncio.Event()

    async def __call__(self, message: Any) -> None:
        text = message.get("text")
        if text in self.hold:
            self.entered[text].set()
            await self.hold[text].wait()
        self.sent.append(message.get("text", message["type"]))


def driver_for(send: BlockingSend, settings: Settings | None = None) -> ConnectionDriver:
    return ConnectionDriver(Endpoint(lambda req: "x", settings or Settings(), registry=None), send=send,
                            subprotocol=SUBPROTOCOL_JSON)


async def test_writes_keep_their_frames_together_in_order_and_a_cancelled_waiter_passes_its_turn() -> None:
    send = BlockingSend()
    driver = driver_for(send)
    send.block("a1")
    first = asyncio.create_task(driver.writer.write(["a1", "a2"]))
    await send.entered["a1"].wait()  # the first write holds the output, blocked in its first frame
    second = asyncio.create_task(driver.writer.write(["b1", "b2"]))
    third = asyncio.create_task(driver.writer.write(["c1"]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert driver.writer.waiters is not None and len(driver.writer.waiters) == 2  # both wait, in order
    second.cancel()
    await asyncio.sleep(0)
    fourth = asyncio.create_task(driver.writer.write(["d1"]))
    send.hold["a1"].set()
    await asyncio.wait_for(asyncio.gather(first, third, fourth), 10)
    assert second.cancelled()
    assert send.sent == ["a1", "a2", "c1", "d1"]  # a2 right after a1; b's frames never; c before d
    assert not driver.writer.writing and not driver.writer.waiters


async def test_a_writer_woken_then_cancelled_wakes_the_next(monkeypatch) -> None:
    send = BlockingSend()
    driver = driver_for(send)
    send.block("a")
    first = asyncio.create_task(driver.writer.write(["a"]))
    await send.entered["a"].wait()
    second = asyncio.create_task(driver.writer.write(["b"]))
    third = asyncio.create_task(driver.writer.write(["c"]))
    await asyncio.sleep(0)
    wake = Writer._wake_next

    def wake_then_cancel(writer: Writer) -> None:  # the first finishes and wakes the second, cancelled before it runs
        wake(writer)
        second.cancel()

    monkeypatch.setattr(Writer, "_wake_next", wake_then_cancel)
    send.hold["a"].set()
    await asyncio.wait_for(asyncio.gather(first, third), 10)  # the third must still go
    assert second.cancelled()
    assert send.sent == ["a", "c"]


async def test_a_close_goes_after_the_write_before_it() -> None:
    send = BlockingSend()
    driver = driver_for(send)
    send.block("a1")
    first = asyncio.create_task(driver.writer.write(["a1", "a2"]))
    await send.entered["a1"].wait()
    closing = asyncio.create_task(driver.close_socket(1001, "bye"))
    await asyncio.sleep(0)
    assert not closing.done()  # waits for the write in progress
    send.hold["a1"].set()
    await asyncio.wait_for(asyncio.gather(first, closing), 10)
    assert send.sent == ["a1", "a2", "websocket.close"]
    await driver.disconnected(1001)


async def test_a_close_waits_for_a_write_that_never_ends_at_most_close_timeout_then_goes() -> None:
    """(A peer that stopped reading: the write before the close never finishes.) The close still reaches the server,
    which then drops the connection; it is not given up, which left the socket open for good."""
    send = BlockingSend()
    driver = driver_for(send, Settings(close_timeout=0.2))
    send.block("a1")
    first = asyncio.create_task(driver.writer.write(["a1", "a2"]))
    await send.entered["a1"].wait()
    await asyncio.wait_for(driver.close_socket(4001, "no pong"), 10)
    assert send.sent == ["websocket.close"]
    first.cancel()
    await driver.disconnected(1006)


def test_every_action_of_the_machine_has_one_entry_in_the_drivers_action_table() -> None:
    """One action table (runtime/connection.py): each kind of action the server machine returns is carried out at
    once (_NOW), awaited (_LATER), or both (Membership: at once when no listener needs waiting for); frames are the
    interpreter's own (they are batched). A new kind without an entry fails here, not at run time."""
    import dataclasses

    from lowlat_mw.protocol import actions, base, server
    from lowlat_mw.runtime import connection

    kinds = {cls for module in (base, actions) for cls in vars(module).values()
             if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__}
    assert kinds == {base.SendFrame, base.CloseConnection, base.Measured, server.StartStream, server.DeliverInput,
                     server.CancelStream, server.Authenticate, server.ResumeSession, server.Membership}
    assert set(connection._NOW) | set(connection._LATER) == kinds - {base.SendFrame}
    assert set(connection._NOW) & set(connection._LATER) == {server.Membership}


async def test_a_send_that_fails_because_the_socket_went_away_ends_the_output_not_the_stream() -> None:
    """A server's send raises once the socket is gone (uvicorn: ClientDisconnected): the write takes it as the
    disconnect (nothing more goes out, the model's chunk call returns), it does not fail the model with it."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        if message.get("text") == "gone":
            raise OSError("the socket went away")  # (what ClientDisconnected is)
        sent.append(message.get("text", message["type"]))

    driver = ConnectionDriver(Endpoint(lambda req: "x", Settings(), registry=None), send=send,
                              subprotocol=SUBPROTOCOL_JSON)
    await asyncio.wait_for(driver.writer.write(["a"]), 10)
    await asyncio.wait_for(driver.writer.write(["gone"]), 10)  # no exception
    assert driver.writer.closing and not driver.writer.writing
    await asyncio.wait_for(driver.writer.write(["b"]), 10)
    assert sent == ["a"]
    await driver.disconnected(1006)
