"""pytest fixtures that serve a user's app on a free loopback port and hand them a connected client.

Loaded automatically where lowlat-mw is installed (the ``pytest11`` entry point). Define a ``lowlat_app`` fixture
returning your app, then ask for ``lowlat_server`` or ``lowlat_client``::

    import pytest
    from myapp import app

    @pytest.fixture
    def lowlat_app():
        return app                                  # FastAPI/Starlette, a Channels router, or a Flask app

    def test_reply(lowlat_client):                   # a SyncClient, connected to ws://127.0.0.1:<port>/ws
        assert lowlat_client.complete("hello") == "..."

    @pytest.mark.asyncio                             # pytest-asyncio (anyio: @pytest.mark.anyio)
    async def test_async(lowlat_server):
        async with lowlat_mw.connect(lowlat_server.url) as client:
            ...

ASGI apps run in uvicorn with lowlat-mw's HTTP and WebSocket protocols (what ``lowlat-mw serve`` runs; its h11
parser where httptools is not installed, as with the ``django`` extra), Flask apps in werkzeug's threaded server
(what ``flask run`` runs), each in a thread of the test process, stopped after the test. ``lowlat_path`` (default
``/ws``) names the WebSocket path. For no socket at all, see :class:`lowlat_mw.testing.AppClient`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["RunningServer", "lowlat_app", "lowlat_client", "lowlat_path", "lowlat_server", "uvicorn_test_options"]

START_TIMEOUT = 30.0  # seconds for a server to listen (generous: a loaded machine)
H11_PROTOCOL = "lowlat_mw.servers.uvicorn:H11Protocol"  # uvicorn's h11 protocol, with the handshake bounded


class RunningServer:
    """A user's app served from a thread of this process on 127.0.0.1:`port` (:meth:`stop` ends it)."""

    def __init__(self, app: Any, path: str = "/ws") -> None:
        self.app = app
        self.path = path
        # IPPROTO_TCP: asyncio turns Nagle's algorithm off only on connections of such a socket; TCP_NODELAY on
        # the listening socket is inherited by its connections (Linux) under werkzeug's threads too.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind(("127.0.0.1", 0))  # bound here and handed over: no race for a "free" port
        self.port: int = self._sock.getsockname()[1]
        self.error: BaseException | None = None
        self._stop: Any = None
        self._options: dict[str, Any] = {}  # uvicorn's, for an ASGI app (uvicorn_test_options)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"lowlat-mw-test-server-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        """The WebSocket URL of the app's lowlat-mw endpoint."""
        return f"ws://127.0.0.1:{self.port}{self.path}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RunningServer:
        if not hasattr(self.app, "wsgi_app"):
            try:
                self._options = uvicorn_test_options()  # (a missing uvicorn is said here, before any thread starts)
            except ImportError:
                self._sock.close()
                raise
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT) or self.error is not None:
            self.stop()
            raise RuntimeError(f"the app did not start serving on port {self.port}") from self.error
        return self

    def _serve(self) -> None:
        try:
            if hasattr(self.app, "wsgi_app"):  # Flask
                self._serve_wsgi()
            else:
                asyncio.run(self._serve_asgi())
        except BaseException as exc:  # reported by start() (or at stop)
            self.error = exc
            self._ready.set()

    def _serve_wsgi(self) -> None:
        from werkzeug.serving import make_server

        self._sock.listen(128)
        server = make_server("127.0.0.1", self.port, self.app, threaded=True, fd=self._sock.fileno())
        self._stop = server.shutdown
        self._ready.set()
        server.serve_forever(poll_interval=0.1)

    async def _serve_asgi(self) -> None:
        import uvicorn

        config = uvicorn.Config(self.app, lifespan="auto", log_level="warning", **self._options)
        server = uvicorn.Server(config)
        loop = asyncio.get_running_loop()
        self._stop = lambda: loop.call_soon_threadsafe(setattr, server, "should_exit", True)

        async def serve() -> SystemExit | None:
            try:
                await server.serve(sockets=[self._sock])
            except SystemExit as exc:  # uvicorn's exit on a failed lifespan start-up, SystemExit(3): returned, for
                return exc  # this coroutine to raise (raised in a task, it leaves the task's exception unretrieved)
            return None

        task = loop.create_task(serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if task.done() and not server.started:
            exited = task.result()  # (raises what else stopped it)
            if exited is not None:
                raise exited
            raise RuntimeError("the app's lifespan start-up failed (see the log above)")
        self._ready.set()
        exited = await task
        if exited is not None:
            raise exited

    def stop(self) -> None:
        """Stop serving and wait for the thread (bounded)."""
        try:
            if self._stop is not None and self._thread.is_alive():
                self._stop()
        except RuntimeError:  # the server's loop is closed already (it stopped by itself, e.g. a failed start-up)
            pass
        finally:
            if self._thread.is_alive():
                self._thread.join(START_TIMEOUT)
            self._sock.close()


def uvicorn_test_options() -> dict[str, Any]:
    """``uvicorn.Config`` options for an ASGI app under test: :func:`~lowlat_mw.servers.serving.uvicorn_options`,
    with lowlat-mw's h11 HTTP protocol where httptools is not installed. ImportError naming the extra without
    uvicorn."""
    try:
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"lowlat_server serves ASGI apps in uvicorn, which is not installed ({exc}): "
                          "pip install 'lowlat-mw[serve]'") from None
    from ..servers.serving import uvicorn_options

    options = uvicorn_options()
    try:
        import httptools  # noqa: F401
    except ImportError:
        options["http"] = H11_PROTOCOL
    return options


@pytest.fixture
def lowlat_app() -> Any:
    """Your app: override this fixture (in your conftest.py or test module) to return it."""
    raise pytest.UsageError("define a `lowlat_app` fixture that returns your app (ASGI, a Channels router or Flask) "
                            "to use lowlat_server / lowlat_client")


@pytest.fixture
def lowlat_path() -> str:
    """The WebSocket path of your app's lowlat-mw endpoint: override it if it is not /ws."""
    return "/ws"


@pytest.fixture
def lowlat_server(lowlat_app: Any, lowlat_path: str) -> Iterator[RunningServer]:
    """`lowlat_app` served on a free loopback port for this test (``.url``, ``.port``, ``.http_url``)."""
    server = RunningServer(lowlat_app, lowlat_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def lowlat_client(lowlat_server: RunningServer) -> Iterator[Any]:
    """A :class:`~lowlat_mw.client.SyncClient` connected to `lowlat_server` (closed after the test)."""
    from ..client import connect_sync

    with connect_sync(lowlat_server.url) as client:
        yield client
