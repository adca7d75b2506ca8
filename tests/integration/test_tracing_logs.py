"""OpenTelemetry spans and connection logs, through a real uvicorn server on loopback.

Spans: one ``lowlat.handshake`` per connection, one ``lowlat.stream`` per Request with its stage
events, first_delta event, usage and outcome; a ``traceparent`` in the Request params continues
the caller's trace; setting ``tracing=False`` produces nothing. Logs (logger ``lowlat_mw``): one
open and one close record per connection with their extras, the idle reaper's 4000 close, model
failures at ERROR with the stream id, and nothing per delta at INFO.

The global tracer provider can be set once per process, so a module fixture installs an SDK
provider (or reuses an SDK provider already installed) and adds an in-memory exporter to it; each
test clears the exporter and only looks at spans of its own sessions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest
from opentelemetry import propagate, trace
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support import seconds, wait_until
from support.raw import JSON, codec_of, raw_connect, read_until_closed

from lowlat_mw.client import AsyncClient, connect
from lowlat_mw.errors import CloseCode, ErrorCode, StreamError
from lowlat_mw.observability.timing import STAGES
from lowlat_mw.protocol import events as ev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

WAIT = seconds(5.0)  # bound on every wait for a span or a log record from the server thread
LOGGER = "lowlat_mw"


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def span_exporter() -> Iterator[InMemorySpanExporter]:
    """An in-memory exporter on the process's SDK tracer provider (installed here if none is)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())  # a no-op (logged) if a provider was set already
        provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        pytest.skip(f"a non-SDK tracer provider is installed already: {provider!r}")
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    # An SDK provider cannot drop a processor: a shut-down exporter discards later modules' spans.
    exporter.shutdown()


@pytest.fixture
def spans(span_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    span_exporter.clear()
    yield span_exporter
    span_exporter.clear()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=LOGGER)
    return caplog


# ------------------------------------------------------------------------------ models
async def words(req):
    for w in (req.prompt or "").split():
        yield w + " "


async def five(req):
    for i in range(5):
        await asyncio.sleep(0)
        yield f"chunk{i} "


async def two_hundred(req):
    for i in range(200):
        yield f"{i} "


async def forever(req):
    i = 0
    while True:
        yield f"tick{i} "
        i += 1
        await asyncio.sleep(0.005)


async def failing(req):
    yield "about to fail "
    raise RuntimeError("kaputt")


def refuse_everyone(handshake):
    raise PermissionError("no entry")


# ------------------------------------------------------------------------------ helpers
def session_of(client: AsyncClient) -> str:
    assert client.welcome is not None
    return client.welcome.session_id


def named(exporter: InMemorySpanExporter, name: str, session_id: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans()
            if s.name == name and (s.attributes or {}).get("lowlat.session_id") == session_id]


async def handshake_span(exporter: InMemorySpanExporter, session_id: str) -> ReadableSpan:
    found = await wait_until(lambda: named(exporter, "lowlat.handshake", session_id), WAIT,
                             what=f"the handshake span of {session_id}")
    assert len(found) == 1, found
    return found[0]


async def stream_span(exporter: InMemorySpanExporter, session_id: str, stream_id: int) -> ReadableSpan:
    def fetch() -> list[ReadableSpan]:
        return [s for s in named(exporter, "lowlat.stream", session_id)
                if s.attributes["lowlat.stream_id"] == stream_id]

    found = await wait_until(fetch, WAIT, what=f"the stream span of {session_id}/{stream_id}")
    assert len(found) == 1, found
    return found[0]


def assert_stages(span: ReadableSpan) -> None:
    """One stage event per stage, in order, adding up to the End's total (within 1 ms)."""
    attrs = span.attributes
    stages = [e for e in span.events if e.name == "stage"]
    assert [e.attributes["lowlat.stage"] for e in stages] == list(STAGES)
    durations = {e.attributes["lowlat.stage"]: e.attributes["lowlat.duration_ms"] for e in stages}
    assert all(d >= 0 for d in durations.values()), durations
    for stage, ms in durations.items():  # the events and End.timings_ms tell the same story
        assert attrs[f"lowlat.timing.{stage}_ms"] == pytest.approx(ms, abs=1e-6)
    total = attrs["lowlat.timing.total_ms"]
    assert sum(durations.values()) == pytest.approx(total, abs=1.0), (durations, total)


