"""Sessions shared through Redis (setting ``session_store``), across two real `lowlat-mw serve` processes and a real
redis-server (tests/redis_support.py): a client on process A whose connection drops reconnects (through a proxy
that now forwards to process B) and resumes there. A stream A is still running is followed live to its End; one
whose process was killed arrives up to what A had saved and ends with ResumeFailed, never with a gap or a repeat.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from support.ports import free_port, wait_listening
from support.time import seconds
from support.waits import wait_until, wait_until_sync

from lowlat_mw import Backoff, ResumeFailed, ToolCall, connect
from lowlat_mw.cache import request_key
from lowlat_mw.errors import SettingsError
from lowlat_mw.protocol import events as ev
from lowlat_mw.servers.serving import daphne_args, gunicorn_args, uvicorn_args
from lowlat_mw.settings import Settings
from lowlat_mw.testing import FaultProxy, LoggedProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKENS = 500
WAIT = 60.0
MODEL = '''
import asyncio

import lowlat_mw


async def count(req):
    """TOKENS numbered tokens, `gap` seconds apart; with `mark`, that file is written when it stops."""
    gap = float(req.params.get("gap", 0.004))
    pad = "." * int(req.params.get("pad", 0))
    try:
        for i in range(int(req.params.get("n", 500))):
            yield f"{i}{pad} "
            await asyncio.sleep(gap)
    finally:
        if req.params.get("mark"):
            open(req.params["mark"], "w").close()


async def announce(req):
    """Publishes the prompt to params["target"] (through Redis, to every process): how many processes it reached."""
    yield str(await lowlat_mw.apublish(req.params["target"], req.prompt))


async def agent(req):
    """Protocol v1.3: asks the client for a tool call, waits for the answer, then echoes input until its end."""
    yield "asking;"
    call = req.tool_call("lookup", {"q": req.prompt})
    yield call
    result = await req.inputs.result(call)
    yield f"got:{result.content};"
    async for item in req.inputs:
        yield f"in:{item};"
    yield "done;"


async def det(req):
    """A deterministic model (the result cache keeps its replies): writes params["mark"]/<pid> each time it runs."""
    import os

    open(os.path.join(req.params["mark"], str(os.getpid())), "a").write("ran;")
    for word in req.prompt.split():
        yield word + " "


det.deterministic = True

MODELS = {"count": count, "announce": announce, "agent": agent, "det": det}


def who(handshake):
    """The push test's authenticate hook (LOWLAT_AUTHENTICATE): the bearer token names the user."""
    return handshake.bearer or None
