"""Per-stream stage timings: where one stream's server time went, in stages that add up to its total.

The drivers create a :class:`StreamTimer` when a Request frame arrives and lap it as the stream
moves on (the protocol machine reads no clock: the driver laps around its calls). The stages go to
the client in End.timings_ms, to the metrics and to the stream's span.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SAMPLE_EVERY", "STAGES", "StreamTimer", "stage_sum"]

SAMPLE_EVERY = 32
"""A stream's first two Deltas, then two in every 32 (consecutive ones) are timed stage by stage (model,
encode, compress, send: three clock reads), and the gap between the two goes to the inter-delta histogram.
The others read no clock: the time from one sampled Delta to the next is split when the stream ends, each
Delta in between charged the mean encode, compress and send time of the sampled ones after the first (the
first pays for first-use costs, which the others do not), model the rest (:meth:`StreamTimer.timings_ms`).
Setting ``delta_timing`` (and a model that is lapped per chunk anyway) times every Delta and every gap."""

STAGES = ("decode", "queue", "model", "encode", "compress", "send", "flow")
"""The additive stages of a stream, in End.timings_ms (milliseconds); they sum to ``total``.

decode: parsing the Request frame. queue: waiting for the model to start running (task
scheduling, or a free worker thread for sync models, per chunk for sync generators). model:
inside the model callable. encode: numbering, recording (for resume) and encoding Delta frames.
compress: compressing them. send: handing frames to the server (including waiting for another write
of the connection to finish). flow: paused because the client's flow-control window was full or the
connection was gone. Encode, compress and send are measured on a stream's first two Deltas and two in
every 32 (every Delta with setting delta_timing, and for a model that is lapped per chunk: sync models,
merged Deltas) and estimated for the others from those; model is the rest.
"""


def stage_sum(timings_ms: Mapping[str, float]) -> float:
    """Sum of the additive stages in an End's timings_ms (compare with ``timings_ms["total"]``)."""
    return sum(timings_ms.get(s, 0.0) for s in STAGES)


