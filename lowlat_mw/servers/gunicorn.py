"""gunicorn's gthread worker with a bounded opening handshake: ``gunicorn -k lowlat_mw.servers.gunicorn.ThreadWorker``.

gthread waits 5 s (not configurable) for a new connection's first byte in one of its threads, and
then reads the request with a blocking socket and no deadline: a client that drips its request a
byte at a time holds a thread (of ``--threads``) for as long as it likes. This worker closes every
connection whose first request is not complete within ``handshake_timeout`` (the setting of the
app's ``LowLat`` extension, else ``LOWLAT_HANDSHAKE_TIMEOUT`` or the default of 10 s) by shutting
its socket down, which ends the thread's read at once. Everything else is gthread's.

It also moves gthread's graceful close off the worker's main thread. gunicorn (27) closes a finished
connection from its main loop with ``util.close_graceful``, which half-closes and then waits up to
2 s for the client to close its side: a client that does not (a slow upload answered early, a
half-open WebSocket after the heartbeat closed it, or an attacker) stopped the main loop, and with
it every accept and keep-alive, for those 2 s each. Here those closes run in a small thread pool.

On SIGTERM, and on SIGINT and SIGQUIT (Ctrl-C; gunicorn's "quick shutdown", which froze every stream until
SIGKILL) it drains: every lowlat-mw connection gets GoAway, running streams finish within the
``drain_grace`` setting (capped one second under gunicorn's ``--graceful-timeout``), and then it is
closed with 4002, so clients resume elsewhere. Without it, gunicorn waits out ``--graceful-timeout``
(30 s) for the open WebSockets and then kills the worker: every client sees its connection drop.

Request headers are bounded by gunicorn itself (``--limit-request-line``, ``--limit-request-fields``,
``--limit-request-field_size``: HTTP 431 / 400 past them).

Big buffers are allocated alone (glibc ``mallopt(M_MMAP_THRESHOLD, 256 KiB)``, where glibc is the C library).
Each WebSocket has a reader thread of its own (simple-websocket), and a message arriving fragment by fragment
grows a buffer; glibc's default raises its threshold once a big block is freed, after which such buffers come
from the thread's malloc arena, whose heap grows by the message and may keep it: a peak that depends on which
thread and arena a connection gets (from +0 to +2.3 MiB for a refused 1 MiB message, measured). With a fixed
threshold every buffer past 256 KiB is mapped on its own and given back when freed: the same peak each time,
the size of the message.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gunicorn.errors import AppImportError
from gunicorn.workers.gthread import ThreadWorker as _ThreadWorker

from lowlat_mw.errors import SettingsError
from lowlat_mw.runtime.threads import drain_all_sync
from lowlat_mw.servers.serving import several_workers
from lowlat_mw.settings import Settings

__all__ = ["ThreadWorker"]

CLOSER_THREADS = 16  # threads for gthread's lingering graceful closes
MMAP_THRESHOLD = 256 * 1024  # bytes from which a block is mapped alone (see the module's docstring)
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Allocate blocks of `threshold` bytes and more alone, and hand them back when freed (glibc's mallopt, which
    also keeps the threshold from moving); False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # not glibc (musl, macOS): its own policy stays
        return False


class ThreadWorker(_ThreadWorker):
    """gthread, closing connections whose first request is not in within the handshake timeout, and
    lingering closes off the main thread."""

    def init_process(self) -> None:
        fix_mmap_threshold()
        # graceful closes linger up to 2 s each: a pool, so a flood of them queues instead of adding threads
        self._lowlat_closer = ThreadPoolExecutor(max_workers=CLOSER_THREADS, thread_name_prefix="lowlat-mw-close")
        self._lowlat_lock = threading.Lock()
        self._lowlat_pending: dict[int, tuple[float, Any]] = {}  # id(conn) -> (deadline, conn)
        self._lowlat_timeout = 10.0
        self._lowlat_drain_grace = Settings().drain_grace
        self._lowlat_draining = False
        super().init_process()

    def load_wsgi(self) -> None:
        try:
            super().load_wsgi()
        except SettingsError as exc:  # its message once, as gunicorn reports an app that does not load (not a
            raise AppImportError(str(exc)) from exc  # traceback, then the message again)
        ext = getattr(self.wsgi, "extensions", {}).get("lowlat_mw")
        settings = getattr(ext, "settings", None)
        try:
            settings = settings or Settings.load()
        except SettingsError:  # the app reports the bad setting itself; bound the handshake all the same
            settings = Settings()
        self._lowlat_timeout = settings.handshake_timeout
        self._lowlat_drain_grace = settings.drain_grace
        if self.age == 1:  # the first worker of this gunicorn says it once
            several_workers(self.cfg.workers, "gunicorn --workers")
        threading.Thread(target=self._lowlat_watch, name="lowlat-mw-handshakes", daemon=True).start()

    def handle_exit(self, sig: Any, frame: Any) -> None:
        super().handle_exit(sig, frame)  # stops accepting; gthread then waits for open connections
        if not self._lowlat_draining:
            self._lowlat_draining = True
            grace = max(0.0, min(self._lowlat_drain_grace, self.cfg.graceful_timeout - 1))
            self._lowlat_drain = threading.Thread(target=drain_all_sync, args=(grace,), name="lowlat-mw-drain",
                                                  daemon=True)
            self._lowlat_drain.start()

    def handle_quit(self, sig: Any, frame: Any) -> None:
        """SIGINT (Ctrl-C: the master sends SIGQUIT too) drains as SIGTERM does. gunicorn's quick shutdown exits the
        main thread at once, and the process then waits for the WebSocket threads until the master's SIGKILL, after
        ``--graceful-timeout``: every stream froze and its output was lost."""
        self.cfg.worker_int(self)  # (gunicorn's hook for SIGINT and SIGQUIT)
        self.handle_exit(sig, frame)

    def run(self) -> None:
        super().run()
        # gthread returns once its connections are closed; with shared sessions the drain closes them first and
        # lets their streams run on (within the grace): the worker waits for it before it exits.
        drain = getattr(self, "_lowlat_drain", None)
        if drain is not None:
            drain.join(self._lowlat_drain_grace + 5)

    def enqueue_req(self, conn: Any) -> None:
        if not getattr(conn, "_lowlat_seen", False):  # a new connection (not a kept-alive or deferred one)
            conn._lowlat_seen = True
            with self._lowlat_lock:
                self._lowlat_pending[id(conn)] = (time.monotonic() + self._lowlat_timeout, conn)
        super().enqueue_req(conn)

    def finish_request(self, conn: Any, fs: Any) -> None:
        close = conn.close

        def close_off_the_main_thread(graceful: bool = False) -> None:
            if graceful:  # lingers until the client closes its side, up to 2 s
                self._lowlat_closer.submit(close, graceful=True)
            else:
                close()

        conn.close = close_off_the_main_thread
        super().finish_request(conn, fs)

    def handle_request(self, req: Any, conn: Any) -> Any:
        with self._lowlat_lock:
            self._lowlat_pending.pop(id(conn), None)
        return super().handle_request(req, conn)

    def _lowlat_watch(self) -> None:
        while self.alive:
            time.sleep(0.05)
            now = time.monotonic()
            with self._lowlat_lock:
                late = [conn for deadline, conn in self._lowlat_pending.values() if deadline <= now]
                for conn in late:
                    del self._lowlat_pending[id(conn)]
            for conn in late:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)  # the reading thread sees EOF and closes it
                except OSError:
                    pass  # already closed
