"""Incremental context (protocol v1.3): a model that reads a document the client edits, and a conversation
continued by stream id, served by the Starlette middleware.

Run the server:  uvicorn examples.context_app:app --port 8000
Run the client:  python -m examples.context_app ws://127.0.0.1:8000/ws

The client sends the document once, then only patches (each checked by the server against the SHA-256 of the
whole text); each request names the document instead of carrying it, and the second question continues the
first without resending it (docs/protocol.md section 19).
"""

from __future__ import annotations

import asyncio
import sys

from starlette.applications import Starlette

from lowlat_mw import ModelRequest
from lowlat_mw.adapters.starlette import LowLatMiddleware


async def assistant(req: ModelRequest):
    """Answers about the named documents: their size, what changed since the last request, a line asked for."""
    for turn in req.history:  # the turns this request continues, oldest first
        yield f"(earlier: {turn.prompt!r} -> {len(turn.output)} characters)\n"
    for name, doc in req.context.items():
        lines = doc.text.splitlines()
        changed = "the whole text is new" if doc.patches is None else f"{len(doc.patches)} patches since last time"
        yield f"{name} v{doc.version}: {len(lines)} lines, {changed}.\n"
        words = req.prompt.split()
        if words and words[-1].isdigit() and 0 < int(words[-1]) <= len(lines):
            yield f"line {words[-1]}: {lines[int(words[-1]) - 1]}\n"


app = Starlette()
app.add_middleware(LowLatMiddleware, model=assistant, path="/ws")


async def demo(client) -> list[str]:
    """Edit a document through `client` (an AsyncClient made with history=True) and ask about it."""
    doc = await client.context("main.py", "def main():\n    print('hello')\n")
    await doc.patch(len(doc.text), 0, "\nmain()\n")           # append: offsets are Python string indices
    await doc.replace("'hello'", "'hello, world'")             # replace the first occurrence
    first = client.stream("what is line 2", context=[doc])
    answers = [await first.text()]
    answers.append(await client.complete("and line 4", context=[doc], continues=first))
    return answers


async def _main(url: str) -> None:
    from lowlat_mw import connect

    async with connect(url, history=True) as client:
        for answer in await demo(client):
            print(answer)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8000/ws"))
