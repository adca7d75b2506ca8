"""Process metrics exported to Prometheus: counters, gauges and histograms of lowlat-mw's connections.

:class:`Metrics` keeps them in plain Python numbers (a histogram observation is a bisect and two
additions, ~0.2 us, against ~3 us for ``prometheus_client``'s locked Histogram) and hands them to
Prometheus through a custom collector at scrape time. The drivers feed it what the protocol machines
report (frame counters, Errors, heartbeat round trips) and what they time themselves (stages, streams,
handshakes), one call per event. Disabled (setting ``metrics=False``) there is no Metrics object and
no call at all.

A collector reports the process it runs in: with several worker processes, scrape each one.
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import CloseCode
from ..protocol.base import FrameStats
from .timing import STAGES, StreamTimer

__all__ = [
    "LATENCY_BUCKETS",
    "Metrics",
    "Snapshot",
    "quantile",
]

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                    300.0, 600.0)


# ================================================================================ aggregation
class _Hist:
    """A cumulative-at-export histogram: counts per upper bound, sum, count."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
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
    _Spec("connections_opened", "counter",
          "WebSocket connections accepted, by how frames are written (direct: to the socket; send: through ASGI) "
          "and read (direct: from the server's parser; receive: through ASGI).",
          ("subprotocol", "writes", "reads")),
    _Spec("connections_closed", "counter",
          "Connections closed, by close code (name: idle_timeout = reaped, heartbeat_timeout = dead peer).",
          ("code", "name", "by")),
    _Spec("handshakes_refused", "counter", "WebSocket handshakes refused before a session began.", ("reason",)),
    _Spec("streams_finished", "counter", "Streams ended, by model and outcome (stop, cancelled, warmup, error).",
          ("model", "outcome")),
    _Spec("errors", "counter", "Error messages sent to clients, by error code.", ("code",)),
    _Spec("cache_lookups", "counter",
          "Requests for deterministic models looked up in the result cache (setting cache_size), by model and outcome "
          "(hit: the kept reply was sent, miss: the model ran).", ("model", "outcome")),
    _Spec("resumes", "counter", "Hellos that asked to resume a session, by outcome (resumed, failed).",
          ("outcome",)),
    _Spec("session_store_errors", "counter",
          "Failed operations on the shared session store (Redis: setting session_store), by operation (write, "
          "read, alive). While it fails, sessions go on in their own process without resume in another.",
          ("operation",)),
    _Spec("pushes", "counter",
          "Pushes (lowlat_mw.publish) that reached a connection of this process, by outcome: sent, or skipped "
          "(the client speaks protocol v1.0, or the connection is closing).", ("outcome",)),
    _Spec("frames_received", "counter", "WebSocket messages received.", ("subprotocol",)),
    _Spec("received_bytes", "counter", "Bytes received in WebSocket messages.", ("subprotocol",)),
    _Spec("frames_sent", "counter", "WebSocket messages sent, by compression used.", ("subprotocol", "compression")),
    _Spec("payload_bytes", "counter", "Bytes sent before compression, by compression used.",
          ("subprotocol", "compression")),
    _Spec("wire_bytes", "counter", "Bytes sent on the wire (after compression), by compression used.",
          ("subprotocol", "compression")),
    _Spec("time_to_first_delta_seconds", "histogram",
          "From receiving a Request to sending its first Delta.", ("model",)),
    _Spec("inter_delta_seconds", "histogram",
          "Gap between consecutive Deltas of a stream (sampled: one gap in 32; every gap with setting delta_timing).",
          ("model",)),
    _Spec("stream_duration_seconds", "histogram", "From receiving a Request to its End or Error.",
          ("model", "outcome"), DURATION_BUCKETS),
    _Spec("stage_seconds", "histogram", "Time of each stream spent per stage (see STAGES), per stream.",
          ("stage", "model")),
    _Spec("heartbeat_rtt_seconds", "histogram", "Ping to Pong round-trip time of server heartbeats."),
    _Spec("handshake_seconds", "histogram", "From WebSocket accept to Welcome."),
)
_SPEC_BY_NAME = {s.name: s for s in _SPECS}
_COMPRESSION_NAMES = {0: "none", 1: "zstd", 2: "lz4", 3: "snappy"}


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
        self._stages_of: dict[str, tuple[_Hist, ...]] = {}  # each label's stage histograms, in STAGES order
        self.heartbeat_rtt: _Hist | None = None  # bound by :meth:`rtt_hist`
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

    def rtt_hist(self) -> _Hist:
        """The heartbeat RTT histogram, bound to `heartbeat_rtt` on first use (its one sample per heartbeat of every
        idle connection then costs no lookup)."""
        h = self.heartbeat_rtt = self.hist("heartbeat_rtt_seconds")
        return h

    def observe(self, name: str, value: float, *labels: str) -> None:
        """Observe `value` in histogram `name` (:meth:`hist` and ``_Hist.observe``, written out: a heartbeat's RTT
        is observed per heartbeat of every idle connection)."""
        series = self._values[name]
        found = series.get(labels)
        if found is None:
            found = series[labels] = _Hist(_SPEC_BY_NAME[name].buckets)
        found.counts[bisect_left(found.bounds, value)] += 1
        found.sum += value

    # ------------------------------------------------------------------ one call per event (the drivers')
    # Written out rather than built on inc/hist/observe above: these run per connection and per stream.
    def connection_opened(self, stats: FrameStats, direct: bool = False, reads: bool = False) -> None:
        """A WebSocket was accepted (`direct`: its frames are written straight to the socket; `reads`: its
        messages come straight from the server's parser): count it, and its frames from now on (read at
        scrape time)."""
        self.connections += 1
        series = self._values["connections_opened"]
        key = (stats.label, "direct" if direct else "send", "direct" if reads else "receive")
        with self._inc_lock:
            series[key] = series.get(key, 0) + 1
        with self._frames_lock:
            self._open.add(stats)

    def handshake_done(self, seconds: float) -> None:
        """Welcome went out `seconds` after the WebSocket was accepted."""
        h = self._values["handshake_seconds"].get(())
        if h is None:
            h = self._values["handshake_seconds"][()] = _Hist(LATENCY_BUCKETS)
        h.counts[bisect_left(h.bounds, seconds)] += 1
        h.sum += seconds

    def connection_closed(self, stats: FrameStats, code: int, by: str) -> None:
        """A connection ended with close `code`, closed `by` "server" or "client": its frames join the totals."""
        self.connections -= 1
        with self._frames_lock:
            if stats in self._open:
                self._open.discard(stats)
                total = self._closed_by_label.get(stats.label)
                if total is None:
                    total = self._closed_by_label[stats.label] = FrameStats(stats.label)
                sent = total.sent  # (_add_frames)
                for i, n in enumerate(stats.sent):
                    sent[i] += n
                total.received[0] += stats.received[0]
                total.received[1] += stats.received[1]
        try:
            name = CloseCode(code).name.lower()
        except ValueError:
            name = "other"
        series = self._values["connections_closed"]
        key = (str(code), name, by)
        with self._inc_lock:
            series[key] = series.get(key, 0) + 1

    def stream_started(self, label: str) -> tuple[_Hist, _Hist]:
        """A model started for `label`: the time-to-first-delta and inter-delta histograms to bind its timer to."""
        self.streams += 1
        key = (label,)
        ttfd, gaps = self._values["time_to_first_delta_seconds"], self._values["inter_delta_seconds"]
        first = ttfd.get(key)
        if first is None:
            first = ttfd[key] = _Hist(LATENCY_BUCKETS)
        between = gaps.get(key)
        if between is None:
            between = gaps[key] = _Hist(LATENCY_BUCKETS)
        return first, between

    def stream_ended(self, label: str, outcome: str, seconds: float, timer: StreamTimer | None) -> None:
        """A stream ended (`outcome`: stop, cancelled, warmup, error) after `seconds`: its counters, duration and
        stages."""
        self.streams -= 1
        key = (label, outcome)
        series = self._values["streams_finished"]
        with self._inc_lock:
            series[key] = series.get(key, 0) + 1
        h = self._values["stream_duration_seconds"].get(key)
        if h is None:
            h = self._values["stream_duration_seconds"][key] = _Hist(DURATION_BUCKETS)
        h.counts[bisect_left(h.bounds, seconds)] += 1
        h.sum += seconds
        if timer is None:
            return
        if timer.lumped_deltas or timer.mark != timer.left:  # (the driver read timer.timings_ms() first, which
            timer.timings_ms()  # settles the unsampled Deltas and splits the lumped time)
        hists = self._stages_of.get(label)
        if hists is None:  # bound once per label, not looked up per stage of every stream
            series = self._values["stage_seconds"]
            hists = tuple(series.setdefault((stage, label), _Hist(LATENCY_BUCKETS)) for stage in STAGES)
            if len(self._stages_of) < 256:
                self._stages_of[label] = hists
        for h, value in zip(hists, (timer.decode, timer.queue, timer.model, timer.encode, timer.compress,
                                    timer.send, timer.flow), strict=True):
            h.counts[bisect_left(h.bounds, value)] += 1
            h.sum += value

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
    sent = total.sent
    for i, n in enumerate(stats.sent):
        sent[i] += n
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
