"""Several worker processes with the in-process session store: the server says once, at start-up (gunicorn) or
at the first connection of each worker (uvicorn), that resume does not cross workers; one worker says nothing.

The example apps under the guides' commands, with ``-w`` / ``--workers`` added as a user would.
"""

from __future__ import annotations

import asyncio

import pytest
from conformance_servers import base_env, server_argv, wait_for_line
from support.ports import wait_listening

from lowlat_mw.client import connect
from lowlat_mw.servers.serving import SEVERAL_WORKERS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NEEDLE = SEVERAL_WORKERS.split("%s")[1].split(":")[0]  # ", each with its own in-process sessions"
FLAGS = {"flask": "--workers", "starlette": "--workers"}


@pytest.mark.parametrize("workers", [2, 1])
@pytest.mark.parametrize("framework", sorted(FLAGS))
async def test_several_workers_are_warned_about(launch, conformance_dir, framework, workers):
    env = base_env(conformance_dir)
    srv = launch(f"workers-{framework}-{workers}", framework,
                 lambda p: server_argv(framework, p, extra=(FLAGS[framework], str(workers)), env=env), env,
                 ready=False)
    assert wait_listening(srv.port, srv.alive, srv.output), srv.output()
    for _ in range(8):  # uvicorn's workers say it at their first connection: reach one of them (or both)
        async with asyncio.timeout(30), connect(srv.url) as client:
            assert await client.complete("x", model="agen", params={"n": 2}) == "a0;a1;"
    if workers == 1:
        assert NEEDLE not in srv.stderr_path.read_text(), srv.output()
        return
    text = await asyncio.to_thread(wait_for_line, srv, NEEDLE)
    line = next(line for line in text.splitlines() if NEEDLE in line)
    assert f"lowlat-mw: {workers} worker processes" in line and "ResumeFailed" in line, line
    assert "Several workers" in line, line
    if framework == "flask":
        assert text.count(NEEDLE) == 1, text  # gunicorn: the first worker only
