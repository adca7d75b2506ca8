"""Compression codecs (zstd, lz4, snappy) and bounded decompression.

Codecs are try-imported into a registry: a missing library only removes that codec from what
is offered. Every decompression is bounded by ``max_decompressed_size`` before the output is
allocated, so a small bomb cannot make the process allocate gigabytes. Which codec a payload gets
is the adaptive selector's choice (:mod:`~lowlat_mw.protocol.selector`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import CloseCode, ErrorCode, RemoteProtocolError

__all__ = [
    "CODEC_IDS",
    "CODEC_NAMES",
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
_READ_STEP = 256 * 1024  # bytes per read when a zstd frame does not declare its size

try:
    import zstandard

    class _Contexts:
        """Idle zstandard contexts made by `make`.

        A context must not be used by two threads at once (wrong output, errors, even segfaults), and
        making one per call costs more than a small compression. So :meth:`run` takes an idle one
        (list.pop and list.append are atomic), or makes one, and puts it back: the pool grows to the
        most calls that ever ran at the same time.
        """

        def __init__(self, make: Callable[[], Any]) -> None:
            self.make = make
            self.idle: list[Any] = []

        def run(self, work: Callable[..., Any], *args: Any) -> Any:
            try:
                ctx = self.idle.pop()
            except IndexError:
                ctx = self.make()
            try:
                return work(ctx, *args)
            finally:
                self.idle.append(ctx)

    _LEVEL1 = _Contexts(lambda: zstandard.ZstdCompressor(level=1, write_content_size=True))
    _LEVEL3 = _Contexts(lambda: zstandard.ZstdCompressor(level=3, write_content_size=True))
    _DECOMPRESSORS = _Contexts(zstandard.ZstdDecompressor)

    def _compress_with(cctx: Any, data: bytes) -> bytes:
        return cctx.compress(data)  # type: ignore[no-any-return]

    def _zstd_compress(data: bytes) -> bytes:
        return _LEVEL1.run(_compress_with, data)  # type: ignore[no-any-return]

    def _zstd3_compress(data: bytes) -> bytes:
        """zstd at level 3: the same frame format (codec id 1), better ratio, slower; for slow links."""
        return _LEVEL3.run(_compress_with, data)  # type: ignore[no-any-return]

    def _zstd_decompress(data: bytes, limit: int) -> bytes:
        return _DECOMPRESSORS.run(_zstd_decompress_with, data, limit)  # type: ignore[no-any-return]

    def _zstd_decompress_with(zd: Any, data: bytes, limit: int) -> bytes:
        try:
            declared = zstandard.frame_content_size(data)
        except zstandard.ZstdError as exc:
            raise _corrupt("zstd", exc) from None
        if declared > limit:
            raise _too_big(limit)
        if declared >= 0:
            # The header's size (checked above) is the output buffer: a frame holding more than it
            # declares fails with "destination buffer too small", a truncated one with "did not
            # decompress full frame". (A stream reader asked for limit + 1 bytes allocates that much
            # up front: 8 MiB per small frame, tens of µs each.)
            try:
                return zd.decompress(data)
            except zstandard.ZstdError as exc:
                raise _corrupt("zstd", exc) from None
        # No size in the header: read in bounded steps, stopping as soon as the output passes the limit.
        chunks: list[bytes] = []
        total = 0
        try:
            with zd.stream_reader(io.BytesIO(data), read_across_frames=False) as reader:
                while piece := reader.read(min(limit + 1 - total, _READ_STEP)):
                    chunks.append(piece)
                    total += len(piece)
                    if total > limit:
                        raise _too_big(limit)
        except zstandard.ZstdError as exc:
            raise _corrupt("zstd", exc) from None
        # The reader stops quietly at the end of the input: check that the frame is complete.
        # Bounded: this yields at most what the reader just did.
        check = zd.decompressobj()
        try:
            check.decompress(data)
        except zstandard.ZstdError as exc:
            raise _corrupt("zstd", exc) from None
        if not check.eof:
            raise _corrupt("zstd", ValueError("truncated frame"))
        return b"".join(chunks)

    _REGISTRY["zstd"] = _Codec("zstd", _zstd_compress, _zstd_decompress)
except ImportError:  # pragma: no cover - zstandard is a core dependency
    pass

try:
    import lz4.frame

    def _lz4_compress(data: bytes) -> bytes:
        return lz4.frame.compress(data, store_size=True)

    def _lz4_declared_size(data: bytes) -> int:
        # LZ4 frame header: magic, FLG (bit 3: content size present), BD, then the size as 8 bytes LE.
        # Read here (get_frame_info costs a few µs per frame); 0 when absent: max_length still bounds.
        if len(data) >= 14 and data[:4] == b"\x04\x22\x4d\x18" and data[4] & 0x08:
            return int.from_bytes(data[6:14], "little")
        return 0

    def _lz4_decompress(data: bytes, limit: int) -> bytes:
        if _lz4_declared_size(data) > limit:
            raise _too_big(limit)
        try:
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=limit + 1)
        except (RuntimeError, ValueError) as exc:
            raise _corrupt("lz4", exc) from None
        if len(out) > limit:
            raise _too_big(limit)
        if not d.eof:
            raise _corrupt("lz4", ValueError("truncated frame"))
        return out

    _REGISTRY["lz4"] = _Codec("lz4", _lz4_compress, _lz4_decompress)
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

    _REGISTRY["snappy"] = _Codec("snappy", _snappy_compress, _snappy_decompress)
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
