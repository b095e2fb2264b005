"""The warehouse events' counters: bound at 0, counted by outcome, discrepancies by kind."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.model import OrderLine
from fulfilment.domain.polls import WarehouseChange
from fulfilment.domain.warehouse_events import (
    DuplicateBy,
    RecordShipment,
    RecordWarehouseCancellation,
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
    discrepancy_kinds,
)

ORDER = uuid.uuid4()
EVENT = uuid.uuid4()
AT = datetime(2026, 12, 6, 10, tzinfo=UTC)


def shipment(*lines: tuple[str, int]) -> RecordShipment:
    return RecordShipment(
        event_id=EVENT,
        shipment_id="SHP-1",
        webhook_id=None,
        fulfilment_order_id="WH-1",
        order_id=ORDER,
        shipped_at=AT,
        carrier=None,
        tracking_numbers=(),
        tracking_url=None,
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines),
        source=Source.POLL,
    )


def cancellation(*lines: tuple[str, int]) -> RecordWarehouseCancellation:
    return RecordWarehouseCancellation(
        event_id=EVENT,
        cancellation_id="CXL-1",
        webhook_id=None,
        fulfilment_order_id="WH-1",
        order_id=ORDER,
        cancelled_at=AT,
        reason="unfulfillable",
        lines=tuple(OrderLine(sku, quantity) for sku, quantity in lines) or None,
        source=Source.POLL,
    )


def shipped(
    kind: ShipmentKind,
    status: OrderStatus | None,
    lines: tuple[OrderLine, ...] = (),
    unmatched: tuple[OrderLine, ...] = (),
) -> ShipmentOutcome:
    return ShipmentOutcome(kind, ORDER, EVENT, lines=lines, unmatched=unmatched, status=status)


def cancelled(
    kind: WarehouseCancellationKind, status: OrderStatus | None
) -> WarehouseCancellationOutcome:
    return WarehouseCancellationOutcome(kind, ORDER, EVENT, status=status)


A2, A1, B3 = OrderLine("A", 2), OrderLine("A", 1), OrderLine("B", 3)


@pytest.mark.parametrize(
    ("change", "outcome", "kinds"),
    [
        (shipment(("A", 2)), shipped(ShipmentKind.SHIPPED, OrderStatus.SHIPPED, (A2,)), []),
        (
            shipment(("A", 3), ("B", 3)),
            shipped(ShipmentKind.SHIPPED, OrderStatus.SHIPPED, (A2,), (A1, B3)),
            ["more_than_held", "sku_not_held"],
        ),
        (
            shipment(("B", 3)),
            shipped(ShipmentKind.DISCREPANCY, OrderStatus.RESERVED, (), (B3,)),
            ["sku_not_held"],
        ),
        (
            shipment(("A", 1), ("B", 3)),
            shipped(ShipmentKind.DISCREPANCY, None, (), (A1, B3)),
            ["unknown_order", "unknown_order"],
        ),
        (
            shipment(("A", 1)),
            shipped(ShipmentKind.DISCREPANCY, OrderStatus.RELEASED, (), (A1,)),
            ["order_not_reserved"],
        ),
        (shipment(("A", 1)), shipped(ShipmentKind.ALREADY_SHIPPED, OrderStatus.SHIPPED), []),
        (
            shipment(("A", 1)),
            ShipmentOutcome(ShipmentKind.DUPLICATE, ORDER, EVENT, duplicate_by=DuplicateBy.CHANGE),
            [],
        ),
        (cancellation(), cancelled(WarehouseCancellationKind.DISCREPANCY, None), ["unknown_order"]),
        (
            cancellation(("A", 1), ("B", 1)),
            cancelled(WarehouseCancellationKind.DISCREPANCY, OrderStatus.REJECTED),
            ["order_not_reserved", "order_not_reserved"],
        ),
        (
            cancellation(("A", 1)),
            cancelled(WarehouseCancellationKind.RELEASED, OrderStatus.RELEASED),
            [],
        ),
        (cancellation(), cancelled(WarehouseCancellationKind.IGNORED, OrderStatus.SHIPPED), []),
    ],
)
def test_each_outcome_counts_the_discrepancy_rows_it_kept(
    change: WarehouseChange, outcome: WarehouseEventOutcome, kinds: list[str]
) -> None:
    assert discrepancy_kinds(change, outcome) == kinds


def test_every_label_of_its_source_is_bound_at_zero_and_an_outcome_counts_once() -> None:
    registry = CollectorRegistry()
    metrics = WarehouseEventMetrics(registry, Source.POLL)

    metrics.count(shipment(("A", 1)), shipped(ShipmentKind.DISCREPANCY, None, (), (A1,)))

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
    ] == [0, 0, 0]
