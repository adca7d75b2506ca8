"""Incremental context (protocol v1.3) in the browser client: lowlat.js in a real headless Chromium against a real
server (uvicorn in this process). The page edits a document with emoji and accents through random patches, checks
the SHA-256 the model computes of its text against its own (crypto.subtle's, independent of lowlat.js's), and
continues a stream; JSON and Protobuf clients side by side."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import Uvicorn, start_uvicorn
from prometheus_client import CollectorRegistry
from test_browser_push import run

from lowlat_mw import ModelRequest
from lowlat_mw.runtime.asgi import LowLatASGI

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def context_echo(req: ModelRequest) -> Any:
    for name, doc in sorted(req.context.items()):
        yield f"{name}={hashlib.sha256(doc.text.encode()).hexdigest()};"
    for turn in req.history:
        yield f"[{turn.prompt}>{turn.output}]"
    if not req.context and not req.history:
        yield f"echo:{req.prompt}"


@pytest.fixture(scope="module")
def context_server() -> Iterator[Uvicorn]:
    server = start_uvicorn(LowLatASGI(context_echo, client_path="/lowlat", rate_limit=0,
                                      registry=CollectorRegistry()))
    try:
        yield server
    finally:
        server.stop()


def test_the_page_patches_a_document_and_the_server_text_matches(page, context_server):
    page.get(f"{context_server.http_url}/lowlat/lowlat.js")  # a page of the server's origin, to import the module
    out = run(page, """
        const hex = async (text) => Array.from(new Uint8Array(
          await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text))),
          (b) => b.toString(16).padStart(2, "0")).join("");
        const alphabet = ["a", "b", " ", "\\n", "é", "€", "😀"];
        let seed = 11;
        const random = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
        const word = (n) => Array.from({ length: n }, () => alphabet[random(alphabet.length)]).join("");
        const out = {};
        for (const mode of ["json", "proto"]) {
          const client = new m.LowLatClient({ mode, history: true, backoff: { retries: 0 } });
          const doc = await client.context("page.txt", word(2000));
          let matched = 0, refused = 0;
          for (let i = 0; i < 30; i++) {
            for (;;) {  // a patch that would split a surrogate pair is refused by the client: pick another
              const offset = random(doc.text.length + 1);
              const length = random(Math.min(6, doc.text.length - offset) + 1);
              try { doc.patch(offset, length, word(random(5))); break; } catch (e) { refused++; }
            }
            const answer = await client.complete("q", { context: [doc] });
            if (answer === `page.txt=${await hex(doc.text)};`) matched++;
          }
          const first = client.stream("hi");
          await first.text();
          out[mode] = { matched, refused: refused > 0, version: doc.version, synced: doc.synced,
                        fullSends: doc.fullSends, continued: await client.complete("more", { continues: first }) };
          client.close();
        }
        return out;
    """)
    for mode in ("json", "proto"):
        assert out[mode] == {"matched": 30, "refused": True, "version": 31, "synced": True, "fullSends": 1,
                             "continued": "[hi>echo:hi]"}, out
