"""The observability core without sockets: the stage timer on a fake clock, what a connection counts
(the machine's frame counters and measurements, recorded by its driver, in process with fake clocks),
histogram export through prometheus_client, and the live summary's quantiles."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lowlat_mw.endpoint import Endpoint
from lowlat_mw.model import Models
from lowlat_mw.observability.metrics import LATENCY_BUCKETS, Metrics, Snapshot, quantile
from lowlat_mw.observability.timing import SAMPLE_EVERY, STAGES, StreamTimer, stage_sum
from lowlat_mw.protocol import events as ev
from lowlat_mw.protocol.base import FrameStats
from lowlat_mw.protocol.selector import CompressionSelector
from lowlat_mw.protocol.wire import codec_for
from lowlat_mw.runtime.connection import ConnectionDriver
from lowlat_mw.runtime.streams import ModelRunner
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings


class FakeClock:
    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a text scrape, keyed by (sample name, sorted labels)."""
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# ================================================================================ StreamTimer
def test_laps_charge_each_interval_to_one_stage_and_add_up() -> None:
    clock = FakeClock()
    timer = StreamTimer(clock, clock.now)
    clock.advance(0.001)
    timer.lap("decode")
    clock.advance(0.002)
    timer.model_running()
    clock.advance(0.010)
    timer.chunk()
    clock.advance(0.0005)
    timer.lap("encode")
    clock.advance(0.0003)
    timer.sent()
    clock.advance(0.004)
    timer.lap("flow")
    clock.advance(0.020)
    timer.chunk()
    ms = timer.timings_ms()
    assert ms["decode"] == pytest.approx(1.0)
    assert ms["queue"] == pytest.approx(2.0)
    assert ms["model"] == pytest.approx(30.0)
    assert ms["encode"] == pytest.approx(0.5)
    assert ms["send"] == pytest.approx(0.3)
    assert ms["flow"] == pytest.approx(4.0)
    assert ms["model_first_chunk"] == pytest.approx(10.0)
    assert stage_sum(ms) == pytest.approx((clock.now - timer.start) * 1000)
    assert set(STAGES) <= set(ms)


@given(st.lists(st.tuples(st.sampled_from(STAGES), st.floats(0, 5, allow_nan=False)), max_size=60))
def test_stage_sum_is_the_elapsed_time_whatever_the_laps(laps: list[tuple[str, float]]) -> None:
    clock = FakeClock(7.0)
    timer = StreamTimer(clock, clock.now)
    for stage, dt in laps:
        clock.advance(dt)
        timer.lap(stage)
    assert stage_sum(timer.timings_ms()) == pytest.approx((clock.now - 7.0) * 1000, abs=1e-6)


def test_sent_feeds_first_delta_and_gaps_histograms() -> None:
    clock = FakeClock()
    metrics = Metrics()
    timer = StreamTimer(clock, clock.now, *metrics.stream_started("m"))
    for dt in (0.003, 0.001, 0.002, 0.0004):
        clock.advance(dt)
        timer.sent()
    ttfd, gaps = metrics.hist("time_to_first_delta_seconds", "m"), metrics.hist("inter_delta_seconds", "m")
    assert ttfd.count == 1 and ttfd.sum == pytest.approx(0.003)
    assert gaps.count == 3
    assert gaps.sum == pytest.approx(0.0034)
    metrics.stream_ended("m", "stop", 0.0064, timer)
    assert gaps.sum == pytest.approx(0.0034)
    assert timer.deltas == 4
    metrics.stream_ended("m", "stop", 0.0064, timer)  # the gaps are added once only
    assert gaps.sum == pytest.approx(0.0034)


def unsampled(timer: StreamTimer) -> None:
    """A Delta between samples, as ConnectionDriver.chunk sends it: a count down, no clock read."""
    timer.left -= 1
    assert timer.left > 0


