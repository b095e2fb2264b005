"""The routes of the warehouse's webhooks, beside the queues' routes that the worker serves."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from pydantic import ValidationError

from fulfilment.contracts.warehouse_events import (
    FULFILMENT_ORDER_CANCELLED,
    INVENTORY_ADJUSTED,
    SHIPMENT_SHIPPED,
    InventoryAdjustmentV1,
    ShipmentV1,
    WarehouseCancellationV1,
)
from fulfilment.domain.model import OrderLine, StockLevel
from fulfilment.domain.warehouse_events import (
    AdjustmentReason,
    RecordAdjustment,
    RecordShipment,
    RecordWarehouseCancellation,
    Source,
    warehouse_event_id,
)
from fulfilment.routes.handling import MalformedEventError
from fulfilment.routes.route import WebhookType
from fulfilment.routes.table import (
    FUNCTIONS,
    OUTCOMES,
    QUEUE_ROUTES,
    ROUTES,
    SUBSCRIBED_QUEUES,
)
from fulfilment.routes.warehouse import WEBHOOK_ROUTES
from tests.support.fakes import FakeStock


class UnusedStock:
    """A stock store that must not be reached: the handler refuses before it applies."""

    async def apply(self, command: object) -> Any:
        msg = f"applied {command!r}"
        raise AssertionError(msg)


def test_the_webhook_routes_are_found_by_their_type_with_their_models() -> None:
    assert {kind: route.model for kind, route in WEBHOOK_ROUTES.items()} == {
        SHIPMENT_SHIPPED: ShipmentV1,
        FULFILMENT_ORDER_CANCELLED: WarehouseCancellationV1,
        INVENTORY_ADJUSTED: InventoryAdjustmentV1,
    }
    assert all(isinstance(route.transport, WebhookType) for route in WEBHOOK_ROUTES.values())


def test_what_serves_only_queues_leaves_the_webhook_routes_out() -> None:
    assert len(ROUTES) == len(QUEUE_ROUTES) + len(WEBHOOK_ROUTES)
    assert [queue.event for queue in SUBSCRIBED_QUEUES] == [r.event for r in QUEUE_ROUTES]
    assert set(OUTCOMES) == {"order_placed", "order_cancelled", "order_shipped"}


def test_each_command_has_its_batch_function() -> None:
    assert FUNCTIONS[RecordShipment].name == "record_shipments"
    assert FUNCTIONS[RecordWarehouseCancellation].name == "record_warehouse_cancellations"
    assert FUNCTIONS[RecordAdjustment].name == "record_adjustments"


def test_a_duplicates_outcome_says_what_it_repeated() -> None:
    outcomes = WEBHOOK_ROUTES[SHIPMENT_SHIPPED].outcomes

    assert ("duplicate", "webhook") in outcomes
    assert ("duplicate", "change") in outcomes
    assert ("shipped", "") in outcomes


@pytest.mark.parametrize("kind", [SHIPMENT_SHIPPED, FULFILMENT_ORDER_CANCELLED, INVENTORY_ADJUSTED])
async def test_data_that_is_not_the_event_of_its_type_is_refused_before_it_applies(
    kind: str,
) -> None:
    route = WEBHOOK_ROUTES[kind]

    with pytest.raises(MalformedEventError, match="invalid"):
        await route.handler(
            b'{"reference": "not-a-uuid"}',
            stock=UnusedStock(),
            webhook_id="msg_1",
            source=Source.WEBHOOK,
        )


def test_the_tracking_numbers_of_a_batch_name_their_shipment_by_ordinal() -> None:
    def shipment(*numbers: str) -> RecordShipment:
        return RecordShipment(
            event_id=uuid4(),
            shipment_id=f"SHP-{uuid4()}",
            webhook_id=None,
            fulfilment_order_id="FO-1",
            order_id=uuid4(),
            shipped_at=datetime(2026, 12, 6, tzinfo=UTC),
            carrier=None,
            tracking_numbers=numbers,
            tracking_url=None,
            lines=(OrderLine("B", 1), OrderLine("A", 2), OrderLine("B", 3)),
            source=Source.POLL,
        )

    arguments = FUNCTIONS[RecordShipment].arguments(
        [shipment("T1", "T2"), shipment(), shipment("T3")]
    )

    assert (arguments["tracking_orders"], arguments["tracking_numbers"]) == (
        [1, 1, 3],
        ["T1", "T2", "T3"],
    )
    assert arguments["sources"] == ["poll", "poll", "poll"]
    assert arguments["line_orders"] == [1, 1, 2, 2, 3, 3]
    assert arguments["line_skus"][:2] == ["A", "B"]
    assert arguments["line_quantities"][:2] == [2, 4]


ADJUSTMENT = (
    b'{"adjustment_id": "ADJ-5531", "sku": "85123A", "delta": -3, "reason": "damaged",'
    b' "occurred_at": "2026-12-06T10:00:00Z", "note": "ignored"}'
)


async def test_an_inventory_adjustment_applies_through_its_route() -> None:
    stock = FakeStock()
    await stock.put_stock({"85123A": 5})

    handled = await WEBHOOK_ROUTES[INVENTORY_ADJUSTED].handler(
        ADJUSTMENT, stock=stock, webhook_id="msg_1", source=Source.WEBHOOK
    )
    again = await WEBHOOK_ROUTES[INVENTORY_ADJUSTED].handler(
        ADJUSTMENT, stock=stock, webhook_id="msg_2", source=Source.WEBHOOK
    )

    assert (handled.event_id, handled.order_id) == (
        warehouse_event_id("adjustment", "ADJ-5531"),
        None,
    )
    assert (handled.outcome, handled.labels) == ("adjusted", ("adjusted", ""))
    assert handled.log_fields["applied"] == -3
    assert (again.outcome, again.labels) == ("duplicate:change", ("duplicate", "change"))
    assert ("adjusted", "") in WEBHOOK_ROUTES[INVENTORY_ADJUSTED].outcomes
    assert await stock.levels_of(["85123A"]) == {"85123A": StockLevel(2)}


@pytest.mark.parametrize(
    ("field", "value"),
    [("delta", 0), ("delta", "3"), ("delta", 1.0), ("reason", "stolen"), ("sku", "")],
)
def test_an_adjustment_with_a_malformed_field_is_refused(field: str, value: object) -> None:
    data = json.loads(ADJUSTMENT) | {field: value}

    with pytest.raises(ValidationError):
        InventoryAdjustmentV1.model_validate_json(json.dumps(data))


def test_an_adjustment_becomes_its_command() -> None:
    command = InventoryAdjustmentV1.model_validate_json(ADJUSTMENT).to_command(
        webhook_id="msg_1", source=Source.WEBHOOK
    )

    assert (command.adjustment_id, command.sku, command.delta, command.reason) == (
        "ADJ-5531",
        "85123A",
        -3,
        AdjustmentReason.DAMAGED,
    )
    assert (command.webhook_id, command.source, command.operator) == (
        "msg_1",
        Source.WEBHOOK,
        None,
    )
