"""Sessions shared across processes through Redis (setting ``session_store = "redis://..."``).

Each process still runs its own sessions in memory (``Endpoint.store``); what Redis adds is a copy
that any process can resume from. A session's output is written behind the socket: the protocol
machine notes each stream start, Delta and End in the session's journal (``Session.journal``), and
every 10 ms at most (WRITE_EVERY) every session with something new is written in one pipelined round trip,
one Redis Stream entry per session (never on a Delta's critical path). Keys, each expiring
``resume_window`` after its last write:

- ``lowlat:s:<session id>``: a hash: the resume token's SHA-256, who authenticated, and which
  process holds the connection now;
- ``lowlat:d:<session id>``: a Redis Stream of entries ``{o: writer process, b: records}``, where
  records are packed (kind, stream id, seq, payload) tuples (:func:`pack`);
- ``lowlat:p:<process id>``: "this process is alive", refreshed every second, gone 5 s after the
  process is;
- the result cache's shared tier (setting ``cache_size``): ``lowlat:c:<key>`` a kept reply
  (:func:`~lowlat_mw.cache.pack_reply`), expiring after ``cache_ttl``; ``lowlat:c:lru`` (a sorted set: keys by
  last use), ``lowlat:c:sizes`` (a hash: key -> bytes) and ``lowlat:c:bytes`` (their total, at most
  ``cache_size``: the least recently used go first, in one script).

A client that resumes on a process that does not hold its session (or no longer holds it: the session
moved) gets it from Redis: finished streams replayed, streams still running elsewhere followed live
until their End (:meth:`SharedSessions.follow`). A stream whose process died ends, after what that
process wrote, with ``Error{resume_failed, retryable}``: the client has every Delta up to there, with no
gap and no duplicate, and knows the rest is lost. docs/scaling.md has the whole story.

While Redis is unreachable, sessions work as before in their own process; the failure is logged once
(and counted in ``lowlat_session_store_errors_total``), and writes resume when it is back. A session
whose writes failed cannot be resumed elsewhere from before the failure (its streams fail with
``resume_failed``: a gap is never replayed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import struct
import uuid
import weakref
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cache import pack_reply, unpack_reply
from ..endpoint import Endpoint
from ..errors import ErrorCode, SettingsError
from ..protocol import events as ev
from ..protocol.session import Session
from ..settings import Settings

__all__ = ["RemoteSession", "SharedSessions", "check_store_url", "open_endpoint", "pack", "principal_key",
           "process_id", "shared_sessions", "unpack"]

log = logging.getLogger("lowlat_mw")

_process_id = [uuid.uuid4().hex[:16]]


def process_id() -> str:
    """This process, as the shared store knows it (who writes an entry, who is alive): drawn again in a forked
    child (gunicorn's workers fork from a master that imported this module)."""
    return _process_id[0]


os.register_at_fork(after_in_child=lambda: _process_id.__setitem__(0, uuid.uuid4().hex[:16]))

ALIVE_TTL_MS = 5000      # a process's liveness key outlives its last refresh by this much
ALIVE_EVERY = 1.0        # seconds between refreshes
FOLLOW_QUIET = 1.0       # seconds a followed stream may bring nothing new before its writer's liveness is checked
TAIL_BLOCK_MS = 50       # the shared tail's blocking read: a stream followed anew is read from within this
MAX_ENTRIES = 100_000    # entries kept per session stream at most (an entry is up to 10 ms of its output)
MIN_ENTRIES = 16         # entries kept at least, however big (the latest streams' starts and ends with them)
EXACT_BELOW = 1000       # a trim to fewer entries is exact (Redis trims approximately in nodes of ~100 entries)
TIMEOUT = 5.0            # seconds for a Redis command or connection (or to wait for a free one of the pool)
POOL_SIZE = 64           # Redis connections per process and event loop at most (one is the tail of followed streams)
READ_TIMEOUT = 1.0       # seconds a resume waits for the store before it goes on without it
RETRY_AFTER = 1.0        # seconds between write attempts while the store fails
WRITE_EVERY = 0.010      # seconds between writes: a pipelined write costs ~50 us of CPU in redis-py, so a busy
#                          process writes many loop turns' output at once (measured per round trip: +19 us at
#                          10 ms, +55 us at 2 ms, docs/benchmarks.md); a kill may lose 10 ms of output (no gap)
JOURNAL_MAX = 65_536     # records a session may hold while a write is in flight; past it its Deltas are dropped

_DELTA_TEXT, _DELTA_BYTES, _START, _END, _ERROR, _DELTA_TOOL_CALL = range(6)
_HEAD = struct.Struct(">BIII")  # kind, stream id, seq, payload length


# ================================================================================ records
def pack(journal: list[Any]) -> bytes:
    """A session's journal (flat: stream, 0, None for a start; stream, seq, piece per Delta; stream, -1, End or Error
    for an end; see ``Session.journal``) as bytes."""
    out: list[bytes] = []
    head = _HEAD.pack
    it = iter(journal)
    for sid, seq, item in zip(it, it, it, strict=True):
        if seq > 0:
            if type(item) is str:
                data = item.encode("utf-8", "surrogatepass")
                out.append(head(_DELTA_TEXT, sid, seq, len(data)))
            elif type(item) is ev.ToolCall:  # (v1.3)
                data = json.dumps([item.id, item.name, item.arguments]).encode()
                out.append(head(_DELTA_TOOL_CALL, sid, seq, len(data)))
            else:
                data = item
                out.append(head(_DELTA_BYTES, sid, seq, len(data)))
            out.append(data)
        elif seq == 0:
            out.append(head(_START, sid, 0, 0))
        elif isinstance(item, ev.End):
            data = json.dumps({"last_seq": item.last_seq, "finish_reason": item.finish_reason,
                               "timings_ms": dict(item.timings_ms), "usage": dict(item.usage)}).encode()
            out.append(head(_END, sid, 0, len(data)))
            out.append(data)
        else:
            data = json.dumps({"code": int(item.code), "message": item.message, "retryable": item.retryable}).encode()
            out.append(head(_ERROR, sid, 0, len(data)))
            out.append(data)
    return b"".join(out)


def unpack(data: bytes) -> list[tuple[int, int, Any]]:
    """The records :func:`pack` made, as (stream, seq, piece) / (stream, 0, None) / (stream, -1, End|Error)."""
    records: list[tuple[int, int, Any]] = []
    pos, end, size = 0, len(data), _HEAD.size
    while pos < end:
        kind, sid, seq, n = _HEAD.unpack_from(data, pos)
        pos += size
        payload = data[pos:pos + n]
        pos += n
        if kind == _DELTA_TEXT:
            records.append((sid, seq, payload.decode("utf-8", "surrogatepass")))
        elif kind == _DELTA_BYTES:
            records.append((sid, seq, bytes(payload)))
        elif kind == _DELTA_TOOL_CALL:
            call_id, name, arguments = json.loads(payload)
            records.append((sid, seq, ev.ToolCall(name, arguments, id=call_id)))
        elif kind == _START:
            records.append((sid, 0, None))
        elif kind == _END:
            f = json.loads(payload)
            records.append((sid, -1, ev.End(stream_id=sid, last_seq=f["last_seq"], finish_reason=f["finish_reason"],
                                            timings_ms=f["timings_ms"], usage=f["usage"])))
        elif kind == _ERROR:
            f = json.loads(payload)
            records.append((sid, -1, ev.Error(stream_id=sid, code=ErrorCode(f["code"]), message=f["message"],
                                              retryable=f["retryable"])))
    return records


def principal_key(principal: object) -> str:
    """Who authenticated, as a string every process derives alike ("" for nobody).

    Text and numbers as they are; a user object by its class and primary key (Django's ``pk``,
    Flask-Login's ``get_id()``, an ``id``). Anything else cannot be compared across processes: a key that
    matches nothing, so such a session is resumed only in its own process."""
    if principal is None:
        return ""
    if isinstance(principal, str | int | float | bool):
        return f"{type(principal).__name__}:{principal}"
    kind = f"{type(principal).__module__}.{type(principal).__qualname__}"
    for name in ("pk", "id"):
        value = getattr(principal, name, None)
        if isinstance(value, str | int) and not callable(value):
            return f"{kind}:{value}"
    get_id = getattr(principal, "get_id", None)
    if callable(get_id):
        try:
            return f"{kind}:{get_id()}"
        except Exception:  # an anonymous user's get_id may raise
            pass
    return f"{kind}@{process_id()}:{id(principal)}"


def token_digest(token: str) -> str:
    """What the store keeps of a resume token: its SHA-256 (a leaked store does not hand out tokens)."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_store_url(url: str) -> None:
    """SettingsError unless `url` is a Redis URL that answers a PING (at start-up: a wrong URL stops the app)."""
    try:
        import redis
    except ImportError:
        raise SettingsError("session_store: a Redis store needs the redis package: "
                            "pip install 'lowlat-mw[redis]'") from None
    try:
        client = redis.Redis.from_url(url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)
    except ValueError as exc:
        raise SettingsError(f"session_store: not a Redis URL: {url!r} ({exc})") from None
    try:
        client.ping()
    except redis.RedisError as exc:
        raise SettingsError(f"session_store: cannot reach Redis at {_safe(url)}: {exc}") from None
    finally:
        client.close()


def _safe(url: str) -> str:
    """`url` without its password."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def open_endpoint(model: Any, settings: Settings, *, registry: Any = None) -> Endpoint:
    """An :class:`~lowlat_mw.endpoint.Endpoint`, its shared session store checked first (what every adapter builds
    its app with: a wrong ``session_store`` stops the app when it is built or starts, not at the first resume)."""
    if settings.shares_sessions:
        check_store_url(settings.session_store)
        from .push import push_hub

        push_hub().listen(settings.session_store)  # pushes from other processes reach this one's connections
    return Endpoint(model, settings, registry=registry)


def shared_sessions(endpoint: Endpoint) -> SharedSessions | None:
    """The running loop's shared session store of `endpoint` (Redis), or None where sessions stay in this process."""
    settings = endpoint.settings
    if not settings.shares_sessions:
        return None
    return SharedSessions.for_loop(settings.session_store, settings, endpoint.metrics)


def _ends_only(journal: list[Any]) -> list[Any]:
    """The starts and ends of a journal (its Deltas dropped: the gap they leave is seen, never replayed)."""
    kept: list[Any] = []
    for i in range(0, len(journal), 3):
        if journal[i + 1] <= 0:
            kept += journal[i:i + 3]
    return kept


# ================================================================================ loading
@dataclass
class RemoteStream:
    """One stream as the shared store has it."""

    first_seq: int = 1
    pieces: list[str | bytes] = field(default_factory=list)
    terminal: ev.End | ev.Error | None = None
    writer: str = ""
    broken: bool = False  # a seq is missing (a failed write): nothing past the gap can be replayed

    def fold(self, writer: str, seq: int, item: Any) -> None:
        """Take one record of this run (not a start). Its Deltas, End and Error count only from the process that
        started the run (a process that relays it writes nothing of it; an older run of a reused stream id is
        ignored); an End past the last Delta kept, or a Delta past the next seq, means Deltas were lost: broken."""
        if self.terminal is not None or writer != self.writer:
            return
        last = self.first_seq - 1 + len(self.pieces)
        if seq < 0:
            self.terminal = item
            if isinstance(item, ev.End) and item.last_seq != last:
                self.broken = True
        elif not self.broken:
            if seq == last + 1:
                self.pieces.append(item)
            elif seq > last + 1:
                self.broken = True


@dataclass
class RemoteSession:
    """A session as the shared store has it: enough to resume it in this process."""

    session_id: str
    token_digest: str
    principal: str
    owner: str
    streams: dict[int, RemoteStream]
    last_id: bytes | str  # the last entry read: a follower reads on from here
    groups: frozenset[str] = frozenset()  # the push groups it is in

    def apply(self, writer: str, records: Iterable[tuple[int, int, Any]]) -> None:
        """Fold one entry's records into the streams (a start begins a stream's run again: RemoteStream.fold)."""
        streams = self.streams
        for sid, seq, item in records:
            if seq == 0:  # (re)started: a stream id a client reuses begins again
                streams[sid] = RemoteStream(writer=writer)
                continue
            st = streams.get(sid)
            if st is None:  # its start was trimmed away: what is left begins at this seq
                first = seq if seq > 0 else item.last_seq + 1 if isinstance(item, ev.End) else 1
                st = streams[sid] = RemoteStream(first_seq=first, writer=writer)
            st.fold(writer, seq, item)

    def to_session(self, settings: Settings, token: str, now: float) -> tuple[Session, dict[int, str]]:
        """A local :class:`Session` with these streams, and the running ones to follow (stream -> writer)."""
        session = Session(settings, now=now, session_id=self.session_id, secret=token.partition(".")[2])
        session.rejoin(self.groups)
        follow: dict[int, str] = {}
        for sid, st in self.streams.items():
            terminal = st.terminal
            if st.broken:  # (ended or not: what follows the gap is never replayed)
                terminal = ev.Error(stream_id=sid, code=ErrorCode.RESUME_FAILED, retryable=True,
                                    message=f"stream {sid}: its output after seq "
                                            f"{st.first_seq - 1 + len(st.pieces)} was not saved")
            running = terminal is None
            session.restore(sid, st.first_seq, st.pieces, terminal, now, followed=running)
            if running:
                follow[sid] = st.writer
        return session, follow


def _entry_id(entry_id: bytes | str) -> tuple[int, int]:
    """A Redis Stream entry id ("<ms>-<seq>") as numbers, to compare."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


@dataclass(eq=False, slots=True)
class _Follower:
    """One stream followed from the shared store: its session's key, the last entry it read, what the tail brings,
    and the run folded from its records so far (the same rules as a resume's RemoteSession.apply)."""

    key: str
    last: bytes | str
    stream_id: int
    seq: int  # the last seq relayed
    run: RemoteStream
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    done: bool = False  # its End or Error was relayed

    def lost(self, why: str) -> ev.Error:
        """The Error that ends the stream when the rest of it cannot be had (resume_failed, retryable)."""
        self.done = True
        return ev.Error(stream_id=self.stream_id, code=ErrorCode.RESUME_FAILED, retryable=True,
                        message=f"stream {self.stream_id} lost after seq {self.seq}: {why}")

    def relay(self, got: list[Any]) -> Iterator[Any]:
        """This stream's chunks in the entries `got` (one tail read), then its End or Error if they hold it
        (`done` is then set); entries it already read (another follower of its session started further back)
        are skipped."""
        run, stream_id = self.run, self.stream_id
        newer_than = _entry_id(self.last)
        for entry_id, fields in got:
            if _entry_id(entry_id) <= newer_than:
                continue  # (read again for a follower of the same session that started further back)
            self.last = entry_id
            for sid, s, item in unpack(fields[b"b"]):
                if sid != stream_id:
                    continue
                if s == 0:  # the stream id was reused: this stream ended without its End reaching the store
                    yield self.lost("its end was not saved")
                    return
                run.fold(fields[b"o"].decode(), s, item)
                yield from run.pieces
                run.first_seq += len(run.pieces)  # (what was relayed is not kept)
                run.pieces.clear()
                self.seq = run.first_seq - 1
                if run.broken:
                    yield self.lost("part of its output was not saved")
                    return
                if run.terminal is not None:
                    self.done = True
                    yield run.terminal
                    return


class _Tail:
    """The process's (one event loop's) reader of the streams it follows from other processes: one blocking XREAD
    at a time for all of them (one Redis connection: a connection each would run out of the pool at 100 streams
    followed), each follower handed its session's new entries."""

    def __init__(self, store: SharedSessions) -> None:
        self.store = store
        self.followers: dict[str, list[_Follower]] = {}  # by session key
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()

    async def follow(self, session_id: str, stream_id: int, after: bytes | str, seq: int,
                     writer: str) -> AsyncIterator[Any]:
        """What :meth:`SharedSessions.follow` yields: the stream's chunks after `seq`, then its End or Error."""
        follower = _Follower(f"lowlat:d:{session_id}", after, stream_id, seq,
                             RemoteStream(first_seq=seq + 1, writer=writer))
        self._join(follower)
        loop = self.store.loop
        quiet_since = loop.time()
        try:
            while not follower.done:
                got = await follower.queue.get()
                if isinstance(got, BaseException):
                    yield follower.lost("the session store is unreachable")
                    return
                if not got:  # nothing new in one tail read
                    self.wake.set()  # (its queue is empty again: the tail may read its session)
                    if loop.time() - quiet_since < FOLLOW_QUIET:
                        continue
                    quiet_since = loop.time()
                    why = await self._writer_gone(writer)
                    if why:
                        yield follower.lost(why)
                        return
                    continue
                quiet_since = loop.time()
                for item in follower.relay(got):
                    yield item
                if not follower.done:
                    self.wake.set()  # done with what it had: the tail may read its session again
        finally:
            self._leave(follower)

    def _join(self, follower: _Follower) -> None:
        """Add `follower` to those the tail reads for, starting the tail if it is not running."""
        self.followers.setdefault(follower.key, []).append(follower)
        if self.task is None or self.task.done():
            self.task = self.store.loop.create_task(self._read())
        self.wake.set()

    def _leave(self, follower: _Follower) -> None:
        """Take `follower` off the tail's list (its stream ended, or its reader went)."""
        group = self.followers.get(follower.key)
        if group is not None and follower in group:
            group.remove(follower)
            if not group:
                del self.followers[follower.key]

    async def _writer_gone(self, writer: str) -> str:
        """Why a followed stream that brought nothing new for FOLLOW_QUIET cannot go on ("" while its writer
        process is alive): that process stopped, or the store cannot be reached."""
        try:
            alive = await self.store.redis.exists(f"lowlat:p:{writer}")
        except Exception as exc:
            self.store._failed("read", exc)
            return "the session store is unreachable"
        return "" if alive else "the process running it stopped"

    async def _read(self) -> None:
        """Read every followed session's new entries with one blocking XREAD at a time and hand each follower its
        session's. A session is read again once all its followers are done with what they got (backpressure:
        a slow client's stream is not read ahead into memory)."""
        while self.followers:
            cursors: dict[str, Any] = {}
            for key, group in self.followers.items():
                if all(f.queue.empty() for f in group):
                    cursors[key] = min((f.last for f in group), key=_entry_id)
            if not cursors:
                self.wake.clear()
                await self.wake.wait()
                continue
            try:
                found = await self.store.redis.xread(cursors, count=256, block=TAIL_BLOCK_MS)
            except Exception as exc:
                self.store._failed("read", exc)
                for group in self.followers.values():
                    for follower in group:
                        follower.queue.put_nowait(exc)
                self.followers = {}
                return
            entries = {(key.decode() if isinstance(key, bytes) else key): got for key, got in found or ()}
            for key in cursors:
                for follower in self.followers.get(key, ()):
                    follower.queue.put_nowait(entries.get(key))


# ================================================================================ the cache tier's scripts
CACHE_TIMEOUT = 0.1  # seconds a result cache lookup may take (loopback Redis answers in well under 1 ms)

# Get a kept reply and note its use (its place in the LRU order).
_CACHE_GET = """
local data = redis.call('GET', KEYS[1])
if data then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], 'XX', t[1] * 1000000 + t[2], ARGV[1])
end
return data
"""
# Keep a reply, then drop the least recently used until the tier's bytes fit `capacity`. (An entry that expired
# still counts until it is dropped: the count is an upper bound, so the bound holds.)
_CACHE_PUT = """
local old = redis.call('HGET', KEYS[3], ARGV[1])
if old then redis.call('DECRBY', KEYS[4], old) end
local size = string.len(ARGV[2])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], size)
local t = redis.call('TIME')
redis.call('ZADD', KEYS[2], t[1] * 1000000 + t[2], ARGV[1])
local total = redis.call('INCRBY', KEYS[4], size)
local capacity = tonumber(ARGV[4])
while total > capacity do
  local oldest = redis.call('ZPOPMIN', KEYS[2])
  if #oldest == 0 then break end
  local sz = redis.call('HGET', KEYS[3], oldest[1]) or 0
  redis.call('HDEL', KEYS[3], oldest[1])
  redis.call('DEL', 'lowlat:c:' .. oldest[1])
  total = redis.call('DECRBY', KEYS[4], sz)
end
return total
"""


# ================================================================================ the store
class SharedSessions:
    """One event loop's connection to the shared store (Redis): the journal writer and the resume reader."""

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, SharedSessions]] = (
        weakref.WeakKeyDictionary())

    def __init__(self, url: str, settings: Settings, loop: asyncio.AbstractEventLoop, metrics: Any = None) -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.settings = settings
        self.loop = loop
        self.metrics = metrics
        self.ttl = max(1, round(settings.resume_window + 1))
        # A pool that makes a command wait for a free connection (up to TIMEOUT) rather than fail: a failover brings
        # a hundred resumes at once, and "Too many connections" would read as Redis being down.
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=TIMEOUT,
                                                        socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT,
                                                        health_check_interval=30)
        self.redis = aioredis.Redis(connection_pool=pool)
        # The result cache's shared tier: scripts run by hash, loaded by redis-py when Redis does not have them yet.
        self._cache_off_until = 0.0  # (loop time) no cache lookups before it: the last one failed
        self._cache_get = self.redis.register_script(_CACHE_GET)
        self._cache_put = self.redis.register_script(_CACHE_PUT)
        self._dirty: dict[int, Session] = {}  # sessions with journal records not yet written, by id()
        self._meta: dict[str, dict[str, str]] = {}  # session hash fields not yet written
        self._held: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()  # shared from here
        self._scheduled = False
        self._writing: asyncio.Task[None] | None = None
        self.down = False
        """The store failed and has not answered since (logged once per outage)."""
        self._retry_at = 0.0
        self._alive: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()  # writes behind the caller (referenced until done)
        self._inputs_out: deque[tuple[str, ev.Input]] = deque()  # (v1.3) Inputs for other processes, in order
        self._input_sender: asyncio.Task[None] | None = None
        self._entry_bytes: dict[str, float] = {}  # each writing session's average entry size (moving)
        self._tail = _Tail(self)  # streams followed from other processes: one blocking XREAD reads them all
        self.stream_bytes = 2 * settings.resume_buffer_size
        """Bytes of output kept in Redis per session, about: twice what the replay buffer keeps in memory."""

    @classmethod
    def for_loop(cls, url: str, settings: Settings, metrics: Any = None) -> SharedSessions:
        """The running loop's store for `url` (made on first use)."""
        loop = asyncio.get_running_loop()
        stores = cls._by_loop.setdefault(loop, {})
        found = stores.get(url)
        if found is None:
            found = stores[url] = cls(url, settings, loop, metrics)
        return found

    # ------------------------------------------------------------------ writing
    def share(self, session: Session, principal: object, *, hold: bool = True) -> None:
        """Journal `session` from now on (its streams, Deltas and Ends go to the store) and record who owns it.
        `hold`: keep its keys from expiring while this process holds it (a session with streams; one that never
        streams is known for `ttl` after its Welcome, long enough for a resume of a Request lost in a drop)."""
        session.start_journal()
        self._meta[session.session_id] = {"token": token_digest(session.resume_token),
                                          "principal": principal_key(principal), "owner": process_id(),
                                          "groups": "\n".join(sorted(session.groups))}
        if hold:
            self._held[session.session_id] = session
        self.touch(session)

    def groups_changed(self, session: Session) -> None:
        """`session` joined or left a push group: a resume in another process puts it in the same ones."""
        self._meta.setdefault(session.session_id, {})["groups"] = "\n".join(sorted(session.groups))
        self.touch(session)

    def touch(self, session: Session) -> None:
        """`session` may have new journal records: write them (with everything else new) within WRITE_EVERY."""
        self._dirty[id(session)] = session
        journal = session.journal
        if journal is not None and len(journal) > 3 * JOURNAL_MAX:  # the store is slow: a gap rather than no bound
            session.shrink_journal(_ends_only(journal))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_later(WRITE_EVERY, self._flush)
        if self._alive is None:
            self._alive = self.loop.create_task(self._keep_alive())

    def _flush(self) -> None:
        self._scheduled = False
        if self._writing is not None:  # one write in flight at a time: what comes meanwhile goes in the next
            return
        wait = self._retry_at - self.loop.time()
        if wait > 0:  # the store failed a moment ago: try again a little later, not every loop turn
            self._scheduled = True
            self.loop.call_later(wait, self._flush)
            return
        dirty, self._dirty = self._dirty, {}
        meta, self._meta = self._meta, {}
        batch: list[tuple[Session, list[Any]]] = []
        pipe = self.redis.pipeline(transaction=False)
        ttl = self.ttl
        commands = 0
        for sid, fields in meta.items():
            key = f"lowlat:s:{sid}"
            pipe.hset(key, mapping=fields)
            pipe.expire(key, ttl)
            commands += 1
        for session in dirty.values():
            sid = session.session_id
            journal = session.take_journal()
            if not journal:
                continue
            batch.append((session, journal))
            key = f"lowlat:d:{sid}"
            packed = pack(journal)
            # Bounded by bytes too (Redis trims by count): as many entries as stream_bytes holds at the session's
            # average entry size, so a long, fast stream keeps about its last stream_bytes, as the replay buffer does.
            average = self._entry_bytes.get(sid)
            average = self._entry_bytes[sid] = len(packed) if average is None else average + (len(packed) - average) / 8
            keep = max(MIN_ENTRIES, min(MAX_ENTRIES, int(self.stream_bytes / max(average, 1.0))))
            pipe.xadd(key, {"o": process_id(), "b": packed}, maxlen=keep, approximate=keep >= EXACT_BELOW)
            pipe.expire(key, ttl)
            pipe.expire(f"lowlat:s:{sid}", ttl)
            commands += 1
        if commands:
            self._writing = self.loop.create_task(self._write(pipe, meta, batch))

    async def _write(self, pipe: Any, meta: dict[str, dict[str, str]],
                     batch: list[tuple[Session, list[Any]]]) -> None:
        try:
            await pipe.execute()
        except Exception as exc:  # Redis down, a timeout: sessions go on in this process
            self._failed("write", exc)
            self._retry_at = self.loop.time() + RETRY_AFTER
            # Written again later: the sessions' hashes, and their streams' starts and ends (a stream whose Deltas
            # were lost then shows a gap, and fails a resume elsewhere, instead of never ending there).
            for sid, fields in meta.items():
                self._meta.setdefault(sid, fields)
            for session, journal in batch:
                kept = _ends_only(journal)
                if kept and session.journal is not None:  # (a write that timed out but landed repeats its starts:
                    session.requeue_journal(kept)        # the stream then restarts there, and fails a resume)
                    self._dirty[id(session)] = session
        else:
            self._ok()
        finally:
            self._writing = None
            if (self._dirty or self._meta) and not self._scheduled:
                self._flush()

    def _ok(self) -> None:
        if self.down:
            self.down = False
            log.warning("session store %s reachable again: sessions are shared again", _safe(self.url))

    def _failed(self, operation: str, exc: BaseException) -> None:
        if self.metrics is not None:
            self.metrics.inc("session_store_errors", operation)
        if not self.down:
            self.down = True
            log.warning("session store %s unreachable (%s): sessions go on in this process, without resume in "
                        "another one, until it is back", _safe(self.url), exc)

    async def _keep_alive(self) -> None:
        """Say this process is alive (followers of its streams elsewhere check it) while the loop runs, and keep
        the keys of the sessions it holds from expiring (a quiet session would lose them after `ttl`)."""
        key = f"lowlat:p:{process_id()}"
        refresh_every = max(1, round(self.ttl / (3 * ALIVE_EVERY)))
        beat = 0
        while True:
            try:
                beat += 1
                if beat % refresh_every == 0 and self._held:
                    pipe = self.redis.pipeline(transaction=False)
                    for sid in list(self._held.keys()):
                        pipe.expire(f"lowlat:s:{sid}", self.ttl)
                        pipe.expire(f"lowlat:d:{sid}", self.ttl)
                    pipe.set(key, "1", px=ALIVE_TTL_MS)
                    await pipe.execute()
                else:
                    await self.redis.set(key, "1", px=ALIVE_TTL_MS)
                self._ok()
            except Exception as exc:
                self._failed("alive", exc)
            await asyncio.sleep(ALIVE_EVERY)

    def release(self, session: Session) -> None:
        """This process gives `session` up (destroyed): it no longer owns it in the store, and its keys expire."""
        sid = session.session_id
        if self._held.get(sid) is session:  # (not a newer session object of the same id, resumed here since)
            del self._held[sid]
            self._entry_bytes.pop(sid, None)
            self._meta.setdefault(sid, {})["owner"] = ""
            self.touch(session)

    def input_elsewhere(self, session_id: str, inp: ev.Input) -> None:
        """(v1.3) The client sent input for a stream this process relays from another: hand it to that process (on
        the push channel), after the ones before it: one sender task, in order."""
        self._inputs_out.append((session_id, inp))
        if self._input_sender is None or self._input_sender.done():
            self._input_sender = self.loop.create_task(self._send_inputs())

    async def _send_inputs(self) -> None:
        from .push import channel, input_message

        queue = self._inputs_out
        while queue:
            session_id, inp = queue.popleft()
            try:
                await self.redis.publish(channel(self.url), input_message(session_id, inp))
            except Exception as exc:  # Redis unreachable: this input is lost, and the model waits (as pushes are)
                self._failed("write", exc)

    # ------------------------------------------------------------------ the result cache's shared tier
    async def cache_get(self, key: bytes) -> tuple[str | bytes, ...] | None:
        """The reply another process (or this one) kept in Redis for `key`, if any; None on a miss, and while Redis
        cannot be reached (a miss: the model runs)."""
        if self.loop.time() < self._cache_off_until:
            return None
        try:
            async with asyncio.timeout(CACHE_TIMEOUT):  # (a miss is cheaper than a slow store: the model runs)
                data = await self._cache_get(keys=[f"lowlat:c:{key.hex()}", "lowlat:c:lru"], args=[key.hex()])
        except Exception as exc:
            # Not asked again for a second, so requests do not each wait out a hung store (the journal's own
            # retries are separate: a cache miss says nothing they need).
            self._cache_off_until = self.loop.time() + 1.0
            if self.metrics is not None:
                self.metrics.inc("session_store_errors", "read")
            log.debug("result cache lookup in %s failed: %r", _safe(self.url), exc)
            return None
        return unpack_reply(data) if data else None

    def cache_put(self, key: bytes, chunks: Sequence[str | bytes]) -> None:
        """Keep the reply `chunks` for `key` in Redis too (for `cache_ttl`, within `cache_size` for the whole tier),
        written behind the stream, in a task of its own."""
        data = pack_reply(chunks)
        if len(data) > max(1, self.settings.cache_size // 4):  # (as the memory tier: a quarter at most)
            return

        async def write() -> None:
            try:
                await self._cache_put(keys=[f"lowlat:c:{key.hex()}", "lowlat:c:lru", "lowlat:c:sizes",
                                            "lowlat:c:bytes"],
                                      args=[key.hex(), data, max(1, round(self.settings.cache_ttl * 1000)),
                                            self.settings.cache_size])
            except Exception as exc:
                self._failed("write", exc)

        self._behind(write())

    def cancel_elsewhere(self, session_id: str, stream_id: int) -> None:
        """The client cancelled a stream this process relays from another: tell that process to stop its model
        (on the push channel, which every serving process reads), in a task of its own."""
        from .push import cancel_message, channel

        async def send() -> None:
            try:
                await self.redis.publish(channel(self.url), cancel_message(session_id, stream_id))
            except Exception as exc:  # the model runs on to its end there, as before the store knew of cancels
                self._failed("write", exc)

        self._behind(send())

    def _behind(self, coro: Any) -> None:
        """Run `coro` (a write that reports its own failure) in a task of its own, kept referenced until done."""
        task = self.loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def flushed(self, timeout: float = TIMEOUT) -> None:
        """Wait (up to `timeout`) until everything journaled so far has been written (or failed): a draining
        process calls it before it exits."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._writing is not None or self._dirty or self._meta:
                    if self._writing is not None:
                        await asyncio.wait([self._writing])
                    elif not self._scheduled:
                        self._flush()
                    else:
                        await asyncio.sleep(0.01)

    # ------------------------------------------------------------------ resuming
    async def owner(self, session_id: str) -> str | None:
        """The process that holds `session_id`, as the store says: "" when none does (no such session, or its
        process gave it up); None when the store cannot say (unreachable, down)."""
        if self.down:
            return None
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                owner = await self.redis.hget(f"lowlat:s:{session_id}", "owner")
        except Exception as exc:
            self._failed("read", exc)
            return None
        return owner.decode() if owner is not None else ""

    async def alive(self, process: str) -> bool | None:
        """Whether `process` said it was alive within the last 5 s (None: the store cannot say)."""
        if self.down:
            return None
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                return bool(await self.redis.exists(f"lowlat:p:{process}"))
        except Exception as exc:
            self._failed("read", exc)
            return None

    async def load(self, session_id: str, token: str) -> RemoteSession | None:
        """`session_id` from the store, if it is there and `token` is its resume token (else None)."""
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                pipe = self.redis.pipeline(transaction=False)
                pipe.hgetall(f"lowlat:s:{session_id}")
                pipe.xrange(f"lowlat:d:{session_id}")
                meta, entries = await pipe.execute()
        except Exception as exc:
            self._failed("read", exc)
            return None
        digest = meta.get(b"token", b"").decode()
        if not digest or not hmac.compare_digest(digest, token_digest(token)):
            return None
        groups = meta.get(b"groups", b"").decode()
        remote = RemoteSession(session_id, digest, meta.get(b"principal", b"").decode(),
                               meta.get(b"owner", b"").decode(), {}, entries[-1][0] if entries else b"0-0",
                               frozenset(groups.split("\n")) if groups else frozenset())
        for _, fields in entries:
            remote.apply(fields[b"o"].decode(), unpack(fields[b"b"]))
        return remote

    def follow(self, session_id: str, stream_id: int, after: bytes | str, seq: int,
               writer: str) -> AsyncIterator[Any]:
        """The chunks of a stream another process is running, after `seq`, read from entry `after` on; then
        its End or Error. If that process stops (or Redis goes) first: an Error resume_failed (retryable).
        Read by the process's one tail of followed streams (:class:`_Tail`), not by a connection of its own."""
        return self._tail.follow(session_id, stream_id, after, seq, writer)

    async def aclose(self) -> None:
        """Write what is left and close the connection (tests; a process that ends just stops)."""
        if self._alive is not None:
            self._alive.cancel()
        if self._dirty or self._meta:
            self._flush()
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        await self.redis.aclose(close_connection_pool=True)
