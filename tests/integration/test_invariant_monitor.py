"""The worker's invariant check sets a gauge per invariant from the real database."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from builders import order, shipment
from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.entrypoints.startup import database_options
from fulfilment.observability.metrics import INVARIANTS, Metrics
from fulfilment.settings import Settings
from fulfilment.worker.monitors import check_invariants

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
    engine = create_engine(database_options(Settings(database_url=SecretStr(clean_database))))
    try:
        warehouse = PostgresWarehouse(engine, consumer="fulfilment", retry_budget_seconds=2.0)
        await warehouse.put_stock({"A": 10})
        placed = order(("A", 2))
        await warehouse.apply(placed)
        await warehouse.apply(shipment(placed.order_id))
        holding = await _first_check(engine, Metrics())
        async with engine.begin() as connection:
            await connection.execute(sa.text("UPDATE stock_levels SET shipped = shipped + 5"))

        broken = await _first_check(engine, Metrics())
    finally:
        await engine.dispose()

    assert holding == dict.fromkeys(INVARIANTS, 0)
    assert broken == dict.fromkeys(INVARIANTS, 0) | {"shipped_mismatches": 1}
