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

Stream states (kept by the server's :class:`~lowlat_mw.protocol.session.Session`, which outlives a
connection; the client's :class:`~lowlat_mw.protocol.client.ClientStream` mirrors the first two)::

    Request --> running --Cancel--> cancelling --model stops--> finished (End "cancelled")
                running --model ends / fails--> finished (End "stop" / Error)
                running --warm-up hook ends--> finished (End "warmup", a Request with warmup set: v1.2)
                finished --Ack(done) or resume without it--> forgotten

While no connection is attached, running streams go on into the session's replay buffer until it
is full (then the model pauses), for ``resume_window`` seconds.
"""

from __future__ import annotations

import enum

from . import events as ev

__all__ = ["CLIENT_RECEIVES", "SERVER_RECEIVES", "ConnState"]


class ConnState(enum.Enum):
    """Where a connection is in its life."""

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
