"""The webhook intake's Prometheus metrics (``fulfilment webhooks``), on a registry of its own.

Names and labels are docs/design.md's, "Metrics" (the alerts and the dashboard query them);
every label takes a bounded set of values, bound at 0 from the start so that ``rate()`` and
the alerts see the zero. ``fulfilment_warehouse_events_total`` and
``fulfilment_warehouse_discrepancies_total`` count what was applied whoever applied it
(``warehouse_event_metrics``): the dispatcher's poll exports the same series with
``source="poll"``.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from fulfilment.domain.warehouse_events import (
    AdjustmentKind,
    ShipmentKind,
    Source,
    WarehouseCancellationKind,
)
from fulfilment.observability.metrics import build_info
from fulfilment.observability.warehouse_event_metrics import (
    WarehouseEventMetrics,
    WarehouseEventOutcome,
)

ANSWER_BUCKETS_SECONDS = (0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
"""Request-to-answer buckets, up to the senders' shortest timeout (5 s)."""

TYPE_NOT_TAKEN = "type_not_taken"
"""The ``outcome`` of a signed webhook of a type the service does not take (answered 204)."""

INVALID = "invalid"
"""The ``outcome`` of a signed webhook that is not a valid event of its type (answered 422)."""

RECEIVED_OUTCOMES: dict[str, tuple[str, ...]] = {
    "shipment.shipped": (*(str(kind) for kind in ShipmentKind), INVALID),
    "fulfilment_order.cancelled": (*(str(kind) for kind in WarehouseCancellationKind), INVALID),
    "inventory.adjusted": (*(str(kind) for kind in AdjustmentKind), INVALID),
    "other": (TYPE_NOT_TAKEN, INVALID),
}
"""The ``(type, outcome)`` series of ``fulfilment_webhooks_received_total`` bound at 0."""

ANSWER_STATUSES = ("204", "401", "413", "422", "503")
"""The status codes of the answer table, bound at 0 (a 400 to a sender gone mid-body and the
500 of a bug appear when they happen)."""


class IntakeMetrics:
    """Collectors of one intake process, registered on :attr:`registry` (a new one).

    Besides these, the registry holds the process's collectors and
    ``fulfilment_build_info{version}``, as every program's does.

    Args:
        version: the service's version.
        refusals: the ``reason`` values of ``fulfilment_webhook_refusals_total``, bound at 0.
    """

    def __init__(self, *, version: str, refusals: tuple[str, ...]) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.build_info = build_info(self.registry, version)
        self.received = Counter(
            "fulfilment_webhooks_received",
            "Signed webhooks by type and by what became of them: the command's outcome,"
            " type_not_taken (204) or invalid (422).",
            ["type", "outcome"],
            registry=self.registry,
        )
        for webhook_type, outcomes in RECEIVED_OUTCOMES.items():
            for outcome in outcomes:
                self.received.labels(type=webhook_type, outcome=outcome)
        self.refusals = Counter(
            "fulfilment_webhook_refusals",
            "Requests refused before their event was applied (401, 413, 503), by reason.",
            ["reason"],
            registry=self.registry,
        )
        for reason in refusals:
            self.refusals.labels(reason=reason)
        self.answer_seconds = Histogram(
            "fulfilment_webhook_answer_seconds",
            "Seconds from a request's arrival to its answer, by status code.",
            ["status"],
            buckets=ANSWER_BUCKETS_SECONDS,
            registry=self.registry,
        )
        for status in ANSWER_STATUSES:
            self.answer_seconds.labels(status=status)
        self.warehouse_events = WarehouseEventMetrics(self.registry, Source.WEBHOOK)

    def count_applied(self, webhook_type: str, outcome: WarehouseEventOutcome) -> None:
        """Count a webhook whose command was applied (or found applied) with ``outcome``.

        Its discrepancies too, as ``WarehouseEventMetrics.count`` counts them.
        """
        self.received.labels(type=webhook_type, outcome=str(outcome.kind)).inc()
        self.warehouse_events.count(outcome)
