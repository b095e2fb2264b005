import threading
import time

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry

from fulfilment.observability.logging import add_trace_ids
from fulfilment.observability.tracing import (
    Tracing,
    context_of,
    start_tracing,
    traceparent_of,
    tracing_configured,
)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Stuck(SpanExporter):
    """A collector that does not answer until released: the export thread waits in it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans):
        self.release.wait(10)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


class Refusing(SpanExporter):
    def __init__(self) -> None:
        self.refused = 0

    def export(self, spans):
        self.refused += len(spans)
        return SpanExportResult.FAILURE


def dropped(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value("fulfilment_trace_spans_dropped_total", {"reason": reason})
    assert value is not None
    return value


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_on_only_with_an_otlp_endpoint(environ, on) -> None:
    assert tracing_configured(environ) is on


def test_without_an_endpoint_nothing_is_built() -> None:
    registry = CollectorRegistry()
    assert start_tracing(registry, service_name="s", version="1", environ={}) is None
    assert (
        registry.get_sample_value("fulfilment_trace_spans_dropped_total", {"reason": "queue_full"})
        is None
    )


async def test_a_collector_that_does_not_answer_costs_dropped_spans_not_a_stalled_caller(
    monkeypatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "8")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    registry = CollectorRegistry()
    stuck = Stuck()
    tracing = Tracing(registry, service_name="worker", version="1", exporter=stuck)
    tracer = tracing.provider.get_tracer("test")
    for _ in range(100):
        tracer.start_span("delivery").end()
    # The export thread holds one batch of 4 at most; the queue 8; everything else is lost.
    assert 100 - 8 - 4 <= dropped(registry, "queue_full") <= 100 - 8
    stuck.release.set()
    await tracing.shutdown(timeout_seconds=5)
    assert stuck.exported + dropped(registry, "queue_full") == 100
    assert dropped(registry, "export_failed") == 0


async def test_spans_the_collector_refuses_are_counted() -> None:
    registry = CollectorRegistry()
    tracing = Tracing(registry, service_name="worker", version="1", exporter=Refusing())
    tracer = tracing.provider.get_tracer("test")
    for _ in range(3):
        tracer.start_span("delivery").end()
    await tracing.shutdown(timeout_seconds=5)
    assert dropped(registry, "export_failed") == 3
    assert dropped(registry, "queue_full") == 0


async def test_the_exit_waits_at_most_its_timeout_for_a_collector_that_hangs() -> None:
    stuck = Stuck()
    tracing = Tracing(CollectorRegistry(), service_name="w", version="1", exporter=stuck)
    tracing.provider.get_tracer("test").start_span("delivery").end()
    started = time.monotonic()
    await tracing.shutdown(timeout_seconds=0.3)
    assert time.monotonic() - started < 2
    stuck.release.set()


def test_the_environment_s_service_name_wins_over_the_program_s(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "fulfilment-eu")
    tracing = Tracing(
        CollectorRegistry(), service_name="fulfilment-worker", version="1.2", exporter=Refusing()
    )
    attributes = tracing.provider.resource.attributes
    assert attributes["service.name"] == "fulfilment-eu"
    assert attributes["service.version"] == "1.2"


@pytest.mark.parametrize(
    "malformed", [None, "00-abc-def-01", TRACEPARENT.upper(), TRACEPARENT + "-x"]
)
def test_a_missing_or_malformed_traceparent_gives_a_new_trace(malformed) -> None:
    assert not trace.get_current_span(context_of(malformed)).get_span_context().is_valid


def test_a_valid_traceparent_is_the_remote_parent_and_reads_back_the_same() -> None:
    span_context = trace.get_current_span(context_of(TRACEPARENT)).get_span_context()
    assert span_context.is_remote
    assert traceparent_of(span_context) == TRACEPARENT


def test_log_lines_carry_the_current_span_s_ids() -> None:
    parent = context_of(TRACEPARENT)
    token = context.attach(parent)
    try:
        line = add_trace_ids(None, "info", {"event": "x"})
    finally:
        context.detach(token)
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert line["span_id"] == "b7ad6b7169203331"
    assert "trace_id" not in add_trace_ids(None, "info", {"event": "y"})
