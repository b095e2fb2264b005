"""No span is started where the sampler would not record it; the trace goes on unchanged.

Each case holds the shortcut to the SDK itself: where ``records_children_of`` says no, the
SDK's own ``start_span`` under the same parent and sampler gives a span that does not record.
"""

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, SpanKind, StatusCode

from fulfilment.observability.tracing import (
    context_of,
    current_span,
    current_traceparent,
    records_children_of,
    records_children_of_traceparent,
)

SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"

SAMPLERS = [
    ("parentbased_always_on", None),
    ("parentbased_traceidratio", "0.01"),
    ("parentbased_always_off", None),
    ("always_on", None),
    ("traceidratio", "0.01"),
    ("always_off", None),
]

PARENTS = [SAMPLED, UNSAMPLED, None, "not a traceparent", "01-" + SAMPLED[3:] + "-more"]


def provider_of(monkeypatch: pytest.MonkeyPatch, sampler: str, argument: str | None):
    """A provider of ``OTEL_TRACES_SAMPLER`` ``sampler``, global for this test only."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if argument is None:
        monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
    else:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", argument)
    provider = TracerProvider()
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    return provider, exported


def parent_context(traceparent: str | None) -> SpanContext:
    return trace.get_current_span(context_of(traceparent)).get_span_context()


@pytest.mark.parametrize(("sampler", "argument"), SAMPLERS)
@pytest.mark.parametrize("traceparent", PARENTS)
def test_a_span_is_skipped_only_where_the_sdk_would_not_record_it(
    monkeypatch, sampler, argument, traceparent
) -> None:
    provider, _ = provider_of(monkeypatch, sampler, argument)
    tracer = provider.get_tracer("test")
    parent = context_of(traceparent)

    # Many starts: a ratio sampler's root decision differs from trace to trace.
    recorded = any(tracer.start_span("s", context=parent).is_recording() for _ in range(500))

    assert records_children_of(parent_context(traceparent)) or not recorded
    assert records_children_of_traceparent(traceparent) or not recorded


@pytest.mark.parametrize(
    ("sampler", "argument"), [("parentbased_always_on", None), ("parentbased_traceidratio", "1")]
)
def test_under_a_parent_based_sampler_an_unsampled_parent_s_children_are_skipped(
    monkeypatch, sampler, argument
) -> None:
    provider_of(monkeypatch, sampler, argument)

    assert not records_children_of(parent_context(UNSAMPLED))
    assert not records_children_of_traceparent(UNSAMPLED)
    assert records_children_of(parent_context(SAMPLED))
    assert records_children_of_traceparent(SAMPLED)
    assert records_children_of(INVALID_SPAN_CONTEXT)
    assert records_children_of_traceparent(None)


@pytest.mark.parametrize("sampler", ["always_on", "traceidratio"])
def test_a_sampler_that_ignores_the_parent_gets_every_span_started(monkeypatch, sampler) -> None:
    provider_of(monkeypatch, sampler, "1")

    assert records_children_of(parent_context(UNSAMPLED))
    assert records_children_of_traceparent(UNSAMPLED)


def test_with_tracing_off_nothing_is_started(monkeypatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.NoOpTracerProvider)

    assert not records_children_of(parent_context(SAMPLED))
    assert not records_children_of_traceparent(SAMPLED)
    assert not records_children_of_traceparent(None)


def test_under_an_unsampled_parent_the_block_runs_in_the_parent_s_context(monkeypatch) -> None:
    provider, exported = provider_of(monkeypatch, "parentbased_always_on", None)
    built: list[str] = []

    def attributes():
        built.append("attributes")
        return {"a": 1}

    with current_span(
        provider.get_tracer("test"),
        "process",
        kind=SpanKind.CONSUMER,
        parent=context_of(UNSAMPLED),
        attributes=attributes,
        links=lambda: built.append("links") or [],
    ) as span:
        assert not span.is_recording()
        assert current_traceparent() == UNSAMPLED
        with current_span(
            provider.get_tracer("test"), "inner", kind=SpanKind.CLIENT, attributes=attributes
        ) as inner:
            assert current_traceparent() == UNSAMPLED
            assert inner is span

    assert current_traceparent() is None
    assert built == []
    assert exported.get_finished_spans() == ()


def test_under_a_sampled_parent_the_span_is_the_parent_s_child_and_current(monkeypatch) -> None:
    provider, exported = provider_of(monkeypatch, "parentbased_always_on", None)
    link = parent_context(SAMPLED)

    with current_span(
        provider.get_tracer("test"),
        "group commit",
        kind=SpanKind.INTERNAL,
        parent=context_of(SAMPLED),
        attributes=lambda: {"fulfilment.group_commit.size": 2},
        links=lambda: [trace.Link(link)],
    ) as span:
        assert span.is_recording()
        assert current_traceparent() != SAMPLED
        assert current_traceparent() is not None
        assert current_traceparent().split("-")[1] == SAMPLED.split("-")[1]

    (finished,) = exported.get_finished_spans()
    assert finished.parent is not None
    assert finished.parent.span_id == link.span_id
    assert finished.kind is SpanKind.INTERNAL
    assert finished.attributes == {"fulfilment.group_commit.size": 2}
    assert [each.context for each in finished.links] == [link]


def refuse() -> None:
    message = "refused"
    raise ValueError(message)


@pytest.mark.parametrize(("record_errors", "status"), [(True, StatusCode.ERROR), (False, None)])
def test_an_error_marks_the_span_only_when_asked(monkeypatch, record_errors, status) -> None:
    provider, exported = provider_of(monkeypatch, "parentbased_always_on", None)

    with (
        pytest.raises(ValueError, match="refused"),
        current_span(
            provider.get_tracer("test"),
            "SELECT f",
            kind=SpanKind.CLIENT,
            parent=context_of(SAMPLED),
            attributes=dict,
            record_errors=record_errors,
        ),
    ):
        refuse()

    (finished,) = exported.get_finished_spans()
    if status is None:
        assert finished.status.status_code is StatusCode.UNSET
        assert finished.events == ()
    else:
        assert finished.status.status_code is status
        assert finished.status.description == "ValueError: refused"
        assert [event.name for event in finished.events] == ["exception"]
