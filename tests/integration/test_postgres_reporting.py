from __future__ import annotations

from dataclasses import asdict

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.outcomes import InvariantChecks, Shortage, outcome_report
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.domain.handoff import Accepted, Failed
from fulfilment.domain.lifecycle import CancelKind
from fulfilment.domain.warehouse_events import AdjustmentReason
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.support.builders import cancellation, order, shipment
from tests.support.warehouse_commands import warehouse_adjustment

pytestmark = pytest.mark.postgres


async def test_an_empty_database_reports_nothing_and_holds_its_invariants(stock):
    report = await outcome_report(stock.engine)

    assert report.reserved == 0
    assert report.rejected == {"insufficient_stock": 0, "unknown_sku": 0, "cancelled": 0}
    assert (report.released, report.shipped, report.cancelled) == (0, 0, 0)
    assert (report.duplicate_orders, report.inbox_total) == (0, 0)
    assert report.processed == {}
    assert report.invariants == InvariantChecks(0, 0, (), 0, 0, 0, ())
    assert report.shortage == Shortage(0, 0, ())
    assert report.ok


async def test_the_report_counts_each_kind_of_outcome(stock):
    await stock.put_stock({"A": 10, "B": 1})
    placed = order(("A", 2), ("A", 1))
    duplicate_event = placed
    await stock.apply(placed)
    await stock.apply(order(("B", 1)))
    await stock.apply(order(("B", 1)))
    await stock.apply(order(("NOPE", 1)))
    await stock.apply(order(("A", 1), order_id=placed.order_id))
    await stock.apply(duplicate_event)

    report = await outcome_report(stock.engine)

    assert report.reserved == 2
    assert report.rejected == {"insufficient_stock": 1, "unknown_sku": 1, "cancelled": 0}
    assert report.duplicate_orders == 1
    # A redelivered event leaves no second trace: five events were processed.
    assert report.inbox_total == 5
    assert report.processed == {"duplicate_order": 1, "rejected": 2, "reserved": 2}
    assert report.ok


async def test_the_report_is_plain_data_for_json(stock):
    report = await outcome_report(stock.engine)

    assert asdict(report) == {
        "reserved": 0,
        "rejected": {"insufficient_stock": 0, "unknown_sku": 0, "cancelled": 0},
        "released": 0,
        "shipped": 0,
        "cancelled": 0,
        "duplicate_orders": 0,
        "inbox_total": 0,
        "processed": {},
        "outbox": {"unpublished": 0, "published": 0},
        "invariants": {
            "stock_out_of_bounds": 0,
            "reserved_mismatches": 0,
            "reserved_mismatch_examples": (),
            "inbox_unaccounted": 0,
            "orphan_lines": 0,
            "shipped_mismatches": 0,
            "shipped_mismatch_examples": (),
        },
        "shortage": {"skus": 0, "units": 0, "examples": ()},
    }


async def test_reserved_units_without_reserved_orders_behind_them_are_reported(stock):
    await stock.put_stock({f"SKU{i:02d}": 10 for i in range(12)} | {"OK": 5})
    await stock.apply(order(("OK", 2)))
    async with stock.engine.begin() as connection:
        await connection.execute(sa.text("UPDATE stock_levels SET reserved = 1 WHERE sku <> 'OK'"))

    report = await outcome_report(stock.engine)

    assert report.invariants.reserved_mismatches == 12
    assert report.invariants.reserved_mismatch_examples == tuple(f"SKU{i:02d}" for i in range(10))
    assert not report.ok


async def test_a_reserved_order_whose_stock_row_vanished_is_reported(stock):
    await stock.put_stock({"A": 5})
    await stock.apply(order(("A", 2)))
    async with stock.engine.begin() as connection:
        await connection.execute(sa.text("DELETE FROM stock_levels"))

    report = await outcome_report(stock.engine)

    assert report.invariants.reserved_mismatch_examples == ("A",)


async def test_an_inbox_row_without_a_reservation_is_reported(stock):
    async with stock.engine.begin() as connection:
        await connection.execute(
            sa.text(
                "INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)"
                " VALUES ('fulfilment', gen_random_uuid(), gen_random_uuid(), 'reserved')"
            )
        )

    report = await outcome_report(stock.engine)

    assert report.invariants.inbox_unaccounted == 1
    assert not report.ok


async def test_lines_of_an_order_without_a_reservation_are_reported(stock):
    await stock.put_stock({"A": 5})
    await stock.apply(order(("A", 2)))
    async with stock.engine.begin() as connection:
        await connection.execute(
            sa.text(
                "INSERT INTO reservation_lines (order_id, sku, quantity)"
                " VALUES (gen_random_uuid(), 'A', 1), (gen_random_uuid(), 'B', 1)"
            )
        )

    report = await outcome_report(stock.engine)

    assert report.invariants.orphan_lines == 2
    assert report.invariants.reserved_mismatches == 0
    assert not report.ok


