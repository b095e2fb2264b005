"""The demo's check of the warehouse's news: what the service recorded against what it made."""

from __future__ import annotations

from dataclasses import replace
from uuid import UUID, uuid4

import pytest

from fulfilment.adapters.postgres.admin import OutboxEntry
from fulfilment.adapters.postgres.warehouse_news import (
    RecordedCancellation,
    RecordedShipment,
    SkuStock,
)
from fulfilment.demo.warehouse_news import (
    MadeCancellation,
    MadeShipment,
    NewsCounts,
    NewsMismatchError,
    WarehouseOrder,
    check_news,
    check_stock,
    outstanding,
    parse_made,
)
from fulfilment.domain.lifecycle import OrderStatus

WHOLE = UUID("00000000-0000-0000-0000-000000000001")
SPLIT = UUID("00000000-0000-0000-0000-000000000002")
CANCELLED = UUID("00000000-0000-0000-0000-000000000003")


def made_day() -> dict[UUID, WarehouseOrder]:
    """Three orders: one shipped whole in one shipment, one in two shipments of which the
    second's webhook was never sent and one line cancelled by the warehouse, one cancelled whole
    by the warehouse."""
    return {
        WHOLE: WarehouseOrder(
            WHOLE,
            "WH-000001",
            {"A": 2},
            {},
            (MadeShipment("SHP-1", {"A": 2}, ("T1",), sent=True),),
            (),
        ),
        SPLIT: WarehouseOrder(
            SPLIT,
            "WH-000002",
            {"A": 1, "B": 3, "C": 1},
            {},
            (
                MadeShipment("SHP-2", {"A": 1, "B": 1}, ("T2", "T3"), sent=True),
                MadeShipment("SHP-3", {"B": 2}, ("T4",), sent=False),
            ),
            (MadeCancellation("CXL-1", {"C": 1}, sent=True),),
        ),
        CANCELLED: WarehouseOrder(
            CANCELLED, "WH-000003", {"D": 4}, {}, (), (MadeCancellation("CXL-2", None, sent=True),)
        ),
    }


def recorded_shipments() -> list[RecordedShipment]:
    return [
        RecordedShipment("SHP-1", WHOLE, "webhook", "shipped", ("T1",), {"A": (2, 2)}),
        RecordedShipment(
            "SHP-2", SPLIT, "webhook", "shipped", ("T2", "T3"), {"A": (1, 1), "B": (1, 1)}
        ),
        RecordedShipment("SHP-3", SPLIT, "poll", "shipped", ("T4",), {"B": (2, 2)}),
    ]


def recorded_cancellations() -> list[RecordedCancellation]:
    return [
        RecordedCancellation(
            "CXL-1", SPLIT, "webhook", "released", whole=False, lines={"C": (1, 1)}
        ),
        RecordedCancellation(
            "CXL-2", CANCELLED, "webhook", "released", whole=True, lines={"D": (4, 4)}
        ),
    ]


LINES = {WHOLE: {"A": (2, 2)}, SPLIT: {"A": (1, 1), "B": (3, 3)}}
STATUSES = {WHOLE: OrderStatus.SHIPPED, SPLIT: OrderStatus.SHIPPED, CANCELLED: OrderStatus.RELEASED}


def shipped_events(*order_ids: UUID) -> list[OutboxEntry]:
    return [
        OutboxEntry(n, uuid4(), order_id, "stock.shipped") for n, order_id in enumerate(order_ids)
    ]


def check(
    orders: dict[UUID, WarehouseOrder] | None = None,
    *,
    shipments: list[RecordedShipment] | None = None,
    cancellations: list[RecordedCancellation] | None = None,
    lines: dict[UUID, dict[str, tuple[int, int]]] | None = None,
    statuses: dict[UUID, OrderStatus] | None = None,
    entries: list[OutboxEntry] | None = None,
) -> NewsCounts:
    return check_news(
        made_day() if orders is None else orders,
        shipments=recorded_shipments() if shipments is None else shipments,
        cancellations=recorded_cancellations() if cancellations is None else cancellations,
        lines=LINES if lines is None else lines,
        statuses=STATUSES if statuses is None else statuses,
        entries=shipped_events(WHOLE, SPLIT, SPLIT) if entries is None else entries,
    )


