"""The drivers: the only code that owns sockets' send and close callables, clocks, tasks and threads.

:mod:`~lowlat_mw.drivers.aio` runs connections and their models on an asyncio loop,
:mod:`~lowlat_mw.drivers.asgi` serves them on any ASGI server, :mod:`~lowlat_mw.drivers.threads`
bridges thread-per-connection servers to the same asyncio driver, and
:mod:`~lowlat_mw.drivers.timers` wakes every connection's timers from one scheduler per loop.
"""
