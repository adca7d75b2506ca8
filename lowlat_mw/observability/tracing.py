"""OpenTelemetry spans for handshakes and streams, when ``opentelemetry-api`` is installed.

``lowlat.handshake`` covers WebSocket accept to Welcome (or refusal); ``lowlat.stream`` covers one
Request from its frame's arrival to its End or Error. A stream span carries the outcome
(``lowlat.finish_reason``: stop, cancelled...; or ERROR status and ``lowlat.error_code``), the
End's ``lowlat.usage.<key>``, the timings as ``lowlat.timing.<key>_ms`` (total, first_delta,
model_first_chunk and every stage, whether or not setting ``stage_timings`` sends them to the
client), one ``stage`` event per stage (``lowlat.stage``, ``lowlat.duration_ms``) and a
``first_delta`` event. A Request whose params carry a W3C ``traceparent`` (and ``tracestate``)
continues that trace, whatever propagators are configured globally. Without the package, with
setting ``tracing=False``, or while no SDK tracer provider is installed (the API alone would only
make non-recording spans), no span is made and nothing here runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .._version import __version__
from ..protocol import events as ev
from .timing import STAGES, StreamTimer

try:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _W3C = TraceContextTextMapPropagator()  # the params name W3C headers: not the global propagator's choice
except ImportError:  # the optional extra is not installed
    trace = None  # type: ignore[assignment]

__all__ = ["available", "end_handshake", "end_stream", "start_handshake", "start_stream", "tracer"]

_SCOPE = "lowlat_mw"


def available() -> bool:
    """True when opentelemetry-api is importable."""
    return trace is not None


def tracer() -> Any:
    """The lowlat_mw tracer of the global tracer provider; None without opentelemetry-api, or while the provider
    is the API's own (no SDK installed yet: its spans would record nothing, so none are made)."""
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer(_SCOPE, __version__)


def start_handshake(tracer_: Any, subprotocol: str | None) -> Any:
    """Open the ``lowlat.handshake`` span of a just-accepted WebSocket."""
    return tracer_.start_span("lowlat.handshake", kind=SpanKind.SERVER,
                              attributes={"lowlat.subprotocol": subprotocol or "lowlat.v1.json"})


def end_handshake(span: Any, *, session_id: str, resumed: bool, compression: tuple[str, ...],
                  close_code: int | None, client: tuple[str, int] | None = None) -> None:
    """Close the handshake span: admitted (Welcome sent) or refused with `close_code`."""
    if span.is_recording():
        attributes: dict[str, Any] = {"lowlat.session_id": session_id, "lowlat.resumed": resumed,
                                      "lowlat.compression": list(compression)}
        if client:
            attributes["client.address"] = str(client[0])
        if close_code is not None:
            attributes["lowlat.close_code"] = close_code
        span.set_attributes(attributes)
        if close_code is not None:
            span.set_status(Status(StatusCode.ERROR, f"closed with {close_code}"))
    span.end()


def _epoch_ns(timer: StreamTimer, at: float) -> int:
    """Wall-clock ns of `at` on the timer's clock (spans take epoch times)."""
    return time.time_ns() - int((timer.clock() - at) * 1e9)


def start_stream(tracer_: Any, request: ev.Request, session_id: str, model_label: str,
                 timer: StreamTimer | None) -> Any:
    """Open the ``lowlat.stream`` span, started when the Request frame arrived."""
    ctx = None
    params: Mapping[str, Any] = request.params or {}
    parent = params.get("traceparent")
    if isinstance(parent, str):
        carrier = {"traceparent": parent}
        state = params.get("tracestate")
        if isinstance(state, str):
            carrier["tracestate"] = state
        ctx = _W3C.extract(carrier)
    start = _epoch_ns(timer, timer.start) if timer is not None else None
    return tracer_.start_span(
        "lowlat.stream", context=ctx, kind=SpanKind.SERVER, start_time=start,
        attributes={"lowlat.session_id": session_id, "lowlat.stream_id": request.stream_id,
                    "lowlat.model": model_label},
    )


def end_stream(span: Any, terminal: ev.End | ev.Error | None, timer: StreamTimer | None) -> None:
    """Close a stream span with its outcome, timings, stage events and first_delta event.

    `terminal` None: the stream was stopped without one (its session ended), reported as cancelled.
    """
    if span.is_recording():
        timings: dict[str, float] = {}
        if timer is not None:  # stages even when stage_timings keeps them off the wire, and for errors
            timings.update(timer.timings_ms())
            timings["total"] = sum(timer.stages.values()) * 1000.0
            if timer.first_delta is not None:
                timings["first_delta"] = (timer.first_delta - timer.start) * 1000.0
        attributes: dict[str, Any] = {}  # set in one call: the SDK takes its lock and checks limits once
        if isinstance(terminal, ev.End):
            attributes["lowlat.finish_reason"] = terminal.finish_reason
            for key, value in terminal.usage.items():
                attributes[f"lowlat.usage.{key}"] = value
            timings.update(terminal.timings_ms)  # what the client was told wins
        elif isinstance(terminal, ev.Error):
            attributes["lowlat.error_code"] = terminal.code.wire_name
            span.set_status(Status(StatusCode.ERROR, terminal.message))
        else:
            attributes["lowlat.finish_reason"] = "cancelled"
        for key, value in timings.items():
            attributes[f"lowlat.timing.{key}_ms"] = float(value)
        span.set_attributes(attributes)
        if timer is not None:
            if timer.first_delta is not None:
                span.add_event("first_delta", timestamp=_epoch_ns(timer, timer.first_delta))
            for stage in STAGES:
                span.add_event("stage", {"lowlat.stage": stage, "lowlat.duration_ms": timer.stages[stage] * 1000.0})
    span.end()
