"""The routes of the warehouse's webhooks, beside the queues' routes that the worker serves."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from fulfilment.contracts.warehouse_events import (
    FULFILMENT_ORDER_CANCELLED,
    SHIPMENT_SHIPPED,
    ShipmentV1,
    WarehouseCancellationV1,
)
from fulfilment.domain.model import OrderLine
from fulfilment.domain.warehouse_events import RecordShipment, RecordWarehouseCancellation, Source
from fulfilment.routes.handling import MalformedEventError
from fulfilment.routes.route import WebhookType
from fulfilment.routes.table import (
    FUNCTIONS,
    OUTCOMES,
    QUEUE_ROUTES,
    ROUTES,
    SUBSCRIBED_QUEUES,
    WEBHOOK_ROUTES,
)


class UnusedStock:
    """A stock store that must not be reached: the handler refuses before it applies."""

    async def apply(self, command: object) -> Any:
        msg = f"applied {command!r}"
        raise AssertionError(msg)


def test_the_webhook_routes_are_found_by_their_type_with_their_models() -> None:
    assert {kind: route.model for kind, route in WEBHOOK_ROUTES.items()} == {
        SHIPMENT_SHIPPED: ShipmentV1,
        FULFILMENT_ORDER_CANCELLED: WarehouseCancellationV1,
    }
    assert all(isinstance(route.transport, WebhookType) for route in WEBHOOK_ROUTES.values())


def test_what_serves_only_queues_leaves_the_webhook_routes_out() -> None:
    assert len(ROUTES) == len(QUEUE_ROUTES) + len(WEBHOOK_ROUTES)
    assert [queue.event for queue in SUBSCRIBED_QUEUES] == [r.event for r in QUEUE_ROUTES]
    assert set(OUTCOMES) == {"order_placed", "order_cancelled", "order_shipped"}


def test_both_commands_have_their_batch_function() -> None:
    assert FUNCTIONS[RecordShipment].name == "record_shipments"
    assert FUNCTIONS[RecordWarehouseCancellation].name == "record_warehouse_cancellations"


def test_a_duplicates_outcome_says_what_it_repeated() -> None:
    outcomes = WEBHOOK_ROUTES[SHIPMENT_SHIPPED].outcomes

    assert ("duplicate", "webhook") in outcomes
    assert ("duplicate", "change") in outcomes
    assert ("shipped", "") in outcomes


@pytest.mark.parametrize("kind", [SHIPMENT_SHIPPED, FULFILMENT_ORDER_CANCELLED])
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