def test_unsampled_deltas_are_split_in_the_sampled_proportions() -> None:
    """Two Deltas timed stage by stage (the first with a slow, first-use encode), then 14 not timed at all:
    they are charged the second's encode and send time, not the first's; model is the rest, and the
    stages still add up."""
    clock = FakeClock()
    metrics = Metrics()
    timer = StreamTimer(clock, clock.now, *metrics.stream_started("m"))
    for encode in (0.008, 0.002):  # first use: 8 ms; then 2 ms
        clock.advance(0.010)
        produced = clock.now
        clock.advance(encode)
        encoded = clock.now
        clock.advance(0.001)
        timer.tick(produced, encoded, clock.now)
    for _ in range(14):
        clock.advance(0.013)  # model 10 ms + encode 2 ms + send 1 ms, not told apart
        unsampled(timer)
    assert timer.deltas == 16 and timer.sampled == 1
    ms = timer.timings_ms()
    assert ms["encode"] == pytest.approx(8.0 + 2.0 + 28.0) and ms["send"] == pytest.approx(16.0)
    assert ms["model"] == pytest.approx(160.0)
    assert stage_sum(ms) == pytest.approx((clock.now - timer.start) * 1000)
    assert metrics.hist("inter_delta_seconds", "m").count == 1  # the first two Deltas' gap: the others not timed


def test_delta_timing_times_every_delta_and_every_gap() -> None:
    """With every Delta sampled (setting delta_timing, or a model lapped per chunk), every gap is counted."""
    clock = FakeClock()
    metrics = Metrics()
    timer = StreamTimer(clock, clock.now, *metrics.stream_started("m"))
    timer.every = 1
    for i in range(16):
        clock.advance(0.010 + i / 1000)
        produced = clock.now
        clock.advance(0.002)
        encoded = clock.now
        clock.advance(0.001)
        assert timer.left - 1 == 0  # (never a Delta between samples)
        timer.tick(produced, encoded, clock.now)
    ms = timer.timings_ms()
    assert ms["encode"] == pytest.approx(32.0) and ms["send"] == pytest.approx(16.0)
    assert ms["model"] == pytest.approx(160.0 + sum(range(16)))
    gaps = metrics.hist("inter_delta_seconds", "m")
    assert gaps.count == 15  # every gap
    assert gaps.sum == pytest.approx(15 * 0.013 + sum(range(1, 16)) / 1000)


def test_deltas_are_sampled_in_pairs_and_laps_between_samples_are_lumped() -> None:
    """After the first two, two consecutive Deltas in every SAMPLE_EVERY are sampled, and the gap between
    them counted; a lap (a flow-control pause begins) after unsampled Deltas charges their time to the
    lumped pool, not to its stage, and the next sampled Delta starts a pair; the stages stay right."""
    clock = FakeClock()
    metrics = Metrics()
    timer = StreamTimer(clock, clock.now, *metrics.stream_started("m"))
    assert SAMPLE_EVERY == 32
    sampled_at = []
    for i in range(1, 81):
        clock.advance(0.002)  # 1 ms model, then 0.5 ms encode and 0.5 ms send
        if timer.left - 1:
            unsampled(timer)
        else:
            sampled_at.append(i)
            timer.tick(clock.now - 0.001, clock.now - 0.0005, clock.now)
        if i == 32:  # (the next Delta is sampled, and nothing in between was: it starts a pair)
            timer.lap("model")  # a pause begins: the 30 unsampled Deltas since the 2nd are lumped
            clock.advance(0.100)
            timer.lap("flow")
    assert sampled_at == [1, 2, 33, 34, 65, 66]
    assert timer.deltas == 80
    ms = timer.timings_ms()
    assert ms["flow"] == pytest.approx(100.0)
    assert ms["encode"] == pytest.approx(40.0) and ms["send"] == pytest.approx(40.0)
    assert ms["model"] == pytest.approx(80.0)
    assert stage_sum(ms) == pytest.approx((clock.now - timer.start) * 1000)
    gaps = metrics.hist("inter_delta_seconds", "m")
    assert gaps.count == 3 and gaps.sum == pytest.approx(0.006)  # (1, 2), (33, 34), (65, 66): 2 ms each


