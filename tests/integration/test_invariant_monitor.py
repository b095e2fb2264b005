"""The worker's invariant check sets a gauge per invariant from the real database."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.domain.warehouse_events import AdjustmentReason
from fulfilment.entrypoints.startup import database_options
from fulfilment.observability.metrics import INVARIANTS, Metrics
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from fulfilment.tools.command import ToolOptions
from fulfilment.tools.stock_adjust import adjust_command
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


RECORDED = "fulfilment_stock_adjustments_recorded_total"
RECORDED_UNITS = "fulfilment_stock_adjusted_units_recorded_total"


async def test_the_adjustments_recorded_are_exported_by_source_and_reason(clean_database):
    # The operator's adjustment is made by the command, which exits: only the rows it leaves
    # can count it.
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    metrics = Metrics()
    try:
        stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0)
        await stock.put_stock({"A": 10, "B": 3})
        await stock.apply(warehouse_adjustment("A", 5, AdjustmentReason.RECEIVED))
        await stock.apply(warehouse_adjustment("A", -2, AdjustmentReason.DAMAGED))
        await stock.apply(warehouse_adjustment("B", -4, AdjustmentReason.DAMAGED))  # 3 taken
        await adjust_command(
            ToolOptions(
                amqp_url="amqp://unused/",
                database=database_options(
                    DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings()
                ),
                consumer="fulfilment",
            ),
            "A",
            -6,
            reason=AdjustmentReason.COUNTED,
            comment="cycle count",
            operator="jane",
            execute=True,
            echo=lambda _: None,
        )
        assert metrics.registry.get_sample_value(RECORDED, WEBHOOK_RECEIVED) is None

        await _first_check(engine, metrics)
    finally:
        await engine.dispose()

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value(RECORDED, source="webhook", reason="received") == 1
    assert value(RECORDED, source="webhook", reason="damaged") == 2
    assert value(RECORDED, source="operator", reason="counted") == 1
    assert value(RECORDED, source="operator", reason="damaged") == 0  # bound at 0
    assert value(RECORDED_UNITS, source="webhook", reason="received", direction="in") == 5
    assert value(RECORDED_UNITS, source="webhook", reason="damaged", direction="out") == 2 + 3
    assert value(RECORDED_UNITS, source="operator", reason="counted", direction="out") == 6
    assert value(RECORDED_UNITS, source="operator", reason="counted", direction="in") == 0
    metrics.forget_invariants()
    assert value(RECORDED, source="operator", reason="counted") is None


WEBHOOK_RECEIVED = {"source": "webhook", "reason": "received"}
