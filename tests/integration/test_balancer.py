"""docs/scaling.md's nginx configuration, run: two `lowlat-mw serve` processes behind nginx (Debian's package,
installed by `python3 dev.py test` when run as root), a fault proxy between the client and nginx cutting every
connection after a few KB. With the guide's `ip_hash` every stream arrives exact through its resumes; without it
the reconnects land on the other process and the resumes fail, which is why the guide asks for affinity.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.ports import free_port, wait_listening

from lowlat_mw import Backoff, ResumeFailed, connect
from lowlat_mw.testing import FaultProxy, LoggedProcess
from lowlat_mw.testing.nginx import Nginx, find_nginx, guide_nginx_block, nginx_conf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
NGINX = find_nginx()
STREAMS = 12
CUT = (600, 2500)  # each connection is cut after this many bytes from the server, at random (a reply is ~500 B;
# a resume replays what the client has not acknowledged, so a connection must be able to carry more than that)
WAIT = 60.0


def _guide_block() -> str:
    """docs/scaling.md's nginx block; lowlat_mw.testing.nginx (shared with the shared benchmark's failover run)
    fills in this test's ports and puts it inside the little an nginx.conf needs around it."""
    block = guide_nginx_block(ROOT / "docs" / "scaling.md")
    assert "ip_hash;" in block
    return block


def _wait_port(port: int, proc: LoggedProcess, bound: float = WAIT) -> None:
    assert wait_listening(port, proc.alive, proc.output, bound), proc.output()


@pytest.fixture
def backends(tmp_path: Path, request: pytest.FixtureRequest):
    """Two `lowlat-mw serve` processes (the demo model, 5 ms between tokens), each on its own port; sharing
    sessions through Redis where the test is parametrized with "redis"."""
    procs, ports = [], []
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWLAT_")}
    if "redis" in getattr(request, "param", ""):
        env["LOWLAT_SESSION_STORE"] = request.getfixturevalue("redis_url")
    try:
        for i in range(2):
            port = free_port()
            proc = LoggedProcess(f"balanced-{i}", [sys.executable, "-m", "lowlat_mw", "serve", "--port", str(port),
                                                   "--delay", "0.005", "--log-level", "warning"],
                                 logdir=tmp_path, env=env, cwd=tmp_path)
            procs.append(proc)
            ports.append(port)
        for proc, port in zip(procs, ports, strict=True):
            _wait_port(port, proc)
        yield tuple(ports)
    finally:
        for proc in procs:
            proc.stop()


def _start_nginx(tmp_path: Path, backends: tuple[int, int], affinity: bool) -> Nginx:
    return Nginx(_guide_block(), backends, folder=tmp_path, affinity=affinity,
                 name="nginx-affinity" if affinity else "nginx-round-robin", binary=NGINX, wait=WAIT)


async def _reference(port: int, prompt: str) -> str:
    async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{port}/ws") as client:
        return await client.complete(prompt)


async def _run_streams(url: str) -> tuple[list[str | BaseException], int]:
    """STREAMS streams one after another on one client, through the cutting proxy: the replies (or errors) and
    how many times the client resumed its session."""
    out: list[str | BaseException] = []
    async with asyncio.timeout(WAIT), connect(url, backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
        for i in range(STREAMS):
            try:
                out.append(await client.complete(f"stream {i} through the balancer"))
            except ResumeFailed as exc:
                out.append(exc)
        return out, client.resumes


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (`python3 dev.py test` installs it as root)")
@pytest.mark.parametrize(("backends", "affinity"), [("memory", True), ("memory", False), ("redis", False)],
                         ids=["ip_hash", "round-robin", "round-robin-redis"], indirect=["backends"])
async def test_streams_resume_through_nginx_with_affinity_or_shared_sessions(tmp_path: Path, backends,
                                                                             affinity: bool, request) -> None:
    """With affinity, or with sessions shared through Redis, every stream arrives exact through its resumes;
    with neither, the reconnects that land on the other process fail to resume."""
    shared = "redis" in request.node.callspec.id
    nginx = _start_nginx(tmp_path, backends, affinity)
    port = nginx.port
    try:
        expected = [await _reference(backends[0], f"stream {i} through the balancer") for i in range(STREAMS)]
        assert expected[0] == await _reference(backends[1], "stream 0 through the balancer")  # the same model
        with FaultProxy(("127.0.0.1", port), seed=15) as proxy:
            proxy.cut_randomly(*CUT)
            replies, resumes = await _run_streams(f"ws://127.0.0.1:{proxy.port}/ws")
            cuts = proxy.cuts
    finally:
        nginx.stop()
    print(f"balancer {request.node.callspec.id}: {cuts} cuts, {resumes} resumes, "
          f"{sum(isinstance(r, ResumeFailed) for r in replies)} of {STREAMS} streams failed to resume")
    assert cuts >= 3, cuts  # connections were cut all along
    if affinity or shared:
        assert replies == expected  # exact: no gap, no repeat, through every resume
        assert resumes >= 2, resumes  # (a cut between two streams needs no resume)
    else:
        failed = [r for r in replies if isinstance(r, ResumeFailed)]
        assert failed, replies  # the reconnect went to the other process, which does not know the session
        assert all(r == e for r, e in zip(replies, expected, strict=True) if isinstance(r, str))


@pytest.mark.parametrize(("affinity", "backup"), [(True, False), (False, True)], ids=["guide", "primary-backup"])
def test_the_guides_block_is_a_valid_nginx_configuration(tmp_path: Path, affinity: bool, backup: bool) -> None:
    """The guide's block as the guide has it, and as the failover run (benchmarks/shared.py) has it: without
    ip_hash, the second server its first's backup."""
    if NGINX is None:
        pytest.skip("nginx is not installed (`python3 dev.py test` installs it as root)")
    prefix = tmp_path / "check"
    (prefix / "tmp").mkdir(parents=True)
    conf = nginx_conf(_guide_block(), prefix, free_port(), (free_port(), free_port()), affinity=affinity,
                      backup=backup)
    assert ("ip_hash;" in conf) == affinity and conf.count(" backup;") == backup
    (prefix / "nginx.conf").write_text(conf)
    result = subprocess.run([NGINX, "-t", "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e",
                             str(prefix / "error.log")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
