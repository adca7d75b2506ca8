"""Context suite: bytes a client sends to edit a document the model reads, patches (protocol v1.3) against
resending the whole document with every request.

In process (the Python AsyncClient on an in-memory WebSocket to the Starlette middleware, default settings), in
both wire formats. A document of ``doc_bytes`` (deterministic text of words and code-like lines, about 1 in 40
characters non-ASCII) is edited ``patches`` times, typing-sized edits at random places (insert 1-20 characters,
delete up to 10, or replace a few); after each edit the client asks the model one short question about it:

* **resend**: every request carries the whole current document as its input (``text``), as a client without
  context documents does;
* **resend, compressed** (Protobuf only): the same, with the client's compressor told the link is slow (1 Mbit/s),
  so that it compresses every resent document (at its default, 1 Gbit/s, it finds that compressing 50 KB costs
  more time than the bytes save, and sends most of them as they are);
* **context**: the document is created once (``client.context``), each edit is one ``Context`` patch, and each
  request names the document (``context=[doc]``).

Counted: every WebSocket message the client sends after its Hello (Requests, Contexts, Acks, Pings), each as its
frame on the wire: the payload as sent (Protobuf frames are compressed where the client and server negotiate it,
as they do by default) plus the client's WebSocket header (2, 4 or 10 bytes and the 4-byte mask). The model checks
the SHA-256 of the text it was given against the client's after every edit, so a run that loses an edit fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass
from typing import Any

from .core import SuiteResult, log, machine_facts, markdown_table, suite

NAME = "context"
HEADING = "Context documents: bytes sent for patches against resending the document"
TARGET = 0.05  # issue 19, item 2: 100 small patches to a 50 KB document send under 5% of resending it
SEED = 19


@dataclass(frozen=True)
class Size:
    doc_bytes: int
    patches: int


SIZES = {
    "tiny": Size(doc_bytes=5_000, patches=10),
    "quick": Size(doc_bytes=50_000, patches=100),
    "full": Size(doc_bytes=50_000, patches=100),
}
MODES = ("proto", "json")
WORDS = ("def", "return", "self", "value", "for", "in", "range", "if", "else", "print", "name", "data", "x", "y",
         "café", "naïve", "→", "total", "count", "item", "list", "dict", "None", "True", "False", "await")


def document(size: int, rng: random.Random) -> str:
    """Deterministic code-like text of about `size` UTF-8 bytes."""
    lines, total = [], 0
    while total < size:
        line = "    " * rng.randrange(3) + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 10)))
        lines.append(line)
        total += len(line.encode()) + 1
    return "\n".join(lines)[:size]


def edits(text_len: int, rng: random.Random) -> tuple[int, int, str]:
    """One typing-sized edit of a text of `text_len` characters: (offset, length, new text)."""
    offset = rng.randrange(text_len + 1)
    kind = rng.random()
    if kind < 0.6:  # typing
        return offset, 0, " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))[:20]
    if kind < 0.8:  # deleting
        return offset, min(rng.randrange(1, 11), text_len - offset), ""
    return offset, min(rng.randrange(1, 6), text_len - offset), rng.choice(WORDS)


async def model(req: Any) -> Any:
    """The SHA-256 of what the model was given: the named document, or the request's text."""
    if req.context:
        yield hashlib.sha256(next(iter(req.context.values())).text.encode()).hexdigest()
    else:
        yield hashlib.sha256((req.text or "").encode()).hexdigest()


def _counting_client(app: Any, mode: str) -> Any:
    from lowlat_mw.testing.inprocess import AppClient

    class Counting(AppClient):
        """Counts every message it sends after the Hello, as frames on the wire."""

        sent = 0

        def count(self, frame: bytes | str) -> None:
            n = len(frame) if isinstance(frame, bytes) else len(frame.encode())
            self.sent += n + (2 if n < 126 else 4 if n < 65536 else 10) + 4  # header and mask

        async def _send(self, frame: bytes | str) -> None:
            self.count(frame)
            await super()._send(frame)

        async def _send_quietly(self, ws: Any, frame: bytes | str) -> None:
            self.count(frame)
            await super()._send_quietly(ws, frame)

    return Counting(app, "/ws", mode=mode)