class StreamTimer:
    """Lap timer of one stream: each lap charges the time since the previous one to a stage.

    Created when the Request frame arrives (`start`: the clock value before it was decoded) and
    carried by the stream's task, so a resumed stream keeps counting. Deltas are counted down to the
    next sampled one (`left`); the driver sends the others without a call or a clock read (it stores
    ``left - 1``). For a sampled Delta (``left - 1 == 0``) it reads the clock where the model's chunk
    reached it, where the frames were built and where they were handed to the server, and calls
    :meth:`tick`. Samples come in pairs, so the gap between two Deltas is measured without a clock
    read on every Delta. `ttfd` and `gaps` are the metrics' histograms (None: metrics off).
    """

    __slots__ = ("cheapest", "clock", "compress", "counted", "decode", "encode", "every", "first_delta", "flow",
                 "gaps", "last", "last_sampled", "last_sent", "left", "lumped", "lumped_deltas", "mark", "model",
                 "model_first_chunk", "model_started", "queue", "sampled", "sampled_compress", "sampled_encode",
                 "sampled_send", "send", "start", "ttfd")

    def __init__(self, clock: Callable[[], float], start: float, ttfd: Any = None, gaps: Any = None) -> None:
        self.clock = clock
        self.start = start
        self.last = start
        self.decode = self.queue = self.model = self.encode = self.compress = self.send = self.flow = 0.0
        self.model_started: float | None = None
        self.model_first_chunk: float | None = None
        self.every = SAMPLE_EVERY  # a pair of Deltas in `every` is sampled after the first two (1: every Delta)
        self.left = self.mark = 1  # countdown to the next sampled Delta, and its value at the last lap or tick
        self.counted = 0  # Deltas accounted for by a lap or tick (`deltas` adds those since)
        self.sampled = 0  # Deltas timed stage by stage after the first, and their encode, compress and send time
        self.sampled_encode = self.sampled_compress = self.sampled_send = 0.0
        self.cheapest = math.inf  # the least encode + compress + send time of any timed Delta (the first included)
        self.lumped = 0.0  # the whole time of the unsampled Deltas (and the model time between them), not split yet
        self.lumped_deltas = 0
        self.first_delta: float | None = None
        self.last_sent = 0.0  # when the last sampled Delta was handed over, and its number (the first is 1)
        self.last_sampled = 0
        self.ttfd = ttfd  # time to first delta: observed at the first Delta
        self.gaps = gaps  # inter-delta gaps: observed at the second Delta of each sampled pair

    @property
    def deltas(self) -> int:
        """Deltas sent so far."""
        return self.counted + self.mark - self.left

    @property
    def stages(self) -> dict[str, float]:
        """Seconds per stage, in STAGES order (read at the stream's end: what :meth:`tick` lumped is split)."""
        if self.lumped_deltas:
            self.timings_ms()
        return {"decode": self.decode, "queue": self.queue, "model": self.model, "encode": self.encode,
                "compress": self.compress, "send": self.send, "flow": self.flow}

    def lap(self, stage: str) -> float:
        """Charge the time since the last lap to `stage` (one of STAGES); returns the clock value.

        If unsampled Deltas went out since, the time is theirs (and the model's between them): lumped."""
        now = self.clock()
        n = self.mark - self.left
        if n:
            self.lumped += now - self.last
            self.lumped_deltas += n
            self.counted += n
            self.mark = self.left
        else:
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
        now = self.lap("model")
        if self.model_first_chunk is None and self.model_started is not None:
            self.model_first_chunk = now

    def tick(self, produced: float, encoded: float, sent: float, compressed: float = 0.0) -> None:
        """A sampled Delta: its chunk reached the driver at `produced`, its frames were built by `encoded`
        (`compressed` seconds of that compressing) and handed to the server by `sent`.

        The time until `produced` is model time, or lumped with the unsampled Deltas before it. Feeds the
        time to first delta, and the gap histogram if the Delta before was sampled too."""
        n = self.mark - self.left  # unsampled Deltas since the last lap or tick
        if n:
            self.lumped += produced - self.last
            self.lumped_deltas += n
        else:
            self.model += produced - self.last
        if self.model_first_chunk is None and self.model_started is not None:
            self.model_first_chunk = produced
        took = encoded - produced
        if sent - produced < self.cheapest:
            self.cheapest = sent - produced
        if compressed:
            compressed = took if compressed > took else compressed
            self.compress += compressed
        self.encode += took - compressed
        self.send += sent - encoded
        self.last = sent
        counted = self.counted
        if counted:  # (the first Delta's first-use costs would skew the estimate)
            self.sampled += 1
            self.sampled_encode += took - compressed
            self.sampled_compress += compressed
            self.sampled_send += sent - encoded
            if self.last_sampled != counted + n:  # the first of a pair: the next Delta is sampled too
                self.left = self.mark = 1
            else:  # the second (the Delta before was sampled): the gap between them
                gaps = self.gaps
                if gaps is not None:  # (its observe(), written out)
                    gaps.counts[bisect_left(gaps.bounds, sent - self.last_sent)] += 1
                    gaps.sum += sent - self.last_sent
                self.left = self.mark = self.every - 1 or 1
        else:
            self.left = self.mark = 1  # the second Delta is sampled too
            self.first_delta = sent
            ttfd = self.ttfd
            if ttfd is not None:  # (its observe(), written out)
                ttfd.counts[bisect_left(ttfd.bounds, sent - self.start)] += 1
                ttfd.sum += sent - self.start
        self.counted = self.last_sampled = counted + n + 1
        self.last_sent = sent

    def sent(self) -> None:
        """A Delta went to the server with nothing to charge but send time (since the last lap)."""
        last = self.last
        self.tick(last, last, self.clock())

    def timings_ms(self) -> dict[str, float]:
        """The stages in milliseconds; ``total`` on the same clock (the Request frame's arrival to the last
        lap); and ``model_first_chunk`` (model start to its first chunk).

        ``total`` is the stages' own span: read from another clock at another moment, a pause between
        the two reads (a garbage collection in a big heap) opened a gap the stages did not cover.
        """
        if self.mark != self.left:  # unsampled Deltas since the last lap (the drivers lap at the end)
            self.lap("model")
        n = self.lumped_deltas
        if n:
            # Split the lumped time: each unsampled Delta is charged the sampled ones' mean encode, compress and send
            # time, the model the rest. The charge is bounded by what was lumped, and by the cheapest timed Delta's
            # cost per Delta: a short stream has one sample, and one that a busy machine preempted (milliseconds
            # of "send") is not what a frame costs; charged to every unsampled Delta it took the model's time.
            lumped, sampled = self.lumped, self.sampled
            self.lumped, self.lumped_deltas = 0.0, 0
            per = n / sampled if sampled else 0.0
            encode, compress, send = self.sampled_encode * per, self.sampled_compress * per, self.sampled_send * per
            charged, bound = encode + compress + send, min(lumped, n * self.cheapest)
            if charged > bound:
                scale = bound / charged if bound > 0 else 0.0
                encode, compress, send = encode * scale, compress * scale, send * scale
            self.encode += encode
            self.compress += compress
            self.send += send
            self.model += lumped - encode - compress - send
        out = {"decode": self.decode * 1000.0, "queue": self.queue * 1000.0, "model": self.model * 1000.0,
               "encode": self.encode * 1000.0, "compress": self.compress * 1000.0, "send": self.send * 1000.0,
               "flow": self.flow * 1000.0, "total": (self.last - self.start) * 1000.0}
        if self.model_first_chunk is not None and self.model_started is not None:
            out["model_first_chunk"] = (self.model_first_chunk - self.model_started) * 1000.0
        return out
