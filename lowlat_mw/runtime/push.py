"""Server push (protocol v1.1): :func:`publish` from any thread or process to a session, a user or a group.

A connection is reachable, from its Welcome until it closes, by the keys of its session: ``session:<id>``,
``user:<name>`` (who authenticated: :func:`principal_name`) and ``group:<name>`` for each push group the
session is in (a client's Subscribe, or :func:`join` from the server side). Each process keeps an index of its
own connections by those keys (:class:`PushHub`).

Where a message goes depends on the session store (setting ``session_store``): in-process ("" or "memory"),
:func:`publish` reaches this process's connections; with Redis, it is published on one Redis channel,
``lowlat:push:<db>``, which every serving process listens to from a thread of its own (started when the app is
built, again after a fork), and each process delivers it to its own connections. One channel for every
target, as python-socketio's Redis manager does: joining a group costs no Redis round trip, and a Subscribe is
answered as soon as the process listens, so a push published after the answer reaches the connection.

Delivery is at most once: a push reaches the connections open when it arrives; one that is closing, dropped
or being resumed misses it, and nothing is stored or replayed (streams are for what must arrive). A client
that did not say it speaks v1.1 (its Hello's revision) is skipped, never sent a message kind it does not
know. docs/push.md has the whole story.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..errors import LowLatError
from ..protocol.server import MAX_GROUP_NAME, group_problem

__all__ = ["CHANNEL", "MAX_PUSH", "PublishError", "PushHub", "apublish", "join", "leave", "principal_name",
           "publish", "push_hub"]

log = logging.getLogger("lowlat_mw")

CHANNEL = "lowlat:push"
MAX_PUSH = 512 * 1024  # bytes of one push's body: its Push frame, base64 on JSON, stays within 1 MiB
TIMEOUT = 5.0  # seconds for a Redis connection or command
RETRY_AFTER = 1.0  # seconds between a listener's attempts while Redis is unreachable
TARGET_KINDS = ("session", "user", "group")

_TEXT, _DATA, _JOIN, _LEAVE, _CANCEL, _INPUT = range(6)  # what a message on the channel carries
_HEAD = struct.Struct(">BH")  # kind, target length (then the target, then the body)


class PublishError(LowLatError):
    """A push could not be handed to the shared store (Redis unreachable); nothing was delivered."""


def channel(url: str) -> str:
    """The push channel of the Redis database `url` names: pub/sub ignores database numbers, so apps on two
    databases of one server (staging on /1, production on /0) would otherwise get each other's pushes."""
    from redis.connection import parse_url

    try:
        db = parse_url(url).get("db", 0)
    except ValueError:
        db = 0
    return f"{CHANNEL}:{db}"


def check_target(target: str) -> str:
    """`target` if it names a session, user or group (else ValueError, saying how to write one)."""
    if not isinstance(target, str):
        raise TypeError(f"a push target is a string such as 'group:news', not {type(target).__name__}")
    kind, sep, name = target.partition(":")
    if not sep or kind not in TARGET_KINDS or not name or len(name) > MAX_GROUP_NAME:
        raise ValueError(f"a push target is 'session:<id>', 'user:<name>' or 'group:<name>' (a name of 1 to "
                         f"{MAX_GROUP_NAME} characters), got {target!r}")
    return target


def principal_name(principal: object) -> str | None:
    """The name ``user:<name>`` targets reach a connection by: text as it is, a number in decimal, a user object
    by its primary key (Django's ``pk``, an ``id``, Flask-Login's ``get_id()``); None for nobody (no
    authenticate hook) or a principal without one."""
    if principal is None or isinstance(principal, bool):
        return None
    if isinstance(principal, str | int):
        return str(principal) or None
    try:  # (a user object's attributes may be properties that raise: a detached ORM instance)
        for attr in ("pk", "id"):
            value = getattr(principal, attr, None)
            if value is not None and not isinstance(value, bool) and not callable(value):  # a UUID too
                return str(value)
        get_id = getattr(principal, "get_id", None)
        if callable(get_id):
            value = get_id()
            return str(value) if value is not None else None
    except Exception:  # (an anonymous user's get_id may raise)
        return None
    return None


def _message(kind: int, target: str, body: bytes) -> bytes:
    encoded = target.encode()
    return _HEAD.pack(kind, len(encoded)) + encoded + body


def cancel_message(session_id: str, stream_id: int) -> bytes:
    """What the channel carries to stop stream `stream_id` of `session_id` in the process running its model (its
    client cancelled it while another process relayed it: runtime.shared)."""
    return _message(_CANCEL, f"session:{session_id}", stream_id.to_bytes(4, "big"))


