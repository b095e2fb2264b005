"""OrderCancelledV1 and OrderShippedV1 are as strict as OrderPlacedV1, with its very types.

Each refusal is a one-line ``MalformedEventError`` from the worker's parse, which the delivery
policy dead-letters as ``permanent`` on the first delivery.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from fulfilment.contracts.order_cancelled import OrderCancelledV1, order_cancelled_body
from fulfilment.contracts.order_placed import MAX_LINES, MAX_QUANTITY, MAX_SKU_LENGTH
from fulfilment.contracts.order_shipped import OrderShippedV1, order_shipped_body
from fulfilment.contracts.topology import (
    ORDER_CANCELLED_DEAD_LETTER_QUEUE,
    ORDER_CANCELLED_QUEUE,
    ORDER_CANCELLED_ROUTING_KEY,
    ORDER_SHIPPED_DEAD_LETTER_QUEUE,
    ORDER_SHIPPED_QUEUE,
    ORDER_SHIPPED_ROUTING_KEY,
)
from fulfilment.domain.lifecycle import CancelOrder, ShipOrder
from fulfilment.domain.model import OrderLine
from fulfilment.routes.handling import MalformedEventError, check_body, parse_event

NIL_UUID = "00000000-0000-0000-0000-000000000000"
MAX_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
CANCELLED_AT = datetime(2010, 12, 1, 9, 41, tzinfo=UTC)


def cancelled(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "version": 1,
        "event_id": str(uuid.uuid4()),
        "order_id": str(uuid.uuid4()),
        "cancelled_at": "2010-12-01T09:41:00+00:00",
    }
    document.update(changes)
    return {key: value for key, value in document.items() if value is not ...}


def shipped(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "version": 1,
        "event_id": str(uuid.uuid4()),
        "order_id": str(uuid.uuid4()),
        "shipped_at": "2010-12-02T07:05:00+00:00",
    }
    document.update(changes)
    return {key: value for key, value in document.items() if value is not ...}


def parse(model, document: dict[str, Any]):
    body = json.dumps(document).encode()
    check_body(body, "application/json")
    return parse_event(model, body)


def refusal(model, document: dict[str, Any]) -> str:
    with pytest.raises(MalformedEventError) as refused:
        parse(model, document)
    reason = str(refused.value)
    assert "\n" not in reason
    return reason


MODELS = [
    pytest.param(OrderCancelledV1, cancelled, "cancelled_at", id="cancelled"),
    pytest.param(OrderShippedV1, shipped, "shipped_at", id="shipped"),
]


def test_the_names_of_the_new_queues_are_those_of_the_contract():
    assert (ORDER_CANCELLED_ROUTING_KEY, ORDER_SHIPPED_ROUTING_KEY) == (
        "order.cancelled",
        "order.shipped",
    )
    assert (ORDER_CANCELLED_QUEUE, ORDER_CANCELLED_DEAD_LETTER_QUEUE) == (
        "fulfilment.order-cancelled",
        "fulfilment.order-cancelled.dlq",
    )
    assert (ORDER_SHIPPED_QUEUE, ORDER_SHIPPED_DEAD_LETTER_QUEUE) == (
        "fulfilment.order-shipped",
        "fulfilment.order-shipped.dlq",
    )


def test_a_cancel_without_lines_is_a_command_to_cancel_the_whole_order():
    document = cancelled()

    command = parse(OrderCancelledV1, document).to_command()

    assert command == CancelOrder(
        uuid.UUID(document["event_id"]), uuid.UUID(document["order_id"]), CANCELLED_AT, None
    )


def test_a_cancel_with_lines_is_a_command_to_cancel_them_in_the_order_sent():
    document = cancelled(lines=[{"sku": "85123A", "quantity": 2}, {"sku": "71053", "quantity": 1}])

    command = parse(OrderCancelledV1, document).to_command()

    assert command.lines == (OrderLine("85123A", 2), OrderLine("71053", 1))
    assert command.cancelled() == {"71053": 1, "85123A": 2}


def test_a_shipment_is_a_command_to_ship_the_order():
    document = shipped()

    command = parse(OrderShippedV1, document).to_command()

    assert command == ShipOrder(
        uuid.UUID(document["event_id"]),
        uuid.UUID(document["order_id"]),
        datetime(2010, 12, 2, 7, 5, tzinfo=UTC),
    )


@pytest.mark.parametrize("lines", [None, []], ids=["null", "empty"])
def test_a_cancel_with_null_or_empty_lines_is_refused_rather_than_cancelling_everything(lines):
    reason = refusal(OrderCancelledV1, cancelled(lines=lines))

    assert reason.startswith("invalid OrderCancelled v1: lines: ")


@pytest.mark.parametrize(("model", "document", "time_field"), MODELS)
def test_unknown_fields_are_ignored(model, document, time_field):
    event = parse(model, document(producer="checkout", priority=3))

    assert getattr(event, time_field).tzinfo is not None


@pytest.mark.parametrize(("model", "document", "_time_field"), MODELS)
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": 2}, "version"),
        ({"version": "1"}, "version"),
        ({"event_id": NIL_UUID}, "event_id"),
        ({"order_id": MAX_UUID}, "order_id"),
        ({"event_id": "not-a-uuid"}, "event_id"),
        ({"order_id": ...}, "order_id"),
        ({"version": ...}, "version"),
    ],
)
def test_ids_and_version_follow_the_rules_of_order_placed(
    model, document, _time_field, change, field
):
    reason = refusal(model, document(**change))

    assert f": {field}: " in reason


@pytest.mark.parametrize(("model", "document", "time_field"), MODELS)
@pytest.mark.parametrize(
    "value",
    [
        "2010-12-01T09:41:00",  # no offset
        "0001-01-01T00:00:00+01:00",  # before Python's first instant in UTC
        "9999-12-31T23:59:59.999999Z",  # asyncpg would store infinity
        1291196460,  # a number, not a time
        ...,  # missing
    ],
)
def test_times_follow_the_rules_of_placed_at(model, document, time_field, value):
    reason = refusal(model, document(**{time_field: value}))

    assert f": {time_field}: " in reason


@pytest.mark.parametrize(("model", "document", "time_field"), MODELS)
def test_a_time_with_any_offset_is_accepted(model, document, time_field):
    event = parse(model, document(**{time_field: "2010-12-01T10:41:00+01:00"}))

    instant = getattr(event, time_field)
    assert instant.utcoffset() == timedelta(hours=1)
    assert instant == datetime(2010, 12, 1, 10, 41, tzinfo=timezone(timedelta(hours=1)))


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ({"sku": "85123A\x00", "quantity": 1}, "lines.0.sku"),
        ({"sku": " 85123A", "quantity": 1}, "lines.0.sku"),
        ({"sku": "", "quantity": 1}, "lines.0.sku"),
        ({"sku": "x" * (MAX_SKU_LENGTH + 1), "quantity": 1}, "lines.0.sku"),
        ({"sku": "85123A", "quantity": 0}, "lines.0.quantity"),
        ({"sku": "85123A", "quantity": MAX_QUANTITY + 1}, "lines.0.quantity"),
        ({"sku": "85123A", "quantity": "2"}, "lines.0.quantity"),
        ({"sku": "85123A", "quantity": 2.0}, "lines.0.quantity"),
        ({"sku": "85123A"}, "lines.0.quantity"),
    ],
)
def test_cancelled_lines_follow_the_rules_of_order_placed(line, where):
    reason = refusal(OrderCancelledV1, cancelled(lines=[line]))

    assert f": {where}: " in reason


def test_a_cancel_may_name_as_many_lines_as_an_order_and_no_more():
    most = [{"sku": f"SKU{i}", "quantity": MAX_QUANTITY} for i in range(MAX_LINES)]

    assert len(parse(OrderCancelledV1, cancelled(lines=most)).lines or []) == MAX_LINES
    assert ": lines: " in refusal(
        OrderCancelledV1, cancelled(lines=[*most, {"sku": "X", "quantity": 1}])
    )


@pytest.mark.parametrize("model", [OrderCancelledV1, OrderShippedV1])
def test_the_models_are_strict_and_frozen(model):
    assert model.model_config["strict"] is True
    assert model.model_config["frozen"] is True


def test_the_cancel_builder_leaves_lines_out_for_the_whole_order():
    event_id, order_id = uuid.uuid4(), uuid.uuid4()

    body = order_cancelled_body(event_id=event_id, order_id=order_id, cancelled_at=CANCELLED_AT)

    assert json.loads(body) == {
        "version": 1,
        "event_id": str(event_id),
        "order_id": str(order_id),
        "cancelled_at": "2010-12-01T09:41:00Z",
    }
    assert parse(OrderCancelledV1, json.loads(body)).to_command().lines is None


def test_the_cancel_builder_writes_the_lines_it_is_given():
    body = order_cancelled_body(
        event_id=uuid.uuid4(),
        order_id=uuid.uuid4(),
        cancelled_at=CANCELLED_AT,
        lines=[("85123A", 2), ("85123A", 1)],
    )

    assert json.loads(body)["lines"] == [
        {"sku": "85123A", "quantity": 2},
        {"sku": "85123A", "quantity": 1},
    ]
    assert parse(OrderCancelledV1, json.loads(body)).to_command().cancelled() == {"85123A": 3}


def test_the_ship_builder_round_trips():
    event_id, order_id = uuid.uuid4(), uuid.uuid4()
    shipped_at = datetime(2010, 12, 2, 7, 5, tzinfo=UTC)

    body = order_shipped_body(event_id=event_id, order_id=order_id, shipped_at=shipped_at)

    assert parse(OrderShippedV1, json.loads(body)).to_command() == ShipOrder(
        event_id, order_id, shipped_at
    )


@pytest.mark.parametrize(
    "build",
    [
        lambda: order_cancelled_body(
            event_id=uuid.uuid4(),
            order_id=uuid.uuid4(),
            cancelled_at=CANCELLED_AT.replace(tzinfo=None),
        ),
        lambda: order_cancelled_body(
            event_id=uuid.uuid4(), order_id=uuid.uuid4(), cancelled_at=CANCELLED_AT, lines=[]
        ),
        lambda: order_shipped_body(
            event_id=uuid.UUID(NIL_UUID), order_id=uuid.uuid4(), shipped_at=CANCELLED_AT
        ),
    ],
    ids=["naive time", "no lines", "nil id"],
)
def test_the_builders_refuse_what_the_contract_refuses(build):
    with pytest.raises(ValueError, match="validation error"):
        build()