def test_stream_ended_settles_unsampled_deltas_the_driver_did_not_lap() -> None:
    """Given a timer whose last Deltas were not sampled and not lapped, the stage histograms still get the
    whole stream: stream_ended settles and splits them first."""
    clock = FakeClock()
    metrics = Metrics()
    timer = StreamTimer(clock, clock.now, *metrics.stream_started("m"))
    for _ in range(2):
        clock.advance(0.002)
        timer.tick(clock.now - 0.001, clock.now - 0.0005, clock.now)
    for _ in range(5):
        clock.advance(0.002)
        unsampled(timer)
    metrics.stream_ended("m", "stop", clock.now - timer.start, timer)
    stages = sum(metrics.hist("stage_seconds", stage, "m").sum for stage in STAGES)
    assert stages == pytest.approx(0.014)
    assert metrics.hist("stage_seconds", "send", "m").sum == pytest.approx(0.0035)


def test_an_estimate_larger_than_the_lumped_time_is_scaled_down() -> None:
    clock = FakeClock()
    timer = StreamTimer(clock, clock.now)
    timer.tick(clock.now, clock.now + 0.001, clock.now + 0.001)  # the first Delta: 1 ms encode, no send time
    clock.now += 0.001
    timer.tick(clock.now, clock.now + 0.004, clock.now + 0.004)  # a slow second encode: 4 ms
    clock.now += 0.004
    for _ in range(3):
        clock.advance(0.001)  # 1 ms from one send to the next: less than 4 ms of encode
        unsampled(timer)
    ms = timer.timings_ms()
    assert ms["encode"] == pytest.approx(8.0) and ms["model"] == pytest.approx(0.0)
    assert stage_sum(ms) == pytest.approx((clock.now - timer.start) * 1000)


def test_one_preempted_sample_does_not_take_the_models_time_from_a_short_stream() -> None:
    """A stream shorter than SAMPLE_EVERY has one sample: when a busy machine preempted it (5 ms of send for a
    frame that costs 0.1 ms), charging that to each unsampled Delta took the model's time (a 2 ms sleep before
    each Delta) for "send". Each is charged at most the cheapest timed Delta's cost."""
    clock = FakeClock()
    timer = StreamTimer(clock, clock.now)
    clock.advance(0.002)
    timer.tick(clock.now - 0.0001, clock.now - 0.00005, clock.now)  # the first: 2 ms model, 0.1 ms to send
    clock.advance(0.002 + 0.005)
    timer.tick(clock.now - 0.005, clock.now - 0.005, clock.now)  # the second: preempted, 5 ms in its send
    for _ in range(8):
        clock.advance(0.0021)  # 2 ms of model, 0.1 ms to send
        unsampled(timer)
    ms = timer.timings_ms()
    assert ms["model"] == pytest.approx(1.9 + 2 + 8 * 2.0)  # the first Delta's 0.1 ms went to its encode and send
    assert ms["send"] == pytest.approx(0.05 + 5 + 8 * 0.1)
    assert stage_sum(ms) == pytest.approx((clock.now - timer.start) * 1000)


# ================================================================================ export
def test_histograms_export_cumulative_buckets_with_le_semantics() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    for v in (0.001, 0.001, 0.0011, 0.5, 1000.0):  # exactly on a bound counts in that bucket
        metrics.observe("heartbeat_rtt_seconds", v)
    samples = scrape(registry)
    assert samples[("lowlat_heartbeat_rtt_seconds_bucket", (("le", "0.001"),))] == 2
    assert samples[("lowlat_heartbeat_rtt_seconds_bucket", (("le", "0.0025"),))] == 3
    assert samples[("lowlat_heartbeat_rtt_seconds_bucket", (("le", "0.5"),))] == 4
    assert samples[("lowlat_heartbeat_rtt_seconds_bucket", (("le", "60.0"),))] == 4
    assert samples[("lowlat_heartbeat_rtt_seconds_bucket", (("le", "+Inf"),))] == 5
    assert samples[("lowlat_heartbeat_rtt_seconds_count", ())] == 5
    assert samples[("lowlat_heartbeat_rtt_seconds_sum", ())] == pytest.approx(1000.5031)


