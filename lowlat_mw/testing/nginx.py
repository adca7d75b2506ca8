"""nginx in front of server processes, configured with docs/scaling.md's block (for balancer tests).

    block = guide_nginx_block(Path("docs/scaling.md"))  # the guide's upstream, map and server blocks
    with Nginx(block, (port_a, port_b), folder=tmp_path, affinity=False) as nginx:
        url = f"ws://127.0.0.1:{nginx.port}/ws"

:func:`nginx_conf` puts the guide's block, its ports replaced, inside the little an ``nginx.conf`` needs
around it; ``affinity=False`` drops the guide's ``ip_hash`` (round robin over the servers), and ``backup=True``
with it marks every server but the first ``backup`` (all connections go to the first while it takes them).
:class:`Nginx` runs that nginx (Debian's package, or any :func:`find_nginx` finds) in the foreground with its
own prefix folder, pid file, error log and temp paths under `folder`, one worker, listening on a free loopback
port, and stops it as :class:`~lowlat_mw.testing.LoggedProcess` does. tests/integration/test_balancer.py and
the shared benchmark's failover run (benchmarks/shared.py, with ``backup=True``) both use it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from .process import LoggedProcess

__all__ = ["GUIDE_BLOCK_FIRST_LINE", "Nginx", "find_nginx", "guide_nginx_block", "nginx_conf"]

GUIDE_BLOCK_FIRST_LINE = "# lowlat-mw behind nginx: two server processes, each client kept on one of them"
"""The first line of docs/scaling.md's nginx block."""

_TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def find_nginx() -> str | None:
    """The nginx binary on PATH or at /usr/sbin/nginx (Debian's, for a user without /usr/sbin on PATH); None."""
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def guide_nginx_block(scaling_md: str | Path) -> str:
    """The ```` ```nginx ```` block of `scaling_md` (docs/scaling.md) that starts with
    :data:`GUIDE_BLOCK_FIRST_LINE`; ValueError unless there is exactly one."""
    blocks = Path(scaling_md).read_text(encoding="utf-8").split("```nginx\n")[1:]
    found = [b.split("```", 1)[0] for b in blocks if b.startswith(GUIDE_BLOCK_FIRST_LINE + "\n")]
    if len(found) != 1:
        raise ValueError(f"{scaling_md} has {len(found)} nginx blocks starting {GUIDE_BLOCK_FIRST_LINE!r}")
    return found[0]


def nginx_conf(block: str, prefix: str | Path, listen: int, backends: Sequence[int], *, affinity: bool = True,
               backup: bool = False, worker_connections: int = 256, access_log: str | Path | None = None) -> str:
    """A whole nginx.conf around the guide's `block`: it listens on 127.0.0.1:`listen`, its upstream's servers
    are 127.0.0.1:`backends` (as many as the block has), and ``ip_hash`` is dropped unless `affinity`. With
    `backup` (only without `affinity`: nginx allows no backup server with ``ip_hash``), every server but the
    first is marked ``backup``: nginx sends every connection to the first, and to the next only when it is
    unavailable (its connect refused or reset, per ``proxy_next_upstream``). One worker of
    `worker_connections` (a proxied connection takes two), in the foreground, its pid file, error log and temp
    paths under `prefix`; with `access_log`, one line per connection there naming the upstream(s) it went to."""
    if backup and affinity:
        raise ValueError("nginx allows no backup server with ip_hash: backup=True needs affinity=False")
    block, n = re.subn(r"\blisten \d+;", f"listen 127.0.0.1:{listen};", block)
    if n != 1:
        raise ValueError(f"the block has {n} 'listen PORT;' lines, not 1")
    servers = re.findall(r"\n(\s*)server 127\.0\.0\.1:\d+;", block)
    if len(servers) != len(backends):
        raise ValueError(f"the block's upstream has {len(servers)} servers, not {len(backends)}")
    ports = iter(backends)
    marks = iter(["", *[" backup" if backup else ""] * (len(backends) - 1)])
    block = re.sub(r"(\n\s*server) 127\.0\.0\.1:\d+;",
                   lambda m: f"{m.group(1)} 127.0.0.1:{next(ports)}{next(marks)};", block)
    if not affinity:
        block = re.sub(r"\n\s*ip_hash;[^\n]*", "", block)
    temp = "\n".join(f"    {name}_temp_path {prefix}/tmp/{name};" for name in _TEMP_PATHS)
    if access_log is None:
        log = "    access_log off;"
    else:
        log = ('    log_format upstreams \'$msec $status $request_time "$upstream_addr" "$upstream_status"\';\n'
               f"    access_log {access_log} upstreams;")
    return (f"worker_processes 1;\ndaemon off;\npid {prefix}/nginx.pid;\nerror_log {prefix}/error.log warn;\n"
            f"events {{ worker_connections {worker_connections}; }}\nhttp {{\n{log}\n{temp}\n{block}\n}}\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nginx(LoggedProcess):
    """nginx with :func:`nginx_conf` (`block`, `backends`, `affinity`, `backup`, ...) in its own prefix folder
    ``folder/name``, output in `folder`; started, and listening on 127.0.0.1:``port``, when the constructor
    returns (RuntimeError with its output if it exits or does not listen within `wait` seconds)."""

    def __init__(self, block: str, backends: Sequence[int], *, folder: str | Path, affinity: bool = True,
                 backup: bool = False, name: str = "nginx", worker_connections: int = 256, access_log: bool = False,
                 binary: str | None = None, wait: float = 60.0) -> None:
        binary = binary or find_nginx()
        if binary is None:
            raise RuntimeError("nginx is not installed")
        self.prefix = Path(folder) / name
        (self.prefix / "tmp").mkdir(parents=True)
        self.prefix.chmod(0o755)  # (nginx's workers run as another user when the master runs as root)
        self.port = _free_port()
        self.conf_path = self.prefix / "nginx.conf"
        self.error_log = self.prefix / "error.log"
        self.access_log = self.prefix / "access.log" if access_log else None
        self.conf_path.write_text(nginx_conf(block, self.prefix, self.port, backends, affinity=affinity,
                                             backup=backup, worker_connections=worker_connections,
                                             access_log=self.access_log))
        super().__init__(name, [binary, "-p", str(self.prefix), "-c", str(self.conf_path), "-e", str(self.error_log)],
                         logdir=Path(folder), cwd=self.prefix)
        deadline = time.monotonic() + wait
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                pass
            if not self.alive() or time.monotonic() > deadline:
                output = self.output()
                self.stop()
                raise RuntimeError(f"nginx did not listen on port {self.port}\n{output}")
            time.sleep(0.05)

    def __enter__(self) -> Nginx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
