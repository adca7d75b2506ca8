"""Observability: per-stream stage timings and process metrics exported to Prometheus.

Two pieces, both fed by the drivers (the sans-IO state machines only count):

* :class:`StreamTimer` splits one stream's server time into contiguous *stages* (lap timing), so
  the stages of End.timings_ms add up to the stream's total. It reads the clock it is given.
* :class:`Metrics` keeps counters, gauges and histograms in plain Python numbers (a histogram
  observation is a bisect and two additions, ~0.2 us, against ~3 us for ``prometheus_client``'s
  locked Histogram) and hands them to Prometheus through a custom collector at scrape time.
  Disabled (setting ``metrics=False``) there is no Metrics object and no call at all.

A collector reports the process it runs in: with several worker processes, scrape each one.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from bisect import bisect_left as _bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import CloseCode

__all__ = [
    "LATENCY_BUCKETS",
    "STAGES",
    "FrameStats",
    "Metrics",
    "Snapshot",
    "StreamTimer",
    "quantile",
    "stage_sum",
]

STAGES = ("decode", "queue", "model", "encode", "compress", "send", "flow")
"""The additive stages of a stream, in End.timings_ms (milliseconds); they sum to ``total``.

decode: parsing the Request frame. queue: waiting for the model to start running (task
scheduling, or a free worker thread for sync models, per chunk for sync generators). model:
inside the model callable. encode: building Delta frames. compress: compressing them. send:
bookkeeping and handing frames to the server (including waiting for the connection's send lock).
flow: paused because the client's flow-control window was full or the connection was gone.
"""

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                    300.0, 600.0)


def stage_sum(timings_ms: Mapping[str, float]) -> float:
    """Sum of the additive stages in an End's timings_ms (compare with ``timings_ms["total"]``)."""
    return sum(timings_ms.get(s, 0.0) for s in STAGES)


# ================================================================================ stream timer
class StreamTimer:
    """Lap timer of one stream: each lap charges the time since the previous one to a stage.

    Created when the Request frame arrives (`start`: the clock value before it was decoded) and
    carried by the stream's state, so a resumed stream keeps counting. The per-delta laps
    (:meth:`chunk`, :meth:`encoded`, :meth:`compressed`, :meth:`sent`) are written out rather than
    shared, because they run for every delta: one clock read and two additions each.
    """

    __slots__ = ("clock", "compress", "decode", "deltas", "encode", "first_delta", "flow", "gap_bounds", "gap_counts",
                 "gap_hi", "gap_i", "gap_lo", "gaps", "last", "last_delta", "model", "model_first_chunk",
                 "model_started", "queue", "send", "start", "ttfd")

    def __init__(self, clock: Callable[[], float], start: float) -> None:
        self.clock = clock
        self.start = start
        self.last = start
        self.decode = self.queue = self.model = self.encode = self.compress = self.send = self.flow = 0.0
        self.model_started: float | None = None
        self.model_first_chunk: float | None = None
        self.deltas = 0
        self.last_delta = 0.0
        self.first_delta: float | None = None
        self.ttfd: _Hist | None = None  # metric children bound at stream start (None: metrics off)
        self.gaps: _Hist | None = None  # see bind_gaps
        self.gap_counts: list[int] | None = None
        self.gap_bounds: tuple[float, ...] = ()
        # the bucket the last gap fell in, (gap_lo, gap_hi]: consecutive gaps mostly share one
        self.gap_lo, self.gap_hi, self.gap_i = 0.0, -1.0, 0

    def bind_gaps(self, hist: _Hist) -> None:
        """Count this stream's inter-delta gaps into `hist` (its sum is added by :meth:`close_gaps`)."""
        self.gaps, self.gap_counts, self.gap_bounds = hist, hist.counts, hist.bounds

    def _new_gap_bucket(self, counts: list[int], gap: float) -> None:
        bounds = self.gap_bounds
        i = _bisect_left(bounds, gap)
        counts[i] += 1
        self.gap_i = i
        self.gap_lo = bounds[i - 1] if i > 0 else float("-inf")
        self.gap_hi = bounds[i] if i < len(bounds) else float("inf")

    def close_gaps(self) -> None:
        """The stream ended: add the sum of its gaps (last Delta's time - first's) to the histogram.

        Per Delta only the bucket count moves (one bisect): the gaps add up to that difference, so
        the sum is added once, at the end. A scrape during a stream sees its counts, not yet its sum.
        """
        if self.gaps is not None and self.first_delta is not None and self.deltas > 1:
            self.gaps.sum += self.last_delta - self.first_delta
        self.gaps = self.gap_counts = None

    @property
    def stages(self) -> dict[str, float]:
        """Seconds per stage, in STAGES order."""
        return {name: getattr(self, name) for name in STAGES}

    def lap(self, stage: str) -> float:
        """Charge the time since the last lap to `stage` (one of STAGES); returns the clock value."""
        now = self.clock()
        setattr(self, stage, getattr(self, stage) + now - self.last)
        self.last = now
        return now

    def model_running(self) -> None:
        """The model's code starts (or resumes, for a sync generator's next chunk): end of a queue wait."""
        now = self.lap("queue")
        if self.model_started is None:
            self.model_started = now

    def chunk(self) -> None:
        """The model produced a chunk (or finished)."""
        now = self.clock()
        self.model += now - self.last
        self.last = now
        if self.model_first_chunk is None and self.model_started is not None:
            self.model_first_chunk = now

    def encoded(self) -> None:
        """A frame was serialized."""
        now = self.clock()
        self.encode += now - self.last
        self.last = now

    def compressed(self) -> None:
        """A frame was compressed."""
        now = self.clock()
        self.compress += now - self.last
        self.last = now

    def sent(self) -> None:
        """A Delta went to the server: charge send time, feed time-to-first-delta and inter-delta gap."""
        now = self.clock()
        self.send += now - self.last
        self.last = now
        self.deltas += 1
        if self.deltas == 1:
            self.first_delta = now
            if self.ttfd is not None:
                self.ttfd.observe(now - self.start)
        else:
            counts = self.gap_counts
            if counts is not None:  # the bucket of this gap (the sum is added at the end: close_gaps)
                gap = now - self.last_delta
                if self.gap_lo < gap <= self.gap_hi:
                    counts[self.gap_i] += 1
                else:
                    self._new_gap_bucket(counts, gap)
        self.last_delta = now

    def timings_ms(self) -> dict[str, float]:
        """The stages in milliseconds; ``total`` on the same clock (the Request frame's arrival to the last
        lap); and ``model_first_chunk`` (model start to its first chunk).

        ``total`` is the stages' own span: read from another clock at another moment, a pause between
        the two reads (a garbage collection in a big heap) opened a gap the stages did not cover.
        """
        out = {name: getattr(self, name) * 1000.0 for name in STAGES}
        out["total"] = (self.last - self.start) * 1000.0
        if self.model_first_chunk is not None and self.model_started is not None:
            out["model_first_chunk"] = (self.model_first_chunk - self.model_started) * 1000.0
        return out


CODEC_SLOTS = 5  # compression codec ids counted per connection: none, zstd, lz4, snappy, and the reserved 4


class FrameStats:
    """Frames and bytes of one connection, by compression codec id: what the connection counts anyway.

    ``sent[3 * codec_id : 3 * codec_id + 3]`` is ``frames, bytes before compression, bytes on the
    wire`` (one flat list: small, as every connection has one) and ``received`` is ``[frames, bytes]``.
    :class:`Metrics` reads the open connections' counters at scrape time and folds a connection's
    into its totals when it closes, so metrics cost nothing per frame.
    """

    __slots__ = ("__weakref__", "label", "received", "sent")

    def __init__(self, label: str) -> None:
        self.label = label
        self.sent = [0] * (3 * CODEC_SLOTS)
        self.received = [0, 0]

    def count_sent(self, codec_id: int, raw: int, wire: int) -> None:
        """One frame sent."""
        sent, base = self.sent, 3 * codec_id
        sent[base] += 1
        sent[base + 1] += raw
        sent[base + 2] += wire

    def by_codec(self) -> list[tuple[int, int, int]]:
        """(frames, bytes before compression, bytes on the wire) per codec id."""
        s = self.sent
        return [(s[i], s[i + 1], s[i + 2]) for i in range(0, len(s), 3)]

    @property
    def frames_out(self) -> int:
        return sum(self.sent[0::3])

    @property
    def payload_bytes_out(self) -> int:
        return sum(self.sent[1::3])

    @property
    def bytes_out(self) -> int:
        return sum(self.sent[2::3])

    @property
    def frames_in(self) -> int:
        return self.received[0]

    @property
    def bytes_in(self) -> int:
        return self.received[1]


# ================================================================================ aggregation
class _Hist:
    """A cumulative-at-export histogram: counts per upper bound, sum, count."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    kind: str  # counter | gauge | histogram
    doc: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = LATENCY_BUCKETS


_SPECS = (
    _Spec("connections", "gauge", "Open lowlat-mw WebSocket connections."),
    _Spec("streams", "gauge", "Streams whose model is running."),
    _Spec("sessions_detached", "gauge", "Sessions whose connection dropped, kept for a resume."),
    _Spec("connections_opened", "counter", "WebSocket connections accepted.", ("subprotocol",)),
    _Spec("connections_closed", "counter",
          "Connections closed, by close code (name: idle_timeout = reaped, heartbeat_timeout = dead peer).",
          ("code", "name", "by")),
    _Spec("handshakes_refused", "counter", "WebSocket handshakes refused before a session began.", ("reason",)),
    _Spec("streams_finished", "counter", "Streams ended, by model and outcome (stop, cancelled, error).",
          ("model", "outcome")),
    _Spec("errors", "counter", "Error messages sent to clients, by error code.", ("code",)),
    _Spec("resumes", "counter", "Hellos that asked to resume a session, by outcome (resumed, failed).",
          ("outcome",)),
    _Spec("frames_received", "counter", "WebSocket messages received.", ("subprotocol",)),
    _Spec("received_bytes", "counter", "Bytes received in WebSocket messages.", ("subprotocol",)),
    _Spec("frames_sent", "counter", "WebSocket messages sent, by compression used.", ("subprotocol", "compression")),
    _Spec("payload_bytes", "counter", "Bytes sent before compression, by compression used.",
          ("subprotocol", "compression")),
    _Spec("wire_bytes", "counter", "Bytes sent on the wire (after compression), by compression used.",
          ("subprotocol", "compression")),
    _Spec("time_to_first_delta_seconds", "histogram",
          "From receiving a Request to sending its first Delta.", ("model",)),
    _Spec("inter_delta_seconds", "histogram", "Gap between consecutive Deltas of a stream.", ("model",)),
    _Spec("stream_duration_seconds", "histogram", "From receiving a Request to its End or Error.",
          ("model", "outcome"), DURATION_BUCKETS),
    _Spec("stage_seconds", "histogram", "Time of each stream spent per stage (see STAGES), per stream.",
          ("stage", "model")),
    _Spec("heartbeat_rtt_seconds", "histogram", "Ping to Pong round-trip time of server heartbeats."),
    _Spec("handshake_seconds", "histogram", "From WebSocket accept to Welcome."),
)
_SPEC_BY_NAME = {s.name: s for s in _SPECS}
_COMPRESSION_NAMES = {0: "none", 1: "zstd", 2: "lz4", 3: "snappy"}
_SUBPROTOCOL_LABEL = {"lowlat.v1.proto": "proto", "lowlat.v1.json": "json", None: "json"}


def subprotocol_label(subprotocol: str | None) -> str:
    """The short label value for a subprotocol ("proto" or "json")."""
    return _SUBPROTOCOL_LABEL.get(subprotocol, "json")


def close_code_name(code: int) -> str:
    """A readable name for a close code, e.g. 4000 -> "idle_timeout"."""
    try:
        return CloseCode(code).name.lower()
    except ValueError:
        return "other"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What ``lowlat-mw serve --stats-interval`` prints: gauges now and the time-to-first-delta histogram."""

    connections: int
    streams: int
    ttfd_bounds: tuple[float, ...]
    ttfd_counts: tuple[int, ...]

    def since(self, earlier: Snapshot | None) -> tuple[int, ...]:
        """Time-to-first-delta bucket counts observed after `earlier`."""
        if earlier is None:
            return self.ttfd_counts
        return tuple(a - b for a, b in zip(self.ttfd_counts, earlier.ttfd_counts, strict=True))

    def summary(self, earlier: Snapshot | None = None) -> str:
        """One line: connections, streams, and p50/p99 time to first delta since `earlier`."""
        counts = self.since(earlier)
        n = sum(counts)
        if n:
            p50, p99 = quantile(0.5, self.ttfd_bounds, counts), quantile(0.99, self.ttfd_bounds, counts)
            ttfd = f"first delta p50 {p50 * 1000:.2f} ms p99 {p99 * 1000:.2f} ms over {n} stream{'s' if n != 1 else ''}"
        else:
            ttfd = "no new streams"
        return f"lowlat-mw: {self.connections} connections, {self.streams} streams running, {ttfd}"


def quantile(q: float, bounds: tuple[float, ...], counts: tuple[int, ...] | list[int]) -> float:
    """Estimate the q-quantile from bucket counts (linear within a bucket, like PromQL's histogram_quantile)."""
    total = sum(counts)
    if not total:
        return float("nan")
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        if seen + c >= rank and c:
            if i == len(bounds):  # the +Inf bucket: the best answer is its lower bound
                return bounds[-1]
            lo = bounds[i - 1] if i else 0.0
            return lo + (bounds[i] - lo) * (rank - seen) / c
        seen += c
    return bounds[-1]


class Metrics:
    """lowlat-mw's process metrics; one per Prometheus registry (see :meth:`for_registry`).

    Hot-path numbers (bytes, histograms, gauges) are plain numbers updated on the event-loop thread
    that drives the connections (Flask's too: its protocol runs on one background loop); labelled
    counters take a lock, as adapters count refusals from request threads. A scrape reads without
    locks: a sample may be one event old.
    """

    _by_registry: dict[int, Metrics] = {}
    _lock = threading.Lock()

    def __init__(self, registry: Any = None, *, namespace: str = "lowlat") -> None:
        self.namespace = namespace
        self.registry = registry
        self._values: dict[str, dict[tuple[str, ...], Any]] = {s.name: {} for s in _SPECS}
        self.connections = 0
        self.streams = 0
        self.sessions_detached = 0
        self._closed_by_label: dict[str, FrameStats] = {}
        self._open: weakref.WeakSet[FrameStats] = weakref.WeakSet()
        self._frames_lock = threading.Lock()
        self._inc_lock = threading.Lock()
        if registry is not None:
            registry.register(_Collector(self))

    @classmethod
    def for_registry(cls, registry: Any = None) -> Metrics:
        """The Metrics of `registry` (default: prometheus_client's global REGISTRY), made once."""
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        with cls._lock:
            found = cls._by_registry.get(id(registry))
            if found is None or found.registry is not registry:
                found = cls._by_registry[id(registry)] = cls(registry)
            return found

    # ------------------------------------------------------------------ recording
    def inc(self, name: str, *labels: str, amount: float = 1) -> None:
        """Add `amount` to counter `name` with these label values (any thread)."""
        series = self._values[name]
        with self._inc_lock:
            series[labels] = series.get(labels, 0) + amount

    def attach(self, stats: FrameStats) -> None:
        """Count an open connection's frames (read at scrape time: nothing is done per frame)."""
        with self._frames_lock:
            self._open.add(stats)

    def detach(self, stats: FrameStats) -> None:
        """The connection closed: fold its frame counters into the totals."""
        with self._frames_lock:
            if stats not in self._open:
                return
            self._open.discard(stats)
            total = self._closed_by_label.get(stats.label)
            if total is None:
                total = self._closed_by_label[stats.label] = FrameStats(stats.label)
            _add_frames(total, stats)

    def hist(self, name: str, *labels: str) -> _Hist:
        """The histogram child of `name` for these label values (bind it once, observe often)."""
        series = self._values[name]
        found = series.get(labels)
        if found is None:
            found = series[labels] = _Hist(_SPEC_BY_NAME[name].buckets)
        return found

    def observe(self, name: str, value: float, *labels: str) -> None:
        """Observe `value` in histogram `name`."""
        self.hist(name, *labels).observe(value)

    def snapshot(self) -> Snapshot:
        """Gauges and the summed time-to-first-delta histogram, for a live summary line."""
        counts = [0] * (len(LATENCY_BUCKETS) + 1)
        for h in list(self._values["time_to_first_delta_seconds"].values()):
            for i, c in enumerate(h.counts):
                counts[i] += c
        return Snapshot(self.connections, self.streams, LATENCY_BUCKETS, tuple(counts))

    def value(self, name: str, *labels: str) -> float:
        """Current value of counter `name` for these labels (0 if never incremented); for tests and summaries."""
        return self._counters()[name].get(labels, 0)

    def _counters(self) -> dict[str, dict[tuple[str, ...], Any]]:
        values = dict(self._values)
        by_label: dict[str, FrameStats] = {}
        with self._frames_lock:
            for stats in [*self._closed_by_label.values(), *self._open]:
                total = by_label.get(stats.label)
                if total is None:
                    total = by_label[stats.label] = FrameStats(stats.label)
                _add_frames(total, stats)
        frames: dict[tuple[str, ...], Any] = {}
        raw: dict[tuple[str, ...], Any] = {}
        wire: dict[tuple[str, ...], Any] = {}
        for label, total in by_label.items():
            for codec_id, (n, r, w) in enumerate(total.by_codec()):
                if n:
                    key = (label, _COMPRESSION_NAMES.get(codec_id, str(codec_id)))
                    frames[key], raw[key], wire[key] = n, r, w
        values["frames_sent"], values["payload_bytes"], values["wire_bytes"] = frames, raw, wire
        values["frames_received"] = {(lb,): t.received[0] for lb, t in by_label.items() if t.received[0]}
        values["received_bytes"] = {(lb,): t.received[1] for lb, t in by_label.items() if t.received[0]}
        return values

    # ------------------------------------------------------------------ export
    def families(self) -> Iterator[Any]:
        """Prometheus metric families of the current values (what a scrape returns)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        ns = self.namespace
        gauges = {"connections": self.connections, "streams": self.streams,
                  "sessions_detached": self.sessions_detached}
        values = self._counters()
        for spec in _SPECS:
            name = f"{ns}_{spec.name}"
            series = list(values[spec.name].items())
            if spec.kind == "gauge":
                fam = GaugeMetricFamily(name, spec.doc, value=gauges[spec.name])
            elif spec.kind == "counter":
                fam = CounterMetricFamily(name, spec.doc, labels=spec.labels)
                for labels, value in series:
                    fam.add_metric(labels, value)
            else:
                fam = HistogramMetricFamily(name, spec.doc, labels=spec.labels)
                for labels, h in series:
                    counts, cumulative, buckets = list(h.counts), 0, []
                    for bound, c in zip((*h.bounds, float("inf")), counts, strict=True):
                        cumulative += c
                        buckets.append((_le(bound), cumulative))
                    fam.add_metric(labels, buckets, h.sum)
            yield fam


def _add_frames(total: FrameStats, stats: FrameStats) -> None:
    total.sent[:] = [a + b for a, b in zip(total.sent, stats.sent, strict=True)]
    total.received[0] += stats.received[0]
    total.received[1] += stats.received[1]


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _Collector:
    """prometheus_client collector that reads a :class:`Metrics` at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        return self.metrics.families()

    def describe(self) -> list[Any]:
        return list(self.metrics.families())


def exposition(metrics: Metrics) -> tuple[bytes, str]:
    """(body, content type) of a Prometheus text scrape of `metrics`' registry."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(metrics.registry), CONTENT_TYPE_LATEST
