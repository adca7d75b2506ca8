"""The adaptive compressor: picks none / zstd (level 1 or 3) / lz4 / snappy per payload.

A cost model of delivery time (CPU to compress and decompress, plus bytes over the link) decides,
learning how compressible each kind of payload is and, when the driver gives it a CPU clock
(``clock=``), how fast this machine compresses. Without a clock it keeps its priors and is
deterministic: the bytes on the wire then depend only on the payloads. It never returns a compressed
payload that is not smaller than the original (docs/protocol.md, "Compression").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import compression as _codecs
from .compression import CODEC_IDS, NONE

__all__ = ["BINARY", "TEXT", "CompressionSelector"]

TEXT = "text"
BINARY = "binary"


@dataclass(frozen=True, slots=True)
class _Variant:
    """One way to compress: a codec (its wire id) at a level, with the cost model's priors for it.

    Times are one core of a modest machine on compressible text, through this module's functions
    (per-call overhead included); the selector rescales them with what it measures.
    """

    key: str  # "zstd-1", "zstd-3", "lz4", "snappy"
    codec: str  # the codec name on the wire
    c_fixed: float  # seconds per compress call
    c_byte: float  # seconds per byte compressed
    d_fixed: float  # seconds per decompress call (on the peer)
    d_byte: float  # seconds per byte decompressed
    priors: tuple[float, ...]  # compressed/original on text per size class, before anything is observed

    @property
    def prior(self) -> float:
        """The prior ratio on large text."""
        return self.priors[-2]


# Ratio priors per size class (see _CLASSES): English prose, source code and chat JSON, averaged.
_VARIANTS = (
    _Variant("zstd-1", "zstd", 3e-6, 4.0e-9, 2e-6, 1.2e-9, (0.56, 0.43, 0.39, 0.34, 0.32)),
    _Variant("zstd-3", "zstd", 5e-6, 6.4e-9, 2e-6, 1.2e-9, (0.56, 0.42, 0.38, 0.32, 0.29)),
    _Variant("lz4", "lz4", 2e-6, 2.6e-9, 3e-6, 0.6e-9, (0.78, 0.62, 0.56, 0.49, 0.46)),
    _Variant("snappy", "snappy", 1.5e-6, 2.7e-9, 1.5e-6, 1.0e-9, (0.77, 0.59, 0.54, 0.47, 0.46)),
)
_BY_KEY = {v.key: v for v in _VARIANTS}

# Size classes: [.., 2K), [2K, 8K), [8K, 32K), [32K, 128K), [128K, ..): small payloads compress worse.
_CLASSES = range(5)


def _size_class(n: int) -> int:
    """The size class of an n-byte payload: (n.bit_length() - 1) // 2 - 4, clamped to 0..4."""
    cls = (n.bit_length() - 1) // 2 - 4
    return 0 if cls < 0 else 4 if cls > 4 else cls


_CLASS_START = (0, 2048, 8192, 32768, 131072)
_NEAREST = tuple(tuple(sorted(_CLASSES, key=lambda c, k=k: (abs(c - k), c))) for k in _CLASSES)
_BINARY_PRIOR = 0.35  # binary payloads (data deltas) are expected this much less compressible than text
_NEVER = 1 << 62
_MAX_MIN_SIZE = 65536  # payloads this large always reach the selector (its decision is then noise)
_EWMA = 0.2  # weight of a new observation of a ratio
_SPEED_RATES = (0.2, 0.1, 0.02)  # learning rates of a timing's error: machine, size class, variant
# A timing counts for at most this much down or up (a preempted call is not a trend), from the prior on.
_SPEED_CLIP = (-3.0, 1.0)
_EXPLORE_EVERY = 32  # every N-th payload of a kind probes another variant: with the payload itself if
_PROBE_REGRET = 1.1  # the model expects it to cost at most this much more than the best
_PROBE_MAX = 65536  # and the payload is at most this large, else on
_PROBE_BYTES = 4096  # at most this many bytes of it, while the payload goes out as decided
_CPU_MARGIN = 1.3  # decisions count the modelled CPU time this much higher (timings are the noisy part)
_REFRESH_EVERY = 128  # observations of a kind between full recomputations of its cost model
_TIME_FIRST, _TIME_EVERY = 16, 16  # time the first compressions of a kind, then one in 16

