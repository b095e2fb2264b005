"""What a span costs in this process: CPU microseconds of the OpenTelemetry SDK per span.

Three figures, each the best of ``--repeats`` runs in CPU time (so another process on the
machine changes it little):

* **the root decision at 1 %**: the delivery's span when its event comes without a
  ``traceparent`` (``observability.tracing.current_span`` under a parent-based 1 % sampler,
  the global provider): the sampler's decision, two ids, a span that records nothing, its
  context current for the block. Beside it the same block with tracing off (no provider).
* **a sampled span**, under a remote parent, started with ``N`` attributes and ended, the
  batch processor's ``on_end`` replaced by a list append (what ``BatchSpanProcessor`` does
  with a span, less its lock);
* **its export**: the OTLP/HTTP exporter's own encoding of batches of 512 such spans (the
  ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` default) into the protobuf request, serialised, per span,
  and its bytes. The HTTP request is not counted.

``N`` runs over ``--attributes`` (default 0, 6 and 12): the delivery's span carries 12 when
handled (9 at its start, 3 after), the relay's publish span 11. The values are strings of 36
characters, the length of the event and order ids. To compare with another version of the
SDK or the service, run this file with that version first on the path, e.g.
``PYTHONPATH=/tmp/old/src uv run python bench/span_cost.py``.

Run: ``uv run python bench/span_cost.py [--spans N] [--repeats R] [--attributes 0 6 12]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from fulfilment.observability.tracing import context_of, current_span

BATCH = 512
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
VALUE = "7d48686f-66be-4357-a391-202f48fb5965"


class _Kept(SpanProcessor):
    """Keeps the ended spans, as the batch processor's queue would."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def _best(run: Callable[[], None], *, count: int, repeats: int) -> float:
    """The best of ``repeats`` runs of ``run``, in CPU microseconds per ``count``."""
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        run()
        best = min(best, (time.process_time() - started) / count)
    return best * 1e6


def root_decision(spans: int, repeats: int) -> tuple[float, float]:
    """The delivery's block without tracing and at 1 % without a parent, µs per delivery.

    Sets the global tracer provider (once per process: call this once).
    """
    tracer = trace.get_tracer("fulfilment.bench")

    def deliveries() -> None:
        for _ in range(spans):
            with current_span(
                tracer,
                "process orders",
                kind=SpanKind.CONSUMER,
                parent=context_of(None),
                attributes=lambda: {"fulfilment.event": "order_placed"},
                record_errors=False,
            ):
                pass

    off = _best(deliveries, count=spans, repeats=repeats)
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(0.01)),
        resource=Resource.create({"service.name": "fulfilment-bench"}),
    )
    trace.set_tracer_provider(provider)
    return off, _best(deliveries, count=spans, repeats=repeats)


def sampled(attributes: int, spans: int, repeats: int) -> tuple[float, float, float]:
    """A sampled span with ``attributes`` attributes: (start and end µs, export µs, bytes)."""
    provider = TracerProvider(
        sampler=ParentBased(ALWAYS_ON),
        resource=Resource.create({"service.name": "fulfilment-bench"}),
    )
    kept = _Kept()
    provider.add_span_processor(kept)
    tracer = provider.get_tracer("fulfilment.bench")
    parent = context_of(PARENT)
    values = {f"fulfilment.attribute_{index}": VALUE for index in range(attributes)}

    def start_and_end() -> None:
        kept.spans.clear()
        for _ in range(spans):
            tracer.start_span(
                "process orders", context=parent, kind=SpanKind.CONSUMER, attributes=values
            ).end()

    lifetime = _best(start_and_end, count=spans, repeats=repeats)
    batch = kept.spans[:BATCH]
    export = _best(
        lambda: encode_spans(batch).SerializeToString(), count=len(batch), repeats=repeats
    )
    size = len(encode_spans(batch).SerializeToString()) / len(batch)
    return lifetime, export, size


def main() -> None:
    """Print the root decision's cost, then one line per attribute count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=20_000, help="spans per run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--attributes", type=int, nargs="+", default=[0, 6, 12])
    args = parser.parse_args()
    off, root = root_decision(args.spans, args.repeats)
    print(
        f"delivery block, tracing off: {off:.1f} µs; at 1 % without a traceparent:"
        f" {root:.1f} µs (+{root - off:.1f} µs per delivery)"
    )
    print("attributes | start and end, µs | OTLP encoding, µs | together, µs | bytes")
    for count in args.attributes:
        lifetime, export, size = sampled(count, args.spans, args.repeats)
        print(
            f"{count:10d} | {lifetime:16.1f} | {export:17.1f} | {lifetime + export:12.1f}"
            f" | {size:5.0f}"
        )
    print(f"(best of {args.repeats} runs of {args.spans:,} spans, CPU time)")


if __name__ == "__main__":
    main()
