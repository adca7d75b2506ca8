"""Compression: codec round trips, bounded decompression (bombs), corrupt input, the adaptive selector."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable

import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlat_mw.errors import CloseCode, ErrorCode, RemoteProtocolError
from lowlat_mw.protocol import compression as cmp
from lowlat_mw.protocol.compression import (
    CODEC_IDS,
    CODEC_NAMES,
    available_codecs,
    compress,
    decompress,
)
from lowlat_mw.protocol.selector import BINARY, TEXT, CompressionSelector
from lowlat_mw.protocol.wire import encode_varint

MiB = 1024 * 1024
CODECS = ("zstd", "lz4", "snappy")
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
LOREM = (
    b"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore "
    b"et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut "
)


def assert_refused(exc_info: pytest.ExceptionInfo[RemoteProtocolError], code: ErrorCode, close: int) -> None:
    assert (exc_info.value.error_code, exc_info.value.close_code) == (code, close), str(exc_info.value)


def test_all_codecs_are_installed_and_numbered() -> None:
    assert available_codecs() == CODECS
    assert CODEC_IDS == {"zstd": 1, "lz4": 2, "snappy": 3}
    assert {v: k for k, v in CODEC_IDS.items()} == CODEC_NAMES


# ============================================================================ round trips
PAYLOADS = [b"", b"x", LOREM, LOREM * 200, os.urandom(5000), bytes(100_000)]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: f"{len(p)}B")
def test_codec_round_trip(codec: str, payload: bytes) -> None:
    out = compress(codec, payload)
    assert decompress(CODEC_IDS[codec], out, len(payload)) == payload  # a limit of exactly the size is fine


@FUZZ
@given(st.sampled_from(CODECS), st.binary(max_size=3000))
def test_codec_round_trip_fuzz(codec: str, payload: bytes) -> None:
    assert decompress(CODEC_IDS[codec], compress(codec, payload), 4096, allowed=[codec]) == payload


def test_codec_id_zero_is_identity() -> None:
    assert decompress(0, b"anything", 1) == b"anything"  # the frame size limit covers raw payloads


@pytest.mark.parametrize("codec", CODECS)
def test_one_byte_over_the_limit_is_refused(codec: str) -> None:
    out = compress(codec, b"ab" * 500)
    assert len(decompress(CODEC_IDS[codec], out, 1000)) == 1000
    with pytest.raises(RemoteProtocolError) as info:
        decompress(CODEC_IDS[codec], out, 999)
    assert_refused(info, ErrorCode.MESSAGE_TOO_BIG, 1009)


def test_frames_without_stored_size_round_trip() -> None:
    data = os.urandom(50_000) + LOREM * 5000
    z = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert zstandard.frame_content_size(z) == -1
    assert decompress(1, z, 4 * MiB) == data
    obj = zstandard.ZstdCompressor().compressobj()
    streamed = obj.compress(data) + obj.flush()
    assert zstandard.frame_content_size(streamed) == -1
    assert decompress(1, streamed, 4 * MiB) == data
    lz = lz4.frame.compress(data, store_size=False)
    assert not lz4.frame.get_frame_info(lz)["content_size"]
    assert decompress(2, lz, 4 * MiB) == data


# ============================================================================ not negotiated
@pytest.mark.parametrize(("codec_id", "allowed"), [
    (1, ()), (2, ("zstd",)), (3, ("zstd", "lz4")), (4, None), (15, CODECS), (7, None),
])
def test_codec_not_negotiated_or_unknown(codec_id: int, allowed: tuple[str, ...] | None) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decompress(codec_id, b"whatever", MiB, allowed)
    assert info.value.error_code is ErrorCode.UNSUPPORTED_COMPRESSION
    assert info.value.close_code == CloseCode.INVALID_PAYLOAD


def test_unknown_codec_name_names_the_package() -> None:
    with pytest.raises(ImportError, match="brotli"):
        compress("brotli", b"x")


# ============================================================================ bombs
@pytest.fixture(scope="module")
def bombs() -> dict[str, tuple[int, bytes]]:
    """64 MiB of zeros, compressed every way a client could send it."""
    zeros = bytes(64 * MiB)
    obj = zstandard.ZstdCompressor().compressobj()
    return {
        "zstd": (1, zstandard.ZstdCompressor().compress(zeros)),
        "zstd-no-content-size": (1, zstandard.ZstdCompressor(write_content_size=False).compress(zeros)),
        "zstd-streamed": (1, obj.compress(zeros) + obj.flush()),
        "lz4": (2, lz4.frame.compress(zeros, store_size=True)),
        "lz4-no-stored-size": (2, lz4.frame.compress(zeros, store_size=False)),
        "snappy": (3, snappy.compress(zeros)),
    }


BOMBS = ["zstd", "zstd-no-content-size", "zstd-streamed", "lz4", "lz4-no-stored-size", "snappy"]


@pytest.mark.parametrize("name", BOMBS)
def test_bomb_is_refused_without_allocating_it(bombs: dict[str, tuple[int, bytes]], name: str) -> None:
    codec_id, bomb = bombs[name]
    assert len(bomb) < 4 * MiB  # the bomb itself is small
    limit = MiB
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError) as info:
            decompress(codec_id, bomb, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_refused(info, ErrorCode.MESSAGE_TOO_BIG, 1009)
    assert peak < limit + 3 * MiB, f"peak allocation {peak / MiB:.1f} MiB while refusing a 64 MiB bomb"


def test_tracemalloc_sees_what_a_naive_decompressor_allocates(bombs: dict[str, tuple[int, bytes]]) -> None:
    # Guard for the test above: the measurement does see C-extension output buffers.
    _, bomb = bombs["zstd-no-content-size"]
    tracemalloc.start()
    try:
        out = zstandard.ZstdDecompressor().decompressobj().decompress(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(out) == 64 * MiB
    assert peak >= 64 * MiB


def test_zstd_frame_lying_about_its_size_is_refused() -> None:
    # Rewrite the header of a 4 MiB frame to declare 100 bytes.
    frame = bytearray(zstandard.ZstdCompressor().compress(bytes(4 * MiB)))
    fhd = frame[4]
    single_segment, dict_id_flag, fcs_flag = (fhd >> 5) & 1, fhd & 3, fhd >> 6
    offset = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_id_flag]
    size = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    assert size == 4 and int.from_bytes(frame[offset:offset + size], "little") == 4 * MiB
    frame[offset:offset + size] = (100).to_bytes(size, "little")
    assert zstandard.frame_content_size(bytes(frame)) == 100
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError) as info:
            decompress(1, bytes(frame), MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.close_code in (1007, 1009)
    assert peak < 3 * MiB


def test_snappy_header_lying_about_its_size_is_refused() -> None:
    real = snappy.compress(bytes(4 * MiB))
    forged = encode_varint(100) + real[len(encode_varint(4 * MiB)):]
    with pytest.raises(RemoteProtocolError) as info:
        decompress(3, forged, MiB)
    assert_refused(info, ErrorCode.INVALID_PAYLOAD, 1007)


def test_snappy_declared_size_over_limit_is_refused_before_decoding() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decompress(3, encode_varint(10 * MiB) + b"\x00", MiB)
    assert_refused(info, ErrorCode.MESSAGE_TOO_BIG, 1009)


# ============================================================================ corrupt payloads
def _truncated(make: Callable[[bytes], bytes]) -> bytes:
    return make(LOREM * 20)[:-5]


CORRUPT = [
    ("zstd empty", 1, b""),
    ("zstd garbage", 1, b"definitely not zstd"),
    ("zstd magic then zeros", 1, b"\x28\xb5\x2f\xfd" + bytes(20)),
    ("zstd truncated", 1, _truncated(zstandard.ZstdCompressor().compress)),
    ("zstd truncated, no content size", 1, _truncated(zstandard.ZstdCompressor(write_content_size=False).compress)),
    ("zstd body flipped", 1, (lambda b: b[:-8] + bytes(x ^ 0xFF for x in b[-8:]))(
        zstandard.ZstdCompressor(write_checksum=True).compress(os.urandom(300) + LOREM))),
    ("lz4 empty", 2, b""),
    ("lz4 garbage", 2, b"definitely not lz4"),
    ("lz4 magic then zeros", 2, b"\x04\x22\x4d\x18" + bytes(20)),
    ("lz4 truncated", 2, _truncated(lz4.frame.compress)),
    ("lz4 truncated, no stored size", 2, _truncated(lambda d: lz4.frame.compress(d, store_size=False))),
    ("snappy empty", 3, b""),
    ("snappy garbage", 3, b"\x10" + b"\xff" * 20),
    ("snappy bad varint", 3, b"\xff\xff\xff\xff\xff\xff"),
    ("snappy truncated", 3, _truncated(snappy.compress)),
]


@pytest.mark.parametrize(("codec_id", "payload"), [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_corrupt_payload_is_invalid(codec_id: int, payload: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decompress(codec_id, payload, MiB)
    assert_refused(info, ErrorCode.INVALID_PAYLOAD, 1007)


@FUZZ
@given(st.sampled_from([1, 2, 3]), st.binary(max_size=300))
def test_arbitrary_payload_only_raises_remote_protocol_error(codec_id: int, payload: bytes) -> None:
    try:
        out = decompress(codec_id, payload, 64 * 1024)
    except RemoteProtocolError as exc:
        assert exc.close_code in (1007, 1009)
    else:
        assert len(out) <= 64 * 1024


@FUZZ
@given(st.sampled_from(CODECS), st.binary(min_size=1, max_size=2000), st.data())
def test_damaged_frame_never_decodes_to_something_else_silently(codec: str, payload: bytes,
                                                                 data: st.DataObject) -> None:
    out = bytearray(compress(codec, payload))
    cut = data.draw(st.integers(0, len(out) - 1))
    try:
        got = decompress(CODEC_IDS[codec], bytes(out[:cut]), 4096)
    except RemoteProtocolError as exc:
        assert exc.close_code == 1007
    else:  # a cut frame may only "succeed" when nothing was lost (e.g. trailing checksum/end mark)
        assert got == payload


# ============================================================================ selector
def _spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count real compression calls per codec (zstd at level 3, which the selector uses on slow links, as zstd)."""
    calls = dict.fromkeys(CODECS, 0)
    for name in CODECS:
        codec = cmp._REGISTRY[name]

        def counting(data: bytes, _orig: Callable[[bytes], bytes] = codec.compress, _name: str = name) -> bytes:
            calls[_name] += 1
            return _orig(data)

        monkeypatch.setitem(cmp._REGISTRY, name, dataclasses.replace(codec, compress=counting))

    def counting_level3(data: bytes, _orig: Callable[[bytes], bytes] = cmp._zstd3_compress) -> bytes:
        calls["zstd"] += 1
        return _orig(data)

    monkeypatch.setattr(cmp, "_zstd3_compress", counting_level3)
    return calls