async def _run(mode: str, way: str, size: Size) -> tuple[int, int]:
    """Bytes the client sent for the edits and requests, and for the document's first full text."""
    from starlette.applications import Starlette

    from lowlat_mw.adapters.starlette import LowLatMiddleware

    app = Starlette()
    app.add_middleware(LowLatMiddleware, model=model, path="/ws", metrics=False, tracing=False, rate_limit=0)
    rng = random.Random(SEED)
    text = document(size.doc_bytes, rng)
    async with _counting_client(app, mode) as client:
        if way == "resend-compressed":
            assert client.protocol.compressor is not None, "no compression negotiated"
            client.protocol.compressor.link_bps = 1e6 / 8  # a slow link: compressing always pays
        client.sent = 0
        first = 0
        doc = None
        if way == "context":
            doc = await client.context("main.py", text)
            await doc.wait_synced()
            first = client.sent
        for i in range(size.patches):
            offset, length, new = edits(len(text), rng)
            text = text[:offset] + new + text[offset + length:]
            if doc is not None:
                await doc.patch(offset, length, new)
                reply = await client.complete("what changed?", context=[doc])
            else:
                reply = await client.complete(text)
            if reply != hashlib.sha256(text.encode()).hexdigest():
                raise AssertionError(f"{mode} {way}: the model's text differs from the client's after edit {i}")
        if doc is not None:
            await doc.wait_synced()
            assert doc.state.full_sends == 1 and doc.text == text
        return client.sent, first


@suite(NAME, HEADING)
def run(mode: str) -> SuiteResult:
    size = SIZES[mode]
    rows: dict[str, dict[str, float]] = {}
    table = []
    for wire, against in (("proto", "resend"), ("proto", "resend-compressed"), ("json", "resend")):
        log(f"[context] {wire} against {against}: {size.patches} edits of a {size.doc_bytes} B document")
        resend, _ = asyncio.run(_run(wire, against, size))
        patched, first = asyncio.run(_run(wire, "context", size))
        edits_only = patched - first
        label = wire if against == "resend" else f"{wire}, resend compressed"
        rows[label] = {"resend_bytes": float(resend), "context_bytes": float(patched), "first_bytes": float(first),
                       "ratio": patched / resend, "edits_ratio": edits_only / resend}
        table.append([label, f"{resend:,}", f"{patched:,}", f"{first:,}", f"{patched / resend:.2%}",
                      f"{edits_only / resend:.2%}", f"{edits_only / size.patches:.0f}"])
    worst = max(r["ratio"] for r in rows.values())
    met = worst < TARGET
    verdict = (f"**Verdict** (issue 19, item 2: {size.patches} small patches to a {size.doc_bytes // 1000} KB "
               f"document send under {TARGET:.0%} of the bytes of resending it): the whole context run, first full "
               f"text included, sends {rows['proto']['ratio']:.2%} (proto; "
               f"{rows['proto, resend compressed']['ratio']:.2%} of a resend run with every document compressed) "
               f"and {rows['json']['ratio']:.2%} (JSON) of the resend run's bytes: **{'met' if met else 'missed'}**. "
               f"The server's text matched the client's (SHA-256) after every edit in every run.")
    header = ["wire format", f"resend: {size.patches} requests carrying the document (B)",
              "context: first text + patches + requests naming it (B)", "of which the first full text (B)",
              "context / resend", "edits only / resend", "B per edit and request"]
    text = markdown_table(header, table) + "\n\n" + verdict
    body = f"""{machine_facts(mode)}

Reproduce: `.venv/bin/python -m benchmarks --suite context` (`--quick`: the same sizes; the byte counts are
deterministic). In process: the Python client and the Starlette middleware on an in-memory WebSocket, default
settings but `rate_limit` 0 (20 requests a second by default). A {size.doc_bytes:,}-byte code-like document gets
{size.patches} typing-sized edits at random places (inserts of 1-20 characters, deletes of up to 10, small
replacements), each followed by one request; the model answers with the SHA-256 of the text it was given, which the
client checks. Counted: every message the client sends after its Hello, as WebSocket frames (payload as sent,
header and mask). "resend compressed": the client's compressor told the link is slow (1 Mbit/s), so it compresses
every resent document (at its default of 1 Gbit/s it sends most of them as they are: compressing 50 KB costs more
time than the bytes save).

{text}
"""
    return SuiteResult(NAME, HEADING, body, text, rows)
