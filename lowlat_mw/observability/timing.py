"""Per-stream stage timings: where one stream's server time went, in stages that add up to its total.

The drivers create a :class:`StreamTimer` when a Request frame arrives and lap it as the stream
moves on (the protocol machine reads no clock: the driver laps around its calls). The stages go to
the client in End.timings_ms, to the metrics and to the stream's span.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SAMPLE_EVERY", "STAGES", "StreamTimer", "stage_sum"]

SAMPLE_EVERY = 16
"""A stream's first two Deltas and every 16th after them are timed stage by stage (model, encode, compress,
send: three clock reads); the others with two reads (before and after the send), each charged the mean
encode and compress time of the sampled ones after the first (the first pays for first-use costs, which
the others do not), model the rest (:meth:`StreamTimer.timings_ms`)."""

STAGES = ("decode", "queue", "model", "encode", "compress", "send", "flow")
"""The additive stages of a stream, in End.timings_ms (milliseconds); they sum to ``total``.

decode: parsing the Request frame. queue: waiting for the model to start running (task
scheduling, or a free worker thread for sync models, per chunk for sync generators). model:
inside the model callable. encode: numbering, recording (for resume) and encoding Delta frames.
compress: compressing them. send: handing frames to the server (including waiting for the
connection's send lock). flow: paused because the client's flow-control window was full or the
connection was gone. Send is measured for every Delta; encode and compress on a stream's first two
Deltas and every 16th, and estimated for the others from those; model is the rest.
"""


def stage_sum(timings_ms: Mapping[str, float]) -> float:
    """Sum of the additive stages in an End's timings_ms (compare with ``timings_ms["total"]``)."""
    return sum(timings_ms.get(s, 0.0) for s in STAGES)


class StreamTimer:
    """Lap timer of one stream: each lap charges the time since the previous one to a stage.

    Created when the Request frame arrives (`start`: the clock value before it was decoded) and
    carried by the stream's task, so a resumed stream keeps counting. For a sampled Delta (the first,
    then every SAMPLE_EVERY-th) the driver reads the clock where the model's chunk reached it, where
    the frames were built and where they were handed to the server; for the others only the last two;
    either way it makes one call, :meth:`tick` (written out, not built on :meth:`lap`: it runs for every
    token).
    `ttfd` and `gaps` are the metrics' histograms (None: metrics off).
    """

    __slots__ = ("clock", "compress", "decode", "deltas", "encode", "first_delta", "flow", "gap_bounds", "gap_counts",
                 "gap_hi", "gap_i", "gap_lo", "gaps", "last", "last_delta", "lumped", "lumped_deltas", "model",
                 "model_first_chunk", "model_started", "queue", "sampled", "sampled_compress", "sampled_encode",
                 "send", "start", "ttfd")

    def __init__(self, clock: Callable[[], float], start: float, ttfd: Any = None, gaps: Any = None) -> None:
        self.clock = clock
        self.start = start
        self.last = start
        self.decode = self.queue = self.model = self.encode = self.compress = self.send = self.flow = 0.0
        self.model_started: float | None = None
        self.model_first_chunk: float | None = None
        self.deltas = 0
        self.sampled = 0  # Deltas timed stage by stage after the first, and their encode and compress time
        self.sampled_encode = self.sampled_compress = 0.0
        self.lumped = 0.0  # model + encode + compress time of the other Deltas (tick), not split yet
        self.lumped_deltas = 0
        self.last_delta = 0.0
        self.first_delta: float | None = None
        self.ttfd = ttfd  # time to first delta: observed at the first Delta
        self.gaps = gaps  # inter-delta gaps: each gap's bucket counted per Delta, their sum added at the end
        self.gap_counts: list[int] | None = gaps.counts if gaps is not None else None
        self.gap_bounds: tuple[float, ...] = gaps.bounds if gaps is not None else ()
        # the bucket the last gap fell in, (gap_lo, gap_hi]: consecutive gaps mostly share one
        self.gap_lo, self.gap_hi, self.gap_i = 0.0, -1.0, 0

    @property
    def stages(self) -> dict[str, float]:
        """Seconds per stage, in STAGES order (read at the stream's end: what :meth:`tick` lumped is split)."""
        if self.lumped_deltas:
            self.timings_ms()
        return {"decode": self.decode, "queue": self.queue, "model": self.model, "encode": self.encode,
                "compress": self.compress, "send": self.send, "flow": self.flow}

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

    def tick(self, encoded: float, sent: float, produced: float | None = None, compressed: float = 0.0) -> None:
        """One Delta: its frames were built by `encoded` and handed to the server by `sent` (send time).

        Sampled (`produced` given: when its chunk reached the driver), the time until then is model time
        and from then to `encoded` encode time (`compressed` seconds of it compressing). Otherwise the time
        until `encoded` is model, encode and compress time together, split when the stream's timings are
        read (:meth:`timings_ms`). Feeds the time to first delta and the inter-delta gaps."""
        if produced is None:
            self.lumped += encoded - self.last
            self.lumped_deltas += 1
        else:
            self.model += produced - self.last
            if self.model_first_chunk is None and self.model_started is not None:
                self.model_first_chunk = produced
            took = encoded - produced
            if compressed:
                compressed = took if compressed > took else compressed
                self.compress += compressed
            self.encode += took - compressed
            if self.deltas:  # (the first Delta's first-use costs would skew the estimate)
                self.sampled += 1
                self.sampled_encode += took - compressed
                self.sampled_compress += compressed
        self.send += sent - encoded
        self.last = sent
        self.deltas += 1
        if self.deltas == 1:
            self.first_delta = sent
            ttfd = self.ttfd
            if ttfd is not None:  # (its observe(), written out)
                ttfd.counts[bisect_left(ttfd.bounds, sent - self.start)] += 1
                ttfd.sum += sent - self.start
        else:
            counts = self.gap_counts
            if counts is not None:  # the bucket of this gap (the sum is added when the stream ends)
                gap = sent - self.last_delta
                if self.gap_lo < gap <= self.gap_hi:
                    counts[self.gap_i] += 1
                else:
                    bounds = self.gap_bounds
                    i = bisect_left(bounds, gap)
                    counts[i] += 1
                    self.gap_i = i
                    self.gap_lo = bounds[i - 1] if i > 0 else float("-inf")
                    self.gap_hi = bounds[i] if i < len(bounds) else float("inf")
        self.last_delta = sent

    def sent(self) -> None:
        """A Delta went to the server with nothing to charge but send time (since the last lap)."""
        last = self.last
        self.tick(last, self.clock(), last)

    def timings_ms(self) -> dict[str, float]:
        """The stages in milliseconds; ``total`` on the same clock (the Request frame's arrival to the last
        lap); and ``model_first_chunk`` (model start to its first chunk).

        ``total`` is the stages' own span: read from another clock at another moment, a pause between
        the two reads (a garbage collection in a big heap) opened a gap the stages did not cover.
        """
        n = self.lumped_deltas
        if n:  # split what tick() lumped: each such Delta is charged the sampled ones' mean encode and compress
            lumped, sampled = self.lumped, self.sampled  # time (scaled down if more than was lumped), model the rest
            self.lumped, self.lumped_deltas = 0.0, 0
            encode = self.sampled_encode / sampled * n if sampled else 0.0
            compress = self.sampled_compress / sampled * n if sampled else 0.0
            if encode + compress > lumped:
                scale = lumped / (encode + compress) if lumped > 0 else 0.0
                encode, compress = encode * scale, compress * scale
            self.encode += encode
            self.compress += compress
            self.model += lumped - encode - compress
        out = {"decode": self.decode * 1000.0, "queue": self.queue * 1000.0, "model": self.model * 1000.0,
               "encode": self.encode * 1000.0, "compress": self.compress * 1000.0, "send": self.send * 1000.0,
               "flow": self.flow * 1000.0, "total": (self.last - self.start) * 1000.0}
        if self.model_first_chunk is not None and self.model_started is not None:
            out["model_first_chunk"] = (self.model_first_chunk - self.model_started) * 1000.0
        return out