def input_message(session_id: str, inp: Any) -> bytes:
    """What the channel carries to hand a client's Input (protocol v1.3) to the process running its stream's model
    (the client resumed on another process, which relays the stream: runtime.shared). The body is the Input's
    binary frame."""
    from ..protocol.wire import PROTO_CODEC

    return _message(_INPUT, f"session:{session_id}", PROTO_CODEC.encode(inp))


def _body(data: str | bytes) -> tuple[int, bytes]:
    if isinstance(data, str):
        try:
            body = data.encode()
        except UnicodeEncodeError:
            raise ValueError("a push's text must be valid Unicode (it holds an unpaired surrogate)") from None
        kind = _TEXT
    elif isinstance(data, bytes | bytearray | memoryview):
        body, kind = bytes(data), _DATA
    else:
        raise TypeError(f"a push carries str or bytes, not {type(data).__name__} (json.dumps it first)")
    if len(body) > MAX_PUSH:
        raise ValueError(f"a push carries at most {MAX_PUSH} bytes, got {len(body)}")
    return kind, body


class PushHub:
    """This process's connections by the keys pushes reach them by, and its listeners on Redis (one per URL)."""

    def __init__(self) -> None:
        self.sessions: dict[str, Any] = {}
        """Session id -> the connection carrying it: set by the driver at its Welcome and removed when it closes,
        with plain dict operations (atomic; no function call per connection)."""
        self._lock = threading.Lock()  # connections join on their loops; pushes arrive on any thread
        self._index: dict[str, set[Any]] = {}  # user:<name> and group:<name> -> connections
        self._keys: dict[Any, set[str]] = {}  # each connection's keys in _index
        self._listeners: dict[str, _Listener] = {}
        self._publishers: dict[str, Any] = {}  # sync Redis clients by URL (thread-safe: each has a pool)
        self.runners: dict[str, list[Any]] = {}
        """(Shared sessions) session id -> this process's ModelRunners of it, while they run models: where a client's
        input for a stream followed on another process is handed over (``_input``). Not the endpoint's session
        store: a session that left and came back here is relayed by a new runner while the old one still runs its
        models. Changed under the lock (runners of several loops)."""

    def runner_started(self, session_id: str, runner: Any) -> None:
        """`runner` (of a shared session) runs models of `session_id` here: input for them may come from elsewhere."""
        with self._lock:
            self.runners.setdefault(session_id, []).append(runner)

    def runner_ended(self, session_id: str, runner: Any) -> None:
        """`runner` was destroyed."""
        with self._lock:
            found = self.runners.get(session_id)
            if found is not None and runner in found:
                found.remove(runner)
                if not found:
                    del self.runners[session_id]

    # ------------------------------------------------------------------ the index
    def add(self, driver: Any, keys: Iterable[str]) -> None:
        """Pushes to `keys` (``user:`` and ``group:`` ones) reach `driver` (a ConnectionDriver: its ``loop``,
        ``push`` and ``join_group``), unless it closed (its ``member`` is set here: it discards itself when it does)."""
        with self._lock:
            driver.member = True  # (first: a driver closing meanwhile reads it after it stopped being reachable)
            if not driver.reachable:
                return
            own = self._keys.get(driver)
            if own is None:
                own = self._keys[driver] = set()
            for key in keys:
                own.add(key)
                self._index.setdefault(key, set()).add(driver)

    def discard(self, driver: Any, keys: Iterable[str] | None = None) -> None:
        """Pushes to `keys` (None: to any key) no longer reach `driver`."""
        with self._lock:
            own = self._keys.get(driver)
            if own is None:
                return
            for key in list(own) if keys is None else keys:
                own.discard(key)
                members = self._index.get(key)
                if members is not None:
                    members.discard(driver)
                    if not members:
                        del self._index[key]
            if keys is None:
                del self._keys[driver]

    def members(self, key: str) -> list[Any]:
        """The connections `key` reaches now."""
        if key.startswith("session:"):
            driver = self.sessions.get(key[8:])
            return [driver] if driver is not None else []
        with self._lock:
            return list(self._index.get(key, ()))

    def deliver(self, message: bytes) -> int:
        """Hand one published message to the connections of this process it names, each on its own loop: how
        many it reached. Malformed messages (not ours) are ignored."""
        try:
            kind, size = _HEAD.unpack_from(message)
            target = message[_HEAD.size:_HEAD.size + size].decode()
            body = message[_HEAD.size + size:]
        except (struct.error, UnicodeDecodeError):
            return 0
        if kind == _CANCEL:
            return self._cancel(target.partition(":")[2], int.from_bytes(body, "big"))
        if kind == _INPUT:
            return self._input(target.partition(":")[2], body)
        drivers = self.members(target)
        if not drivers:
            return 0
        if kind == _TEXT:
            call, args = "push", (target, body.decode("utf-8", "replace"))
        elif kind == _DATA:
            call, args = "push", (target, body)
        elif kind in (_JOIN, _LEAVE):
            group = body.decode("utf-8", "replace")
            call, args = "join_group", (group, kind == _JOIN)
            for driver in drivers:  # indexed at once: a push published after the join reaches them
                if kind == _JOIN:
                    self.add(driver, (f"group:{group}",))
                else:
                    self.discard(driver, (f"group:{group}",))
        else:
            return 0
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        reached = 0
        for driver in drivers:
            loop = driver.loop
            try:
                if loop is running:
                    getattr(driver, call)(*args)
                else:
                    loop.call_soon_threadsafe(getattr(driver, call), *args)
                reached += 1
            except RuntimeError:  # its loop is closed: the connection is gone
                pass
        return reached

    @staticmethod
    def _cancel(session_id: str, stream_id: int) -> int:
        """A client cancelled, in another process, a stream it followed from here: stop the model (each endpoint
        holding the session's runner; on the runner's loop). How many it stopped."""
        from ..endpoint import Endpoint, _snapshot

        stopped = 0
        for endpoint in _snapshot(Endpoint.instances):
            runner = endpoint.store.get(session_id)
            task = runner.tasks.get(stream_id) if runner is not None else None
            if task is not None and stream_id not in runner.session.followed:  # (its own model, not a relay)
                try:
                    task.get_loop().call_soon_threadsafe(runner.cancel, stream_id)
                    stopped += 1
                except RuntimeError:  # its loop is closed
                    pass
        return stopped

    def _input(self, session_id: str, frame: bytes) -> int:
        """A client sent, on another process, input for a stream whose model runs here: hand it to the model (on the
        runner's loop). How many runners took it."""
        from ..protocol import events as ev
        from ..protocol.wire import PROTO_CODEC

        try:
            inp = PROTO_CODEC.decode(frame, limit=len(frame))
        except Exception:  # not ours
            return 0
        if type(inp) is not ev.Input:
            return 0
        reached = 0
        with self._lock:
            runners = list(self.runners.get(session_id, ()))
        for runner in runners:
            if inp.stream_id in runner.tasks and inp.stream_id not in runner.session.followed:
                try:
                    runner.loop.call_soon_threadsafe(runner.deliver_remote, inp)
                    reached += 1
                except RuntimeError:  # its loop is closed
                    pass
        return reached

    # ------------------------------------------------------------------ Redis
    def listen(self, url: str) -> _Listener:
        """Listen to the push channel of the Redis at `url` (once per process and URL): its ``ready`` is set while
        it is subscribed, its ``failing`` while Redis cannot be reached."""
        with self._lock:
            listener = self._listeners.get(url)
            if listener is None:
                listener = self._listeners[url] = _Listener(self, url)
                listener.start()
            return listener

    def send(self, url: str, message: bytes) -> int:
        """Deliver `message` here (`url` "memory") or publish it on Redis: connections / processes reached."""
        if url == "memory":
            return self.deliver(message)
        client = self._publishers.get(url)
        if client is None:
            import redis

            client = self._publishers[url] = redis.Redis.from_url(url, socket_timeout=TIMEOUT,
                                                                  socket_connect_timeout=TIMEOUT)
        try:
            return int(client.publish(channel(url), message))
        except Exception as exc:
            raise PublishError(f"push not sent: the session store is unreachable ({exc})") from exc


