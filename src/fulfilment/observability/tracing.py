"""OpenTelemetry tracing: a tracer provider from the standard ``OTEL_*`` variables, or none.

Tracing is on when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``
is set (and ``OTEL_SDK_DISABLED`` is not ``true``); the spans then go over OTLP/HTTP with
protobuf to that collector. Everything else is the SDK's own reading of the environment:
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (the program's name is the default
service name), ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` (default
``parentbased_always_on``), ``OTEL_BSP_*`` (queue of 2048 spans, batches of 512 every 5 s),
``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s), ``OTEL_EXPORTER_OTLP_HEADERS`` and the rest.

Without an endpoint no provider is built: the API's no-op tracer answers, and the service
starts no span (:func:`current_span` only makes the delivery's incoming trace context
current, so that result events still carry it on, as before tracing existed).

Nor is a span started under a parent that is not sampled, where the default, parent-based
samplers record nothing (:func:`records_children_of`): the parent's context goes on as it came,
into the rows written and the result events' headers, as W3C Trace Context allows (a
participant MAY pass ``parent-id`` on unchanged). At a 1 % ratio that spares 99 of 100 group
commits, database calls, publishes and warehouse calls the sampler's decision, two ids and a
span object.

The span processor is the SDK's ``BatchSpanProcessor``: spans wait in a bounded queue and a
thread of its own exports them, so a collector that is down or slow never stalls the event
loop; when the queue is full the oldest span is dropped. The SDK drops silently (it logs, and
counts only in its own, opt-in OpenTelemetry metrics: opentelemetry-python issue #3152), so
the provider's processor is wrapped to count the losses in the process's Prometheus registry,
``fulfilment_trace_spans_dropped_total{reason}``:

* ``queue_full``: a span ended while the queue held ``max_queue_size`` spans. The count is the
  estimate the SDK's authors proposed (spans ended, less spans handed to the exporter, above
  the capacity): exact, except that a span ending in the microseconds between the export
  thread taking a batch off the queue and calling the exporter may be counted although the
  queue had room.
* ``export_failed``: the exporter gave up on a batch (collector unreachable or refusing past
  the exporter's own retries within ``OTEL_EXPORTER_OTLP_TIMEOUT``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Final

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import Link, Span, SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from prometheus_client import CollectorRegistry, Counter

__all__ = [
    "ENDPOINT_VARIABLES",
    "Tracing",
    "context_of",
    "current_span",
    "current_traceparent",
    "records_children_of",
    "records_children_of_traceparent",
    "start_tracing",
    "traceparent_of",
    "tracing_configured",
    "tracing_enabled",
]

logger = structlog.get_logger("fulfilment.tracing")

ENDPOINT_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""Either one turns tracing on (the SDK's own variables, read by the exporter)."""

SHUTDOWN_SECONDS: Final = 5.0
"""Longest wait at exit for the queued spans to be exported; then they are given up."""

QUEUE_FULL: Final = "queue_full"
EXPORT_FAILED: Final = "export_failed"

_DEFAULT_MAX_QUEUE_SIZE: Final = 2048
"""The SDK's default of ``OTEL_BSP_MAX_QUEUE_SIZE``, read the same way here to count drops."""

_PROPAGATOR: Final = TraceContextTextMapPropagator()
"""W3C Trace Context, whatever ``OTEL_PROPAGATORS`` says: the contract's ``traceparent``."""


class _Losses:
    """Spans handed to the batch processor and not yet to the exporter; losses counted."""

    def __init__(self, dropped: Counter, capacity: int) -> None:
        self._lock = threading.Lock()
        self._pending = 0
        self._capacity = capacity
        self._queue_full = dropped.labels(reason=QUEUE_FULL)
        self._export_failed = dropped.labels(reason=EXPORT_FAILED)

    def queued(self) -> None:
        """One sampled span went to the queue; a full queue drops one (the oldest)."""
        with self._lock:
            if self._pending >= self._capacity:
                self._queue_full.inc()
            else:
                self._pending += 1

    def taken(self, count: int) -> None:
        with self._lock:
            self._pending = max(0, self._pending - count)

    def failed(self, count: int) -> None:
        self._export_failed.inc(count)

    @property
    def pending(self) -> int:
        return self._pending


class _CountingExporter(SpanExporter):
    """The OTLP exporter, counting the batches it takes and the spans it fails to send."""

    def __init__(self, exporter: SpanExporter, losses: _Losses) -> None:
        self._exporter = exporter
        self._losses = losses

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._losses.taken(len(spans))
        result = self._exporter.export(spans)
        if result is not SpanExportResult.SUCCESS:
            self._losses.failed(len(spans))
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class _CountingProcessor(SpanProcessor):
    """The batch processor, counting the sampled spans it queues (see the module text)."""

    def __init__(self, processor: SpanProcessor, losses: _Losses) -> None:
        self._processor = processor
        self._losses = losses

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        self._processor.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self._losses.queued()
        self._processor.on_end(span)

    def shutdown(self) -> None:
        self._processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._processor.force_flush(timeout_millis)