def test_a_day_recorded_as_the_warehouse_made_it_is_counted() -> None:
    counts = check()

    assert counts == NewsCounts(
        orders=3,
        shipments=3,
        tracking_numbers=4,
        shipments_polled=1,
        whole=1,
        part=1,
        none=1,
        cancellations=2,
        cancellations_polled=0,
        units_shipped=6,
        units_released=5,
        unsent=1,
    )
    assert counts.describe() == (
        "shipments 3 (tracking numbers 4, found by the poll 1), orders shipped in whole 1, in"
        " part 1, not at all 1; its own cancellations 2 (found by the poll 0), units released 5;"
        " webhooks never sent 1"
    )


def test_a_shipment_the_service_never_recorded_is_a_mismatch_saying_it_was_never_sent() -> None:
    shipments = [s for s in recorded_shipments() if s.shipment_id != "SHP-3"]

    with pytest.raises(
        NewsMismatchError, match=r"SHP-3 is not recorded \(its webhook was never sent\)"
    ):
        check(shipments=shipments)


def test_a_shipment_or_cancellation_the_warehouse_never_made_is_a_mismatch() -> None:
    extra = RecordedShipment("SHP-9", WHOLE, "webhook", "shipped", (), {"A": (1, 1)})

    with pytest.raises(NewsMismatchError, match="recorded SHP-9, which the warehouse never made"):
        check(shipments=[*recorded_shipments(), extra])


def test_a_shipment_never_sent_yet_recorded_from_a_webhook_is_a_mismatch() -> None:
    shipments = [
        replace(s, source="webhook") if s.shipment_id == "SHP-3" else s
        for s in recorded_shipments()
    ]

    with pytest.raises(NewsMismatchError, match="SHP-3 was never sent, yet came by webhook"):
        check(shipments=shipments)


@pytest.mark.parametrize(
    "changed",
    [
        {"lines": {"B": (2, 1)}},  # a unit not taken from the order
        {"lines": {"B": (3, 3)}},  # not the units the warehouse sent
        {"outcome": "discrepancy"},
        {"tracking_numbers": ()},
    ],
)
def test_a_shipment_recorded_otherwise_than_made_is_a_mismatch(changed: dict[str, object]) -> None:
    shipments = [
        replace(s, **changed) if s.shipment_id == "SHP-3" else s  # type: ignore[arg-type]
        for s in recorded_shipments()
    ]

    with pytest.raises(NewsMismatchError, match="shipment SHP-3 of"):
        check(shipments=shipments)


@pytest.mark.parametrize(
    "changed",
    [
        {"whole": True},
        {"lines": {"C": (1, 0)}},  # nothing released
        {"outcome": "ignored"},
    ],
)
def test_a_cancellation_recorded_otherwise_than_made_is_a_mismatch(
    changed: dict[str, object],
) -> None:
    cancellations = [
        replace(c, **changed) if c.cancellation_id == "CXL-1" else c  # type: ignore[arg-type]
        for c in recorded_cancellations()
    ]

    with pytest.raises(NewsMismatchError, match="cancellation CXL-1 of"):
        check(cancellations=cancellations)


@pytest.mark.parametrize(
    ("lines", "statuses", "why"),
    [
        ({**LINES, SPLIT: {"A": (1, 1), "B": (3, 1)}}, STATUSES, r"hold \{'B': 2\}"),
        ({**LINES, WHOLE: {"A": (2, 1)}}, STATUSES, "shipped {'A': 1}; the warehouse shipped"),
        (LINES, {**STATUSES, SPLIT: OrderStatus.RESERVED}, "is reserved, not shipped"),
        (LINES, {**STATUSES, CANCELLED: OrderStatus.SHIPPED}, "is shipped, not released"),
    ],
)
def test_an_order_whose_lines_or_status_do_not_follow_the_warehouse_is_a_mismatch(
    lines: dict[UUID, dict[str, tuple[int, int]]], statuses: dict[UUID, OrderStatus], why: str
) -> None:
    with pytest.raises(NewsMismatchError, match=why):
        check(lines=lines, statuses=statuses)


def test_an_order_the_warehouse_is_not_done_with_is_a_mismatch() -> None:
    orders = made_day()
    orders[WHOLE] = replace(orders[WHOLE], remaining={"A": 1})

    with pytest.raises(NewsMismatchError, match="the warehouse is not done with it"):
        check(orders)


def test_a_shipment_without_its_one_stock_shipped_event_is_a_mismatch() -> None:
    with pytest.raises(NewsMismatchError, match=r"2 shipments applied, but 1 stock\.shipped"):
        check(entries=shipped_events(WHOLE, SPLIT))