def test_counters_gauges_and_byte_accumulators_export() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.connections += 3
    metrics.inc("errors", "model_error")
    metrics.inc("errors", "model_error")
    proto, json_ = FrameStats("proto"), FrameStats("json")
    proto.count_sent(1, 1000, 300)
    proto.count_sent(0, 50, 50)
    json_.received[:] = [1, 42]
    metrics.attach(proto)
    metrics.attach(json_)
    metrics.detach(json_)  # closed: folded into the totals
    metrics.detach(json_)  # twice is harmless
    del json_
    samples = scrape(registry)
    assert samples[("lowlat_connections", ())] == 3
    assert samples[("lowlat_errors_total", (("code", "model_error"),))] == 2
    assert samples[("lowlat_payload_bytes_total", (("compression", "zstd"), ("subprotocol", "proto")))] == 1000
    assert samples[("lowlat_wire_bytes_total", (("compression", "zstd"), ("subprotocol", "proto")))] == 300
    assert samples[("lowlat_frames_sent_total", (("compression", "none"), ("subprotocol", "proto")))] == 1
    assert samples[("lowlat_received_bytes_total", (("subprotocol", "json"),))] == 42
    assert metrics.value("errors", "model_error") == 2


def test_one_metrics_object_per_registry() -> None:
    registry = CollectorRegistry()
    assert Metrics.for_registry(registry) is Metrics.for_registry(registry)
    assert Metrics.for_registry(CollectorRegistry()) is not Metrics.for_registry(registry)
    assert Metrics.for_registry() is Metrics.for_registry()  # the global REGISTRY


def test_model_labels_are_bounded() -> None:
    single = Models(lambda req: "x")
    assert single.label("anything-a-client-says") == "default"
    named = Models({"gpt": lambda req: "x", "echo": lambda req: "y"})
    assert named.label("gpt") == "gpt" and named.label("") == "default"
    assert named.label("no-such-model-" + "x" * 50) == "unknown"


# ================================================================================ quantiles
def test_quantile_interpolates_within_buckets() -> None:
    bounds = (1.0, 2.0, 4.0)
    assert quantile(0.5, bounds, [0, 10, 0, 0]) == pytest.approx(1.5)
    assert quantile(0.99, bounds, [50, 0, 50, 0]) == pytest.approx(2.0 + 2.0 * 0.98)
    assert quantile(0.5, bounds, [0, 0, 0, 5]) == 4.0  # +Inf bucket: its lower bound
    assert math.isnan(quantile(0.5, bounds, [0, 0, 0, 0]))


def test_snapshot_summary_covers_streams_since_the_previous_line() -> None:
    metrics = Metrics()
    for _ in range(10):
        metrics.observe("time_to_first_delta_seconds", 0.002, "m")
    first = metrics.snapshot()
    assert "over 10 streams" in first.summary()
    metrics.streams = 2
    metrics.observe("time_to_first_delta_seconds", 0.3, "other")
    second = metrics.snapshot()
    line = second.summary(first)
    assert "2 streams running" in line and "over 1 stream" in line
    assert "p50 375.00 ms" in line  # one sample in (0.25, 0.5]: halfway, as histogram_quantile says
    assert "no new streams" in Snapshot(0, 0, LATENCY_BUCKETS, second.ttfd_counts).summary(second)


# ================================================================================ what a connection counts
class Wire:
    """One ConnectionDriver in this loop (no socket): its sends collected, its clocks fake."""

    def __init__(self, settings: Settings, subprotocol: str, monotonic: FakeClock, clock: FakeClock | None = None,
                 metrics: Metrics | None = None) -> None:
        self.endpoint = Endpoint(lambda req: "x", settings, registry=CollectorRegistry())
        if metrics is not None:
            self.endpoint.metrics = metrics
        self.codec = codec_for(subprotocol)
        self.sent: list[Any] = []

        async def send(message: Any) -> None:
            self.sent.append(message)

        driver = ConnectionDriver.__new__(ConnectionDriver)
        driver.monotonic = monotonic  # type: ignore[method-assign]
        if clock is not None:
            driver.clock = clock  # type: ignore[method-assign]
        ConnectionDriver.__init__(driver, self.endpoint, send=send, subprotocol=subprotocol)
        self.driver = driver

    def frames(self) -> list[bytes | str]:
        return [m.get("bytes", m.get("text")) for m in self.sent if m["type"] == "websocket.send"]

    async def receive(self, event: ev.Event) -> None:
        await self.driver.receive(self.codec.encode(event))