def _repetitive(seed: int, size: int) -> bytes:
    rnd = random.Random(seed)
    words = [bytes(rnd.choices(b"abcdefghijklmnopqrstuvwxyz", k=rnd.randint(2, 9))) for _ in range(40)]
    out = bytearray()
    while len(out) < size:
        out += rnd.choice(words) + b" "
    return bytes(out[:size])


payloads = st.one_of(
    st.binary(max_size=4000),
    st.tuples(st.binary(min_size=1, max_size=40), st.integers(1, 300)).map(lambda t: t[0] * t[1]),
    st.tuples(st.integers(0, 2**32), st.integers(0, 20_000)).map(lambda t: _repetitive(*t)),
)


@FUZZ
@given(
    st.lists(st.sampled_from(CODECS), unique=True),
    st.integers(0, 2048),
    st.sampled_from([0.01, 1.0, 100.0, 1000.0, 1e6]),
    st.lists(st.tuples(payloads, st.sampled_from([TEXT, BINARY])), min_size=1, max_size=40),
)
def test_selector_never_returns_output_not_smaller_than_input(
    codecs: list[str], min_size: int, mbps: float, messages: list[tuple[bytes, str]]
) -> None:
    sel = CompressionSelector(codecs, min_size=min_size, link_mbps=mbps)
    for payload, kind in messages:
        codec_id, out = sel.compress(payload, kind)
        if codec_id == 0:
            assert out == payload
        else:
            assert CODEC_NAMES[codec_id] in codecs
            assert len(payload) >= min_size
            assert len(out) < len(payload)
            assert decompress(codec_id, out, len(payload), allowed=codecs) == payload


