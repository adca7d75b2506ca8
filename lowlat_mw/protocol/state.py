"""Every state of lowlat-mw's protocol machines, and which message moves them where: the tables.

One module holds what decides which message may arrive in which state (h11's ``_state.py`` rule).
The machines look their handler up in these tables for every message they receive, so the tables
are the code, not a description of it: a message missing from its state's row is *unexpected*.
Before Welcome an unexpected message closes the connection (1002); after Welcome the server answers
it with an Error frame and goes on, and the client ignores it.

Connection states (both roles)::

    server: AWAIT_HELLO --Hello--> OPEN                                   (no authenticate hook, no resume)
            AWAIT_HELLO --Hello--> ADMITTING --authenticated()/resume()--> OPEN
    client: AWAIT_WELCOME --Welcome--> OPEN
    any state --close()/timeout/bad frame/connection lost--> CLOSED

Stream phases (kept by the server's :class:`~lowlat_mw.protocol.session.Session`, which outlives a
connection; the client's :class:`~lowlat_mw.protocol.client.ClientStream` mirrors running and ended) are the
second table, :data:`STREAM_MOVES`: which event each phase accepts, and where it goes::

    Request --> RUNNING --Cancel / resume without it / input refused--> CANCELLING --model stops--> STOPPED
                RUNNING --model ends / fails / warm-up hook ends--> ENDED (End "stop" / Error / End "warmup")
                ENDED, STOPPED (kept for replay) --Ack(done) / resume without it / evicted--> FORGOTTEN

Pausing is not a phase of a stream: a session's models pause together while its flow window (or, detached,
its replay buffer) is full (``Session.blocked``). While no connection is attached, running streams go on
into the session's replay buffer for ``resume_window`` seconds.
"""

from __future__ import annotations

import enum

from . import events as ev

__all__ = ["CLIENT_RECEIVES", "SERVER_RECEIVES", "STREAM_MOVES", "ConnState", "StreamPhase"]


class ConnState(enum.Enum):
    """Where a connection is in its life."""

    # Members are singletons: hashed by identity, in C. (Enum's own __hash__ hashes the name in Python, and the
    # tables below are looked up by state for every message.)
    __hash__ = object.__hash__

    AWAIT_HELLO = "await_hello"
    """Server: the WebSocket is accepted, no Hello yet (only the handshake timeout runs)."""
    ADMITTING = "admitting"
    """Server: Hello arrived; the driver runs the authenticate hook or looks up the session to resume."""
    AWAIT_WELCOME = "await_welcome"
    """Client: Hello sent, no Welcome yet."""
    OPEN = "open"
    """Between Welcome and close: streams, heartbeats, Acks."""
    CLOSED = "closed"
    """Closed by either side or lost: every method returns nothing."""


SERVER_RECEIVES: dict[ConnState, dict[type, str]] = {
    ConnState.AWAIT_HELLO: {ev.Hello: "hello"},
    ConnState.ADMITTING: {},  # a client sends nothing but Hello before Welcome (protocol.md 7)
    ConnState.OPEN: {ev.Request: "request", ev.Cancel: "cancel", ev.Ack: "ack", ev.Ping: "ping", ev.Pong: "pong",
                     ev.Error: "peer_error", ev.Subscribe: "subscribe", ev.Input: "input", ev.Context: "context"},
    ConnState.CLOSED: {},
}
"""What a server does with each message a client may send, per state (handler ``_on_<name>``)."""

CLIENT_RECEIVES: dict[ConnState, dict[type, str]] = {
    ConnState.AWAIT_WELCOME: {ev.Welcome: "welcome", ev.Error: "refused"},
    ConnState.OPEN: {ev.Delta: "delta", ev.End: "terminal", ev.Error: "error", ev.Ping: "ping", ev.Pong: "pong",
                     ev.GoAway: "goaway", ev.Push: "push", ev.Subscribed: "subscribed",
                     ev.ContextAck: "context_ack"},
    ConnState.CLOSED: {},
}
"""What a client does with each message a server may send, per state (handler ``_on_<name>``)."""


def handlers(cls: type, table: dict[ConnState, dict[type, str]]) -> dict[ConnState, dict[type, object]]:
    """`table` with each handler name resolved to ``cls._on_<name>`` (done once, when the class is made)."""
    return {state: {kind: getattr(cls, f"_on_{name}") for kind, name in row.items()} for state, row in table.items()}


class StreamPhase(enum.Enum):
    """Where a stream is in its life (one session's bookkeeping of it; sans-IO, no clock)."""

    __hash__ = object.__hash__  # (as ConnState's: STREAM_MOVES is looked up by phase twice a stream)

    RUNNING = "running"
    """Its model produces: output is recorded, Inputs and a Cancel are accepted."""
    CANCELLING = "cancelling"
    """Its stop was asked (a Cancel, a resume that left it out, an Input refused): output is still recorded until
    the model stops; no Input, no second Cancel."""
    ENDED = "ended"
    """Its End or Error is made (the model ended or failed on its own): kept for replay until acknowledged."""
    STOPPED = "stopped"
    """Ended after its stop was asked (End "cancelled", an Error of a refused Input): kept for replay as ENDED."""
    FORGOTTEN = "forgotten"
    """Acknowledged done, left out by a resume, or evicted: gone from the session."""


STREAM_MOVES: dict[StreamPhase, dict[str, StreamPhase]] = {
    StreamPhase.RUNNING: {"output": StreamPhase.RUNNING, "input": StreamPhase.RUNNING,
                          "cancel": StreamPhase.CANCELLING, "end": StreamPhase.ENDED},
    StreamPhase.CANCELLING: {"output": StreamPhase.CANCELLING, "end": StreamPhase.STOPPED},
    StreamPhase.ENDED: {"done": StreamPhase.FORGOTTEN},
    StreamPhase.STOPPED: {"done": StreamPhase.FORGOTTEN},
    StreamPhase.FORGOTTEN: {},
}
"""What each stream phase accepts (an event missing from its row is not) and the phase it moves to. Events:
``output`` (a model's chunk is recorded), ``input`` (a client's Input is delivered), ``cancel`` (its stop is asked),
``end`` (its End or Error is made), ``done`` (the client has it all: Ack done, or a resume that left it out)."""
