from __future__ import annotations

from dataclasses import asdict

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from builders import order, shipment
from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.outcomes import InvariantChecks, outcome_report
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.composition import database_options
from fulfilment.settings import Settings

pytestmark = pytest.mark.postgres


@pytest.fixture
async def warehouse(clean_database):
    engine = create_engine(database_options(Settings(database_url=SecretStr(clean_database))))
    try:
        yield PostgresWarehouse(engine, consumer="fulfilment", retry_budget_seconds=2.0)
    finally:
        await engine.dispose()


async def test_an_empty_database_reports_nothing_and_holds_its_invariants(warehouse):
    report = await outcome_report(warehouse.engine)

    assert report.reserved == 0
    assert report.rejected == {"insufficient_stock": 0, "unknown_sku": 0, "cancelled": 0}
    assert (report.released, report.shipped, report.cancelled) == (0, 0, 0)
    assert (report.duplicate_orders, report.inbox_total) == (0, 0)
    assert report.processed == {}
    assert report.invariants == InvariantChecks(0, 0, (), 0, 0, 0, ())
    assert report.ok


async def test_the_report_counts_each_kind_of_outcome(warehouse):
    await warehouse.put_stock({"A": 10, "B": 1})
    placed = order(("A", 2), ("A", 1))
    duplicate_event = placed
    await warehouse.reserve(placed)
    await warehouse.reserve(order(("B", 1)))
    await warehouse.reserve(order(("B", 1)))
    await warehouse.reserve(order(("NOPE", 1)))
    await warehouse.reserve(order(("A", 1), order_id=placed.order_id))
    await warehouse.reserve(duplicate_event)

    report = await outcome_report(warehouse.engine)

    assert report.reserved == 2
    assert report.rejected == {"insufficient_stock": 1, "unknown_sku": 1, "cancelled": 0}
    assert report.duplicate_orders == 1
    # A redelivered event leaves no second trace: five events were processed.
    assert report.inbox_total == 5
    assert report.processed == {"duplicate_order": 1, "rejected": 2, "reserved": 2}
    assert report.ok


async def test_the_report_is_plain_data_for_json(warehouse):
    report = await outcome_report(warehouse.engine)

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
    }


async def test_reserved_units_without_reserved_orders_behind_them_are_reported(warehouse):
    await warehouse.put_stock({f"SKU{i:02d}": 10 for i in range(12)} | {"OK": 5})
    await warehouse.reserve(order(("OK", 2)))
    async with warehouse.engine.begin() as connection:
        await connection.execute(sa.text("UPDATE stock_levels SET reserved = 1 WHERE sku <> 'OK'"))

    report = await outcome_report(warehouse.engine)

    assert report.invariants.reserved_mismatches == 12
    assert report.invariants.reserved_mismatch_examples == tuple(f"SKU{i:02d}" for i in range(10))
    assert not report.ok


async def test_a_reserved_order_whose_stock_row_vanished_is_reported(warehouse):
    await warehouse.put_stock({"A": 5})
    await warehouse.reserve(order(("A", 2)))
    async with warehouse.engine.begin() as connection:
        await connection.execute(sa.text("DELETE FROM stock_levels"))

    report = await outcome_report(warehouse.engine)

    assert report.invariants.reserved_mismatch_examples == ("A",)


async def test_an_inbox_row_without_a_reservation_is_reported(warehouse):
    async with warehouse.engine.begin() as connection:
        await connection.execute(
            sa.text(
                "INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)"
                " VALUES ('fulfilment', gen_random_uuid(), gen_random_uuid(), 'reserved')"
            )
        )

    report = await outcome_report(warehouse.engine)

    assert report.invariants.inbox_unaccounted == 1
    assert not report.ok


async def test_lines_of_an_order_without_a_reservation_are_reported(warehouse):
    await warehouse.put_stock({"A": 5})
    await warehouse.reserve(order(("A", 2)))
    async with warehouse.engine.begin() as connection:
        await connection.execute(
            sa.text(
                "INSERT INTO reservation_lines (order_id, sku, quantity)"
                " VALUES (gen_random_uuid(), 'A', 1), (gen_random_uuid(), 'B', 1)"
            )
        )

    report = await outcome_report(warehouse.engine)

    assert report.invariants.orphan_lines == 2
    assert report.invariants.reserved_mismatches == 0
    assert not report.ok


async def test_stock_beyond_its_bounds_is_reported_if_the_check_was_ever_lifted(warehouse):
    async with warehouse.engine.begin() as connection:
        await connection.execute(
            sa.text("ALTER TABLE stock_levels DROP CONSTRAINT stock_levels_reserved_within_on_hand")
        )
        await connection.execute(
            sa.text(
                "INSERT INTO stock_levels (sku, on_hand, reserved) VALUES ('A', 1, 2), ('B', 1, -1)"
            )
        )
        report = await outcome_report(connection)
        # DDL is transactional: leaving the block with an error restores the constraint.
        await connection.rollback()

    assert report.invariants.stock_out_of_bounds == 2


async def test_shipped_units_hold_for_every_shipment_and_a_difference_is_reported(warehouse):
    await warehouse.put_stock({"A": 10, "B": 10, "C": 10})
    first, second = order(("A", 2), ("B", 1)), order(("A", 3))
    for command in (first, second):
        await warehouse.reserve(command)
        await warehouse.ship(shipment(command.order_id))
    assert (await outcome_report(warehouse.engine)).ok
    async with warehouse.engine.begin() as connection:
        # on_hand went down by one unit more than the shipped lines (A), and a SKU no shipped
        # order holds counts a shipped unit (C).
        await connection.execute(
            sa.text("UPDATE stock_levels SET shipped = shipped + 1 WHERE sku IN ('A', 'C')")
        )

    report = await outcome_report(warehouse.engine)

    assert report.invariants.shipped_mismatches == 2
    assert report.invariants.shipped_mismatch_examples == ("A", "C")
    assert report.invariants.reserved_mismatches == 0
    assert not report.ok


async def test_shipped_lines_not_counted_in_shipped_units_are_reported(warehouse):
    await warehouse.put_stock({"A": 10})
    command = order(("A", 2))
    await warehouse.reserve(command)
    await warehouse.ship(shipment(command.order_id))
    async with warehouse.engine.begin() as connection:
        await connection.execute(sa.text("UPDATE stock_levels SET shipped = 0"))

    report = await outcome_report(warehouse.engine)

    assert report.invariants.shipped_mismatch_examples == ("A",)
    assert not report.ok


async def test_the_report_counts_the_outbox_rows_published_and_not(warehouse):
    await warehouse.put_stock({"A": 10})
    for _ in range(3):
        await warehouse.reserve(order(("A", 1)))
    async with warehouse.engine.begin() as connection:
        await connection.execute(
            sa.text(
                "UPDATE outbox SET published_at = now() WHERE id = (SELECT min(id) FROM outbox)"
            )
        )

    report = await outcome_report(warehouse.engine)

    assert report.outbox == {"unpublished": 2, "published": 1}
