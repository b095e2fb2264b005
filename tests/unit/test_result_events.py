"""The published result events: the contract's example bodies pass, broken ones are refused.

The bodies (``builders.RESULT_EVENT_EXAMPLES``) are written as the SQL functions write them
(``jsonb``: keys in any order, ``occurred_at`` with microseconds and an offset), one per
routing key.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from fulfilment.contracts.result_events import (
    RESULT_EVENTS,
    StockAdjustedV1,
    StockCancelRefusedV1,
    StockRejectedV1,
    StockReleasedV1,
    StockReservedV1,
    StockShippedV1,
    StockShortageV1,
    UnknownRoutingKeyError,
    parse_result_event,
    subject_of,
)
from fulfilment.contracts.topology import EVENTS_EXCHANGE
from fulfilment.domain.model import RejectionReason
from tests.support.builders import (
    CAUSATION_ID,
    EVENT_ID,
    ORDER_ID,
    RESULT_EVENT_EXAMPLES,
    SKU_EVENT_EXAMPLES,
)

EXAMPLES = RESULT_EVENT_EXAMPLES


def body(routing_key: str, **changes: Any) -> bytes:
    """The example body of ``routing_key`` with ``changes`` (a value of ``...`` drops the field)."""
    document = {**EXAMPLES[routing_key], **changes}
    return json.dumps({k: v for k, v in document.items() if v is not ...}).encode()


def test_every_result_event_has_its_routing_key_on_the_events_exchange() -> None:
    assert EVENTS_EXCHANGE == "fulfilment.events"
    assert dict(RESULT_EVENTS) == {
        "stock.reserved": StockReservedV1,
        "stock.rejected": StockRejectedV1,
        "stock.released": StockReleasedV1,
        "stock.shipped": StockShippedV1,
        "stock.cancel_refused": StockCancelRefusedV1,
        "stock.adjusted": StockAdjustedV1,
        "stock.shortage": StockShortageV1,
    }
    assert set(EXAMPLES) | set(SKU_EVENT_EXAMPLES) == set(RESULT_EVENTS)


@pytest.mark.parametrize("routing_key", list(EXAMPLES))
def test_the_example_body_of_each_routing_key_is_its_event(routing_key: str) -> None:
    event = parse_result_event(routing_key, body(routing_key))

    assert type(event) is RESULT_EVENTS[routing_key]
    assert event.version == 1
    assert event.event_id == uuid.UUID(EVENT_ID)
    assert event.causation_id == uuid.UUID(CAUSATION_ID)
    assert event.order_id == uuid.UUID(ORDER_ID)
    assert event.occurred_at == datetime(2026, 11, 30, 10, 15, 2, 123456, tzinfo=UTC)


def test_the_events_carry_their_own_fields() -> None:
    reserved = parse_result_event("stock.reserved", body("stock.reserved"))
    rejected = parse_result_event("stock.rejected", body("stock.rejected"))
    released = parse_result_event("stock.released", body("stock.released"))

    assert isinstance(reserved, StockReservedV1)
    assert [(line.sku, line.quantity) for line in reserved.lines] == [("71053", 6), ("85123A", 12)]
    assert isinstance(rejected, StockRejectedV1)
    assert rejected.reason is RejectionReason.INSUFFICIENT_STOCK
    assert rejected.skus == ["85123A"]
    assert isinstance(released, StockReleasedV1)
    assert released.order_status == "reserved"


@pytest.mark.parametrize("reason", ["insufficient_stock", "unknown_sku", "cancelled"])
def test_every_rejection_reason_of_the_contract_is_accepted(reason: str) -> None:
    event = parse_result_event("stock.rejected", body("stock.rejected", reason=reason))

    assert isinstance(event, StockRejectedV1)
    assert event.reason == reason


@pytest.mark.parametrize("order_status", ["released", "reserved", "shipped"])
def test_a_release_says_the_status_it_left_the_order_in(order_status: str) -> None:
    event = parse_result_event("stock.released", body("stock.released", order_status=order_status))

    assert isinstance(event, StockReleasedV1)
    assert event.order_status == order_status


def test_a_refused_cancel_of_the_whole_order_has_null_lines() -> None:
    event = parse_result_event("stock.cancel_refused", body("stock.cancel_refused", lines=None))

    assert isinstance(event, StockCancelRefusedV1)
    assert (event.lines, event.warehouse_id) == (None, "WH-000123")
    with pytest.raises(ValidationError, match="warehouse_id"):
        parse_result_event("stock.cancel_refused", body("stock.cancel_refused", warehouse_id=...))


def test_any_utc_offset_and_unknown_fields_are_accepted() -> None:
    event = parse_result_event(
        "stock.shipped",
        body("stock.shipped", occurred_at="2026-11-30T11:15:02+01:00", trace="added later"),
    )

    assert event.occurred_at == datetime(2026, 11, 30, 10, 15, 2, tzinfo=UTC)


def test_a_serialised_event_is_read_back_as_the_same_event() -> None:
    event = parse_result_event("stock.released", body("stock.released"))

    assert parse_result_event("stock.released", event.model_dump_json()) == event


@pytest.mark.parametrize(
    ("routing_key", "changes", "field"),
    [
        # A common field missing, of each kind.
        ("stock.reserved", {"event_id": ...}, "event_id"),
        ("stock.rejected", {"causation_id": ...}, "causation_id"),
        ("stock.released", {"order_id": ...}, "order_id"),
        ("stock.shipped", {"occurred_at": ...}, "occurred_at"),
        ("stock.shipped", {"version": ...}, "version"),
        # An event's own field missing.
        ("stock.reserved", {"lines": ...}, "lines"),
        ("stock.rejected", {"reason": ...}, "reason"),
        ("stock.rejected", {"skus": ...}, "skus"),
        ("stock.released", {"order_status": ...}, "order_status"),
        # Wrong values.
        ("stock.reserved", {"version": 2}, "version"),
        ("stock.reserved", {"version": "1"}, "version"),
        ("stock.shipped", {"occurred_at": "2026-11-30T10:15:02"}, "occurred_at"),
        ("stock.reserved", {"event_id": "not-a-uuid"}, "event_id"),
        ("stock.reserved", {"causation_id": str(uuid.UUID(int=0))}, "causation_id"),
        ("stock.rejected", {"reason": "out_of_stock"}, "reason"),
        ("stock.rejected", {"skus": []}, "skus"),
        ("stock.rejected", {"skus": ["85123A", "71053"]}, "skus"),
        ("stock.rejected", {"skus": ["85123A", "85123A"]}, "skus"),
        ("stock.released", {"order_status": "cancelled"}, "order_status"),
        ("stock.released", {"reason": "lost"}, "reason"),
        ("stock.shipped", {"order_status": "released"}, "order_status"),
        ("stock.shipped", {"tracking_numbers": "JD014600003828392019"}, "tracking_numbers"),
        ("stock.reserved", {"lines": []}, "lines"),
        ("stock.reserved", {"lines": [{"sku": "85123A", "quantity": 0}]}, "lines.0.quantity"),
        ("stock.reserved", {"lines": [{"sku": "85123A", "quantity": -1}]}, "lines.0.quantity"),
        ("stock.reserved", {"lines": [{"sku": "85123A", "quantity": "6"}]}, "lines.0.quantity"),
        ("stock.shipped", {"lines": [{"sku": "85123A"}]}, "lines.0.quantity"),
        ("stock.shipped", {"lines": [{"sku": "", "quantity": 1}]}, "lines.0.sku"),
        (
            "stock.reserved",
            {"lines": [{"sku": "85123A", "quantity": 1}, {"sku": "71053", "quantity": 1}]},
            "lines",
        ),
        (
            "stock.released",
            {"lines": [{"sku": "85123A", "quantity": 1}, {"sku": "85123A", "quantity": 1}]},
            "lines",
        ),
    ],
)
def test_a_body_that_breaks_the_contract_is_refused_naming_the_field(
    routing_key: str, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_result_event(routing_key, body(routing_key, **changes))

    assert field in {
        ".".join(str(part) for part in error["loc"]) for error in refused.value.errors()
    }


def test_a_body_is_held_to_the_model_of_its_routing_key() -> None:
    # A stock.rejected body has no lines, so it is no stock.reserved event.
    with pytest.raises(ValidationError, match="StockReserved v1"):
        parse_result_event("stock.reserved", body("stock.rejected"))


def test_sorting_is_by_code_point_as_the_sql_sorts_with_collate_c() -> None:
    # Upper case sorts before lower case, and digits before both.
    skus = ["15056BL", "15056bl", "BANK CHARGES", "gift_0001_40"]
    event = parse_result_event("stock.rejected", body("stock.rejected", skus=skus))

    assert isinstance(event, StockRejectedV1)
    assert event.skus == skus
    with pytest.raises(ValidationError, match="sorted by SKU"):
        parse_result_event(
            "stock.rejected", body("stock.rejected", skus=sorted(skus, key=str.lower)[::-1])
        )


def test_a_routing_key_of_no_result_event_is_refused_with_the_known_ones() -> None:
    with pytest.raises(UnknownRoutingKeyError, match=r"'order\.placed'.*stock\.reserved"):
        parse_result_event("order.placed", body("stock.reserved"))


def sku_body(routing_key: str, **changes: Any) -> bytes:
    """The example body of an event about a SKU with ``changes`` (``...`` drops the field)."""
    document = {**SKU_EVENT_EXAMPLES[routing_key], **changes}
    return json.dumps({k: v for k, v in document.items() if v is not ...}).encode()


def test_the_events_about_a_sku_carry_the_sku_and_its_levels() -> None:
    adjusted = parse_result_event("stock.adjusted", sku_body("stock.adjusted"))
    shortage = parse_result_event("stock.shortage", sku_body("stock.shortage"))

    assert isinstance(adjusted, StockAdjustedV1)
    assert (adjusted.sku, adjusted.delta, adjusted.applied, adjusted.reason) == (
        "85123A",
        -3,
        -3,
        "damaged",
    )
    assert (adjusted.on_hand, adjusted.reserved, adjusted.available) == (4, 6, 0)
    assert isinstance(shortage, StockShortageV1)
    assert (shortage.sku, shortage.short) == ("85123A", 2)
    assert (subject_of(adjusted), subject_of(shortage)) == ("85123A", "85123A")


@pytest.mark.parametrize(
    ("routing_key", "changes", "field"),
    [
        ("stock.adjusted", {"sku": ...}, "sku"),
        ("stock.adjusted", {"causation_id": ...}, "causation_id"),
        ("stock.adjusted", {"reason": "stolen"}, "reason"),
        ("stock.adjusted", {"source": "poll"}, "source"),
        ("stock.adjusted", {"on_hand": -1}, "on_hand"),
        ("stock.shortage", {"short": -1}, "short"),
        ("stock.shortage", {"reserved": ...}, "reserved"),
    ],
)
def test_an_event_about_a_sku_that_breaks_its_contract_is_refused(
    routing_key: str, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        parse_result_event(routing_key, sku_body(routing_key, **changes))
