"""Resume: a client that reconnects takes its session back, from this process or from the shared store.

:func:`resume` carries out the machine's ResumeSession action for a connection: it finds the session (the endpoint's
store; the shared store's copy when another process holds it now), hands it to the machine, moves the session's
models to this connection, sends the Welcome and the replay before any live Delta, and closes the connection that
held the session before. Streams still running in another process are relayed from the shared store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..errors import CloseCode
from ..protocol.server import ConnState, ResumeSession
from ..protocol.session import Session
from . import push
from .shared import SharedSessions, principal_key, process_id, shared_sessions
from .streams import ModelRunner

if TYPE_CHECKING:
    from .connection import ConnectionDriver

__all__ = ["RELOAD_AFTER", "resume"]

log = logging.getLogger("lowlat_mw")

RELOAD_AFTER = (0.02, 0.06)  # seconds between looks for a session the shared store does not have (yet): it writes
# every 10 ms (shared.WRITE_EVERY), so a session whose first Request came just before the drop may be on its way

Remote = tuple[Session, dict[int, str], Any]  # a session from the shared store, the streams to follow, its last id


async def resume(driver: ConnectionDriver, action: ResumeSession) -> None:
    """Resume the session `action` names on `driver`'s connection (or tell the client it cannot be resumed)."""
    found = driver.endpoint.store.get(action.session_id)
    runner = found if isinstance(found, ModelRunner) and not found.destroyed else None
    shared = shared_sessions(driver.endpoint)
    remote: Remote | None = None
    if shared is not None and (runner is None
                               or await shared.owner(action.session_id) not in (None, "", process_id())):
        # Not here, or it moved to another process since: the shared store's copy is the one to resume.
        remote = await _remote_session(driver, shared, action)
        if remote is not None:
            runner = None  # (else: the store could not give it; the one here, if any, is resumed)
    proto = driver.protocol
    if proto.state is not ConnState.ADMITTING:  # it closed (a timeout, the client) while the store answered
        return
    if runner is not None and runner.destroyed:
        runner = None
    session = runner.session if runner is not None else remote[0] if remote is not None else None
    actions = proto.resume(session, driver.monotonic())
    if remote is not None and proto.session is remote[0]:
        runner = ModelRunner(remote[0], driver)  # (this process holds the session from now on)
    resumed = runner is not None and proto.session is runner.session
    if driver.metrics is not None:
        driver.metrics.inc("resumes", "resumed" if resumed else "failed")
    old = _take_over(driver, runner) if resumed else None  # type: ignore[arg-type]
    # Welcome and the replay go out before any await lets a model task run: the live Deltas
    # it now sends through this connection must follow them (never a Delta before Welcome).
    await driver._act(actions)
    if resumed and remote is not None:
        _follow_remote(driver, remote, shared)  # type: ignore[arg-type]
    if old is not None and old is not driver:
        await old.close(CloseCode.GOING_AWAY, "session resumed on another connection")
    if driver.runner is not None:
        driver.runner.window_changed()


def _take_over(driver: ConnectionDriver, runner: ModelRunner) -> ConnectionDriver | None:
    """Move the session's models from the connection that held it (returned) to `driver`'s."""
    old = runner.driver
    driver.runner = runner
    driver.info = dataclasses.replace(driver.info, session_id=runner.session.session_id)
    runner.attach(driver)  # from now on the model tasks send through this connection
    if old is not None and old is not driver:
        old.runner = None  # its socket is stale: it must not touch the session any more
        old._superseded = True  # nor start a second runner for it (see _start_stream)
        if old.member:
            push.HUB.discard(old)  # (its session's key is this connection's now)
    log.info("session %s resumed", runner.session.session_id, extra={"session_id": runner.session.session_id})
    return old


async def _remote_session(driver: ConnectionDriver, shared: SharedSessions, action: ResumeSession) -> Remote | None:
    """The session `action` resumes, from the shared store (None: not there, or not this client's)."""
    found = await shared.load(action.session_id, action.token)
    for delay in RELOAD_AFTER:  # written behind the socket: a session a moment old may not be there yet
        if found is not None or shared.down:
            break
        await asyncio.sleep(delay)
        found = await shared.load(action.session_id, action.token)
    if found is None or found.principal != principal_key(driver.protocol.principal):
        return None
    session, follow = found.to_session(driver.settings, action.token, driver.monotonic())
    session.belongs_to(driver.protocol.principal)
    return session, follow, found.last_id


def _follow_remote(driver: ConnectionDriver, remote: Remote, shared: SharedSessions) -> None:
    """After a resume from the shared store: relay the streams still running in another process, and end
    (unsent) those the client no longer wants."""
    session, follow, last_id = remote
    runner = driver.runner
    assert runner is not None
    now = driver.monotonic()
    for sid, writer in follow.items():
        st = session.streams.get(sid)
        if st is None or st.terminal is not None:
            continue
        if st.cancelling:
            session.finish(sid, now, reason="cancelled")
            shared.cancel_elsewhere(session.session_id, sid)
            continue
        runner.follow(sid, shared.follow(session.session_id, sid, last_id, st.seq, writer))
