from __future__ import annotations

from dataclasses import asdict

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from builders import order
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
    assert report.invariants == InvariantChecks(0, 0, (), 0, 0)
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
        "invariants": {
            "stock_out_of_bounds": 0,
            "reserved_mismatches": 0,
            "reserved_mismatch_examples": (),
            "inbox_unaccounted": 0,
            "orphan_lines": 0,
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