async def test_stock_beyond_its_bounds_is_reported_if_the_check_was_ever_lifted(stock):
    async with stock.engine.begin() as connection:
        await connection.execute(
            sa.text("ALTER TABLE stock_levels DROP CONSTRAINT stock_levels_within_bounds")
        )
        await connection.execute(
            sa.text(
                "INSERT INTO stock_levels (sku, on_hand, reserved)"
                " VALUES ('A', 1, 1), ('B', 1, -1), ('C', -1, 0)"
            )
        )
        report = await outcome_report(connection)
        # DDL is transactional: leaving the block with an error restores the constraint.
        await connection.rollback()

    assert report.invariants.stock_out_of_bounds == 2


async def test_a_sku_short_after_a_reported_loss_is_counted_apart_and_is_no_violation(stock):
    await stock.put_stock({"A": 10, "B": 10, "C": 10})
    await stock.apply(order(("A", 6), ("B", 5), ("C", 1)))
    await stock.apply(warehouse_adjustment("A", -7))
    await stock.apply(warehouse_adjustment("B", -8))
    await stock.apply(warehouse_adjustment("C", -2))

    report = await outcome_report(stock.engine)

    assert report.shortage == Shortage(skus=2, units=3 + 3, examples=("A", "B"))
    assert report.invariants.stock_out_of_bounds == 0
    assert report.ok


async def test_a_sku_short_without_a_reported_loss_is_a_violation(stock):
    await stock.put_stock({"A": 10, "B": 10})
    await stock.apply(order(("A", 6), ("B", 6)))
    await stock.apply(warehouse_adjustment("B", 3, AdjustmentReason.RECEIVED))
    async with stock.engine.begin() as connection:
        await connection.execute(sa.text("UPDATE stock_levels SET on_hand = 5"))

    report = await outcome_report(stock.engine)

    assert report.invariants.stock_out_of_bounds == 2
    assert report.shortage == Shortage(0, 0, ())
    assert not report.ok


async def test_shipped_units_hold_for_every_shipment_and_a_difference_is_reported(stock):
    await stock.put_stock({"A": 10, "B": 10, "C": 10})
    first, second = order(("A", 2), ("B", 1)), order(("A", 3))
    for command in (first, second):
        await stock.apply(command)
        await stock.apply(shipment(command.order_id))
    assert (await outcome_report(stock.engine)).ok
    async with stock.engine.begin() as connection:
        # on_hand went down by one unit more than the shipped lines (A), and a SKU no shipped
        # order holds counts a shipped unit (C).
        await connection.execute(
            sa.text("UPDATE stock_levels SET shipped = shipped + 1 WHERE sku IN ('A', 'C')")
        )

    report = await outcome_report(stock.engine)

    assert report.invariants.shipped_mismatches == 2
    assert report.invariants.shipped_mismatch_examples == ("A", "C")
    assert report.invariants.reserved_mismatches == 0
    assert not report.ok


async def test_shipped_lines_not_counted_in_shipped_units_are_reported(stock):
    await stock.put_stock({"A": 10})
    command = order(("A", 2))
    await stock.apply(command)
    await stock.apply(shipment(command.order_id))
    async with stock.engine.begin() as connection:
        await connection.execute(sa.text("UPDATE stock_levels SET shipped = 0"))

    report = await outcome_report(stock.engine)

    assert report.invariants.shipped_mismatch_examples == ("A",)
    assert not report.ok


async def test_the_report_counts_the_outbox_rows_published_and_not(stock):
    await stock.put_stock({"A": 10})
    for _ in range(3):
        await stock.apply(order(("A", 1)))
    async with stock.engine.begin() as connection:
        await connection.execute(
            sa.text(
                "UPDATE outbox SET published_at = now() WHERE id = (SELECT min(id) FROM outbox)"
            )
        )

    report = await outcome_report(stock.engine)

    assert report.outbox == {"unpublished": 2, "published": 1}


# --- with the hand-off: a release that waited for the warehouse's answer ------------------

LEASE = 30.0
"""A lease no test outlives."""


class HandedOff:
    """The stock store with the hand-off on, and the requests' store, over one database."""

    def __init__(self, stock: PostgresStock, requests: PostgresWarehouseRequests) -> None:
        self.stock = stock
        self.requests = requests

    async def placed(self, *lines):
        """An order reserved, its fulfilment order claimed (sent, no answer yet)."""
        await self.stock.put_stock({"A": 10, "B": 10})
        command = order(*lines)
        await self.stock.apply(command)
        [self.fulfilment_order] = await self.requests.claim(10, lease_seconds=LEASE)
        return command

    async def accepted(self, *lines):
        """An order whose fulfilment order the warehouse accepted."""
        command = await self.placed(*lines)
        await self.requests.record(
            self.fulfilment_order, Accepted(201, '{"status": "received"}', "WH-1")
        )
        return command

    async def cancel_accepted(self, command, *lines):
        """A cancel that the warehouse must be asked, asked, and accepted."""
        outcome = await self.stock.apply(cancellation(command.order_id, *lines))
        assert outcome.kind is CancelKind.CANCEL_REQUESTED
        [cancelling] = await self.requests.claim(10, lease_seconds=LEASE)
        await self.requests.record(cancelling, Accepted(201, '{"status": "cancelled"}'))

    async def released_order_marks(self):
        """``released_order`` of every request, in the order recorded."""
        async with self.stock.engine.connect() as connection:
            rows = await connection.execute(
                sa.text("SELECT released_order FROM warehouse_requests ORDER BY id")
            )
            return [marked for (marked,) in rows]


