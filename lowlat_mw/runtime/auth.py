"""The authenticate hook, run for a connection's handshake (sync hooks in an executor)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from ..observability.logs import CLIENT_LOGS
from ..protocol.server import Authenticate
from ..security import Handshake, load_authenticator

if TYPE_CHECKING:
    from .connection import ConnectionDriver

__all__ = ["authenticate", "run_authenticator"]

log = logging.getLogger("lowlat_mw")

async def run_authenticator(hook: Callable[[Handshake], Any], handshake: Handshake,
                            executor: Executor | None = None) -> tuple[Any, str]:
    """Call the hook (async, or sync in `executor`): (principal or None, refusal reason).

    A hook admits by returning anything but None/False and refuses by returning None/False or
    raising PermissionError (its message becomes the reason); other exceptions refuse too and
    are logged, so a broken hook fails closed.
    """
    try:
        if inspect.iscoroutinefunction(hook):
            principal = await hook(handshake)
        else:
            principal = await asyncio.get_running_loop().run_in_executor(executor, hook, handshake)
            if inspect.isawaitable(principal):
                principal = await principal
    except PermissionError as exc:
        return None, str(exc) or "authentication failed"
    except Exception:
        log.exception("authenticate hook failed")
        return None, "authentication failed"
    if principal is None or principal is False:
        return None, "authentication failed"
    return principal, ""


async def authenticate(driver: ConnectionDriver, action: Authenticate) -> None:
    """The machine's Authenticate action: run the hook on the Hello's credentials, tell the machine the answer."""
    hook = load_authenticator(driver.settings.authenticate)
    principal, reason = await run_authenticator(hook, Handshake.from_info(driver.info, action.hello.auth),
                                                 driver.endpoint.executor)
    if principal is not None:
        driver.info = dataclasses.replace(driver.info, principal=principal)
    else:
        CLIENT_LOGS.log(log, logging.WARNING, driver.address, "refused client %s: %s", driver.info.client, reason,
                        extra={"session_id": driver.protocol.session_id, "client": driver.info.client})
    await driver._act(driver.protocol.authenticated(principal, driver.monotonic(), reason))
