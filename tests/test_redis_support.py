"""The Redis of the tests (tests/redis_support.py, the redis_server / redis_url fixtures) works: a real
redis-server, reached through redis.asyncio, that can go away and come back on the same port."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry  # redis.retry.Retry is the sync client's: it would not retry here
from redis.backoff import NoBackoff
from redis_support import RedisServer


async def test_set_and_get_through_the_redis_url(redis_url: str) -> None:
    async with aioredis.Redis.from_url(redis_url, socket_timeout=5) as client:
        assert await client.dbsize() == 0  # FLUSHALL before each test
        await client.set("lowlat:key", "value", px=10_000)
        assert await client.get("lowlat:key") == b"value"


async def test_a_client_reconnects_after_redis_restarts_on_the_same_port() -> None:
    with RedisServer() as server:
        port = server.port
        # No backoff: a restarted server is reached at once, and a gone one fails at once.
        async with aioredis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=2,
                                           retry=Retry(NoBackoff(), 1)) as client:
            await client.set("before", "1")
            assert await client.get("before") == b"1"

            server.stop()
            assert not server.running
            with pytest.raises(redis.ConnectionError):
                await client.ping()

            server.start()
            assert server.port == port and server.url == f"redis://127.0.0.1:{port}/0"
            assert await client.get("before") is None  # no persistence: a restarted Redis is empty
            await client.set("after", "2")
            assert await client.get("after") == b"2"

            server.kill()  # a crash this time, then back again
            server.start()
            assert server.port == port
            assert await client.ping()
        assert server.running
    assert not server.running
