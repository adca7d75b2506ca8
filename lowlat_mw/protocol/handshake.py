"""The server's handshake: Hello in, then the authenticate hook and the resume lookup, then Welcome.

:class:`ServerHandshake` is the part of :class:`~lowlat_mw.protocol.server.ServerProtocol` that admits a client
(state AWAIT_HELLO -> ADMITTING -> OPEN, the connection table of :mod:`~lowlat_mw.protocol.state`): it negotiates
compression, asks the driver to authenticate or look a session up, and frames Welcome.
"""

from __future__ import annotations

from typing import Any

from ..errors import CloseCode, ErrorCode
from ..settings import SUBPROTOCOL_JSON, Settings
from . import events as ev
from .actions import Authenticate, CancelStream, ResumeSession
from .base import Protocol, SendFrame
from .compression import available_codecs
from .session import Session
from .state import ConnState

__all__ = ["ServerHandshake", "negotiate_subprotocol"]

_INSTALLED = available_codecs()  # fixed at import


def negotiate_subprotocol(offered: list[str] | tuple[str, ...], settings: Settings) -> tuple[bool, str | None]:
    """Pick the subprotocol: (accept?, subprotocol to answer with).

    The first offered subprotocol the server serves wins. No offer means JSON without a
    subprotocol header (if JSON is served). Offers of which none is served are refused.
    """
    if not offered:
        return (SUBPROTOCOL_JSON in settings.subprotocols), None
    for sp in offered:
        if sp in settings.subprotocols:
            return True, sp
    return False, None


class ServerHandshake(Protocol):
    """Admitting a client: Hello, the authenticate hook, a resume, Welcome (mixed into ServerProtocol)."""

    settings: Settings
    hello: ev.Hello | None
    session: Session | None
    principal: object | None
    _new_session: tuple[str, str]

    def _on_hello(self, hello: ev.Hello, now: float) -> list[Any]:
        self.hello = hello
        offered = hello.compression
        if offered and self.codec.binary:  # the server's codecs, in its order, that the client offered
            common = []
            for codec in self.settings.compression:
                if codec in offered and codec in _INSTALLED:
                    common.append(codec)
            if common:
                self._negotiated(tuple(common), min_size=self.settings.compression_min_size,
                                 link_mbps=self.settings.link_mbps)
        if self.settings.authenticate:
            self.state = ConnState.ADMITTING
            return [Authenticate(hello)]
        if hello.resume_token:
            self.state = ConnState.ADMITTING
            return [ResumeSession(hello.resume_token, Session.session_id_of(hello.resume_token), hello.last_seq)]
        session_id, secret = self._new_session
        return self._welcome(Session(self.settings, now=now, session_id=session_id, secret=secret), now, resumed=False)

    def authenticated(self, principal: object | None, now: float, reason: str = "") -> list[Any]:
        """Answer an :class:`Authenticate`: `principal` admits the client, None refuses it (1008)."""
        if self.state is not ConnState.ADMITTING or self.hello is None:
            return []
        if principal is None:
            return [self._error(0, ErrorCode.UNAUTHORIZED, reason or "authentication failed"),
                    *self._close(CloseCode.POLICY_VIOLATION, "unauthorized")]
        self.principal = principal
        hello = self.hello
        if hello.resume_token:  # (as for a Hello without the hook)
            return [ResumeSession(hello.resume_token, Session.session_id_of(hello.resume_token), hello.last_seq)]
        session_id, secret = self._new_session
        return self._welcome(Session(self.settings, now=now, session_id=session_id, secret=secret), now, resumed=False)

    def resume(self, session: Session | None, now: float) -> list[Any]:
        """Answer a :class:`ResumeSession`: `session` is what the store had for the id (or None).

        Returns Welcome (``resumed`` true or false), then everything the client missed, and
        CancelStream for streams the client no longer wants. A failed resume starts a new
        session and fails each stream the client listed with ``resume_failed``.
        """
        hello = self.hello
        assert hello is not None and self.state is ConnState.ADMITTING
        if (session is None or not session.token_matches(hello.resume_token)
                or (session.principal is not None and session.principal != self.principal)):
            session_id, secret = self._new_session
            actions = self._welcome(Session(self.settings, now=now, session_id=session_id, secret=secret), now,
                                    resumed=False)
            actions += [self._error(sid, ErrorCode.RESUME_FAILED, "session expired or unknown")
                        for sid in hello.last_seq]
            if not hello.last_seq:
                actions.append(self._error(0, ErrorCode.RESUME_FAILED, "session expired or unknown"))
            return actions
        session.attach()
        actions = self._welcome(session, now, resumed=True)
        events, cancels = session.replay(hello.last_seq)
        actions += [self._send(e) for e in events]
        actions += [CancelStream(sid) for sid in cancels]
        return actions

    def _welcome(self, session: Session, now: float, *, resumed: bool) -> list[Any]:
        assert self.hello is not None
        self.session = session
        self.session_id = session.session_id
        self.resumed = resumed
        if not resumed:
            session.belongs_to(self.principal)
        session.revision = self.hello.revision
        hello = self.hello
        if hello.history and hello.revision >= ev.CONTEXT_REVISION and self.settings.history_size:  # (v1.3)
            session.keeps_turns = True
            session.contexts()
        window = session.set_client_window(self.hello.flow_window)
        self.state = ConnState.OPEN
        if self._welcome_moves:
            self.deadline_moved = True
        self.reaper.touch(now)
        s = self.settings
        welcome = ev.Welcome(
            session_id=session.session_id,
            resume_token=session.resume_token,
            compression=self.compression,
            max_frame_size=s.max_frame_size,
            max_decompressed_size=s.max_decompressed_size,
            max_streams=s.max_streams,
            heartbeat_interval_ms=round(s.heartbeat_interval * 1000),
            idle_timeout_ms=round(s.idle_timeout * 1000),
            server=s.server_name,
            resumed=resumed,
            resume_window_ms=round(s.resume_window * 1000),
            flow_window=window,
            revision=ev.REVISION,
            # (v1.3) a resume: the Inputs this session holds, so the client sends the rest again
            input_seq=session.input_seqs() if resumed and self.hello.revision >= ev.DUPLEX_REVISION else {},
            contexts=session.context.versions() if session.context is not None and resumed else {},
        )
        # Welcome itself is never compressed: the client learns the codecs from it.
        compressor, self.compressor = self.compressor, None
        frame = SendFrame(self._frame(welcome))
        self.compressor = compressor
        return [frame]
