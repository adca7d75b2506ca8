"""Deterministic payload corpora for the codec and compression suites (no downloads).

Sources, all on this machine and the same for every run of one checkout and Python version:

* prose: English paragraphs of the Python documentation the interpreter ships
  (``pydoc_data.topics``, ~450 KB); the repository's docs/*.md if that module is missing;
* code: the ``.py`` files of this repository's ``lowlat_mw/`` and ``adapters/`` (generated
  Protobuf modules left out);
* tokens: that prose cut into BPE-like pieces of 1-8 characters (a leading space stays with its
  word), about 1 in 20 replaced by a non-ASCII token (accents, CJK, emoji, typographic quotes);
* chat JSON: compact JSON of chat transcripts (roles, prose contents, ids, usage, tool calls);
* binary: random bytes (already-compressed media) and float32 embeddings.

Every generator takes a :class:`random.Random`, so a seed fixes the corpus.
"""

from __future__ import annotations

import functools
import json
import random
import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NON_ASCII_TOKENS = (
    "é", " café", "ü", " naïve", "ß", "ñ", " señor", "\u2019", "\u201c", "\u201d", "—", "…", "°", "€",
    "日本", "語", "中文", "の", "は", "한국", "\u0440\u0443", "\u0441\u0441\u043a\u0438\u0439", "🙂", "🚀", "✓",
    " Zürich", "ø", "å",
)


@functools.cache
def prose_text() -> str:
    """About 450 KB of English documentation prose (paragraphs joined by blank lines)."""
    try:
        from pydoc_data.topics import topics

        parts = [topics[k] for k in sorted(topics)]
    except ImportError:  # pragma: no cover - some distributions strip pydoc_data
        parts = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))
                 if p.name != "benchmarks.md"]
        parts.append((ROOT / "README.md").read_text(encoding="utf-8"))
    paragraphs = [p.strip() for part in parts for p in part.split("\n\n")]
    # Keep paragraphs that read as prose: mostly letters and spaces, not code listings or tables.
    keep = [p for p in paragraphs if len(p) > 80 and sum(c.isalpha() or c == " " for c in p) > 0.85 * len(p)]
    return "\n\n".join(" ".join(p.split()) for p in keep)


@functools.cache
def code_text() -> str:
    """This repository's Python source (lowlat_mw/ and adapters/), file after file."""
    files = sorted([*(ROOT / "lowlat_mw").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")])
    return "\n\n".join(p.read_text(encoding="utf-8") for p in files if not p.name.endswith("_pb2.py"))


def _slice(text: str, size: int, rnd: random.Random, boundary: str) -> str:
    """About `size` UTF-8 bytes of `text` from a random `boundary` onwards (wrapping around)."""
    start = _position(rnd, len(text))
    found = text.find(boundary, start)
    start = found + len(boundary) if found >= 0 else 0
    out = text[start:start + size]
    while len(out) < size:
        out += boundary + text[: size - len(out)]
    out = out[:size]
    while len(out.encode("utf-8")) > size:  # non-ASCII: trim to the byte budget
        out = out[:-1]
    return out


def _position(rnd: random.Random, n: int) -> int:
    """A random index below `n` that takes the same 64 bits from `rnd` whatever `n` is (randrange's rejection
    sampling takes more or fewer): the corpus's shape (sizes, classes, order) then stays the same when the docs
    or the code it samples change length, only its text changes."""
    return random.Random(rnd.getrandbits(64)).randrange(n)


def prose(size: int, rnd: random.Random) -> str:
    """`size` bytes of English prose starting at a paragraph."""
    return _slice(prose_text(), size, rnd, "\n\n")


def code(size: int, rnd: random.Random) -> str:
    """`size` bytes of Python source starting at a line."""
    return _slice(code_text(), size, rnd, "\n")


@functools.cache
def _token_pool() -> tuple[str, ...]:
    pieces: list[str] = []
    for word in re.findall(r" ?[A-Za-z0-9_]+| ?[^\sA-Za-z0-9_]|\n+| +", prose_text()[:120_000]):
        # Long words split the way BPE vocabularies often do: a head of up to 8, then pieces of 2-5.
        head, rest = word[:8], word[8:]
        pieces.append(head)
        while rest:
            cut = 2 + len(rest) % 4
            pieces.append(rest[:cut])
            rest = rest[cut:]
    return tuple(pieces)


def tokens(n: int, rnd: random.Random, non_ascii: float = 0.05) -> list[str]:
    """`n` consecutive model tokens (1-8 characters), a fraction `non_ascii` of them non-ASCII."""
    pool = _token_pool()
    start = _position(rnd, len(pool) - n) if n < len(pool) else 0
    out = [pool[(start + i) % len(pool)] for i in range(n)]
    return [rnd.choice(NON_ASCII_TOKENS) if rnd.random() < non_ascii else t for t in out]


def chat_history(size: int, rnd: random.Random) -> list[dict[str, str]]:
    """Chat turns (system, then user / assistant alternating) of about `size` bytes of content."""
    turns = [{"role": "system", "content": prose(rnd.randint(120, 400), rnd)}]
    total = len(turns[0]["content"])
    while total < size:
        role = "user" if len(turns) % 2 else "assistant"
        n = rnd.randint(60, 600) if role == "user" else rnd.randint(300, 3000)
        content = code(n, rnd) if role == "assistant" and rnd.random() < 0.2 else prose(n, rnd)
        turns.append({"role": role, "content": content})
        total += len(content)
    return turns


def chat_json(size: int, rnd: random.Random) -> str:
    """Compact JSON of about `size` bytes: chat completions (ids, roles, contents, tool calls, usage)."""
    out: list[dict[str, object]] = []
    length = 2
    while length < size:
        history = chat_history(min(rnd.randint(200, 4000), max(size - length, 200)), rnd)
        item: dict[str, object] = {
            "id": f"chatcmpl-{rnd.getrandbits(96):024x}",
            "object": "chat.completion",
            "created": 1_700_000_000 + rnd.randrange(30_000_000),
            "model": rnd.choice(["demo-7b", "demo-70b-instruct", "tiny-chat"]),
            "messages": history,
            "usage": {"prompt_tokens": rnd.randrange(10, 9000), "completion_tokens": rnd.randrange(1, 2000)},
        }
        if rnd.random() < 0.4:
            item["tool_calls"] = [{
                "id": f"call_{rnd.getrandbits(64):016x}", "type": "function",
                "function": {"name": rnd.choice(["search", "get_weather", "run_sql"]),
                             "arguments": json.dumps({"query": prose(rnd.randint(20, 80), rnd),
                                                      "limit": rnd.randint(1, 50)})},
            }]
        out.append(item)
        length += len(json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode("utf-8")) + 1
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def random_bytes(size: int, rnd: random.Random) -> bytes:
    """Incompressible bytes (stands for images, audio, anything already compressed)."""
    return rnd.randbytes(size)


def embedding(dim: int, rnd: random.Random) -> bytes:
    """A float32 embedding vector of `dim` normally distributed values (little-endian)."""
    return struct.pack(f"<{dim}f", *(rnd.gauss(0.0, 0.05) for _ in range(dim)))
