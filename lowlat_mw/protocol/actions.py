"""What :class:`~lowlat_mw.protocol.server.ServerProtocol` asks its driver to do besides sending and closing.

Each action is a frozen record; the driver carries it out and reports back through the machine's methods
(``send_chunk``, ``finish_stream``, ``authenticated``, ``resume``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from . import events as ev
from .base import CloseConnection, Measured, SendFrame

__all__ = ["Action", "Authenticate", "CancelStream", "DeliverInput", "Membership", "ResumeSession", "StartStream"]


@dataclass(frozen=True, slots=True)
class StartStream:
    """Run the model for `request`; report its output with ``send_chunk`` and its end with
    ``finish_stream`` / ``fail_stream``."""

    request: ev.Request


@dataclass(frozen=True, slots=True)
class DeliverInput:
    """Hand `input` (v1.3: text, data, a tool result and/or its end) to the running model of its stream."""

    input: ev.Input


@dataclass(frozen=True, slots=True)
class CancelStream:
    """Stop the model of `stream_id`, then call ``finish_stream(reason="cancelled")``."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Run the authenticate hook for `hello`, then call ``authenticated(principal, now)``."""

    hello: ev.Hello


@dataclass(frozen=True, slots=True)
class ResumeSession:
    """The client asks to resume: look the session up by id, then call ``resume(session, now)``."""

    token: str
    session_id: str
    last_seq: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class Membership:
    """The session joined (`joined`) or left push group `group`: pushes to it reach this connection, or no more."""

    group: str
    joined: bool


Action = (SendFrame | CloseConnection | Measured | StartStream | CancelStream | ResumeSession | Authenticate
          | Membership)