@pytest.mark.parametrize("min_size", [1, 100, 512, 4096])
def test_selector_skips_payloads_smaller_than_min_size(min_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    sel = CompressionSelector(CODECS, min_size=min_size, link_mbps=1.0)
    small = bytes(min_size - 1)
    for _ in range(100):
        assert sel.compress(small) == (0, small)
    assert sum(calls.values()) == 0  # not even tried
    codec_id, _ = sel.compress(bytes(min_size))
    assert sum(calls.values()) == 1
    assert codec_id != 0 or min_size < 20  # zeros of that size compress (tiny inputs may not shrink)


def test_selector_default_min_size_skips_tiny_deltas() -> None:
    sel = CompressionSelector(CODECS)
    assert sel.min_size == 512
    assert sel.choose(36) is None


def test_selector_sends_random_data_raw_after_learning(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    # Labelled text and on a slow link, so every codec looks worth trying at first.
    sel = CompressionSelector(CODECS, min_size=0, link_mbps=100.0)
    assert sel.choose(8192, TEXT) is not None
    rnd = random.Random(1)
    results = [sel.compress(rnd.randbytes(8192), TEXT) for _ in range(200)]
    assert all(codec_id == 0 for codec_id, _ in results)
    # It tries each codec once to learn, then only the periodic probe (1 in 32) spends CPU.
    assert all(calls[name] >= 1 for name in CODECS), calls
    assert sum(calls.values()) <= len(CODECS) + 200 // 32 + 1, calls
    assert all(sel.ratio(name, TEXT) > 0.92 for name in CODECS)


def test_selector_learns_text_kind_separately(monkeypatch: pytest.MonkeyPatch) -> None:
    sel = CompressionSelector(CODECS, min_size=0, link_mbps=100.0)
    rnd = random.Random(2)
    for _ in range(20):
        sel.compress(rnd.randbytes(8192), BINARY)
    assert sel.choose(8192, BINARY) is None
    codec_id, out = sel.compress(LOREM * 80, TEXT)
    assert codec_id != 0 and len(out) < len(LOREM * 80) // 3


@pytest.mark.parametrize("mbps", [1.0, 100.0, 1000.0])
def test_selector_picks_a_codec_for_large_repetitive_text(mbps: float) -> None:
    # clock=None: the priors decide, not this machine's measured speed (at 1 Gbit/s a slow or busy
    # machine rightly sends raw).
    sel = CompressionSelector(CODECS, link_mbps=mbps, clock=None)
    for seed in range(5):
        payload = _repetitive(seed, 64 * 1024)
        codec_id, out = sel.compress(payload, TEXT)
        assert codec_id in (1, 2, 3)
        assert len(out) < len(payload) // 2
        assert decompress(codec_id, out, len(payload)) == payload


@pytest.mark.parametrize("only", [("zstd",), ("lz4",), ("snappy",), ("snappy", "lz4")])
def test_selector_respects_the_codec_list(only: tuple[str, ...]) -> None:
    sel = CompressionSelector(only, min_size=0, link_mbps=1.0)
    seen = set()
    for seed in range(100):  # enough to pass several exploration rounds
        codec_id, _ = sel.compress(_repetitive(seed, 4096), TEXT)
        seen.add(codec_id)
    assert seen - {0} <= {CODEC_IDS[c] for c in only}
    assert seen - {0}, "a repetitive payload on a slow link must be compressed"


def test_selector_drops_unknown_and_empty_codec_lists() -> None:
    assert CompressionSelector(["gzip", "lz4", "brotli"]).codecs == ("lz4",)
    sel = CompressionSelector([], min_size=0, link_mbps=0.01)
    assert sel.compress(LOREM * 100) == (0, LOREM * 100)


def test_slow_link_compresses_where_a_very_fast_link_does_not() -> None:
    payload = _repetitive(7, 2048)
    slow = CompressionSelector(CODECS, min_size=0, link_mbps=1.0)
    fast = CompressionSelector(CODECS, min_size=0, link_mbps=1e6)  # 1 Tbit/s: CPU costs more than bytes
    assert slow.choose(len(payload)) is not None
    assert fast.choose(len(payload)) is None
    assert slow.compress(payload)[0] != 0
    assert fast.compress(payload) == (0, payload)


def test_set_link_speed_changes_the_decision() -> None:
    sel = CompressionSelector(CODECS, min_size=0, link_mbps=1e6)
    assert sel.choose(4096) is None
    sel.set_link_speed(1.0)
    assert sel.choose(4096) is not None
    sel.set_link_speed(0)  # ignored
    sel.set_link_speed(-5)  # ignored
    assert sel.link_bps == 1.0 * 1e6 / 8


def test_selector_ratio_follows_observations() -> None:
    sel = CompressionSelector(CODECS)
    prior = sel.ratio("zstd", TEXT)
    assert 0 < prior < 1
    assert sel.ratio("zstd", BINARY) > prior  # binary starts more pessimistic
    sel.observe("zstd", TEXT, 1000, 900)
    assert sel.ratio("zstd", TEXT) == pytest.approx(0.9)
    sel.observe("zstd", TEXT, 1000, 100)
    assert 0.1 < sel.ratio("zstd", TEXT) < 0.9  # moving average, not a jump
    sel.observe("lz4", TEXT, 0, 0)
    assert sel.ratio("lz4", TEXT) == 1.0


def test_selector_explores_other_codecs_periodically(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    sel = CompressionSelector(CODECS, min_size=0, link_mbps=10.0)
    for seed in range(200):
        sel.compress(_repetitive(seed, 4096), TEXT)
    assert all(calls[name] > 0 for name in CODECS), calls


# ============================================================================ selector: cost model, learning
class FakeClock:
    """A clock under which every compression the selector times takes `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.now, self.reads = seconds, 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # the selector reads before and after each compression it times
            self.now += self.seconds
        return self.now


def test_selector_uses_zstd_level_3_on_a_slow_link() -> None:
    sel = CompressionSelector(CODECS, link_mbps=1.0, clock=None)
    used = []
    for seed in range(40):
        payload = _repetitive(seed, 64 * 1024)
        codec_id, out = sel.compress(payload, TEXT)
        used.append(sel.last_variant)
        assert decompress(codec_id, out, len(payload)) == payload
        if sel.last_variant == "zstd-3":  # the same frame format as level 1
            assert codec_id == CODEC_IDS["zstd"]
    assert used[-30:].count("zstd-3") >= 25, used


def test_selector_does_not_spend_zstd_level_3_on_a_fast_link() -> None:
    sel = CompressionSelector(CODECS, link_mbps=1000.0, clock=None)
    used = [sel.compress(_repetitive(seed, 16 * 1024), TEXT) and sel.last_variant for seed in range(64)]
    assert used[-40:].count("zstd-3") <= 2, used  # probes at most


def test_measured_speed_decides_on_a_fast_link() -> None:
    payloads = [_repetitive(seed, 16 * 1024) for seed in range(60)]
    slow = CompressionSelector(CODECS, link_mbps=1000.0, clock=FakeClock(1e-3))  # 1 ms per compression
    fast = CompressionSelector(CODECS, link_mbps=1000.0, clock=FakeClock(1e-7))
    slow_ids = [slow.compress(p, TEXT)[0] for p in payloads]
    fast_ids = [fast.compress(p, TEXT)[0] for p in payloads]
    assert all(codec_id == 0 for codec_id in slow_ids[-40:]), slow_ids  # sending raw is cheaper
    assert all(codec_id != 0 for codec_id in fast_ids[-40:]), fast_ids


def test_min_size_rises_where_no_codec_can_pay() -> None:
    assert CompressionSelector(CODECS).min_size == 512  # 1 Gbit/s: a codec may pay, we do not know yet
    assert CompressionSelector(CODECS, link_mbps=1e5).min_size == 65536  # no codec beats 100 Gbit/s, capped
    sel = CompressionSelector(CODECS, link_mbps=1000.0, clock=FakeClock(1e-3))
    for seed in range(8):  # the first payload and one per other variant
        sel.compress(_repetitive(seed, 8192), TEXT)
    assert sel.min_size > 16384  # learnt: at 1 ms per compression small payloads cannot pay on 1 Gbit/s
    assert sel.compress(bytes(8192)) == (0, bytes(8192))
    sel.set_link_speed(1.0)
    assert sel.min_size == 512  # on 1 Mbit/s it pays again
    sel.min_size = 2000  # the configured floor can be changed
    assert sel.min_size == 2000


def test_binary_payloads_alone_do_not_raise_min_size() -> None:
    sel = CompressionSelector(CODECS, min_size=100, link_mbps=1000.0, clock=FakeClock(1e-3))
    rnd = random.Random(4)
    for _ in range(20):
        sel.compress(rnd.randbytes(8192), BINARY)
    # text never seen: it must still reach the selector (only the CPU floor applies, as on a fresh selector)
    assert sel.min_size == CompressionSelector(CODECS, min_size=100, link_mbps=1000.0).min_size < 512


def test_first_payloads_and_probes_try_other_variants_on_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    for name in CODECS:
        codec = cmp._REGISTRY[name]

        def sizing(data: bytes, _orig: Callable[[bytes], bytes] = codec.compress) -> bytes:
            sizes.append(len(data))
            return _orig(data)

        monkeypatch.setitem(cmp._REGISTRY, name, dataclasses.replace(codec, compress=sizing))
    level3 = cmp._zstd3_compress
    monkeypatch.setattr(cmp, "_zstd3_compress", lambda data: sizes.append(len(data)) or level3(data))
    sel = CompressionSelector(CODECS, link_mbps=10.0, clock=None)
    for seed in range(100):
        sel.compress(_repetitive(seed, 100_000), TEXT)
    samples = [n for n in sizes if n != 100_000]
    assert sizes.count(100_000) == 100  # every payload compressed once, with the variant chosen
    assert samples and all(n == 4096 for n in samples)
    assert len(samples) == 3 + 100 // 32  # the 3 other variants once each, then one probe per 32 payloads


def test_ratios_are_learnt_per_size_class() -> None:
    sel = CompressionSelector(CODECS, clock=None)
    sel.observe("zstd", TEXT, 1000, 900)  # small payloads compress badly
    sel.observe("zstd", TEXT, 200_000, 20_000)  # large ones well
    st = sel._kinds[TEXT]
    zstd1 = [v.key for v in sel.variants].index("zstd-1")
    assert sel._expected_ratio(st, zstd1, 0) == pytest.approx(0.9)
    assert sel._expected_ratio(st, zstd1, 4) == pytest.approx(0.1)
    lz4 = [v.key for v in sel.variants].index("lz4")
    assert 0.1 < sel._expected_ratio(st, lz4, 4) < 0.2  # borrowed from zstd in that class, scaled by the priors


def test_observe_accepts_variant_names() -> None:
    sel = CompressionSelector(CODECS, clock=None)
    sel.observe("zstd-3", TEXT, 1000, 300)
    assert sel.ratio("zstd-3", TEXT) == pytest.approx(0.3)
    assert sel.ratio("zstd", TEXT) == sel.ratio("zstd-1", TEXT) != pytest.approx(0.3)  # level 1: still the prior


def test_selector_without_clock_is_deterministic() -> None:
    rnd = random.Random(5)
    messages = [(_repetitive(rnd.randrange(1000), rnd.randrange(512, 40_000)), TEXT) for _ in range(60)]
    messages += [(rnd.randbytes(rnd.randrange(512, 9000)), BINARY) for _ in range(20)]
    rnd.shuffle(messages)
    runs = []
    for _ in range(2):
        sel = CompressionSelector(CODECS, link_mbps=100.0, clock=None)
        runs.append([(sel.compress(p, k), sel.last_variant, sel.min_size) for p, k in messages])
    assert runs[0] == runs[1]


def test_small_zstd_frame_decompresses_without_allocating_the_limit() -> None:
    # A frame that declares its size is decompressed into a buffer of that size, not of the limit.
    frame = compress("zstd", LOREM * 5)
    tracemalloc.start()
    try:
        assert decompress(1, frame, 64 * MiB) == LOREM * 5
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"peak allocation {peak} bytes for a {len(LOREM) * 5}-byte payload"


# ============================================================================ threads
THREADED = textwrap.dedent("""
    import random, sys, threading
    from lowlat_mw.protocol.compression import compress, decompress
    from lowlat_mw.protocol.selector import CompressionSelector

    payloads = [random.Random(i).randbytes(64) * 500 for i in range(8)]
    expected = {name: [compress(name, p) for p in payloads] for name in ("zstd", "lz4", "snappy")}
    bad = []

    def worker(i):
        sel = CompressionSelector(["zstd"], min_size=0)
        for k in range(150):
            j = (i + k) % 8
            for name, cid in (("zstd", 1), ("lz4", 2), ("snappy", 3)):
                if compress(name, payloads[j]) != expected[name][j]:
                    bad.append(("compress", name))
                if decompress(cid, expected[name][j], 1 << 20) != payloads[j]:
                    bad.append(("decompress", name))
            codec_id, out = sel.compress(payloads[j])
            if decompress(codec_id, out, 1 << 20) != payloads[j]:
                bad.append(("selector", codec_id))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(len(bad), sorted(set(bad)))
    sys.exit(1 if bad else 0)
""")


def test_codecs_are_safe_to_use_from_many_threads() -> None:
    # Sync clients each run a loop thread; a shared zstd context corrupts output or crashes the
    # process, so this runs in a child process where a crash is a failure, not the end of the run.
    proc = subprocess.run([sys.executable, "-c", THREADED], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"exit {proc.returncode} (-11 is a segfault)\n{proc.stdout}{proc.stderr[-2000:]}"
    assert proc.stdout.strip() == "0 []"
    assert "Exception in thread" not in proc.stderr
