"""examples/context_app.py: the context example's client against its app, in process, in both wire formats."""

from __future__ import annotations

import pytest

from examples import context_app
from lowlat_mw.testing.inprocess import AppClient

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_the_example_edits_a_document_and_continues_the_conversation(mode: str) -> None:
    async with AppClient(context_app.app, "/ws", mode=mode, history=True) as client:
        first, second = await context_app.demo(client)
    assert first == "main.py v3: 4 lines, the whole text is new.\nline 2:     print('hello, world')\n"
    assert second == ("(earlier: 'what is line 2' -> 78 characters)\n"
                      "main.py v3: 4 lines, 0 patches since last time.\nline 4: main()\n")
