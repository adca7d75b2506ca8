"""Django composition: the consumer behind AllowedHostsOriginValidator(AuthMiddlewareStack(...)) in daphne.

Django-only by nature (Channels middleware), so these tests are not parametrized by framework.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conformance_servers import HERE, REPO, VENV_BIN, ServerProcess, base_env, server_argv, start_ready
from conformance_support import MODES, PROTO, raw_connect
from websockets.exceptions import InvalidStatus

from lowlat_mw import Backoff, ConnectionClosed
from lowlat_mw.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

USERNAME = "alice"


@dataclass
class Composed:
    server: ServerProcess
    sessionid: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def origin(self) -> str:
        return self.server.origin


def _run(argv: list[str], env: dict[str, str], what: str) -> str:
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def composed(conformance_dir: Path) -> Iterator[Composed]:
    env = base_env(conformance_dir, {
        "DJANGO_DB": str(conformance_dir / "composed.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "examples.django_project.settings",
    })
    _run([str(VENV_BIN / "django-admin"), "migrate", "--noinput"], env, "django-admin migrate")
    sessionid = _run([sys.executable, str(HERE / "conformance_django_login.py"), USERNAME], env,
                     "creating a user and a session").strip()
    assert sessionid
    srv = start_ready("django-composed", "django",
                      lambda p: server_argv("django", p, app="conformance_django_asgi:application"), env,
                      conformance_dir / "logs")
    try:
        yield Composed(srv, sessionid)
    finally:
        srv.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_matching_origin_streams(composed, mode):
    async with asyncio.timeout(20), connect(composed.url, mode=mode, headers={"Origin": composed.origin}) as client:
        assert await client.complete("x", model="agen", params={"n": 3}) == "a0;a1;a2;"
        assert await client.complete("x", model="user") == "user:AnonymousUser"


@pytest.mark.parametrize(
    ("origin", "refused_by"),
    [
        ("http://evil.example", "AllowedHostsOriginValidator"),
        (None, "AllowedHostsOriginValidator (no Origin header)"),
        ("http://localhost:{port}", "lowlat-mw (allowed host, but not the same host as Host: 127.0.0.1)"),
    ],
    ids=["foreign", "no-origin", "other-allowed-host"],
)
async def test_bad_origin_is_refused(composed, origin, refused_by):
    headers = {"Origin": origin.format(port=composed.server.port)} if origin else {}
    with pytest.raises(InvalidStatus) as info:
        async with raw_connect(composed.url, [PROTO], additional_headers=headers):
            pass
    assert info.value.response.status_code == 403, refused_by
    # the Python client reports it as a final refusal, without retrying
    async with asyncio.timeout(10):
        client = connect(composed.url, headers=headers, backoff=Backoff(retries=0))
        with pytest.raises(ConnectionClosed, match="403"):
            await client.open()
        await client.close()


@pytest.mark.parametrize("mode", MODES)
async def test_authenticated_user_reaches_the_model(composed, mode):
    headers = {"Origin": composed.origin, "Cookie": f"sessionid={composed.sessionid}"}
    async with asyncio.timeout(20):
        async with connect(composed.url, mode=mode, headers=headers) as client:
            assert await client.complete("x", model="user") == f"user:{USERNAME}"
            assert await client.complete("x", model="agen", params={"n": 2}) == "a0;a1;"
        bogus = {"Origin": composed.origin, "Cookie": "sessionid=not-a-session"}
        async with connect(composed.url, mode=mode, headers=bogus) as client:
            assert await client.complete("x", model="user") == "user:AnonymousUser"