class _Listener(threading.Thread):
    """A daemon thread reading the push channel and handing each message to the hub (reconnecting with Redis)."""

    def __init__(self, hub: PushHub, url: str) -> None:
        super().__init__(name="lowlat-mw-push", daemon=True)
        self.hub, self.url = hub, url
        self.ready = threading.Event()
        self.failing = False

    def run(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=TIMEOUT, socket_timeout=TIMEOUT,
                                      health_check_interval=10)
        while True:
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(channel(self.url))
                while True:
                    message = pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self.ready.set()
                        if self.failing:
                            self.failing = False
                            log.warning("push channel on the session store reachable again: pushes from other "
                                        "processes arrive again")
                    elif message["type"] == "message":
                        try:
                            self.hub.deliver(message["data"])
                        except Exception:  # a bug of ours: one message lost, not the listener
                            log.exception("failed delivering a push")
            except Exception as exc:  # Redis down, a timeout: try again, say so once per outage
                self.ready.clear()
                if not self.failing:
                    self.failing = True
                    log.warning("push channel on the session store unreachable (%s): pushes from other processes "
                                "are lost until it is back", exc)
                time.sleep(RETRY_AFTER)
            finally:
                try:
                    pubsub.close()
                except Exception:
                    pass


HUB = PushHub()
"""This process's hub (``push_hub()``); a forked child gets a new one: the parent's connections and listener
threads are not its own (it listens to the same Redis URLs, from threads of its own)."""


