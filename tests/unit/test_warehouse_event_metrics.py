"""The warehouse events' counters: bound at 0, counted by outcome, discrepancies by kind."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry

from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.model import OrderLine
from fulfilment.domain.warehouse_events import (
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
    discrepancy_kinds,
)

ORDER = uuid.uuid4()
EVENT = uuid.uuid4()


def shipped(
    kind: ShipmentKind,
    status: OrderStatus | None,
    lines: tuple[OrderLine, ...] = (),
    unmatched: tuple[OrderLine, ...] = (),
) -> ShipmentOutcome:
    return ShipmentOutcome(kind, ORDER, EVENT, lines=lines, unmatched=unmatched, status=status)


@pytest.mark.parametrize(
    ("outcome", "kinds"),
    [
        (shipped(ShipmentKind.SHIPPED, OrderStatus.SHIPPED, (OrderLine("A", 2),)), []),
        (
            shipped(
                ShipmentKind.SHIPPED,
                OrderStatus.SHIPPED,
                (OrderLine("A", 2),),
                (OrderLine("A", 1), OrderLine("B", 3)),
            ),
            ["more_than_held", "sku_not_held"],
        ),
        (
            shipped(ShipmentKind.DISCREPANCY, OrderStatus.RESERVED, (), (OrderLine("Z", 1),)),
            ["sku_not_held"],
        ),
        (shipped(ShipmentKind.DISCREPANCY, None, (), (OrderLine("A", 1),)), ["unknown_order"]),
        (
            shipped(ShipmentKind.DISCREPANCY, OrderStatus.RELEASED, (), (OrderLine("A", 1),)),
            ["order_not_reserved"],
        ),
        (shipped(ShipmentKind.ALREADY_SHIPPED, OrderStatus.SHIPPED), []),
        (
            ShipmentOutcome(ShipmentKind.DUPLICATE, ORDER, EVENT, duplicate_by=DuplicateBy.CHANGE),
            [],
        ),
        (
            WarehouseCancellationOutcome(WarehouseCancellationKind.DISCREPANCY, ORDER, EVENT),
            ["unknown_order"],
        ),
        (
            WarehouseCancellationOutcome(
                WarehouseCancellationKind.DISCREPANCY, ORDER, EVENT, status=OrderStatus.REJECTED
            ),
            ["order_not_reserved"],
        ),
        (
            WarehouseCancellationOutcome(
                WarehouseCancellationKind.RELEASED,
                ORDER,
                EVENT,
                lines=(OrderLine("A", 1),),
                status=OrderStatus.RELEASED,
            ),
            [],
        ),
    ],
)
def test_each_outcome_records_the_discrepancies_of_its_kind(
    outcome: WarehouseEventOutcome, kinds: list[str]
) -> None:
    assert discrepancy_kinds(outcome) == kinds


def test_every_label_of_its_source_is_bound_at_zero_and_an_outcome_counts_once() -> None:
    registry = CollectorRegistry()
    metrics = WarehouseEventMetrics(registry, Source.POLL)

    metrics.count(shipped(ShipmentKind.DISCREPANCY, None, (), (OrderLine("A", 1),)))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert (
        value(
            "fulfilment_warehouse_events_total",
            event="shipment",
            source="poll",
            outcome="discrepancy",
        )
        == 1
    )
    assert (
        value(
            "fulfilment_warehouse_events_total",
            event="shipment",
            source="webhook",
            outcome="discrepancy",
        )
        is None
    )
    assert (
        value(
            "fulfilment_warehouse_events_total",
            event="cancellation",
            source="poll",
            outcome="ignored",
        )
        == 0
    )
    assert value("fulfilment_warehouse_discrepancies_total", kind="unknown_order") == 1
    assert [
        value("fulfilment_warehouse_discrepancies_total", kind=kind)
        for kind in DISCREPANCY_KINDS
        if kind != "unknown_order"
    ] == [0, 0, 0]