@pytest.fixture
async def handed_off(clean_database):
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    try:
        yield HandedOff(
            PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0, handoff=True),
            PostgresWarehouseRequests(engine, retry_budget_seconds=2.0),
        )
    finally:
        await engine.dispose()


async def test_a_whole_cancel_the_warehouse_accepted_is_the_release_of_its_order(handed_off):
    command = await handed_off.accepted(("A", 3))

    await handed_off.cancel_accepted(command)

    report = await outcome_report(handed_off.stock.engine)
    assert (report.reserved, report.released) == (0, 1)
    assert report.processed == {"cancel_requested": 1, "reserved": 1}
    assert await handed_off.released_order_marks() == [False, True]
    assert report.invariants == InvariantChecks(0, 0, (), 0, 0, 0, ())


async def test_a_partial_then_a_whole_cancel_accepted_release_the_order_once(handed_off):
    command = await handed_off.accepted(("A", 3), ("B", 1))

    await handed_off.cancel_accepted(command, ("A", 1))
    partly = await outcome_report(handed_off.stock.engine)
    await handed_off.cancel_accepted(command)

    assert (partly.reserved, partly.released, partly.ok) == (1, 0, True)
    report = await outcome_report(handed_off.stock.engine)
    assert (report.reserved, report.released) == (0, 1)
    assert await handed_off.released_order_marks() == [False, False, True]
    assert report.ok


async def test_two_whole_cancels_release_the_order_once_the_second_withdrawn_unsent(handed_off):
    command = await handed_off.accepted(("A", 3))
    for _ in range(2):
        outcome = await handed_off.stock.apply(cancellation(command.order_id))
        assert outcome.kind is CancelKind.CANCEL_REQUESTED
    [cancelling] = await handed_off.requests.claim(10, lease_seconds=LEASE)
    await handed_off.requests.record(cancelling, Accepted(201, '{"status": "cancelled"}'))
    # The order is released: the second finds nothing left to cancel and is never sent.
    assert await handed_off.requests.claim(10, lease_seconds=LEASE) == []

    report = await outcome_report(handed_off.stock.engine)
    assert report.released == 1
    assert await handed_off.released_order_marks() == [False, True, False]
    assert report.ok


async def test_a_failed_fulfilment_order_releasing_its_waiting_cancel_is_counted(handed_off):
    command = await handed_off.placed(("A", 3))
    await handed_off.stock.apply(cancellation(command.order_id, ("A", 1)))
    await handed_off.stock.apply(cancellation(command.order_id))

    await handed_off.requests.record(
        handed_off.fulfilment_order, Failed("unknown_sku", '{"error": "unknown sku"}', 422)
    )

    report = await outcome_report(handed_off.stock.engine)
    assert (report.reserved, report.released) == (0, 1)
    assert await handed_off.released_order_marks() == [False, False, True]
    assert report.ok


async def test_a_local_partial_release_then_an_inbox_release_is_counted_once(handed_off):
    command = await handed_off.placed(("A", 3))
    await handed_off.stock.apply(cancellation(command.order_id, ("A", 1)))
    await handed_off.requests.record(
        handed_off.fulfilment_order, Failed("unknown_sku", '{"error": "unknown sku"}', 422)
    )

    # Its fulfilment order failed: a cancel now releases at once, recorded in the inbox.
    outcome = await handed_off.stock.apply(cancellation(command.order_id))

    assert outcome.kind is CancelKind.RELEASED
    report = await outcome_report(handed_off.stock.engine)
    assert report.released == 1
    assert report.processed == {"cancel_requested": 1, "released": 1, "reserved": 1}
    assert await handed_off.released_order_marks() == [False, False]
    assert report.ok


@pytest.mark.parametrize(
    "lost",
    [
        "DELETE FROM inbox_messages WHERE outcome = 'released'",
        "UPDATE warehouse_requests SET released_order = false",
    ],
    ids=["inbox-row", "request-mark"],
)
async def test_a_release_without_its_trace_is_still_reported(handed_off, lost):
    by_inbox = await handed_off.accepted(("A", 1))
    await handed_off.stock.put_stock({"A": 10, "B": 10})
    at_once = order(("B", 1))
    await handed_off.stock.apply(at_once)  # its fulfilment order is never sent
    assert (await handed_off.stock.apply(cancellation(at_once.order_id))).kind is (
        CancelKind.RELEASED
    )
    await handed_off.cancel_accepted(by_inbox)
    assert (await outcome_report(handed_off.stock.engine)).ok

    async with handed_off.stock.engine.begin() as connection:
        await connection.execute(sa.text(lost))

    report = await outcome_report(handed_off.stock.engine)
    assert report.released == 2
    assert report.invariants.inbox_unaccounted == -1
    assert not report.ok
