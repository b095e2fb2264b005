"""The worker's invariant check sets a gauge per invariant from the real database."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.entrypoints.startup import database_options
from fulfilment.observability.metrics import INVARIANTS, Metrics
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from fulfilment.worker.monitors import check_invariants
from tests.support.builders import order, shipment
from tests.support.warehouse_commands import warehouse_adjustment

pytestmark = pytest.mark.postgres

VIOLATIONS = "fulfilment_stock_invariant_violations"


async def _first_check(engine, metrics):
    """The gauges once the first check has set them all (the check then sleeps)."""
    task = asyncio.create_task(check_invariants(engine, metrics, interval_seconds=3600))
    try:
        while metrics.registry.get_sample_value(VIOLATIONS, {"invariant": INVARIANTS[-1]}) is None:
            assert not task.done(), task
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return {
        invariant: metrics.registry.get_sample_value(VIOLATIONS, {"invariant": invariant})
        for invariant in INVARIANTS
    }


async def test_shipped_units_that_differ_from_the_shipped_lines_set_their_gauge(clean_database):
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    try:
        stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0)
        await stock.put_stock({"A": 10})
        placed = order(("A", 2))
        await stock.apply(placed)
        await stock.apply(shipment(placed.order_id))
        holding = await _first_check(engine, Metrics())
        async with engine.begin() as connection:
            await connection.execute(sa.text("UPDATE stock_levels SET shipped = shipped + 5"))

        broken = await _first_check(engine, Metrics())
    finally:
        await engine.dispose()

    assert holding == dict.fromkeys(INVARIANTS, 0)
    assert broken == dict.fromkeys(INVARIANTS, 0) | {"shipped_mismatches": 1}


async def test_a_short_sku_sets_the_shortage_gauges_and_no_violation(clean_database):
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    metrics = Metrics()
    try:
        stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0)
        await stock.put_stock({"A": 10, "B": 10})
        await stock.apply(order(("A", 6), ("B", 6)))
        await stock.apply(warehouse_adjustment("A", -7))
        await stock.apply(warehouse_adjustment("B", -9))

        violations = await _first_check(engine, metrics)
    finally:
        await engine.dispose()

    assert violations == dict.fromkeys(INVARIANTS, 0)
    assert metrics.registry.get_sample_value("fulfilment_stock_short_skus") == 2
    assert metrics.registry.get_sample_value("fulfilment_stock_short_units") == 3 + 5
    metrics.forget_invariants()
    assert metrics.registry.get_sample_value("fulfilment_stock_short_skus") is None
