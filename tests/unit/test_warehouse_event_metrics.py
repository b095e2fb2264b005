"""The warehouse events' counters: bound at 0, counted by outcome, discrepancies by kind."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.warehouse_events import (
    Discrepancy,
    DiscrepancyKind,
    DuplicateBy,
    ShipmentKind,
    ShipmentOutcome,
    Source,
    WarehouseCancellationKind,
    WarehouseCancellationOutcome,
)
from fulfilment.observability.warehouse_event_metrics import (
    DISCREPANCY_KINDS,
    WarehouseEventMetrics,
    WarehouseEventOutcome,
)

ORDER = uuid.uuid4()
EVENT = uuid.uuid4()


def shipped(kind: ShipmentKind, status: OrderStatus | None, *found: Discrepancy) -> ShipmentOutcome:
    return ShipmentOutcome(kind, ORDER, EVENT, discrepancies=found, status=status)


def cancelled(
    kind: WarehouseCancellationKind, status: OrderStatus | None, *found: Discrepancy
) -> WarehouseCancellationOutcome:
    return WarehouseCancellationOutcome(kind, ORDER, EVENT, discrepancies=found, status=status)


def kept(kind: DiscrepancyKind, sku: str | None = "A") -> Discrepancy:
    return Discrepancy(kind, sku, None if sku is None else 1, OrderStatus.RESERVED)


@pytest.mark.parametrize(
    "outcome",
    [
        # A SKU whose held units had all shipped is more_than_held, as its row says, though
        # the shipment took none of it.
        shipped(
            ShipmentKind.DISCREPANCY,
            OrderStatus.RESERVED,
            kept(DiscrepancyKind.MORE_THAN_HELD),
            kept(DiscrepancyKind.SKU_NOT_HELD, "B"),
        ),
        shipped(ShipmentKind.SHIPPED, OrderStatus.SHIPPED),
        shipped(
            ShipmentKind.DISCREPANCY,
            None,
            kept(DiscrepancyKind.UNKNOWN_ORDER),
            kept(DiscrepancyKind.UNKNOWN_ORDER, "B"),
        ),
        cancelled(
            WarehouseCancellationKind.DISCREPANCY, None, kept(DiscrepancyKind.UNKNOWN_ORDER, None)
        ),
        cancelled(
            WarehouseCancellationKind.DISCREPANCY,
            OrderStatus.REJECTED,
            kept(DiscrepancyKind.ORDER_NOT_RESERVED),
            kept(DiscrepancyKind.ORDER_NOT_RESERVED, "B"),
        ),
        ShipmentOutcome(ShipmentKind.DUPLICATE, ORDER, EVENT, duplicate_by=DuplicateBy.CHANGE),
    ],
)
def test_an_outcome_counts_the_discrepancy_rows_it_kept_by_kind(
    outcome: WarehouseEventOutcome,
) -> None:
    registry = CollectorRegistry()
    metrics = WarehouseEventMetrics(registry, Source.WEBHOOK)

    metrics.count(outcome)

    counted = {
        kind: registry.get_sample_value("fulfilment_warehouse_discrepancies_total", {"kind": kind})
        for kind in DISCREPANCY_KINDS
    }
    assert {kind: count for kind, count in counted.items() if count} == Counter(
        str(found.kind) for found in outcome.discrepancies
    )


def test_every_label_of_its_source_is_bound_at_zero_and_an_outcome_counts_once() -> None:
    registry = CollectorRegistry()
    metrics = WarehouseEventMetrics(registry, Source.POLL)

    metrics.count(shipped(ShipmentKind.DISCREPANCY, None, kept(DiscrepancyKind.UNKNOWN_ORDER)))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    events = "fulfilment_warehouse_events_total"
    assert value(events, event="shipment", source="poll", outcome="discrepancy") == 1
    assert value(events, event="shipment", source="webhook", outcome="discrepancy") is None
    assert value(events, event="cancellation", source="poll", outcome="ignored") == 0
    assert value("fulfilment_warehouse_discrepancies_total", kind="unknown_order") == 1
    assert [
        value("fulfilment_warehouse_discrepancies_total", kind=kind)
        for kind in DISCREPANCY_KINDS
        if kind != "unknown_order"
    ] == [0, 0, 0, 0]
