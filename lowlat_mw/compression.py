"""Compression codecs (zstd, lz4, snappy), bounded decompression and the adaptive selector.

Codecs are try-imported into a registry: a missing library only removes that codec from what
is offered. Every decompression is bounded by ``max_decompressed_size`` before the output is
allocated, so a small bomb cannot make the process allocate gigabytes.

The selector is sans-IO: it sees the payload, its kind and what it learnt from earlier
messages, and never reads a clock. It never returns a compressed payload that is not smaller
than the original (docs/protocol.md, "Compression").
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .errors import CloseCode, ErrorCode, RemoteProtocolError

__all__ = [
    "CODEC_IDS",
    "CODEC_NAMES",
    "CompressionSelector",
    "available_codecs",
    "compress",
    "decompress",
]

NONE = 0
CODEC_IDS: dict[str, int] = {"zstd": 1, "lz4": 2, "snappy": 3}
CODEC_NAMES: dict[int, str] = {v: k for k, v in CODEC_IDS.items()}


@dataclass(frozen=True, slots=True)
class _Codec:
    name: str
    compress: Callable[[bytes], bytes]
    decompress: Callable[[bytes, int], bytes]  # (payload, limit) -> bytes, raises on > limit
    # rough throughput of compress / decompress in bytes per second on one core, for the cost model
    compress_bps: float
    decompress_bps: float
    prior_ratio: float  # expected compressed/original on text before anything is observed


def _too_big(limit: int) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"decompressed payload exceeds max_decompressed_size ({limit} bytes)",
        error_code=ErrorCode.MESSAGE_TOO_BIG,
        close_code=CloseCode.MESSAGE_TOO_BIG,
    )


def _corrupt(name: str, exc: Exception) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"invalid {name} payload: {exc}",
        error_code=ErrorCode.INVALID_PAYLOAD,
        close_code=CloseCode.INVALID_PAYLOAD,
    )


_REGISTRY: dict[str, _Codec] = {}

try:
    import zstandard

    # zstandard's compressor and decompressor objects must not be used by two threads at once
    # (wrong output, errors, even segfaults): one pair per thread.
    _zstd_local = threading.local()

    def _zstd_contexts() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
        pair = getattr(_zstd_local, "pair", None)
        if pair is None:
            pair = _zstd_local.pair = (zstandard.ZstdCompressor(level=1, write_content_size=True),
                                       zstandard.ZstdDecompressor())
        return pair

    def _zstd_compress(data: bytes) -> bytes:
        return _zstd_contexts()[0].compress(data)

    def _zstd_decompress(data: bytes, limit: int) -> bytes:
        zd = _zstd_contexts()[1]
        try:
            declared = zstandard.frame_content_size(data)
        except zstandard.ZstdError as exc:
            raise _corrupt("zstd", exc) from None
        if declared > limit:
            raise _too_big(limit)
        try:
            # stream_reader never produces more than we ask for: limit + 1 tells "too big" apart.
            with zd.stream_reader(io.BytesIO(data), read_across_frames=False) as reader:
                out = reader.read(limit + 1)
        except zstandard.ZstdError as exc:
            raise _corrupt("zstd", exc) from None
        if len(out) > limit:
            raise _too_big(limit)
        if declared >= 0 and len(out) != declared:
            raise _corrupt("zstd", ValueError("truncated frame"))
        if declared < 0:
            # No size in the header, and the reader stops quietly at the end of the input: check
            # that the frame is complete. Bounded: this yields at most what the reader just did.
            check = zd.decompressobj()
            try:
                check.decompress(data)
            except zstandard.ZstdError as exc:
                raise _corrupt("zstd", exc) from None
            if not check.eof:
                raise _corrupt("zstd", ValueError("truncated frame"))
        return out

    _REGISTRY["zstd"] = _Codec("zstd", _zstd_compress, _zstd_decompress, 250e6, 900e6, 0.35)
except ImportError:  # pragma: no cover - zstandard is a core dependency
    pass

try:
    import lz4.frame

    def _lz4_compress(data: bytes) -> bytes:
        return lz4.frame.compress(data, store_size=True)

    def _lz4_decompress(data: bytes, limit: int) -> bytes:
        try:
            declared = lz4.frame.get_frame_info(data).get("content_size") or 0
            if declared > limit:
                raise _too_big(limit)
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=limit + 1)
        except RemoteProtocolError:
            raise
        except (RuntimeError, ValueError) as exc:
            raise _corrupt("lz4", exc) from None
        if len(out) > limit:
            raise _too_big(limit)
        if not d.eof:
            raise _corrupt("lz4", ValueError("truncated frame"))
        return out

    _REGISTRY["lz4"] = _Codec("lz4", _lz4_compress, _lz4_decompress, 600e6, 2000e6, 0.5)
except ImportError:  # pragma: no cover
    pass

try:
    import snappy

    def _snappy_declared_length(data: bytes) -> int:
        # Raw snappy starts with the uncompressed length as a little-endian base-128 varint.
        result = shift = 0
        for i, byte in enumerate(data[:5]):
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if i == 4:
                break
        raise _corrupt("snappy", ValueError("bad length header"))

    def _snappy_decompress(data: bytes, limit: int) -> bytes:
        if _snappy_declared_length(data) > limit:
            raise _too_big(limit)
        try:
            out = snappy.uncompress(data)
        except Exception as exc:  # snappy raises its own UncompressError / cramjam errors
            raise _corrupt("snappy", exc) from None
        return out if isinstance(out, bytes) else bytes(out)

    def _snappy_compress(data: bytes) -> bytes:
        out = snappy.compress(data)
        return out if isinstance(out, bytes) else bytes(out)

    _REGISTRY["snappy"] = _Codec("snappy", _snappy_compress, _snappy_decompress, 500e6, 1500e6, 0.5)
except ImportError:  # pragma: no cover
    pass

_EXTRA_HINT = {
    "zstd": "zstandard",
    "lz4": "lz4",
    "snappy": "python-snappy",
}


def available_codecs() -> tuple[str, ...]:
    """Names of the codecs whose library is installed."""
    return tuple(name for name in CODEC_IDS if name in _REGISTRY)


def _get(name: str) -> _Codec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ImportError(
            f"compression codec {name!r} needs the {_EXTRA_HINT.get(name, name)!r} package: "
            "pip install lowlat-mw"
        ) from None


def compress(name: str, data: bytes) -> bytes:
    """Compress `data` with codec `name` (no size check: see CompressionSelector)."""
    return _get(name).compress(data)


def decompress(codec_id: int, data: bytes, limit: int, allowed: Iterable[str] | None = None) -> bytes:
    """Decompress a payload tagged `codec_id`, refusing output larger than `limit` bytes.

    Raises RemoteProtocolError (1009 for too big, 1007 for corrupt or not negotiated codecs).
    """
    if codec_id == NONE:
        return data
    name = CODEC_NAMES.get(codec_id)
    if name is None or name not in _REGISTRY or (allowed is not None and name not in allowed):
        raise RemoteProtocolError(
            f"compression codec id {codec_id} was not negotiated",
            error_code=ErrorCode.UNSUPPORTED_COMPRESSION,
            close_code=CloseCode.INVALID_PAYLOAD,
        )
    return _REGISTRY[name].decompress(data, limit)


# ------------------------------------------------------------------------------------ selector
TEXT = "text"
BINARY = "binary"

_EWMA = 0.2          # weight of a new observation of a codec's ratio
_GIVE_UP = 0.92      # if the best ratio we expect is worse than this, send raw
_EXPLORE_EVERY = 32  # every N-th compressed message of a kind tries the next codec


class CompressionSelector:
    """Picks none / zstd / lz4 / snappy per payload from its size, kind, learnt ratios and link speed.

    Cost model for a payload of n bytes over a link of B bytes/s:
    ``raw = n / B`` versus ``codec = n / c_speed + ratio * n / B + n / d_speed``; the cheapest wins.
    Ratios start from priors and follow what each codec achieves on each kind (EWMA), with a
    little round-robin exploration so a stale estimate corrects itself. Incompressible kinds
    (ratio close to 1) are sent raw without spending CPU on them, except for the periodic probe.
    """

    def __init__(self, codecs: Iterable[str], *, min_size: int = 512, link_mbps: float = 1000.0) -> None:
        self.codecs = tuple(c for c in codecs if c in _REGISTRY)
        self.min_size = min_size
        self.link_bps = link_mbps * 1e6 / 8
        self._ratio: dict[tuple[str, str], float] = {}
        self._count: dict[str, int] = {}

    def set_link_speed(self, mbps: float) -> None:
        """Update the link-speed estimate (e.g. from a measured throughput)."""
        if mbps > 0:
            self.link_bps = mbps * 1e6 / 8

    def ratio(self, codec: str, kind: str) -> float:
        """Expected compressed/original ratio of `codec` on payloads of `kind`."""
        got = self._ratio.get((codec, kind))
        if got is not None:
            return got
        prior = _REGISTRY[codec].prior_ratio
        return prior if kind == TEXT else min(1.0, prior + 0.35)

    def _cost(self, codec: str, kind: str, n: int) -> float:
        c = _REGISTRY[codec]
        return n / c.compress_bps + self.ratio(codec, kind) * n / self.link_bps + n / c.decompress_bps

    def choose(self, n: int, kind: str = TEXT) -> str | None:
        """The codec to try for an n-byte payload of `kind`, or None to send it raw."""
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
        """Learn from a compression result (called by :meth:`compress`)."""
        r = min(compressed_size / raw_size, 1.2) if raw_size else 1.0
        old = self._ratio.get((codec, kind))
        self._ratio[(codec, kind)] = r if old is None else old + _EWMA * (r - old)

    def compress(self, payload: bytes, kind: str = TEXT) -> tuple[int, bytes]:
        """Return (codec id, bytes) for `payload`; never larger than the raw payload."""
        codec = self.choose(len(payload), kind)
        if codec is None:
            return NONE, payload
        out = _REGISTRY[codec].compress(payload)
        self.observe(codec, kind, len(payload), len(out))
        if len(out) >= len(payload):
            return NONE, payload
        return CODEC_IDS[codec], out