def test_outstanding_counts_unfinished_orders_and_changes_not_recorded_yet() -> None:
    orders = made_day()
    orders[WHOLE] = replace(orders[WHOLE], remaining={"A": 1})

    assert outstanding(orders.values(), recorded_shipments(), recorded_cancellations()) == 1
    assert outstanding(orders.values(), recorded_shipments()[:1], []) == 1 + 2 + 2
    assert outstanding(made_day().values(), recorded_shipments(), recorded_cancellations()) == 0


def test_stock_holds_when_on_hand_moved_by_the_adjustments_and_shipments_and_reserved_is_held() -> (
    None
):
    short = check_stock(
        {"A": 10, "B": 5},
        {"A": 3},
        {"A": 4, "C": 2},
        {
            "A": SkuStock(on_hand=11, reserved=2, held=2),
            "B": SkuStock(5, 0, 0),
            "C": SkuStock(2, 0, 0),
        },
        losses=set(),
    )

    assert short == []


def test_a_sku_short_after_a_reported_loss_is_counted_apart() -> None:
    short = check_stock(
        {"A": 10, "B": 5},
        {},
        {"A": -9},
        {"A": SkuStock(on_hand=1, reserved=3, held=3), "B": SkuStock(5, 0, 0)},
        losses={"A"},
    )

    assert short == ["A"]


@pytest.mark.parametrize(
    ("now", "why"),
    [
        ({"A": SkuStock(8, 2, 2), "B": SkuStock(5, 0, 0)}, "SKU A: on hand 8, but the run began"),
        ({"A": SkuStock(7, 2, 1), "B": SkuStock(5, 0, 0)}, "SKU A: reserved 2, but .* hold 1"),
        ({"A": SkuStock(7, 0, 0)}, "SKU B: on hand missing"),
        (
            {"A": SkuStock(7, 2, 2), "B": SkuStock(5, 0, 0), "C": SkuStock(0, 0, 0)},
            "SKU C: on hand 0, but .* adjustments applied 1",
        ),
        (
            {"A": SkuStock(7, 2, 2), "B": SkuStock(1, 2, 2), "C": SkuStock(1, 0, 0)},
            "SKU B: on hand 1",
        ),
    ],
)
def test_stock_that_does_not_follow_the_shipments_and_adjustments_is_a_mismatch(
    now: dict[str, SkuStock], why: str
) -> None:
    with pytest.raises(NewsMismatchError, match=why):
        check_stock({"A": 10, "B": 5}, {"A": 3}, {"C": 1}, now, losses=set())


def test_a_short_sku_without_a_reported_loss_is_a_mismatch() -> None:
    now = {"A": SkuStock(on_hand=2, reserved=3, held=3)}

    with pytest.raises(NewsMismatchError, match="SKU A: reserved 3 is more than on hand 2"):
        check_stock({"A": 2}, {}, {}, now, losses={"B"})


def test_the_simulator_s_record_is_read_with_its_unsent_webhooks_and_those_in_flight() -> None:
    orders = {
        "orders": [
            {
                "id": "WH-000002",
                "reference": str(SPLIT),
                "lines": [{"sku": "A", "quantity": 1}, {"sku": "B", "quantity": 3}],
                "remaining": {"B": 0},
                "shipments": [
                    {"shipment_id": "SHP-2", "lines": [{"sku": "A", "quantity": 1}]},
                    {
                        "shipment_id": "SHP-3",
                        "tracking_numbers": ["T4"],
                        "lines": [{"sku": "B", "quantity": 1}, {"sku": "B", "quantity": 2}],
                    },
                ],
                "cancellations": [{"cancellation_id": "CXL-1", "lines": None}],
            }
        ],
        "cancellations": [],
    }
    webhooks = {
        "webhooks": [
            {"subject": "SHP-2", "fate": "delivered"},
            {"subject": "SHP-2", "fate": "sending"},  # its duplicate
            {"subject": "SHP-3", "fate": "never_sent"},
            {"subject": "CXL-1", "fate": "held"},
        ],
        "work_pending": 1,
        "in_flight": 2,
    }

    made = parse_made(orders, webhooks)

    assert made.in_flight == 3
    assert made.orders == {
        SPLIT: WarehouseOrder(
            SPLIT,
            "WH-000002",
            {"A": 1, "B": 3},
            {},
            (
                MadeShipment("SHP-2", {"A": 1}, (), sent=True),
                MadeShipment("SHP-3", {"B": 3}, ("T4",), sent=False),
            ),
            (MadeCancellation("CXL-1", None, sent=True),),
        )
    }
