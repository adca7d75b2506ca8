"""A subprocess for test and benchmark servers: its own process group, output in files, bounded stops.

Output goes to ``logdir/<name>.stdout|stderr`` (never pipes, which a chatty server could fill and
block); :meth:`LoggedProcess.stop` sends SIGTERM, then SIGKILL to the whole process group (so a
gunicorn master's worker goes too), and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["STOP_TIMEOUT", "LoggedProcess"]

STOP_TIMEOUT = 8.0  # seconds for each of SIGTERM and SIGKILL to take effect

# Run before the server when this process ignores SIGINT (started in the background of a shell without job control,
# under nohup...): a child inherits SIG_IGN, and Python and Twisted then leave Ctrl-C ignored, so a test sending
# SIGINT (the shutdown tests' Ctrl-C) saw daphne never drain. It restores the default, then execs the server.
_SIGINT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execvp(sys.argv[1], sys.argv[1:])")


class LoggedProcess:
    """`argv` running in its own session (process group), its output captured to files in `logdir`."""

    def __init__(self, name: str, argv: Sequence[str], *, logdir: Path, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, pass_fds: Sequence[int] = ()) -> None:
        self.name = name
        self.argv = list(argv)
        self.logdir = Path(logdir)
        launch = self.argv
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            launch = [sys.executable, "-c", _SIGINT_DEFAULT, *self.argv]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                launch, cwd=cwd, env=dict(env if env is not None else os.environ), stdout=out, stderr=err,
                stdin=subprocess.DEVNULL, pass_fds=tuple(pass_fds), start_new_session=True)

    @property
    def stdout_path(self) -> Path:
        return self.logdir / f"{self.name}.stdout"

    @property
    def stderr_path(self) -> Path:
        return self.logdir / f"{self.name}.stderr"

    def output(self, limit: int = 6000) -> str:
        """The last `limit` characters of the captured stderr and stdout, labelled."""
        parts = []
        for label, path in (("stderr", self.stderr_path), ("stdout", self.stdout_path)):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                text = ""
            parts.append(f"--- {label} of {self.name} ({' '.join(self.argv)}) ---\n{text[-limit:]}")
        return "\n".join(parts)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL to the process group; bounded. RuntimeError if it outlives SIGKILL."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        # The group is ours (start_new_session): it also holds any worker the master left behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover
            raise RuntimeError(f"{self.name} (pid {self.proc.pid}) did not die after SIGKILL") from None
