"""The example messages of ``docs/events.md`` validate with the models they show."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from fulfilment.contracts.envelope import find_ambiguity
from fulfilment.contracts.order_cancelled import OrderCancelledV1
from fulfilment.contracts.order_placed import OrderPlacedV1
from fulfilment.contracts.order_shipped import OrderShippedV1
from fulfilment.contracts.result_events import (
    StockCancelRefusedV1,
    StockReleasedV1,
    StockReservedV1,
    StockShippedV1,
    parse_result_event,
)
from fulfilment.domain.warehouse_events import warehouse_event_id

EVENTS = Path(__file__).parents[2] / "docs/events.md"


def examples() -> list[str]:
    """The JSON blocks of the section "Example messages" of ``docs/events.md``, in order."""
    text = EVENTS.read_text()
    section = text.split("\n## Example messages\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```json\n(.*?)```", section, re.DOTALL)


def test_the_section_shows_one_body_of_each_consumed_event_and_four_result_events() -> None:
    assert len(examples()) == 8


@pytest.mark.parametrize(
    ("index", "model"),
    [
        (0, OrderPlacedV1),
        (1, OrderCancelledV1),
        (2, OrderCancelledV1),
        (3, OrderShippedV1),
        (4, StockReservedV1),
        (5, StockCancelRefusedV1),
        (6, StockShippedV1),
        (7, StockReleasedV1),
    ],
)
def test_each_example_validates_with_its_model(index: int, model: type[BaseModel]) -> None:
    body = examples()[index].encode()

    model.model_validate_json(body)
    assert find_ambiguity(body, model) is None


def test_the_whole_and_the_partial_cancel_differ_by_their_lines() -> None:
    whole, partial = (OrderCancelledV1.model_validate_json(examples()[i]) for i in (1, 2))

    assert whole.lines is None
    assert partial.lines is not None


def test_the_result_event_answers_the_order_placed_example() -> None:
    placed = OrderPlacedV1.model_validate_json(examples()[0])
    reserved = parse_result_event("stock.reserved", examples()[4].encode())

    assert isinstance(reserved, StockReservedV1)
    assert (reserved.causation_id, reserved.order_id) == (placed.event_id, placed.order_id)


def test_the_refused_cancel_answers_the_partial_cancel_example() -> None:
    partial = OrderCancelledV1.model_validate_json(examples()[2])
    refused = parse_result_event("stock.cancel_refused", examples()[5].encode())

    assert isinstance(refused, StockCancelRefusedV1)
    assert (refused.causation_id, refused.order_id) == (partial.event_id, partial.order_id)
    assert refused.lines is not None
    assert partial.lines is not None
    assert [(line.sku, line.quantity) for line in refused.lines] == [
        (line.sku, line.quantity) for line in partial.lines
    ]


def test_the_warehouses_events_are_caused_by_the_ids_derived_from_theirs() -> None:
    shipped = parse_result_event("stock.shipped", examples()[6].encode())
    released = parse_result_event("stock.released", examples()[7].encode())

    assert isinstance(shipped, StockShippedV1)
    assert shipped.shipment_id is not None
    assert shipped.causation_id == warehouse_event_id("shipment", shipped.shipment_id)
    assert isinstance(released, StockReleasedV1)
    assert (released.reason, released.order_status) == ("warehouse_cancelled", "shipped")
    assert released.causation_id == warehouse_event_id("cancellation", "CXL-1120")
