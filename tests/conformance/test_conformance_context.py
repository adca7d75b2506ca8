"""Incremental context (protocol v1.3), on every server, in both wire formats: a 50 KB document edited with 100
small random patches, the server's text hash-identical to the client's after every one (the server checks each
patch's SHA-256 before it acknowledges it; every 10th, the model answers with the SHA-256 of the text it got),
through a resume in the middle that keeps the document; and a conversation continued by stream id."""

from __future__ import annotations

import asyncio
import hashlib
import random

import pytest

from lowlat_mw.client import Backoff, connect
from lowlat_mw.errors import ErrorCode, StreamError
from lowlat_mw.testing import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SEED = 20261203
ALPHABET = "abcdefghij klmnop\n{}();é€"  # some characters take 2 and 3 bytes in UTF-8


def hexdigest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_100_random_patches_to_a_50_kb_document_stay_identical_through_a_resume(server, mode):
    rng = random.Random(SEED)
    text = "".join(rng.choice(ALPHABET) for _ in range(50_000))
    with FaultProxy(("127.0.0.1", server.port), seed=SEED) as proxy:
        client = connect(proxy.url_base + "/ws", mode=mode,
                         backoff=Backoff(base=0.01, cap=0.1, retries=20, rng=random.Random(SEED)))
        try:
            async with asyncio.timeout(90):
                await client.open()
                assert client.welcome is not None and client.welcome.revision >= 3
                doc = await client.context("main.py", text)
                for i in range(100):
                    if i == 50:  # a resume in the middle: a stream is open while every connection is cut
                        await doc.wait_synced()
                        held = client.stream("x", model="hold", params={"delay": 0.3})
                        assert await anext(held) == "started;"
                        proxy.cut_all()
                        assert [c async for c in held] == ["done;"]
                        assert client.resumes == 1 and client.welcome.resumed
                        assert client.welcome.contexts == {"main.py": doc.version}  # the session kept it
                    current = doc.text
                    offset = rng.randrange(len(current) + 1)
                    length = rng.randrange(min(12, len(current) - offset) + 1)
                    await doc.patch(offset, length, "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(10))))
                    # Acknowledged: the server's SHA-256 of its text after the patch equals the client's (it
                    # checks the Context's sha256); every 10th, the model also says what text it was given (the
                    # servers' rate_limit allows 20 requests a second).
                    await doc.wait_synced()
                    if i % 10 == 9:
                        answer = await client.complete("hash", model="context_echo", context=[doc])
                        assert answer == f"main.py={hexdigest(doc.text)};", f"patch {i}"
                await doc.wait_synced()
                # Every patch was taken as it came: no refusal, the whole text sent once (not again after the resume).
                assert doc.state.refusal is None and doc.state.full_sends == 1 and doc.version == 101
        finally:
            await client.close()


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_a_request_continues_an_earlier_stream_and_unknown_ones_are_refused(server, mode):
    async with asyncio.timeout(30):
        async with connect(server.url, mode=mode, history=True) as client:
            first = client.stream("hello", model="sync")
            assert await first.text() == "sync:hello"
            second = client.stream("more", model="context_echo", continues=first)
            assert await second.text() == "[hello>sync:hello]"
            third = client.stream("again", model="context_echo", continues=second)
            assert await third.text() == "[hello>sync:hello][more>[hello>sync:hello]]"
            with pytest.raises(StreamError) as unknown:
                await client.complete("x", model="context_echo", continues=4242)
            assert unknown.value.code is ErrorCode.CONTEXT_MISMATCH
            with pytest.raises(StreamError) as missing:  # a document the session does not hold, named by hand
                await client.complete("x", model="context_echo", context=["never-sent"])
            assert missing.value.code is ErrorCode.CONTEXT_MISMATCH
            assert await client.complete("after", model="sync") == "sync:after"