_Line = tuple[int, float, float, float, float, float]  # variant index, a, b, rel, cpu_a, cpu_b (see _line)


def _prior_weight(ratio: float, prior: float) -> float:
    """How far a variant's observed `ratio` says something about the other variants' through the priors.

    The priors compare the codecs on compressible text (zstd-1 beats lz4 by ~30% there); on data that
    does not compress nothing beats anything. So an observation as compressible as the variant's prior,
    or more, converts in full (weight 1), one that did not compress at all converts as it is (weight 0:
    random bytes through lz4 say zstd would not compress them either, not that it would save 30%), and
    in between the weight goes linearly.
    """
    w = (1.0 - ratio) / (1.0 - prior) if prior < 1.0 else 1.0
    return 0.0 if w < 0.0 else 1.0 if w > 1.0 else w


class _Kind:
    """What a selector learnt about one kind of payload."""

    __slots__ = ("break_even", "count", "kappa", "keff", "lines", "overall", "probes", "seen", "speed", "speed_c",
                 "speed_v", "text", "unseen")

    def __init__(self, variants: int, text: bool) -> None:
        self.text = text
        # Compressibility per size class: the ratio zstd-1 would get (EWMA of every observation, converted
        # through the priors), and each variant's own ratio over all sizes (what ratio() reports).
        self.kappa: list[float | None] = [None] * len(_CLASSES)
        self.overall: list[float | None] = [None] * variants
        # what is used per class: kappa, else the nearest observed class's scaled by the priors, else the prior
        ref = _VARIANTS[0].priors
        self.keff = list(ref) if text else [min(1.0, p + _BINARY_PRIOR) for p in ref]
        # log(measured / modelled time) = speed + speed_c[size class] + speed_v[variant], fitted online: this
        # machine, how its per-call and per-byte costs compare, and (slowly) corrections to the priors'
        # relative speeds of the variants.
        self.speed = 0.0
        self.speed_c = [0.0] * len(_CLASSES)
        self.speed_v = [0.0] * variants
        self.lines: list[list[_Line] | None] = [None] * len(_CLASSES)  # cost model cache per class
        self.break_even: int | None = None  # smallest size some variant may pay at; None until observed
        self.unseen = variants  # variants not observed yet
        self.count = self.seen = self.probes = 0  # payloads decided, observations, probes made


def _tables(codecs: tuple[str, ...]) -> tuple[tuple[Any, ...], tuple[int, ...], tuple[tuple[float, ...], ...]]:
    """A selector's constant tables for the codecs it may use: (variants, their codec ids, each variant's prior
    ratio relative to zstd-1's per size class)."""
    variants = tuple(v for v in _VARIANTS if v.codec in codecs)
    ids = tuple(CODEC_IDS[v.codec] for v in variants)
    rel = tuple(tuple(v.priors[c] / _VARIANTS[0].priors[c] for v in variants) for c in _CLASSES)
    return variants, ids, rel


# The tables of every set of codecs, made at import and shared: per connection they were ~900 bytes of tuples and
# floats. (The compress functions are looked up per selector: tests swap them.)
_CODECS = tuple(sorted({v.codec for v in _VARIANTS}))
_TABLES = {frozenset(chosen): _tables(chosen)
           for k in range(len(_CODECS) + 1) for chosen in itertools.combinations(_CODECS, k)}