def _new_hub() -> None:
    global HUB
    urls = list(HUB._listeners)
    HUB = PushHub()
    for url in urls:
        HUB.listen(url)


os.register_at_fork(after_in_child=_new_hub)


def push_hub() -> PushHub:
    """This process's hub."""
    return HUB


def store_url(store: str | None = None) -> str:
    """Where pushes go: `store` ("memory" or a Redis URL) if given; else the session store of this process's
    lowlat-mw apps (the first that shares sessions); else ``LOWLAT_SESSION_STORE``; else a configured Django
    project's ``LOWLAT_MW["session_store"]`` (a management command, a Celery task); else "memory", which in
    a process without a lowlat-mw app could reach nobody: PublishError then, saying what to set."""
    if store:
        return store
    from ..endpoint import Endpoint, _snapshot

    endpoints = _snapshot(Endpoint.instances)
    for endpoint in endpoints:
        if endpoint.settings.shares_sessions:
            return endpoint.settings.session_store
    env = os.environ.get("LOWLAT_SESSION_STORE", "")
    if env:
        return env
    django_settings = _django_settings()
    if django_settings is not None:
        configured = (getattr(django_settings, "LOWLAT_MW", None) or {}).get("session_store", "")
        if configured:
            return str(configured)
    if not endpoints:
        raise PublishError("push not sent: this process serves no lowlat-mw app and knows no session store; set "
                           "LOWLAT_SESSION_STORE (the Redis URL your servers share) or pass store=")
    return "memory"


def _django_settings() -> Any:
    """Django's settings, if this process has a configured Django project (else None; Django is not needed)."""
    import sys

    if "django.conf" not in sys.modules:
        return None
    from django.conf import settings

    return settings if settings.configured else None


def publish(target: str, data: str | bytes, *, store: str | None = None) -> int:
    """Push `data` (text or bytes, at most 1 MiB) to every connection `target` names, in every process that
    shares `store`: ``"session:<id>"`` (one client session), ``"user:<name>"`` (every connection of who
    authenticated as that name: :func:`principal_name`) or ``"group:<name>"`` (every session in that group).

    At most once, to the connections open when it arrives. Returns how many connections (in-process store) or
    processes (Redis) it reached. Raises ValueError / TypeError for a bad target or body, PublishError when Redis
    cannot be reached. Blocking (one Redis round trip): from async code use :func:`apublish`."""
    kind, body = _body(data)
    return push_hub().send(store_url(store), _message(kind, check_target(target), body))


async def apublish(target: str, data: str | bytes, *, store: str | None = None) -> int:
    """:func:`publish` for async code (the Redis round trip runs in a thread, not on the loop)."""
    kind, body = _body(data)
    message = _message(kind, check_target(target), body)
    url = store_url(store)
    if url == "memory":
        return push_hub().send(url, message)
    return await asyncio.to_thread(push_hub().send, url, message)


def join(target: str, group: str, *, store: str | None = None) -> int:
    """Put the sessions of the connections `target` names (open now, in any process sharing `store`) in push
    group `group`, as a client's Subscribe would, without the ``push_groups`` check: the server decides. The
    sessions stay in it, across resumes, until they end or :func:`leave`. Returns as :func:`publish`."""
    return _membership(target, group, _JOIN, store)


def leave(target: str, group: str, *, store: str | None = None) -> int:
    """Take the sessions `target` names out of push group `group` (see :func:`join`)."""
    return _membership(target, group, _LEAVE, store)


def _membership(target: str, group: str, kind: int, store: str | None) -> int:
    if not isinstance(group, str) or (problem := group_problem(group)) is not None:
        raise ValueError(f"push group {group!r}: {problem if isinstance(group, str) else 'not a string'}")
    return push_hub().send(store_url(store), _message(kind, check_target(target), group.encode()))
