"""The ``authenticate`` hook of the conformance servers (``LOWLAT_AUTHENTICATE=conformance_auth:authenticate``).

A bearer token (from ``Hello.auth``, an ``Authorization: Bearer`` header or a ``?token=`` query
parameter: ``Handshake.bearer`` picks the first present, in that order) is checked:

* ``good`` or ``good-<tag>`` admits the client as principal ``"alice"``; with a tag, every call
  appends a line to ``<CONFORMANCE_MARKS>/auth-<tag>.calls`` so a test can count how often the hook
  ran (it runs on every new connection and every resume);
* ``raise`` makes the hook itself fail (a bug in the hook): the server must refuse (fail closed);
* ``none`` makes it return None (refusal without a reason);
* anything else, or no token, is refused with PermissionError.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from lowlat_mw.security import Handshake

MARKS = Path(os.environ.get("CONFORMANCE_MARKS", tempfile.gettempdir()))
GOOD = "good"
PRINCIPAL = "alice"
_TAG = re.compile(r"[A-Za-z0-9_.-]{1,80}")


def authenticate(handshake: Handshake) -> str | None:
    token = handshake.bearer
    if token == "raise":
        raise RuntimeError("authenticate hook failed on purpose")
    if token == "none":
        return None
    if token == GOOD or token.startswith(GOOD + "-"):
        tag = token[len(GOOD) + 1:]
        if tag and _TAG.fullmatch(tag):
            with open(MARKS / f"auth-{tag}.calls", "a") as f:
                f.write(f"{handshake.subprotocol}\n")
        return PRINCIPAL
    raise PermissionError("unknown token" if token else "no token")