class CompressionSelector:
    """Picks none / zstd (level 1 or 3) / lz4 / snappy per payload from a cost model of delivery time.

    For a payload of n bytes over a link of B bytes/s, sending it raw costs ``n / B``; compressing it
    with variant v costs ``cpu_v(n) + ratio_v * n / B``, where ``cpu_v(n)`` is compress plus
    decompress time (a per-call overhead plus a per-byte time). The cheapest wins, counting the CPU
    time 30% higher than modelled: timings are the noisy part, and where CPU and transfer times are
    close a wrong guess costs more than the gain.

    * Ratios: the selector learns how compressible each kind of payload is per size class (an EWMA of
      every observation, whichever variant made it, converted to what zstd-1 would get through the
      priors), and takes how the variants compare, and how a class without observations compares with
      its nearest observed one, from the priors (measured on prose, code and chat JSON). Learning one
      number per class from every payload is far less noisy than one per variant, each seeing only
      the payloads it was picked for.
    * Times start from priors and are rescaled by what the selector measures: given a `clock` (the
      drivers pass this thread's CPU time, ``time.thread_time``, where it is fine-grained; the default
      ``None`` keeps the priors, for a deterministic selector), it times its own compressions, learns
      from the first 16 of a kind and then one in 16, and fits, per kind, log(measured / modelled) as a
      machine factor plus one per size class plus a slowly learnt one per variant (how the codecs compare
      in speed is a property of the codecs, known from the priors; a few timings of a rarely used one are
      not evidence against them). So a slow or busy machine compresses less on a fast link. The peer's
      decompression is assumed to run at the same relative speed.
    * Exploration costs little: every 32nd payload of a kind probes another variant (in turn), to keep
      its estimates current. If the model expects that variant to cost at most 10% more than the best
      (and the payload is at most 64 KiB), the payload goes out with it; otherwise it compresses at most
      4 KiB of the payload, which goes out as decided. The first payload of a kind is compressed to
      learn, unless no codec's CPU time alone is under the raw transfer time (then compression cannot
      pay, whatever the ratio); each of the next ones has one variant not observed yet try 4 KiB of it.
    * Deciding costs a few µs of Python, as much as sending a few hundred bytes on a 1 Gbit/s link.
      So ``min_size`` (which ``ProtoCodec.encode_frame`` checks before calling the selector at all)
      rises to the smallest size at which some codec could pay: at once from the CPU priors alone (at
      ratio 0, on a machine twice as fast), and once every variant has been observed on text payloads,
      to where the cost model expects some codec to pay for the kinds seen so far. Never below the
      configured ``min_size`` nor above 64 KiB; recomputed as estimates and the link speed change.

    It never returns a compressed payload that is not smaller than the original. After
    :meth:`compress`, ``last_variant`` names the variant whose output was sent (None: raw), and
    ``spent`` holds the seconds the clock measured in compressions so far (for stage timings).
    """

    def __init__(self, codecs: Iterable[str], *, min_size: int = 512, link_mbps: float = 1000.0,
                 clock: Callable[[], float] | None = None) -> None:
        self.codecs = tuple(c for c in codecs if c in _codecs._REGISTRY)
        self.variants, self._ids, self._rel = _TABLES[frozenset(self.codecs)]  # (priors: ratio to zstd-1's by size)
        self._fns = tuple(_codecs._zstd3_compress if v.key == "zstd-3" else _codecs._REGISTRY[v.codec].compress
                         for v in self.variants)
        self.link_bps = link_mbps * 1e6 / 8
        self.last_variant: str | None = None
        self._clock = clock
        self.spent = 0.0  # seconds measured by `clock` in compressions (probes included)
        self._kinds: dict[str, _Kind] = {}
        # Payloads shorter than `min_size` are sent raw without asking the selector (see the class docstring).
        # A plain attribute, not a property: every Delta reads it.
        self._configured_min = self.min_size = min_size
        self._update_min()

    def set_min_size(self, value: int) -> None:
        """Configure the lowest `min_size` (it may rise above it as the class docstring says)."""
        self._configured_min = value
        self._update_min()

    def _update_min(self) -> None:
        # Below the CPU floor no codec can pay even at ratio 0 on a machine twice as fast as the priors.
        floor = _NEVER
        per_byte_link = 1.0 / self.link_bps
        for v in self.variants:
            a, b = (v.c_fixed + v.d_fixed) / 2, (v.c_byte + v.d_byte) / 2
            if b < per_byte_link:
                floor = min(floor, math.ceil(a / (per_byte_link - b)))
        learnt = min(floor, _MAX_MIN_SIZE)
        # The cost model's break-even only once every variant was observed on text (most payloads): a kind
        # never observed must still reach the selector.
        text = self._kinds.get(TEXT)
        if text is not None and not text.unseen:
            learnt = max(learnt, min(min(k.break_even for k in self._kinds.values() if k.break_even is not None),
                                     _MAX_MIN_SIZE))
        self.min_size = max(self._configured_min, learnt)

    def set_link_speed(self, mbps: float) -> None:
        """Update the link-speed estimate (e.g. from a measured throughput)."""
        if mbps > 0:
            self.link_bps = mbps * 1e6 / 8
            for st in self._kinds.values():
                st.lines = [None] * len(_CLASSES)
                if st.break_even is not None:
                    self._refresh(st)
            self._update_min()

    def ratio(self, codec: str, kind: str) -> float:
        """Expected compressed/original ratio of `codec` (a codec name, or a variant such as "zstd-3")."""
        v = _BY_KEY["zstd-1" if codec == "zstd" else codec]
        st = self._kinds.get(kind)
        if st is not None and v in self.variants:
            got = st.overall[self.variants.index(v)]
            if got is not None:
                return got
        return v.prior if kind == TEXT else min(1.0, v.prior + _BINARY_PRIOR)

    def _kind(self, kind: str) -> _Kind:
        st = self._kinds.get(kind)
        if st is None:
            st = self._kinds[kind] = _Kind(len(self.variants), kind == TEXT)
        return st

    # ------------------------------------------------------------------ the cost model
    def _expected_ratio(self, st: _Kind, vi: int, cls: int) -> float:
        return min(1.2, st.keff[cls] * self._rel[cls][vi])

    @staticmethod
    def _update_keff(st: _Kind) -> None:
        ref = _VARIANTS[0].priors
        for cls in _CLASSES:
            for c in _NEAREST[cls]:  # this class, else the nearest one observed, scaled by the priors
                kappa = st.kappa[c]
                if kappa is not None:
                    st.keff[cls] = kappa * ref[cls] / ref[c]
                    break

    def _line(self, st: _Kind, vi: int, cls: int) -> _Line:
        """Variant vi's cost for n bytes in class `cls` is ``a + (b + keff * rel / B) * n`` seconds, of which
        ``cpu_a + cpu_b * n`` CPU (keff: the class's compressibility, rel: vi's ratio relative to zstd-1)."""
        v = self.variants[vi]
        factor = math.exp(st.speed + st.speed_c[cls] + st.speed_v[vi])
        cpu_a, cpu_b = factor * (v.c_fixed + v.d_fixed), factor * (v.c_byte + v.d_byte)
        return vi, _CPU_MARGIN * cpu_a, _CPU_MARGIN * cpu_b, self._rel[cls][vi], cpu_a, cpu_b

    def _class_lines(self, st: _Kind, cls: int) -> list[_Line]:
        got = st.lines[cls] = [self._line(st, vi, cls) for vi in range(len(self.variants))]
        return got

    def _refresh(self, st: _Kind) -> None:
        """Recompute the kind's cost model, and the smallest size some variant may pay at."""
        per_byte_link = 1.0 / self.link_bps
        smallest = _NEVER
        for cls in _CLASSES:
            if smallest < _NEVER:  # found: the larger classes are recomputed when next needed
                st.lines[cls] = None
                continue
            end = _CLASS_START[cls + 1] if cls + 1 < len(_CLASS_START) else _NEVER
            keff = st.keff[cls] * per_byte_link
            for _, a, b, rel, _, _ in self._class_lines(st, cls):
                b += keff * rel
                if b < per_byte_link:  # a + b * n < n / B from n = a / (1 / B - b) on
                    n = max(_CLASS_START[cls], math.floor(a / (per_byte_link - b)))
                    if n < end:  # (a line only holds in its class)
                        smallest = min(smallest, n)
        st.break_even = smallest
        st.unseen = sum(r is None for r in st.overall)
        self._update_min()

    # ------------------------------------------------------------------ deciding
    def _decide(self, n: int, kind: str) -> tuple[int, tuple[int, ...]]:
        """(index of the variant to send the payload with or -1 for raw, variants to try on a sample of it)."""
        if n < self.min_size or not self.variants:
            return -1, ()
        st = self._kinds.get(kind) or self._kind(kind)
        st.count += 1
        cls = _size_class(n)
        lines = st.lines[cls] or self._class_lines(st, cls)
        raw = n / self.link_bps
        keff = st.keff[cls] / self.link_bps
        best = -1
        if st.break_even is not None:
            best_cost = raw
            for vi, a, b, rel, _, _ in lines:
                cost = a + (b + keff * rel) * n
                if cost < best_cost:
                    best, best_cost = vi, cost
        else:  # learn from the first payload, unless compression cannot pay whatever the ratio
            best_cost = math.inf
            for vi, a, b, rel, cpu_a, cpu_b in lines:
                cost = a + (b + keff * rel) * n
                if cost < best_cost and cpu_a + cpu_b * n < raw:
                    best, best_cost = vi, cost
        if st.count % _EXPLORE_EVERY:
            if st.unseen and st.break_even is not None:  # each next payload tries a variant not observed yet
                vi = st.overall.index(None)
                return best, () if vi == best else (vi,)
            return best, ()
        k = st.probes
        probe = k % len(self.variants)
        if probe == best and len(self.variants) > 1:
            k += 1
            probe = k % len(self.variants)
        st.probes = k + 1
        _, a, b, rel, _, _ = lines[probe]
        if n <= _PROBE_MAX and a + (b + keff * rel) * n <= _PROBE_REGRET * min(best_cost, raw):  # cheap: send with it
            return probe, ()
        return best, (probe,)

    def choose(self, n: int, kind: str = TEXT) -> str | None:
        """The codec to try for an n-byte payload of `kind`, or None to send it raw."""
        vi = self._decide(n, kind)[0]
        return None if vi < 0 else self.variants[vi].codec

    # ------------------------------------------------------------------ learning
    def observe(self, codec: str, kind: str, raw_size: int, compressed_size: int) -> None:
        """Learn from a compression result (called by :meth:`compress`); `codec` may name a variant."""
        v = _BY_KEY["zstd-1" if codec == "zstd" else codec]
        if v in self.variants:
            self._learn(self._kind(kind), self.variants.index(v), raw_size, compressed_size, None)

    def _learn(self, st: _Kind, vi: int, n: int, out: int, seconds: float | None) -> None:
        cls = _size_class(n)
        r = min(out / n, 1.2) if n else 1.0
        v = self.variants[vi]
        old = st.overall[vi]
        st.overall[vi] = r if old is None else old + _EWMA * (r - old)
        kappa = r / self._rel[cls][vi] ** _prior_weight(r, v.priors[cls])  # as zstd-1 would have done
        old = st.kappa[cls]
        if old is None:
            st.kappa[cls] = kappa
            self._update_keff(st)  # a class observed for the first time: the nearest for others may change
        else:
            st.kappa[cls] = st.keff[cls] = old + _EWMA * (kappa - old)
        timed = seconds is not None
        if timed:
            x = math.log(max(seconds, 1e-9) / (v.c_fixed + n * v.c_byte))
            lo, hi = _SPEED_CLIP
            error = max(lo, min(hi, x - st.speed - st.speed_c[cls] - st.speed_v[vi]))
            rate_m, rate_c, rate_v = _SPEED_RATES
            st.speed += rate_m * error
            st.speed_c[cls] += rate_c * error
            st.speed_v[vi] += rate_v * error
        st.seen += 1
        if st.break_even is None:  # observed: the cost model is recomputed once all variants are
            st.break_even = _NEVER
            if len(self.variants) > 1:
                return
        if st.seen % _REFRESH_EVERY == 0 or (st.unseen and None not in st.overall):
            self._refresh(st)
        elif timed and st.lines[cls] is not None:  # this class now, the others at the next refresh
            self._class_lines(st, cls)

    def _run(self, st: _Kind, vi: int, data: bytes) -> bytes:
        fn = self._fns[vi]
        clock = self._clock
        if clock is None:
            out = fn(data)
            self._learn(st, vi, len(data), len(out), None)
            return out
        learn_speed = st.seen < _TIME_FIRST or not st.seen % _TIME_EVERY  # the first 16, then one in 16
        start = clock()
        out = fn(data)
        took = clock() - start
        self.spent += took
        self._learn(st, vi, len(data), len(out), took if learn_speed else None)
        return out

    def compress(self, payload: bytes, kind: str = TEXT) -> tuple[int, bytes]:
        """Return (codec id, bytes) for `payload`; never larger than the raw payload."""
        self.last_variant = None
        n = len(payload)
        vi, probes = self._decide(n, kind)
        if probes:
            st, sample = self._kinds[kind], payload[:_PROBE_BYTES]
            for probe in probes:
                self._run(st, probe, sample)
        if vi < 0:
            return NONE, payload
        out = self._run(self._kinds[kind], vi, payload)
        if len(out) >= n:
            return NONE, payload
        self.last_variant = self.variants[vi].key
        return self._ids[vi], out
