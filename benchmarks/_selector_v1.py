"""The compression selector as it was before the compression suite (lowlat-mw 0.x, up to issue 7), frozen.

Kept only so that the compression suite can show what the rework of ``CompressionSelector`` changed.
Same codecs (the library's registry), same logic: fixed throughput constants, one learnt ratio per
codec and kind, a 0.92 give-up ratio, a round-robin probe every 32nd message of a kind.
"""

from __future__ import annotations

from collections.abc import Iterable

from lowlat_mw.protocol.compression import _REGISTRY, CODEC_IDS, NONE
from lowlat_mw.protocol.selector import TEXT

_SPEEDS = {"zstd": (250e6, 900e6, 0.35), "lz4": (600e6, 2000e6, 0.5), "snappy": (500e6, 1500e6, 0.5)}
_EWMA = 0.2
_GIVE_UP = 0.92
_EXPLORE_EVERY = 32


class SelectorV1:
    def __init__(self, codecs: Iterable[str], *, min_size: int = 512, link_mbps: float = 1000.0) -> None:
        self.codecs = tuple(c for c in codecs if c in _REGISTRY)
        self.min_size = min_size
        self.link_bps = link_mbps * 1e6 / 8
        self._ratio: dict[tuple[str, str], float] = {}
        self._count: dict[str, int] = {}

    def ratio(self, codec: str, kind: str) -> float:
        got = self._ratio.get((codec, kind))
        if got is not None:
            return got
        prior = _SPEEDS[codec][2]
        return prior if kind == TEXT else min(1.0, prior + 0.35)

    def _cost(self, codec: str, kind: str, n: int) -> float:
        c_bps, d_bps, _ = _SPEEDS[codec]
        return n / c_bps + self.ratio(codec, kind) * n / self.link_bps + n / d_bps

    def choose(self, n: int, kind: str = TEXT) -> str | None:
        if not self.codecs or n < self.min_size:
            return None
        count = self._count.get(kind, 0)
        self._count[kind] = count + 1
        if count % _EXPLORE_EVERY == _EXPLORE_EVERY - 1:
            return self.codecs[(count // _EXPLORE_EVERY) % len(self.codecs)]
        best = min(self.codecs, key=lambda c: self._cost(c, kind, n))
        if self.ratio(best, kind) > _GIVE_UP or self._cost(best, kind, n) >= n / self.link_bps:
            return None
        return best

    def observe(self, codec: str, kind: str, raw_size: int, compressed_size: int) -> None:
        r = min(compressed_size / raw_size, 1.2) if raw_size else 1.0
        old = self._ratio.get((codec, kind))
        self._ratio[(codec, kind)] = r if old is None else old + _EWMA * (r - old)

    def compress(self, payload: bytes, kind: str = TEXT) -> tuple[int, bytes]:
        codec = self.choose(len(payload), kind)
        if codec is None:
            return NONE, payload
        out = _REGISTRY[codec].compress(payload)
        self.observe(codec, kind, len(payload), len(out))
        if len(out) >= len(payload):
            return NONE, payload
        return CODEC_IDS[codec], out