def records(caplog: pytest.LogCaptureFixture, session_id: str, prefix: str) -> list[logging.LogRecord]:
    return [r for r in list(caplog.records) if r.name == LOGGER and getattr(r, "session_id", None) == session_id
            and r.getMessage().startswith(prefix)]


async def close_record(caplog: pytest.LogCaptureFixture, session_id: str) -> logging.LogRecord:
    found = await wait_until(lambda: records(caplog, session_id, f"connection {session_id} closed"), WAIT,
                             what=f"the close log of {session_id}")
    assert len(found) == 1, [r.getMessage() for r in found]
    return found[0]


# ------------------------------------------------------------------------------ spans
@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_one_handshake_span_per_connection(uvicorn_server, starlette_app, spans, mode):
    srv = uvicorn_server(starlette_app(words))
    sessions = []
    async with asyncio.timeout(10):
        for _ in range(2):
            async with connect(srv.url, mode=mode) as client:
                assert await client.complete("hi there") == "hi there "
                sessions.append((session_of(client), client.welcome))
    assert sessions[0][0] != sessions[1][0]
    for session_id, welcome in sessions:
        span = await handshake_span(spans, session_id)
        attrs = span.attributes
        assert span.kind is SpanKind.SERVER
        assert span.end_time is not None and span.start_time is not None
        assert span.start_time <= span.end_time
        assert attrs["lowlat.subprotocol"] == f"lowlat.v1.{mode}"
        assert attrs["lowlat.session_id"] == session_id
        assert attrs["lowlat.resumed"] is False
        assert tuple(attrs["lowlat.compression"]) == tuple(welcome.compression)
        assert attrs["client.address"] == "127.0.0.1"
        assert "lowlat.close_code" not in attrs
        assert span.status.status_code is not StatusCode.ERROR
        assert span.parent is None  # the handshake starts its own trace
    if mode == "proto":  # the client offers its codecs: the handshake span shows what was agreed
        assert sessions[0][1].compression, "no compression negotiated in proto mode"


async def test_stream_span_has_stage_events_first_delta_and_usage(uvicorn_server, starlette_app, spans):
    srv = uvicorn_server(starlette_app(five))
    async with asyncio.timeout(10), connect(srv.url) as client:
        stream = client.stream("go")
        chunks = [c async for c in stream]
        session_id = session_of(client)
    assert chunks == [f"chunk{i} " for i in range(5)]
    end = stream.end
    assert end is not None

    span = await stream_span(spans, session_id, stream.stream_id)
    attrs = span.attributes
    assert span.kind is SpanKind.SERVER
    assert span.parent is None
    assert span.status.status_code is not StatusCode.ERROR
    assert attrs["lowlat.model"] == "default"
    assert attrs["lowlat.finish_reason"] == "stop"
    assert attrs["lowlat.usage.deltas"] == 5 == end.usage["deltas"]
    assert attrs["lowlat.usage.output_bytes"] == end.usage["output_bytes"] > 0
    for key, value in end.timings_ms.items():  # every End timing is on the span
        assert attrs[f"lowlat.timing.{key}_ms"] == pytest.approx(value)
    assert_stages(span)

    firsts = [e for e in span.events if e.name == "first_delta"]
    assert len(firsts) == 1
    assert span.start_time <= firsts[0].timestamp <= span.end_time
    # The span starts when the Request frame arrived: its length is (about) the End's total.
    assert (span.end_time - span.start_time) / 1e6 == pytest.approx(attrs["lowlat.timing.total_ms"], abs=2.0)
    # One stream span per Request: a second request on the connection gets its own.
    assert len(named(spans, "lowlat.stream", session_id)) == 1


@pytest.fixture(params=["default", "no-propagators"])
def global_propagator(request: pytest.FixtureRequest) -> Iterator[str]:
    """The process's propagators: the default, or none (traceparent params must work regardless)."""
    if request.param == "default":
        yield request.param
        return
    saved = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([]))
    try:
        yield request.param
    finally:
        propagate.set_global_textmap(saved)