def tracing_configured(environ: Mapping[str, str]) -> bool:
    """True when ``environ`` names an OTLP endpoint and does not disable the SDK."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


class Tracing:
    """The process's tracer provider and its exporter queue; :meth:`shutdown` at exit.

    Args:
        registry: the process's Prometheus registry, which gets
            ``fulfilment_trace_spans_dropped_total{reason}`` (both reasons at 0).
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` or
            ``OTEL_RESOURCE_ATTRIBUTES`` names one (``fulfilment-worker``).
        version: ``service.version``.
        exporter: where the spans go; the OTLP/HTTP exporter of the environment when None.

    Raises:
        ValueError: an ``OTEL_BSP_*`` value the SDK refuses (a queue smaller than a batch).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        service_name: str,
        version: str,
        exporter: SpanExporter | None = None,
    ) -> None:
        dropped = Counter(
            "fulfilment_trace_spans_dropped_total",
            "Spans lost before the collector got them, by reason: queue_full (the batch "
            "queue was full: the collector is down or slow) or export_failed.",
            ["reason"],
            registry=registry,
        )
        capacity = _max_queue_size()
        self._losses = _Losses(dropped, capacity)
        resource = Resource.create({"service.name": service_name, "service.version": version})
        # The environment's service name wins over the program's default.
        resource = resource.merge(OTELResourceDetector().detect())
        self.provider = TracerProvider(resource=resource)
        batch = BatchSpanProcessor(
            _CountingExporter(exporter or OTLPSpanExporter(), self._losses),
            max_queue_size=capacity,
        )
        self.provider.add_span_processor(_CountingProcessor(batch, self._losses))

    async def shutdown(self, timeout_seconds: float = SHUTDOWN_SECONDS) -> None:
        """Export what is queued, for at most ``timeout_seconds``; then give the rest up.

        The SDK's shutdown waits up to 30 s for its export thread, and that thread may be in
        the exporter's retries against a collector that is down; it runs on a daemon thread
        here, so an exit never waits longer than ``timeout_seconds``.
        """
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def close() -> None:
            self.provider.shutdown()
            # The loop may be gone when a hung export ends long after the timeout.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done.set)

        threading.Thread(target=close, name="tracing-shutdown", daemon=True).start()
        try:
            async with asyncio.timeout(timeout_seconds):
                await done.wait()
        except TimeoutError:
            logger.warning(
                "tracing.shutdown_timed_out",
                timeout_seconds=timeout_seconds,
                spans_unsent=self._losses.pending,
            )


def start_tracing(
    registry: CollectorRegistry,
    *,
    service_name: str,
    version: str,
    environ: Mapping[str, str] | None = None,
) -> Tracing | None:
    """Build the process's :class:`Tracing` and make it the global tracer provider.

    Returns None, building nothing, when the environment (``os.environ`` by default) names no
    OTLP endpoint (:func:`tracing_configured`). Call once per process: OpenTelemetry's
    global provider can be set only once.

    Raises:
        ValueError: as :class:`Tracing`.
    """
    if not tracing_configured(os.environ if environ is None else environ):
        return None
    tracing = Tracing(registry, service_name=service_name, version=version)
    trace.set_tracer_provider(tracing.provider)
    return tracing


def _max_queue_size() -> int:
    # The SDK reads the variable the same way when max_queue_size is None (and logs a bad
    # value and takes its default).
    try:
        return int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", _DEFAULT_MAX_QUEUE_SIZE))
    except ValueError:
        return _DEFAULT_MAX_QUEUE_SIZE


def tracing_enabled() -> bool:
    """True once :func:`start_tracing` set the SDK's provider: spans are worth building."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)


TRACEPARENT_HEADER = "traceparent"
"""The AMQP header of an input delivery that carries its W3C trace context."""

# W3C Trace Context, "traceparent Header": version-trace_id-parent_id-flags in lower-case hex.
# Version ff is invalid; a later version may append fields after a dash, which a reader of
# version 00 ignores (but keeps: the header is passed on as it came).
_TRACEPARENT = re.compile(
    r"(?!ff)(?P<version>[0-9a-f]{2})-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
    r"(?P<rest>-.*)?",
    re.ASCII,
)


def trace_context(headers: Mapping[str, object] | None) -> str | None:
    """The delivery's ``traceparent`` header, when it is a valid W3C trace context.

    Returns None without one, and for one that is not a string or breaks the W3C Trace
    Context format (``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``, ids not all
    zero, version not ``ff``, nothing appended to version ``00``): the specification asks a
    receiver to ignore a malformed ``traceparent``, so the event is handled without one
    rather than refused.
    """
    value = (headers or {}).get(TRACEPARENT_HEADER)
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None or (match["version"] == "00" and match["rest"] is not None):
        return None
    return value


def context_of(traceparent: str | None, tracestate: str | None = None) -> Context:
    """The OpenTelemetry context whose remote parent is ``traceparent`` (W3C Trace Context).

    An empty context (a new trace) for None or a malformed value, as the specification asks.
    """
    if traceparent is None:
        return Context()
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


def traceparent_of(span_context: SpanContext) -> str | None:
    """``span_context`` as a W3C ``traceparent`` value; None when it is not valid."""
    if not span_context.is_valid:
        return None
    return (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
        f"{int(span_context.trace_flags):02x}"
    )


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current span (the delivery's, or its incoming parent's)."""
    return traceparent_of(trace.get_current_span().get_span_context())


@functools.cache
def _drops_children_of_unsampled(sampler: Sampler) -> bool:
    """True when ``sampler`` never samples a span whose parent, remote or local, is not sampled.

    So do the SDK's parent-based samplers, every ``parentbased_*`` value of
    ``OTEL_TRACES_SAMPLER``: OpenTelemetry's ``ParentBased`` sampler hands the child of an
    unsampled parent to ``AlwaysOff`` unless told otherwise (specification, "Built-in
    samplers", ``ParentBased``), and its description names its delegates; ``always_off``
    samples nothing.
    """
    description = sampler.get_description()
    return description == "AlwaysOffSampler" or (
        description.startswith("ParentBased{")
        and "remoteParentNotSampled:AlwaysOffSampler" in description
        and "localParentNotSampled:AlwaysOffSampler" in description
    )


def records_children_of(parent: SpanContext) -> bool:
    """True when a span started under ``parent`` may be recorded, so is worth starting.

    False with tracing off, and for a valid ``parent`` that is not sampled under a sampler that
    drops the children of such parents (the default, parent-based ones): a span started there
    would cost the sampler's decision, two ids and a context for nothing, once per group
    commit, database call and result event at a 1 % ratio. An invalid ``parent`` starts a new
    trace, which the sampler's root decides.
    """
    return _records_children(valid=parent.is_valid, sampled=parent.trace_flags.sampled)


_VERSION_00: Final = "00-"
_VERSION_00_LENGTH: Final = 55
"""``00-<32 hex>-<16 hex>-<2 hex flags>``: a version-00 ``traceparent``, whose flags end it."""


def records_children_of_traceparent(traceparent: str | None) -> bool:
    """:func:`records_children_of` for a stored ``traceparent``, read without parsing it.

    For the values the service wrote itself (:func:`traceparent_of`) or kept after checking
    them (an input delivery's header), beside the rows they belong to: a version-00 value is
    sampled when its last byte's lowest bit is set (W3C Trace Context, "trace-flags").
    Anything else goes the way of a new trace.
    """
    if (
        traceparent is None
        or len(traceparent) != _VERSION_00_LENGTH
        or not traceparent.startswith(_VERSION_00)
    ):
        return _records_children(valid=False, sampled=False)
    try:
        flags = int(traceparent[-2:], 16)
    except ValueError:
        return _records_children(valid=False, sampled=False)
    return _records_children(valid=True, sampled=bool(flags & 1))


def _records_children(*, valid: bool, sampled: bool) -> bool:
    """:func:`records_children_of` for a parent known by whether it is valid and sampled."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return False
    if not valid or sampled:
        return True
    return not _drops_children_of_unsampled(provider.sampler)


@contextmanager
def current_span(  # noqa: PLR0913 - the span's parts by name, as Tracer.start_span takes them
    tracer: trace.Tracer,
    name: str,
    *,
    kind: SpanKind,
    attributes: Callable[[], Mapping[str, AttributeValue]],
    parent: Context | None = None,
    links: Callable[[], Sequence[Link]] | None = None,
    record_errors: bool = True,
) -> Iterator[Span]:
    """A span, current while the block runs, where it may be recorded; else its parent.

    The span is started only where it may be recorded (:func:`records_children_of`).
    Otherwise ``parent``, when given, alone becomes current, so what reads the current span
    context (:func:`current_traceparent`, the log lines, the rows written in the block) still
    sees the trace the work came in, and the block gets ``parent``'s span, which does not
    record.

    Args:
        tracer: the instrumentation's tracer.
        name: the span's name.
        kind: the span's kind (``CONSUMER``, ``CLIENT``, ``INTERNAL``...).
        attributes: the span's attributes at its start, called only when it is started.
        parent: the parent's context; the current one when None.
        links: the span's links, called only when it is started.
        record_errors: an exception out of the block marks the span failed and is recorded on
            it (the SDK's default). False leaves the status to the caller: a delivery
            requeued raises ``RejectMessage``, and is no error.
    """
    parent_span = trace.get_current_span(parent)
    if not records_children_of(parent_span.get_span_context()):
        if parent is None:
            yield parent_span
            return
        token = otel_context.attach(parent)
        try:
            yield parent_span
        finally:
            otel_context.detach(token)
        return
    span = tracer.start_span(
        name, context=parent, kind=kind, attributes=attributes(), links=links() if links else None
    )
    with trace.use_span(
        span,
        end_on_exit=True,
        record_exception=record_errors,
        set_status_on_exception=record_errors,
    ):
        yield span