def stream_timers(monkeypatch: pytest.MonkeyPatch) -> list[StreamTimer | None]:
    """Streams start as they do (their timer made when the Request arrived) but run no model: their timers."""
    started: list[StreamTimer | None] = []

    async def no_model(self: ModelRunner, req: Any, fn: Any, label: str, kind: str, timer: Any) -> None:
        started.append(timer)

    monkeypatch.setattr(ModelRunner, "_run", no_model)
    return started


@pytest.mark.parametrize("subprotocol", [SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON])
async def test_connection_counts_frames_bytes_handshake_and_errors(subprotocol: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    started = stream_timers(monkeypatch)
    clock, now = FakeClock(), FakeClock(10.0)
    metrics = Metrics()
    label = "proto" if subprotocol == SUBPROTOCOL_PROTO else "json"
    wire = Wire(Settings(compression_min_size=64, link_mbps=10), subprotocol, now, clock, metrics)
    now.advance(0.25)
    await wire.receive(ev.Hello(client="t", compression=("zstd",) if label == "proto" else ()))
    assert isinstance(wire.codec.decode(wire.frames()[0], limit=1 << 20), ev.Welcome)
    assert metrics.hist("handshake_seconds").sum == pytest.approx(0.25)
    clock.advance(0.5)
    start = clock.now
    clock.advance(0.001)  # the clock reads at the frame's arrival, then after decoding
    await wire.receive(ev.Request(stream_id=1, text="hi"))
    await asyncio.sleep(0)  # the stream's task starts
    [timer] = started
    assert timer is not None and timer.start == start + 0.001
    compression = "zstd" if label == "proto" else "none"
    before = metrics.value("wire_bytes", label, compression), metrics.value("payload_bytes", label, compression)
    sent_before = len(wire.frames())
    await wire.driver.chunk(1, "word " * 2000, timer)  # compressible, slow link: zstd in binary mode
    frames = wire.frames()[sent_before:]
    wire_size = sum(len(f) if isinstance(f, bytes) else len(f.encode()) for f in frames)
    assert metrics.value("wire_bytes", label, compression) - before[0] == wire_size
    raw = metrics.value("payload_bytes", label, compression) - before[1]
    assert raw > wire_size if label == "proto" else raw == wire_size  # the saving is visible
    await wire.receive(ev.Request(stream_id=1, text="again"))  # stream 1 still runs: error
    assert metrics.value("errors", "stream_id_in_use") == 1
    assert metrics.value("frames_received", label) == 3
    assert set(timer.stages) == set(STAGES)
    await wire.driver.disconnected(1000)


async def test_connection_records_heartbeat_rtt_and_resume_outcomes() -> None:
    metrics = Metrics()
    settings = Settings(heartbeat_interval=1.0, heartbeat_max_interval=1.0)
    now = FakeClock(0.0)
    wire = Wire(settings, SUBPROTOCOL_JSON, now, metrics=metrics)
    await wire.receive(ev.Hello(client="t"))
    wire.driver.on_timer(1.0)
    for _ in range(20):  # the Ping goes out in a task of the connection's own
        if len(wire.frames()) == 2:
            break
        await asyncio.sleep(0)
    ping = wire.codec.decode(wire.frames()[1], limit=1 << 20)
    assert isinstance(ping, ev.Ping)
    now.now = 1.004
    await wire.receive(ev.Pong(id=ping.id))
    assert metrics.hist("heartbeat_rtt_seconds").count == 1
    assert metrics.hist("heartbeat_rtt_seconds").sum == pytest.approx(0.004)
    now.now = 1.5
    await wire.receive(ev.Pong(id=ping.id))  # a stale Pong is no new sample
    assert metrics.hist("heartbeat_rtt_seconds").count == 1
    await wire.driver.disconnected(1000)

    other = Wire(settings, SUBPROTOCOL_JSON, FakeClock(0.0), metrics=metrics)
    await other.receive(ev.Hello(client="t", resume_token="nope.nope"))
    assert metrics.value("resumes", "failed") == 1
    await other.driver.disconnected(1000)


async def test_no_clock_means_no_stage_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    started = stream_timers(monkeypatch)
    wire = Wire(Settings(stage_timings=False, metrics=False, tracing=False), SUBPROTOCOL_PROTO, FakeClock(0.0))
    await wire.receive(ev.Hello(client="t"))
    await wire.receive(ev.Request(stream_id=1, text="x"))
    await asyncio.sleep(0)  # the stream's task starts
    assert started == [None]
    await wire.driver.disconnected(1000)
    sel = CompressionSelector(())
    assert codec_for(SUBPROTOCOL_PROTO).encode_frame(ev.Ping(id=1), sel)[2] == 0


def test_gap_buckets_match_a_bisect_of_every_gap() -> None:
    """Gaps counted in batches of send times count exactly what a bisect per gap would."""
    import bisect
    import random

    rng = random.Random(5)
    clock = FakeClock()
    metrics = Metrics()
    hist = metrics.hist("inter_delta_seconds", "m")
    timer = StreamTimer(clock, clock.now, None, hist)
    expected = [0] * len(hist.counts)
    last = None
    for _ in range(2000):
        # runs of similar gaps, jumps between buckets, and gaps exactly on a bound
        gap = rng.choice([rng.choice(hist.bounds), rng.uniform(0, 0.002), rng.uniform(0, 100), 1e-9])
        clock.advance(gap)
        timer.sent()
        if last is not None:
            expected[bisect.bisect_left(hist.bounds, clock.now - last)] += 1
        last = clock.now
    assert hist.counts == expected


async def _tokens(req: Any) -> Any:
    for i in range(40):
        yield f"t{i} "
        await asyncio.sleep(0)


def _tokens_sync(req: Any) -> Any:
    yield from (f"t{i} " for i in range(40))


@pytest.mark.parametrize(("model", "settings", "gaps"), [
    (_tokens, {}, 2),  # sampled: (1, 2) and (33, 34)
    (_tokens, {"delta_timing": True}, 39),  # every gap
    (_tokens_sync, {}, 39),  # a model lapped per chunk anyway (a thread hop per chunk): every gap
])
async def test_a_stream_through_the_driver_samples_deltas_unless_asked_not_to(model: Any, settings: dict[str, Any],
                                                                                gaps: int) -> None:
    """Through a real ConnectionDriver and clock: the End's stages add up, the time to first delta is observed
    once, and the gap histogram gets the sampled pairs' gaps (every gap with delta_timing)."""
    metrics = Metrics()
    endpoint = Endpoint(model, Settings(**settings), registry=CollectorRegistry())
    endpoint.metrics = metrics
    codec = codec_for(SUBPROTOCOL_PROTO)
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    driver = ConnectionDriver(endpoint, send=send, subprotocol=SUBPROTOCOL_PROTO)
    await driver.receive(codec.encode(ev.Hello(client="t")))
    await driver.receive(codec.encode(ev.Request(stream_id=1, text="x")))
    for _ in range(2000):
        if not driver.tasks:
            break
        await asyncio.sleep(0.001)
    events = [codec.decode(m["bytes"], limit=1 << 20) for m in sent if m["type"] == "websocket.send"]
    assert sum(isinstance(e, ev.Delta) for e in events) == 40
    end = events[-1]
    assert isinstance(end, ev.End) and end.finish_reason == "stop"
    assert stage_sum(end.timings_ms) == pytest.approx(end.timings_ms["total"], rel=1e-6, abs=1e-6)
    assert min(end.timings_ms[s] for s in STAGES) >= 0.0
    assert metrics.hist("time_to_first_delta_seconds", "default").count == 1
    assert metrics.hist("inter_delta_seconds", "default").count == gaps
    await driver.disconnected(1000)