async def test_traceparent_in_params_continues_the_callers_trace(uvicorn_server, starlette_app, spans,
                                                                 global_propagator):
    trace_id, parent_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
    srv = uvicorn_server(starlette_app(words))
    async with asyncio.timeout(10), connect(srv.url) as client:
        traced = client.stream("traced", params={"traceparent": f"00-{trace_id:032x}-{parent_id:016x}-01",
                                                 "tracestate": "vendor=value"})
        assert await traced.text() == "traced "
        plain = client.stream("plain")
        assert await plain.text() == "plain "
        garbled = client.stream("garbled", params={"traceparent": "00-not-a-trace-01"})
        assert await garbled.text() == "garbled "
        session_id = session_of(client)

    span = await stream_span(spans, session_id, traced.stream_id)
    assert span.context.trace_id == trace_id
    assert span.context.span_id != parent_id
    assert span.parent is not None and span.parent.is_remote
    assert span.parent.trace_id == trace_id and span.parent.span_id == parent_id
    assert span.context.trace_state.get("vendor") == "value"

    for other in (plain, garbled):  # no (valid) traceparent: a new trace of its own
        root = await stream_span(spans, session_id, other.stream_id)
        assert root.parent is None
        assert root.context.trace_id != trace_id
        assert root.attributes["lowlat.finish_reason"] == "stop"


async def test_failing_model_span_has_error_status_and_code(uvicorn_server, starlette_app, spans):
    srv = uvicorn_server(starlette_app(failing))
    async with asyncio.timeout(10), connect(srv.url) as client:
        stream = client.stream("boom")
        with pytest.raises(StreamError) as info:
            _ = [c async for c in stream]
        assert info.value.code is ErrorCode.MODEL_ERROR
        session_id = session_of(client)

    span = await stream_span(spans, session_id, stream.stream_id)
    assert span.status.status_code is StatusCode.ERROR
    assert "RuntimeError" in (span.status.description or "")
    assert span.attributes["lowlat.error_code"] == "model_error"
    assert "lowlat.finish_reason" not in span.attributes
    assert len([e for e in span.events if e.name == "first_delta"]) == 1  # it did send one chunk
    assert [e.attributes["lowlat.stage"] for e in span.events if e.name == "stage"] == list(STAGES)
    # The connection itself was fine.
    assert (await handshake_span(spans, session_id)).status.status_code is not StatusCode.ERROR


async def test_cancelled_stream_span_has_finish_reason_cancelled(uvicorn_server, starlette_app, spans):
    srv = uvicorn_server(starlette_app(forever))
    async with asyncio.timeout(10), connect(srv.url) as client:
        stream = client.stream("cancel me")
        assert await stream.__anext__() == "tick0 "
        await stream.cancel()
        _ = [c async for c in stream]
        assert stream.end is not None and stream.end.finish_reason == "cancelled"
        session_id = session_of(client)

    span = await stream_span(spans, session_id, stream.stream_id)
    assert span.attributes["lowlat.finish_reason"] == "cancelled"
    assert span.status.status_code is not StatusCode.ERROR
    assert span.attributes["lowlat.usage.deltas"] == stream.end.usage["deltas"] >= 1
    assert_stages(span)


async def test_tracing_off_produces_no_spans(uvicorn_server, starlette_app, spans, logs):
    srv = uvicorn_server(starlette_app(words, tracing=False))
    async with asyncio.timeout(10):
        async with connect(srv.url) as client:
            stream = client.stream("quiet", params={"traceparent": f"00-{1:032x}-{1:016x}-01"})
            assert await stream.text() == "quiet "
            assert stream.end is not None and "total" in stream.end.timings_ms  # stage timings still work
            session_id = session_of(client)
        await close_record(logs, session_id)  # the server has seen the whole connection
    assert spans.get_finished_spans() == ()


async def test_span_has_stage_timings_even_when_the_end_does_not(uvicorn_server, starlette_app, spans):
    srv = uvicorn_server(starlette_app(five, stage_timings=False))
    async with asyncio.timeout(10), connect(srv.url) as client:
        stream = client.stream("go")
        assert len([c async for c in stream]) == 5
        session_id = session_of(client)
    assert stream.end is not None and not set(STAGES) & set(stream.end.timings_ms)  # off the wire
    span = await stream_span(spans, session_id, stream.stream_id)
    assert span.attributes["lowlat.timing.total_ms"] == pytest.approx(stream.end.timings_ms["total"])
    assert_stages(span)  # but on the span, as attributes and events


