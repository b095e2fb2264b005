"""The demo's check of the result events a consumer of ``fulfilment.events`` received."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

from fulfilment.adapters.postgres.admin import OutboxEntry
from fulfilment.demo.result_events import ResultEventTally
from tests.support.builders import RESULT_EVENT_EXAMPLES, SKU_EVENT_EXAMPLES

QUEUE = "fulfilment.demo.result-events"


def row(outbox_id: int, routing_key: str, order_id: UUID) -> OutboxEntry:
    return OutboxEntry(outbox_id, uuid4(), order_id, routing_key)


def body(entry: OutboxEntry) -> bytes:
    example = RESULT_EVENT_EXAMPLES[entry.routing_key]
    return json.dumps(
        example | {"event_id": str(entry.event_id), "order_id": str(entry.order_id)}
    ).encode()


def receive(tally: ResultEventTally, *entries: OutboxEntry) -> None:
    for entry in entries:
        tally.receive(entry.routing_key, body(entry))


def test_every_event_of_the_run_received_in_order_passes_and_is_counted_per_routing_key() -> None:
    first, second = uuid4(), uuid4()
    rows = [
        row(11, "stock.reserved", first),
        row(12, "stock.rejected", second),
        row(13, "stock.released", first),
        row(14, "stock.shipped", first),
    ]
    tally = ResultEventTally(rows)

    receive(tally, *rows)

    assert tally.failure() is None
    assert tally.lines(QUEUE) == [
        f"result events of this run (outbox rows written; distinct event_ids received on {QUEUE}):",
        "  stock.reserved: published 1, received 1 (duplicates 0)",
        "  stock.rejected: published 1, received 1 (duplicates 0)",
        "  stock.released: published 1, received 1 (duplicates 0)",
        "  stock.shipped: published 1, received 1 (duplicates 0)",
        "  stock.cancel_refused: published 0, received 0 (duplicates 0)",
        "  stock.adjusted: published 0, received 0 (duplicates 0)",
        "  stock.shortage: published 0, received 0 (duplicates 0)",
    ]


def test_a_duplicate_is_counted_apart_and_its_second_arrival_is_no_order_violation() -> None:
    order_id = uuid4()
    reserved, shipped = row(1, "stock.reserved", order_id), row(2, "stock.shipped", order_id)
    tally = ResultEventTally([reserved, shipped])

    # A relay that died between the confirms and the marks publishes both again.
    receive(tally, reserved, shipped, reserved, shipped)

    assert tally.failure() is None
    assert tally.received == {"stock.reserved": 1, "stock.shipped": 1}
    assert tally.duplicates == {"stock.reserved": 1, "stock.shipped": 1}


def test_a_missing_event_fails_naming_the_routing_key_and_both_counts() -> None:
    order_id = uuid4()
    reserved, shipped = row(1, "stock.reserved", order_id), row(2, "stock.shipped", order_id)
    tally = ResultEventTally([reserved, shipped])

    receive(tally, reserved)

    assert tally.failure() == "result events: stock.shipped published 1, received 0"


def test_an_event_that_first_arrives_after_a_later_one_of_its_order_fails() -> None:
    order_id = uuid4()
    reserved, released = row(5, "stock.reserved", order_id), row(9, "stock.released", order_id)
    tally = ResultEventTally([reserved, released])

    receive(tally, released, reserved)

    assert tally.failure() == (
        "result events: 1 out of outbox order (first: order"
        f" {order_id}: stock.reserved (outbox id 5) came after the event of outbox id 9)"
    )


def test_events_of_different_orders_may_arrive_in_any_order() -> None:
    first = row(1, "stock.reserved", uuid4())
    second = row(2, "stock.reserved", uuid4())
    tally = ResultEventTally([first, second])

    receive(tally, second, first)

    assert tally.failure() is None


def test_a_body_the_contract_refuses_fails_the_check_and_is_not_counted() -> None:
    reserved = row(1, "stock.reserved", uuid4())
    tally = ResultEventTally([reserved])
    refused = json.loads(body(reserved)) | {"lines": []}

    tally.receive("stock.reserved", json.dumps(refused).encode())

    failure = tally.failure()
    assert failure is not None
    assert failure.startswith(
        "result events: stock.reserved published 1, received 0, 1 invalid (first: a"
        " stock.reserved message does not validate: 1 validation error for StockReserved v1"
    )
    assert "\n" not in failure


def test_an_event_that_comes_with_another_routing_key_than_its_row_fails() -> None:
    # A stock.released body is also a valid stock.shipped one (unknown fields are ignored).
    released = row(1, "stock.released", uuid4())
    tally = ResultEventTally([released])

    tally.receive("stock.shipped", body(released))

    assert tally.invalid == 1
    assert tally.received.total() == 0
    assert tally.failure() is not None


def test_events_written_before_the_run_are_counted_apart_and_pass() -> None:
    earlier = row(1, "stock.reserved", uuid4())
    tally = ResultEventTally([])

    receive(tally, earlier)

    assert tally.failure() is None
    assert tally.lines(QUEUE)[1:] == [
        "  stock.reserved: published 0, received 0 (duplicates 0)",
        "  stock.rejected: published 0, received 0 (duplicates 0)",
        "  stock.released: published 0, received 0 (duplicates 0)",
        "  stock.shipped: published 0, received 0 (duplicates 0)",
        "  stock.cancel_refused: published 0, received 0 (duplicates 0)",
        "  stock.adjusted: published 0, received 0 (duplicates 0)",
        "  stock.shortage: published 0, received 0 (duplicates 0)",
        "  this run wrote no result event: its events changed nothing (duplicates)",
        "  also received 1 written before this run (not counted)",
    ]


def about_sku(outbox_id: int, routing_key: str, sku: str) -> OutboxEntry:
    return OutboxEntry(outbox_id, uuid4(), None, routing_key, sku)


def sku_body(entry: OutboxEntry) -> bytes:
    example = SKU_EVENT_EXAMPLES[entry.routing_key]
    return json.dumps(example | {"event_id": str(entry.event_id), "sku": entry.sku}).encode()


def test_the_events_about_a_sku_are_checked_by_their_sku_and_in_order_per_sku() -> None:
    shortage, adjusted = about_sku(3, "stock.shortage", "A"), about_sku(4, "stock.adjusted", "A")
    other = about_sku(5, "stock.adjusted", "B")
    tally = ResultEventTally([shortage, adjusted, other])

    for entry in (other, adjusted, shortage):
        tally.receive(entry.routing_key, sku_body(entry))

    assert tally.received == {"stock.shortage": 1, "stock.adjusted": 2}
    assert tally.failure() == (
        "result events: 1 out of outbox order (first: SKU A: stock.shortage (outbox id 3) came"
        " after the event of outbox id 4)"
    )


def test_an_event_about_another_sku_than_its_row_fails() -> None:
    adjusted = about_sku(1, "stock.adjusted", "A")
    tally = ResultEventTally([adjusted])
    moved = json.loads(sku_body(adjusted)) | {"sku": "B"}

    tally.receive("stock.adjusted", json.dumps(moved).encode())

    assert tally.invalid == 1