'''
EXPECTED = [f"{i} " for i in range(TOKENS)]


ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def argv(server: str, port: int) -> list[str]:
    """How each server runs the counting model: `lowlat-mw serve`, or a framework's example app as its guide says
    (the example serves LOWLAT_MODEL)."""
    if server == "serve":
        return [str(BIN / "lowlat-mw"), "serve", "counting:count", "--port", str(port), "--log-level", "warning"]
    if server == "starlette":
        return [str(BIN / "uvicorn"), "examples.starlette_app:app", "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warning", *uvicorn_args(Settings())]
    if server == "flask":
        return [str(BIN / "gunicorn"), *gunicorn_args(Settings()), "--threads", "64", "-b", f"127.0.0.1:{port}",
                "examples.flask_app:app"]
    if server == "django":
        return [sys.executable, "-m", "lowlat_mw.servers.daphne", "-b", "127.0.0.1", "-p", str(port),
                *daphne_args(Settings()), "examples.django_project.asgi:application"]
    raise ValueError(server)


def server_env(tmp_path: Path, redis_url: str, **settings: str) -> dict[str, str]:
    """The environment a server of the counting model runs in: sessions shared through `redis_url`, the examples
    serving LOWLAT_MODEL, `settings` (LOWLAT_* variables) on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOWLAT_", "DJANGO_"))}
    env.update(LOWLAT_SESSION_STORE=redis_url, LOWLAT_MODEL="counting:count", PYTHONPATH=f"{tmp_path}:{ROOT}",
               GUNICORN_CMD_ARGS="--no-control-socket")
    env.update(settings)
    return env


class Servers:
    """Two server processes (A and B) of the counting model sharing `redis_url`, and a proxy in front of A."""

    def __init__(self, tmp_path: Path, redis_url: str, kinds: tuple[str, str] = ("serve", "serve"),
                 settings: dict[str, str] | None = None) -> None:
        self.redis_url = redis_url
        self.tmp_path = tmp_path
        (tmp_path / "counting.py").write_text(MODEL)
        env = server_env(tmp_path, redis_url, **(settings or {}))
        self.procs: list[LoggedProcess] = []
        self.ports: list[int] = []
        for name, kind in zip(("a", "b"), kinds, strict=True):
            port = free_port()
            self.procs.append(LoggedProcess(f"shared-{name}-{kind}", argv(kind, port), logdir=tmp_path, env=env,
                                            cwd=tmp_path))
            self.ports.append(port)
        for proc, port in zip(self.procs, self.ports, strict=True):
            assert wait_listening(port, proc.alive, proc.output, WAIT), proc.output()
        self.proxy = FaultProxy(("127.0.0.1", self.ports[0]))

    def to_b(self) -> None:
        """New connections go to B; the open ones are cut (the client reconnects, and lands on B)."""
        self.proxy.target = ("127.0.0.1", self.ports[1])
        self.proxy.cut_all()

    def close(self) -> None:
        self.proxy.close()
        for proc in self.procs:
            proc.stop()


@pytest.fixture
def servers(tmp_path: Path, redis_url: str, request: pytest.FixtureRequest):
    """A and B: `lowlat-mw serve` both, or the pair the test is parametrized with ("starlette-flask", ...), with the
    settings of the test's `server_settings` mark, if any."""
    mark = request.node.get_closest_marker("server_settings")
    s = Servers(tmp_path, redis_url, tuple(getattr(request, "param", "serve-serve").split("-")),  # type: ignore[arg-type]
                mark.args[0] if mark else None)
    try:
        yield s
    finally:
        s.close()


async def _read(stream, received: list[str], until: int | None = None) -> None:
    """Read `stream` into `received`, to its end or until it holds `until` chunks. (With anext: leaving an
    `async for` loop early cancels the stream, and these tests read one stream in parts.)"""
    while until is None or len(received) < until:
        try:
            received.append(await anext(stream))
        except StopAsyncIteration:
            return


# Issue 18's pairs, each way (`lowlat-mw serve` is the default pair of the other tests): each direction is followed
# or drained here, both events on every pair in the shared benchmark suite's failover run.
FORWARD = pytest.mark.parametrize("servers", ["starlette-flask", "django-starlette"], indirect=True)
BACK = pytest.mark.parametrize("servers", ["flask-starlette", "starlette-django"], indirect=True)


@BACK
async def test_a_stream_running_on_a_is_followed_on_b_after_the_client_moves(servers: Servers) -> None:
    received: list[str] = []
    async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{servers.proxy.port}/ws",
                                               backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
        stream = client.stream("count", params={"n": TOKENS})
        await _read(stream, received, until=100)
        servers.to_b()  # A goes on generating; B relays what A writes to Redis
        await _read(stream, received)
        assert client.resumes == 1
        assert received == EXPECTED  # exact: no gap, no repeat
        assert await client.complete("after", params={"n": 3, "gap": 0}) == "0 1 2 "  # B runs new streams itself
    for proc in servers.procs:
        assert "Traceback" not in proc.output(), proc.output()


async def test_a_stream_longer_than_the_clients_flow_window_is_followed_to_its_end(servers: Servers) -> None:
    """400 KB against the client's 256 KiB flow window: its Acks go to B now, so A must not wait for them."""
    n, pad = 400, 1000
    received: list[str] = []
    async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{servers.proxy.port}/ws",
                                               backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
        stream = client.stream("count", params={"n": n, "pad": pad, "gap": 0.001})
        await _read(stream, received, until=20)
        servers.to_b()
        await _read(stream, received)
    assert received == [f"{i}{'.' * pad} " for i in range(n)]


# Each waits the 5 s after which a silent process counts as dead: gunicorn and daphne killed here; uvicorn killed in
# the shared benchmark suite's failover part (CI runs it in quick mode: tests/test_benchmarks_shared.py).
@pytest.mark.parametrize("servers", ["flask-starlette", "django-starlette"], indirect=True)
async def test_a_stream_whose_process_is_killed_ends_with_resume_failed_after_what_was_saved(
        servers: Servers) -> None:
    received: list[str] = []
    async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{servers.proxy.port}/ws",
                                               backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
        stream = client.stream("count", params={"n": TOKENS})
        await _read(stream, received, until=100)
        os.killpg(servers.procs[0].proc.pid, signal.SIGKILL)  # (LoggedProcess runs it in its own group)
        servers.to_b()
        with pytest.raises(ResumeFailed, match="process running it stopped"):
            await _read(stream, received)
        assert 100 <= len(received) < TOKENS
        assert received == EXPECTED[:len(received)]  # a prefix: no gap, no repeat
        assert await client.complete("after", params={"n": 3, "gap": 0}) == "0 1 2 "


@FORWARD
async def test_a_stream_on_a_draining_process_goes_on_there_and_arrives_whole_through_b(servers: Servers) -> None:
    """SIGTERM to A: GoAway and 4002 at once, the client resumes on B, A's model runs on (drain_grace) and B relays
    it to its End."""
    received: list[str] = []
    async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{servers.proxy.port}/ws",
                                               backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
        stream = client.stream("count", params={"n": TOKENS})
        await _read(stream, received, until=100)
        servers.proxy.target = ("127.0.0.1", servers.ports[1])  # the balancer's part: new connections go to B
        os.kill(servers.procs[0].proc.pid, signal.SIGTERM)
        await _read(stream, received)
        assert received == EXPECTED
        assert client.resumes == 1
    assert servers.procs[0].proc.wait(WAIT) is not None  # A exited once its stream had ended


async def _pushed_until_end(client) -> list[tuple[str, str | bytes]]:
    """What `client` was pushed, up to the "end" sent to its own session (nothing else can hide behind it)."""
    got: list[tuple[str, str | bytes]] = []
    while not got or got[-1] != ("session", "end"):
        push = await client.next_push(WAIT)
        got.append((push.topic.partition(":")[0], push.body))
    return got


@FORWARD
@pytest.mark.server_settings({"LOWLAT_MODEL": "counting:MODELS", "LOWLAT_AUTHENTICATE": "counting:who"})
async def test_publish_reaches_exactly_its_session_user_and_group_across_processes(servers: Servers) -> None:
    """Issue 18: publish to a session, a user and a group from a script (this test) and from a model in A reaches the
    right connections on A and B (different frameworks), and a session's groups move with it when it resumes on B."""
    import lowlat_mw

    store = servers.redis_url
    a, b = (f"ws://127.0.0.1:{port}/ws" for port in servers.ports)
    moving = f"ws://127.0.0.1:{servers.proxy.port}/ws"  # (to A, then B)
    async with (asyncio.timeout(WAIT), connect(a, auth="alice") as alice_a,
                connect(b, auth="alice", mode="json") as alice_b, connect(b, auth="bob") as bob_b,
                connect(a, auth="carol") as carol_a,
                connect(moving, auth="dave", backoff=Backoff(base=0.05, cap=0.2, retries=8)) as dave):
        await alice_a.subscribe("news")  # (answered once A listens to the push channel; B's, next line)
        await bob_b.subscribe("news")
        await dave.subscribe("news")
        assert lowlat_mw.publish("group:news", "g1", store=store) == 2  # processes listening: A and B
        assert await carol_a.complete("to alice", model="announce", params={"target": "user:alice"}) == "2"
        lowlat_mw.publish(f"session:{carol_a.welcome.session_id}", b"to carol", store=store)
        lowlat_mw.join("user:carol", "news", store=store)  # the server side's join, from anywhere
        lowlat_mw.publish("group:news", "g2", store=store)
        assert [(await dave.next_push(WAIT)).body for _ in range(2)] == ["g1", "g2"]  # (then it leaves news)
        await dave.unsubscribe("news")
        await dave.subscribe("late")
        received: list[str] = []
        stream = dave.stream("count", model="count", params={"n": 200})
        await _read(stream, received, until=20)
        servers.to_b()  # dave resumes on B: its session's groups come with it from Redis
        await _read(stream, received)
        assert received == EXPECTED[:200] and dave.resumes == 1 and dave.welcome.resumed
        lowlat_mw.publish("group:late", "after the move", store=store)
        lowlat_mw.publish("group:news", "g3", store=store)
        for client in (alice_a, alice_b, bob_b, carol_a, dave):
            lowlat_mw.publish(f"session:{client.welcome.session_id}", "end", store=store)
        assert await _pushed_until_end(alice_a) == [("group", "g1"), ("user", "to alice"), ("group", "g2"),
                                                    ("group", "g3"), ("session", "end")]
        assert await _pushed_until_end(alice_b) == [("user", "to alice"), ("session", "end")]
        assert await _pushed_until_end(bob_b) == [("group", "g1"), ("group", "g2"), ("group", "g3"),
                                                  ("session", "end")]
        assert await _pushed_until_end(carol_a) == [("session", b"to carol"), ("group", "g2"), ("group", "g3"),
                                                    ("session", "end")]
        assert await _pushed_until_end(dave) == [("group", "after the move"), ("session", "end")]
    for proc in servers.procs:
        assert "Traceback" not in proc.output(), proc.output()


async def test_a_followed_stream_outlives_the_resume_window_of_the_process_running_it(tmp_path: Path,
                                                                                      redis_url: str) -> None:
    """resume_window 1 s, a 2.5 s stream moved to B early: A's session expires there, but the store says B holds it
    now, so A's model runs on to its End, which B relays."""
    servers = Servers(tmp_path, redis_url, settings={"LOWLAT_RESUME_WINDOW": "1"})
    try:
        received: list[str] = []
        async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{servers.proxy.port}/ws",
                                                   backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
            stream = client.stream("count", params={"n": 250, "gap": 0.01})
            await _read(stream, received, until=20)
            servers.to_b()
            await _read(stream, received)
        assert received == EXPECTED[:250]
    finally:
        servers.close()


async def test_a_cancelled_followed_stream_ends_at_once_and_stops_the_model_on_a(servers: Servers) -> None:
    received: list[str] = []
    stopped = servers.tmp_path / "stopped-on-a"
    async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{servers.proxy.port}/ws",
                                               backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
        stream = client.stream("count", params={"n": 100 * TOKENS, "gap": 0.01, "mark": str(stopped)})  # ~8 min
        await _read(stream, received, until=20)
        servers.to_b()
        await _read(stream, received, until=40)  # (relayed by B now)
        await stream.cancel()
        await _read(stream, received)  # ends quietly, long before A's model would
        assert 40 <= len(received) < TOKENS and received == EXPECTED[:len(received)]
        assert await client.complete("after", params={"n": 3, "gap": 0}) == "0 1 2 "
        while not stopped.exists():  # B told A (the push channel): A's model stops, minutes before its end
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("servers", ["starlette-flask", "flask-starlette"], indirect=True)
@pytest.mark.server_settings({"LOWLAT_MODEL": "counting:MODELS"})
async def test_a_tool_call_answered_after_the_client_moved_reaches_the_model_on_a(servers: Servers) -> None:
    """The model runs on A; the client resumes on B, which relays the stream and forwards the client's input (the
    tool result, more text, the end) to A through Redis, in order and each once; then back on A, whose new relay
    of the session forwards it to the runner that still runs the model."""
    async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{servers.proxy.port}/ws",
                                               backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
        stream = client.stream("oslo", model="agent")
        assert await anext(stream) == "asking;"
        call = await anext(stream)
        assert isinstance(call, ToolCall) and call.args == {"q": "oslo"}
        servers.to_b()
        await stream.send_result(call, "cold")  # (sent again on B after the resume, if the drop took it)
        assert await anext(stream) == "got:cold;"
        assert client.resumes == 1
        await stream.send("one")
        assert await anext(stream) == "in:one;"
        servers.proxy.target = ("127.0.0.1", servers.ports[0])  # and back to A, which runs the model: A relays the
        servers.proxy.cut_all()                                 # stream now, and its input still reaches the model
        await stream.send("two")
        await stream.send("three", end=True)
        assert [chunk async for chunk in stream] == ["in:two;", "in:three;", "done;"]
        assert client.resumes == 2
    for proc in servers.procs:
        assert "Traceback" not in proc.output(), proc.output()


@pytest.mark.parametrize("servers", ["starlette-flask"], indirect=True)
@pytest.mark.server_settings({"LOWLAT_MODEL": "counting:MODELS", "LOWLAT_CACHE_SIZE": "1048576"})
async def test_a_reply_kept_by_one_process_is_a_cache_hit_on_another(servers: Servers) -> None:
    """The result cache's shared tier: A runs the deterministic model and keeps its reply in Redis too; B, asked the
    same, answers from there without running the model (and keeps it in its own memory from then on)."""
    marks = servers.tmp_path / "det-runs"
    marks.mkdir()
    params = {"mark": str(marks)}
    a, b = (f"ws://127.0.0.1:{port}/ws" for port in servers.ports)
    async with asyncio.timeout(WAIT):
        async with connect(a) as client:
            assert await client.complete("the same question", model="det", params=params) == "the same question "
        runs = {p.name: p.read_text().count("ran") for p in marks.iterdir()}
        assert list(runs.values()) == [1], runs  # A ran it
        store = redis.Redis.from_url(servers.redis_url)
        try:
            key = request_key(ev.Request(stream_id=1, model="det", text="the same question", params=params))
            while not store.exists(f"lowlat:c:{key.hex()}"):
                await asyncio.sleep(0.02)  # (A writes to Redis behind the stream)
            assert int(store.get("lowlat:c:bytes")) <= 1048576
        finally:
            store.close()
        async with connect(b) as client:
            for _ in range(3):  # from Redis, then from B's own memory: the model runs on no process
                assert await client.complete("the same question", model="det", params=params) == "the same question "
            assert {p.name: p.read_text().count("ran") for p in marks.iterdir()} == runs
            assert await client.complete("another question", model="det", params=params) == "another question "


async def test_with_redis_stopped_sessions_go_on_and_resume_across_processes_once_it_is_back(
        servers: Servers, redis_server) -> None:
    redis_server.stop()
    async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{servers.proxy.port}/ws") as client:
        assert await client.complete("without redis", params={"n": 20, "gap": 0}) == "".join(EXPECTED[:20])
    redis_server.start()
    # A's keep-alive and push listener (every second) find Redis back and say so
    await wait_until(lambda: all(line in servers.procs[0].output() for line in (
        "sessions are shared again", "pushes from other processes arrive again")), WAIT, interval=0.1,
        what="process A to find Redis back")
    received: list[str] = []
    async with asyncio.timeout(WAIT), connect(f"ws://127.0.0.1:{servers.proxy.port}/ws",
                                               backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
        stream = client.stream("count", params={"n": TOKENS})
        await _read(stream, received, until=100)
        servers.to_b()
        await _read(stream, received)
        assert received == EXPECTED
    log = servers.procs[0].output()
    # Said once per outage each: by the session store and by the push channel's listener.
    assert log.count("sessions go on in this process") == 1 and "sessions are shared again" in log, log
    assert log.count("pushes from other processes are lost") == 1 and "pushes from other processes arrive again" in log
    assert log.count("unreachable") == 2, log
    assert "Traceback" not in log, log


def test_a_store_that_does_not_answer_stops_the_app_when_it_is_built() -> None:
    from lowlat_mw.runtime.asgi import LowLatASGI

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with pytest.raises(SettingsError, match=r"cannot reach Redis at redis://127\.0\.0\.1"):
        LowLatASGI(lambda req: "x", session_store=url)
    with pytest.raises(SettingsError, match="session_store"):
        Settings(session_store="http://127.0.0.1:6379")


def test_the_session_is_in_redis_with_a_digest_of_its_token(servers: Servers, redis_url: str) -> None:
    async def run() -> str:
        async with connect(f"ws://127.0.0.1:{servers.ports[0]}/ws") as client:
            await client.complete("x", params={"n": 3, "gap": 0})
            return client.welcome.resume_token

    token = asyncio.run(run())
    sid = token.partition(".")[0]
    client = redis.Redis.from_url(redis_url)
    # written behind the socket: soon after the reply, not before it
    meta = wait_until_sync(lambda: client.hgetall(f"lowlat:s:{sid}"), seconds(10), interval=0.05, what="the session")
    assert meta[b"token"] != token.encode() and len(meta[b"token"]) == 64
    assert token.partition(".")[2].encode() not in b"".join(meta.values())


@pytest.mark.parametrize("server", ["serve", "gunicorn"])
async def test_two_workers_resume_every_stream_on_either_worker(tmp_path: Path, redis_url: str, server: str) -> None:
    """`lowlat-mw serve --workers 2` with the Redis store, and gunicorn -w 2 (the Flask example, its workers forked
    from one master: each must be a process of its own to the store): one port, the kernel picks the worker of
    each connection, so a reconnect lands on either; every stream arrives exact through connections cut at random."""
    (tmp_path / "counting.py").write_text(MODEL)
    port = free_port()
    if server == "serve":
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOWLAT_", "DJANGO_"))}
        command = [str(BIN / "lowlat-mw"), "serve", "counting:count", "--port", str(port), "--workers", "2", "--set",
                   f"session_store={redis_url}"]
    else:
        env = server_env(tmp_path, redis_url)
        command = [*argv("flask", port), "-w", "2", "--log-level", "info"]
    proc = LoggedProcess("workers", command, logdir=tmp_path, env=env, cwd=tmp_path)
    try:
        assert wait_listening(port, proc.alive, proc.output, WAIT), proc.output()
        n, expected = 300, "".join(EXPECTED[:300])
        with FaultProxy(("127.0.0.1", port), seed=18) as proxy:
            proxy.cut_randomly(1500, 5000)
            async with asyncio.timeout(WAIT * 2), connect(f"ws://127.0.0.1:{proxy.port}/ws",
                                                           backoff=Backoff(base=0.05, cap=0.2, retries=8)) as client:
                replies = [await client.complete(f"stream {i}", params={"n": n, "gap": 0.001}) for i in range(6)]
                resumes = client.resumes
        assert replies == [expected] * 6
        assert resumes >= 3, resumes
        started = "Started server process" if server == "serve" else "Booting worker with pid"
        assert proc.output().count(started) == 2, proc.output()
        assert "each with its own in-process sessions" not in proc.output()  # no several-workers warning
    finally:
        proc.stop()


def test_serve_refuses_several_workers_without_shared_sessions(tmp_path: Path) -> None:
    result = subprocess.run([str(BIN / "lowlat-mw"), "serve", "--workers", "2", "--port", str(free_port())],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env={k: v for k, v in os.environ.items() if not k.startswith("LOWLAT_")})
    assert result.returncode != 0
    assert "--workers 2 needs sessions shared between the workers" in result.stderr, result.stderr