async def test_stream_stopped_by_the_client_leaving_is_a_cancelled_span(uvicorn_server, starlette_app, spans):
    srv = uvicorn_server(starlette_app(forever))
    async with asyncio.timeout(10):
        client = connect(srv.url)
        await client.open()
        session_id = session_of(client)
        stream = client.stream("abandoned")
        assert await stream.__anext__() == "tick0 "
        await client.close()  # a normal close: no resume, the server stops the model without an End
    span = await stream_span(spans, session_id, stream.stream_id)
    assert span.attributes["lowlat.finish_reason"] == "cancelled"
    assert span.status.status_code is not StatusCode.ERROR
    assert [e.attributes["lowlat.stage"] for e in span.events if e.name == "stage"] == list(STAGES)
    assert span.attributes["lowlat.timing.total_ms"] == pytest.approx(
        sum(e.attributes["lowlat.duration_ms"] for e in span.events if e.name == "stage"))


async def test_refused_handshake_span_has_error_status_and_close_code(uvicorn_server, starlette_app, spans, logs):
    srv = uvicorn_server(starlette_app(words, authenticate=f"{__name__}:refuse_everyone"))
    async with asyncio.timeout(10), raw_connect(srv.url, [JSON]) as ws:
        await ws.send(codec_of(ws).encode(ev.Hello(client="refused")))
        out = await read_until_closed(ws)
    assert out.close_code == CloseCode.POLICY_VIOLATION
    assert [e.code for e in out.errors] == [ErrorCode.UNAUTHORIZED]

    def refused() -> list[ReadableSpan]:
        return [s for s in spans.get_finished_spans() if s.name == "lowlat.handshake"]

    (span,) = await wait_until(refused, WAIT, what="the refused handshake span")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["lowlat.close_code"] == CloseCode.POLICY_VIOLATION
    assert span.attributes["lowlat.resumed"] is False
    session_id = span.attributes["lowlat.session_id"]
    assert not named(spans, "lowlat.stream", session_id)
    warnings = [r for r in list(logs.records) if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no entry" in warnings[0].getMessage(), warnings
    closed = await close_record(logs, session_id)
    assert closed.close_code == CloseCode.POLICY_VIOLATION and closed.closed_by == "server"
    assert not records(logs, session_id, f"connection {session_id} open")  # never admitted


async def test_handshake_timeout_span_has_error_status(uvicorn_server, starlette_app, spans, logs):
    srv = uvicorn_server(starlette_app(words, handshake_timeout=0.2))
    async with asyncio.timeout(10), raw_connect(srv.url, [JSON]) as ws:
        out = await read_until_closed(ws)  # no Hello
    assert out.close_code == CloseCode.HANDSHAKE_TIMEOUT
    (span,) = await wait_until(lambda: [s for s in spans.get_finished_spans() if s.name == "lowlat.handshake"], WAIT,
                               what="the timed-out handshake span")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["lowlat.close_code"] == CloseCode.HANDSHAKE_TIMEOUT
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(0.2, abs=0.15)
    closed = await close_record(logs, span.attributes["lowlat.session_id"])
    assert closed.close_code == CloseCode.HANDSHAKE_TIMEOUT and closed.closed_by == "server"


async def test_handshake_abandoned_by_the_client_is_not_a_success(uvicorn_server, starlette_app, spans, logs):
    srv = uvicorn_server(starlette_app(words))
    async with asyncio.timeout(10):
        async with raw_connect(srv.url, [JSON]):
            pass  # closes (1000) without sending Hello
        (span,) = await wait_until(lambda: [s for s in spans.get_finished_spans() if s.name == "lowlat.handshake"],
                                   WAIT, what="the abandoned handshake span")
        closed = await close_record(logs, span.attributes["lowlat.session_id"])
    assert closed.closed_by == "client" and closed.close_code == CloseCode.NORMAL
    assert span.attributes["lowlat.close_code"] == CloseCode.NORMAL
    assert span.status.status_code is StatusCode.ERROR


# ------------------------------------------------------------------------------ logs
async def test_refusal_warning_carries_session_id_and_client(uvicorn_server, starlette_app, logs):
    srv = uvicorn_server(starlette_app(words, authenticate=f"{__name__}:refuse_everyone"))
    async with asyncio.timeout(10), raw_connect(srv.url, [JSON]) as ws:
        await ws.send(codec_of(ws).encode(ev.Hello(client="refused")))
        assert (await read_until_closed(ws)).close_code == CloseCode.POLICY_VIOLATION
    (warning,) = await wait_until(lambda: [
        r for r in list(logs.records) if r.name == LOGGER and r.levelno == logging.WARNING], WAIT,
            what="the refusal warning")
    assert hasattr(warning, "session_id"), warning.__dict__
    closed = await close_record(logs, warning.session_id)
    assert warning.client == closed.client and warning.client[0] == "127.0.0.1"


@pytest.mark.parametrize("mode", ["proto", "json"])
async def test_open_and_close_logged_once_per_connection_with_extras(uvicorn_server, starlette_app, logs, mode):
    srv = uvicorn_server(starlette_app(words))
    sessions = []
    async with asyncio.timeout(10):
        for _ in range(2):
            async with connect(srv.url, mode=mode) as client:
                assert await client.complete("a b c") == "a b c "
                sessions.append(session_of(client))
    for session_id in sessions:
        closed = await close_record(logs, session_id)
        opened = records(logs, session_id, f"connection {session_id} open")
        assert len(opened) == 1, [r.getMessage() for r in opened]
        rec = opened[0]
        assert rec.levelno == logging.INFO
        assert rec.subprotocol == f"lowlat.v1.{mode}"
        assert rec.resumed is False
        assert rec.client[0] == "127.0.0.1"
        assert closed.levelno == logging.INFO
        assert closed.close_code == CloseCode.NORMAL
        assert closed.closed_by == "client"
        assert closed.client == rec.client
        assert opened[0].created <= closed.created


async def test_idle_reaped_connection_logs_server_close_4000(uvicorn_server, starlette_app, logs):
    srv = uvicorn_server(starlette_app(words, idle_timeout=0.3))
    async with asyncio.timeout(10), connect(srv.url) as client:
        session_id = session_of(client)
        start = time.monotonic()
        closed = await close_record(logs, session_id)
        assert time.monotonic() - start < 3.0
        await wait_until(lambda: client.last_close is not None, WAIT, what="the client to see the close")
        assert client.last_close.code == CloseCode.IDLE_TIMEOUT
    assert closed.levelno == logging.INFO
    assert closed.close_code == CloseCode.IDLE_TIMEOUT
    assert closed.closed_by == "server"
    assert closed.client[0] == "127.0.0.1"
    assert len(records(logs, session_id, f"connection {session_id} open")) == 1


async def test_model_failure_logged_at_error_with_stream_id(uvicorn_server, starlette_app, logs):
    srv = uvicorn_server(starlette_app(failing))
    async with asyncio.timeout(10), connect(srv.url) as client:
        stream = client.stream("boom")
        with pytest.raises(StreamError):
            _ = [c async for c in stream]
        session_id = session_of(client)
    errors = await wait_until(lambda: [
        r for r in list(logs.records) if r.name == LOGGER and r.levelno >= logging.ERROR], WAIT,
            what="the model failure log")
    assert len(errors) == 1, [r.getMessage() for r in errors]
    rec = errors[0]
    assert rec.levelno == logging.ERROR
    assert rec.stream_id == stream.stream_id
    assert rec.session_id == session_id
    assert rec.exc_info is not None and isinstance(rec.exc_info[1], RuntimeError)
    assert "kaputt" in logs.text  # the traceback is in the log even though the client only got the type


async def test_long_stream_adds_no_info_records_per_delta(uvicorn_server, starlette_app, logs):
    srv = uvicorn_server(starlette_app(two_hundred))
    async with asyncio.timeout(10):
        async with connect(srv.url) as client:
            stream = client.stream("many")
            chunks = [c async for c in stream]
            session_id = session_of(client)
        await close_record(logs, session_id)
    assert len(chunks) == 200
    info = [r for r in list(logs.records) if r.name.startswith(LOGGER) and r.levelno >= logging.INFO]
    assert [r.getMessage().split(":")[0] for r in info] == [
        f"connection {session_id} open", f"connection {session_id} closed by client"]
