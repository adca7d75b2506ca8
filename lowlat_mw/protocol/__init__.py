"""The protocol layer: lowlat-mw's wire protocol as sans-IO state machines, for both roles.

Bytes and `now` go in, events, actions and bytes come out. Nothing here opens a socket, reads a
clock, draws random numbers, starts a task or a thread, or records a metric: the drivers above do
(tests/test_architecture.py checks the imports). It may import the standard library's pure parts,
:mod:`lowlat_mw.errors`, :mod:`lowlat_mw.settings`, the generated Protobuf module and the
compression libraries.
"""
