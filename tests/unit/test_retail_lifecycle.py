"""Which order a cancellation of the Online Retail data cancels, and when each event is sent."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from uuid import uuid4
from zoneinfo import ZoneInfo

import pytest

from fulfilment.contracts.order_cancelled import OrderCancelledV1
from fulfilment.contracts.order_placed import MAX_LINES
from fulfilment.contracts.order_shipped import OrderShippedV1
from fulfilment.dataset.online_retail import (
    OnlineRetailError,
    ReadResult,
    RetailOrder,
    cancellation_event_id_for,
    csv_files,
    order_id_for,
    read_orders,
    shipment_event_id_for,
)
from fulfilment.dataset.retail_lifecycle import (
    CancellationMatch,
    RetailCancellation,
    Unmatched,
    match_cancellations,
    plan_days,
)
from fulfilment.domain.lifecycle import OrderStatus

HEADER = "InvoiceNo,StockCode,Description,Quantity,InvoiceDate,UnitPrice,CustomerID,Country\n"
LONDON = ZoneInfo("Europe/London")
SAMPLE = Path(__file__).parents[2] / "data" / "sample" / "online-retail"
REAL_DATA = Path(os.environ.get("FULFILMENT_TEST_ONLINE_RETAIL_DIR", "/nonexistent"))


def row(invoice: str, sku: str, quantity: int, time: str, customer: str = "17850.0") -> str:
    return f"{invoice},{sku},x,{quantity},2010-12-01 {time}:00,1.0,{customer},United Kingdom\n"


def read(tmp_path: Path, *rows: str, name: str = "2010-12-01.csv") -> ReadResult:
    path = tmp_path / name
    path.write_text(HEADER + "".join(rows), encoding="utf-8")
    return read_orders([path])


def match(tmp_path: Path, *rows: str) -> CancellationMatch:
    result = read(tmp_path, *rows)
    return match_cancellations(result.orders, result.cancellations)


def unmatched(**counts: int) -> dict[Unmatched, int]:
    return {reason: counts.get(reason.value, 0) for reason in Unmatched}


def mapped(result: CancellationMatch) -> list[tuple[str, str]]:
    return [(c.invoice_no, c.cancels) for c in result.cancellations]


def test_a_cancellation_only_one_earlier_order_of_its_customer_holds_cancels_that_order(
    tmp_path,
):
    result = match(
        tmp_path,
        row("1", "A", 6, "08:00"),
        row("1", "B", 12, "08:00"),
        row("2", "A", 1, "08:30"),  # too little of A
        row("3", "A", 6, "08:40", customer="12345.0"),  # another customer
        row("C4", "A", -2, "09:00"),
        row("C4", "B", -12, "09:00"),
    )

    assert result.cancellations == [
        RetailCancellation(
            invoice_no="C4",
            cancels="1",
            event_id=cancellation_event_id_for("C4"),
            order_id=order_id_for("1"),
            cancelled_at=datetime(2010, 12, 1, 9, 0, tzinfo=LONDON),
            lines=(("A", 2), ("B", 12)),
            source="2010-12-01.csv:6",
            day="2010-12-01",
        )
    ]
    assert result.unmatched == unmatched()


def test_the_event_carries_the_lines_as_recorded_never_the_whole_order_form(tmp_path):
    # The cancellation takes everything order 1 holds, with A on two lines: still lines.
    result = match(
        tmp_path,
        row("1", "A", 4, "08:00"),
        row("C2", "A", -1, "09:00"),
        row("C2", "A", -3, "09:00"),
    )

    (cancellation,) = result.cancellations
    event = OrderCancelledV1.model_validate_json(cancellation.body())
    assert event.event_id == cancellation_event_id_for("C2")
    assert event.order_id == order_id_for("1")
    assert event.cancelled_at.isoformat() == "2010-12-01T09:00:00+00:00"
    assert event.lines is not None
    assert [(line.sku, line.quantity) for line in event.lines] == [("A", 1), ("A", 3)]


def test_a_cancellation_without_customer_id_is_not_mapped(tmp_path):
    result = match(
        tmp_path,
        row("1", "A", 6, "08:00", customer=""),
        row("C2", "A", -1, "09:00", customer=""),
    )

    assert result.cancellations == []
    assert result.unmatched == unmatched(no_customer=1)


def test_a_cancellation_with_a_line_that_is_not_negative_is_not_mapped_at_all(tmp_path):
    result = match(
        tmp_path,
        row("1", "A", 6, "08:00"),
        row("1", "B", 6, "08:00"),
        row("C2", "A", -1, "09:00"),
        row("C2", "B", 0, "09:00"),
    )

    assert result.cancellations == []
    assert result.unmatched == unmatched(not_negative=1)


def test_a_cancellation_before_every_order_of_its_customer_has_no_earlier_order(tmp_path):
    result = match(
        tmp_path,
        row("C1", "A", -1, "08:00"),
        row("2", "A", 6, "08:01"),
        row("C3", "A", -1, "09:00", customer="99999.0"),  # a customer without any order
    )

    assert result.cancellations == []
    assert result.unmatched == unmatched(no_earlier_order=2)


def test_an_order_of_the_same_minute_may_be_the_one_cancelled(tmp_path):
    result = match(tmp_path, row("1", "A", 6, "14:55"), row("C2", "A", -6, "14:55"))

    assert mapped(result) == [("C2", "1")]


def test_the_cancelled_units_are_summed_per_sku_against_the_order_summed_per_sku(tmp_path):
    result = match(
        tmp_path,
        row("1", "A", 2, "08:00"),
        row("1", "A", 2, "08:00"),  # order 1 holds 4 of A, on two lines
        row("2", "A", 3, "08:10"),  # order 2 holds 3
        row("C3", "A", -2, "09:00"),
        row("C3", "A", -2, "09:00"),  # 4 of A: only order 1 holds that many
        row("4", "B", 3, "10:00"),
        row("C5", "B", -2, "11:00"),
        row("C5", "B", -2, "11:00"),  # 4 of B: order 4 holds 3
    )

    assert mapped(result) == [("C3", "1")]
    assert result.unmatched == unmatched(not_held=1)


def test_an_order_must_hold_every_sku_of_the_cancellation(tmp_path):
    result = match(
        tmp_path,
        row("1", "A", 6, "08:00"),
        row("2", "B", 6, "08:10"),
        row("C3", "A", -1, "09:00"),
        row("C3", "B", -1, "09:00"),
    )

    assert result.cancellations == []
    assert result.unmatched == unmatched(not_held=1)


def test_a_cancellation_that_several_orders_hold_is_not_mapped(tmp_path):
    result = match(
        tmp_path,
        row("1", "A", 6, "08:00"),
        row("2", "A", 6, "08:10"),
        row("C3", "A", -6, "09:00"),
    )

    assert result.cancellations == []
    assert result.unmatched == unmatched(several_orders=1)


def test_units_an_earlier_cancellation_took_are_no_longer_held(tmp_path):
    result = match(
        tmp_path,
        row("1", "A", 10, "08:00"),
        row("2", "A", 5, "08:10"),
        row("C3", "A", -8, "09:00"),  # only order 1 holds 8; it keeps 2
        row("C4", "A", -5, "10:00"),  # order 1 no longer holds 5: order 2 is the one
        row("C5", "A", -2, "11:00"),  # order 1 holds its last 2, order 2 none: order 1
        row("C6", "A", -1, "12:00"),  # nothing of A is left in either
    )

    assert mapped(result) == [("C3", "1"), ("C4", "2"), ("C5", "1")]
    assert result.unmatched == unmatched(not_held=1)


def test_cancellations_are_mapped_in_time_order_and_returned_in_reading_order(tmp_path):
    # C4 is listed first but happened later: C3 takes order 1's units first.
    result = match(
        tmp_path,
        row("1", "A", 10, "08:00"),
        row("2", "A", 5, "08:10"),
        row("C4", "A", -5, "10:00"),
        row("C3", "A", -8, "09:00"),
    )

    assert mapped(result) == [("C4", "2"), ("C3", "1")]


def test_an_order_of_an_earlier_file_is_a_candidate(tmp_path):
    first = tmp_path / "2010-12-01.csv"
    first.write_text(HEADER + row("1", "A", 6, "08:00"), encoding="utf-8")
    second = tmp_path / "2010-12-02.csv"
    second.write_text(
        HEADER + row("C2", "A", -6, "09:00").replace("2010-12-01", "2010-12-02"),
        encoding="utf-8",
    )
    result = read_orders([first, second])

    (cancellation,) = match_cancellations(result.orders, result.cancellations).cancellations

    assert (cancellation.cancels, cancellation.day) == ("1", "2010-12-02")


def test_mapping_the_same_files_twice_gives_the_same_events(tmp_path):
    rows = (row("1", "A", 6, "08:00"), row("C2", "A", -6, "09:00"))

    first = match(tmp_path, *rows).cancellations
    again = match(tmp_path, *rows).cancellations

    assert [c.body() for c in first] == [c.body() for c in again]


def test_a_mapped_cancellation_longer_than_an_event_is_an_error_not_split(tmp_path):
    rows = [row("1", "A", MAX_LINES + 1, "08:00")]
    rows += [row("C2", "A", -1, "09:00")] * (MAX_LINES + 1)

    with pytest.raises(OnlineRetailError) as error:
        match(tmp_path, *rows)

    assert str(error.value) == (
        f"2010-12-01.csv:3: cancellation C2 has {MAX_LINES + 1} lines; an OrderCancelled"
        f" carries at most {MAX_LINES} and a cancellation is never split"
    )


def test_the_shipped_sample_maps_one_cancellation_of_its_33():
    result = read_orders(csv_files(SAMPLE))

    matched = match_cancellations(result.orders, result.cancellations)

    assert len(result.cancellations) == 33
    assert mapped(matched) == [("C539949", "536769")]
    assert matched.cancellations[0].lines == (("22083", 6),)
    assert matched.unmatched == unmatched(no_customer=1, no_earlier_order=30, not_held=1)
    assert matched.describe() == (
        "no customer 1, not negative 0, no earlier order 30, not held 1, several orders 0"
    )


@pytest.mark.skipif(
    not REAL_DATA.is_dir(), reason="FULFILMENT_TEST_ONLINE_RETAIL_DIR names no folder"
)
def test_all_real_files_map_the_documented_counts():
    result = read_orders(csv_files(REAL_DATA))

    matched = match_cancellations(result.orders, result.cancellations)

    assert len(result.cancellations) == 326
    assert len(matched.cancellations) == 120
    assert matched.unmatched == unmatched(
        no_customer=18, no_earlier_order=119, not_held=61, several_orders=8
    )
    day_of = {order.invoice_no: order.day for order in result.orders}
    assert sum(1 for c in matched.cancellations if c.day != day_of[c.cancels]) == 105
    for cancellation in matched.cancellations:
        OrderCancelledV1.model_validate_json(cancellation.body())


def two_days(tmp_path: Path) -> tuple[ReadResult, CancellationMatch]:
    first = tmp_path / "2010-12-01.csv"
    first.write_text(
        HEADER
        + row("1", "A", 6, "08:00")
        + row("2", "B", 6, "09:00")
        + row("C3", "A", -1, "09:00")  # the same minute as order 2: after it
        + row("C4", "B", -1, "09:30")
        + row("5", "A", 1, "09:20")
        + row("6", "C", 1, "10:00"),
        encoding="utf-8",
    )
    empty = tmp_path / "2010-12-02.csv"
    empty.write_text(HEADER, encoding="utf-8")
    third = tmp_path / "2010-12-03.csv"
    third.write_text(
        HEADER + row("C7", "C", -1, "08:00").replace("2010-12-01", "2010-12-03"),
        encoding="utf-8",
    )
    result = read_orders([first, empty, third])
    return result, match_cancellations(result.orders, result.cancellations)


def invoices(events: tuple[RetailOrder | RetailCancellation, ...]) -> list[str]:
    return [event.invoice_no for event in events]


def test_days_come_in_file_order_each_with_its_own_events(tmp_path):
    result, matched = two_days(tmp_path)

    days = plan_days(result.days, result.orders, matched.cancellations)

    assert [day.name for day in days] == ["2010-12-01", "2010-12-02", "2010-12-03"]
    assert [invoices(day.orders) for day in days] == [["1", "2", "5", "6"], [], []]
    assert [invoices(day.cancellations) for day in days] == [["C3", "C4"], [], ["C7"]]


def test_a_day_is_sent_in_time_order_in_runs_of_one_kind_orders_first_at_a_tie(tmp_path):
    result, matched = two_days(tmp_path)

    first, empty, third = plan_days(result.days, result.orders, matched.cancellations)

    assert [invoices(run) for run in first.runs()] == [["1", "2"], ["C3"], ["5"], ["C4"], ["6"]]
    assert empty.runs() == []
    assert [invoices(run) for run in third.runs()] == [["C7"]]


def test_the_orders_still_reserved_or_already_shipped_ship_when_the_day_closes(tmp_path):
    result, matched = two_days(tmp_path)
    first, empty, third = plan_days(result.days, result.orders, matched.cancellations)
    statuses = {
        order_id_for("1"): OrderStatus.RESERVED,
        order_id_for("2"): OrderStatus.RELEASED,
        order_id_for("5"): OrderStatus.SHIPPED,  # a second run sends its shipment again
        order_id_for("6"): OrderStatus.REJECTED,
        uuid4(): OrderStatus.RESERVED,  # not an order of this day
    }

    shipments = first.shipments(statuses)

    assert [(s.invoice_no, s.event_id, s.order_id) for s in shipments] == [
        ("1", shipment_event_id_for("1"), order_id_for("1")),
        ("5", shipment_event_id_for("5"), order_id_for("5")),
    ]
    assert first.closes_at == datetime(2010, 12, 1, 10, 0, tzinfo=LONDON)
    for shipment in shipments:
        event = OrderShippedV1.model_validate_json(shipment.body())
        assert (event.event_id, event.order_id) == (shipment.event_id, shipment.order_id)
        assert event.shipped_at.isoformat() == "2010-12-01T10:00:00+00:00"
    assert empty.closes_at is None
    assert empty.shipments(statuses) == []
    assert third.shipments(statuses) == []


def test_an_order_the_service_has_not_answered_does_not_ship(tmp_path):
    result, matched = two_days(tmp_path)
    first = plan_days(result.days, result.orders, matched.cancellations)[0]

    assert first.shipments({}) == []
