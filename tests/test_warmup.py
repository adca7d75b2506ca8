"""Warm-up (protocol v1.2) in process: the hook runner, the client's ``warmup()`` and ``warmup=`` option, the
sync client, and what happens against a server of an older revision. (Every server: the conformance suite.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from starlette.applications import Starlette

from lowlat_mw.adapters.starlette import LowLatMiddleware
from lowlat_mw.client.aio import AsyncClient, Stream
from lowlat_mw.errors import ClientError, LocalProtocolError
from lowlat_mw.model import ModelRequest, SessionInfo, warm_up
from lowlat_mw.protocol import events as ev
from lowlat_mw.testing.inprocess import AppClient

pytestmark = pytest.mark.timeout(30)


class Warmable:
    """A model object with a ``warmup`` method: what the hook sees, and whether the model ran."""

    def __init__(self) -> None:
        self.warmed: list[tuple[str | None, dict[str, Any], str]] = []
        self.ran = 0
        self.warm = asyncio.Event()

    async def __call__(self, req: ModelRequest) -> Any:
        self.ran += 1
        yield "warm" if self.warmed else "cold"

    async def warmup(self, req: ModelRequest) -> None:
        self.warmed.append((req.text, dict(req.params), req.model))
        self.warm.set()


def app_of(models: Any) -> Starlette:
    app = Starlette()
    app.add_middleware(LowLatMiddleware, model=models, path="/ws")
    return app


def request(text: str = "x") -> ModelRequest:
    return ModelRequest(stream_id=1, text=text, session=SessionInfo(session_id="s"))


async def test_warm_up_runs_a_sync_hook_off_the_loop_and_an_async_one_on_it() -> None:
    loop_thread = threading.get_ident()
    seen: list[tuple[str, bool]] = []

    def sync_model(req: ModelRequest) -> str:
        return "x"

    sync_model.warmup = lambda req: seen.append((req.prompt, threading.get_ident() == loop_thread))  # type: ignore[attr-defined]

    async def async_model(req: ModelRequest) -> str:
        return "x"

    async def hook(req: ModelRequest) -> None:
        seen.append((req.prompt, threading.get_ident() == loop_thread))

    async_model.warmup = hook  # type: ignore[attr-defined]
    assert await warm_up(sync_model, request("a")) is True
    assert await warm_up(async_model, request("b")) is True
    assert seen == [("a", False), ("b", True)]
    assert await warm_up(lambda req: "no hook", request()) is False  # nothing to do
    not_callable: Any = lambda req: "x"  # noqa: E731
    not_callable.warmup = "soon"
    with pytest.raises(TypeError, match="warmup attribute is not callable"):
        await warm_up(not_callable, request())


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_client_warmup_waits_for_the_hook_and_the_model_never_runs(mode: str) -> None:
    model = Warmable()
    async with AppClient(app_of({"m": model}), "/ws", mode=mode) as client:
        end = await client.warmup("system", model="m", params={"k": 1})
        assert end is not None and (end.finish_reason, end.last_seq) == ("warmup", 0)
        assert model.warmed == [("system", {"k": 1}, "m")] and model.ran == 0
        assert await client.complete("q", model="m") == "warm"
        assert client.warmups == 1


async def test_the_warmup_option_warms_each_new_session_in_the_background() -> None:
    model = Warmable()
    async with AppClient(app_of(model), "/ws", warmup={"text": "preload", "params": {"size": "s"}}) as client:
        await asyncio.wait_for(model.warm.wait(), 10)  # open() returned before it; the hook ran after it
        assert model.warmed == [("preload", {"size": "s"}, "")]
        assert await client.complete("q") == "warm"


def test_the_sync_client_warms_up_too() -> None:
    from lowlat_mw.client.sync import SyncClient

    model = Warmable()

    class InProcess(SyncClient):  # the sync face over the in-process client
        async def _make(self, url: str, kwargs: dict[str, Any]) -> Any:
            return AppClient(app_of(model), "/ws", **kwargs)

    with InProcess("ws://testserver/ws") as client:
        end = client.warmup("s")
        assert end is not None and end.finish_reason == "warmup"
        assert client.complete("q") == "warm"
    assert len(model.warmed) == 1


async def test_against_an_older_server_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A v1.1 server ignores the warmup field and would run the model as a plain request: the client checks
    the Welcome's revision first."""
    monkeypatch.setattr(ev, "REVISION", 1)  # what a v1.1 server says in its Welcome
    model = Warmable()
    async with AppClient(app_of(model), "/ws") as client:
        assert client.welcome is not None and client.welcome.revision == 1
        assert await client.warmup("s") is None
        assert await client.complete("q") == "cold"
    assert model.warmed == [] and model.ran == 1


async def test_a_warm_up_request_is_never_sent_to_an_older_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The revision is checked where the Request is sent, which a resend after a drain or a lost Request may do on
    a connection to another (older) server: the stream ends in the client, the model never runs."""
    monkeypatch.setattr(ev, "REVISION", 1)
    model = Warmable()
    async with AppClient(app_of(model), "/ws") as client:
        stream = Stream(client, client._request("s", None, None, "", None, True))  # (what warmup() starts)
        with pytest.raises(ClientError, match="revision 1: it has no warm-up"):
            await stream.text()
        assert client._streams == {} and await client.complete("q") == "cold"
    assert model.warmed == [] and model.ran == 1


def test_the_warmup_option_is_checked_when_the_client_is_made() -> None:
    with pytest.raises(TypeError, match="not prompt"):
        AsyncClient("ws://127.0.0.1:1/ws", warmup={"prompt": "x"})
    with pytest.raises(LocalProtocolError, match="at most one of text, data, messages"):
        AsyncClient("ws://127.0.0.1:1/ws", warmup={"text": "a", "data": b"b"})
    AsyncClient("ws://127.0.0.1:1/ws", warmup={"messages": [{"role": "system", "content": "be brief"}], "model": "m"})


async def test_a_request_sent_while_connecting_goes_before_the_background_warm_up() -> None:
    """The warmup= option never puts its request ahead of the caller's: with max_streams=1 the caller's request
    still runs (the warm-up then waits its turn or is refused, only a hint)."""
    started: list[str] = []

    async def model(req: ModelRequest) -> Any:
        started.append("request")
        yield "ok"

    async def hook(req: ModelRequest) -> None:
        started.append("warm-up")

    model.warmup = hook  # type: ignore[attr-defined]
    app = Starlette()
    app.add_middleware(LowLatMiddleware, model=model, path="/ws", max_streams=1)
    client = AppClient(app, "/ws", warmup={"text": "w"})
    try:
        assert await client.complete("q") == "ok"  # connects: this request is sent first
    finally:
        await client.close()
    assert started[0] == "request"
