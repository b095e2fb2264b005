"""The poll end to end: a ``fulfilment dispatcher`` process and the warehouse simulator on a
socket, over the session's PostgreSQL. The warehouse ships and cancels on its own and sends no
webhook, so everything the service hears of it comes from the poll.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.e2e.harness import put_stock, wait_for
from tests.e2e.warehouse_harness import DispatcherProcess, SimulatorProcess, handoff_env
from tests.support.builders import order

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

LOADED = {"A": 200, "B": 200}


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[SimulatorProcess]:
    running = SimulatorProcess(tmp_path / "simulator.log")
    running.start()
    yield running
    running.stop()


async def test_shipments_no_webhook_brought_are_applied_once_by_the_dispatchers_poll(
    db: asyncpg.Connection,
    clean_database: str,
    worker_env: dict[str, str],
    simulator: SimulatorProcess,
    tmp_path: Path,
) -> None:
    simulator.faults(ship_delay_seconds=0.5, split_rate=0.6, max_shipments=3, cancel_rate=0.2)
    await put_stock(db, LOADED)
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    try:
        stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=5.0, handoff=True)
        placed = [order(("A", 1 + i % 5), ("B", 1 + i % 2)) for i in range(20)]
        for command in placed:
            await stock.apply(command)
    finally:
        await engine.dispose()
    env = handoff_env(worker_env, simulator, FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS="1")
    dispatcher = DispatcherProcess(env, tmp_path / "dispatcher.log")
    dispatcher.start()
    try:

        async def settled() -> bool:
            reserved = await db.fetchval(
                "SELECT count(*) FROM reservations WHERE status = 'reserved'"
            )
            record = simulator.record()
            return reserved == 0 and not record["work_pending"]

        await wait_for(settled, timeout=90, what="every order settled by the poll")
        answered = dispatcher.metric("fulfilment_warehouse_polls_total", outcome="answered")
        without_news = dispatcher.metric("fulfilment_warehouse_orders_without_news")
    finally:
        dispatcher.stop_quietly()

    record = simulator.record()
    assert record["webhooks"] == []
    made = {shipment["shipment_id"]: shipment for shipment in record["shipments"]}
    rows = await db.fetch("SELECT shipment_id, source, outcome FROM warehouse_shipments")
    assert Counter(row["shipment_id"] for row in rows) == Counter(
        shipment["shipment_id"] for shipment in record["shipments"]
    )
    assert {(row["source"], row["outcome"]) for row in rows} == {("poll", "shipped")}
    cancelled = await db.fetch("SELECT cancellation_id FROM warehouse_cancellations")
    assert sorted(row["cancellation_id"] for row in cancelled) == sorted(
        c["cancellation_id"] for c in record["cancellations"]
    )
    levels = {
        row["sku"]: (row["on_hand"], row["reserved"])
        for row in await db.fetch("SELECT sku, on_hand, reserved FROM stock_levels")
    }
    taken = Counter[str]()
    for shipment in made.values():
        for line in shipment["lines"]:
            taken[line["sku"]] += line["quantity"]
    assert levels == {sku: (loaded - taken[sku], 0) for sku, loaded in LOADED.items()}
    assert await db.fetchval("SELECT count(*) FROM warehouse_discrepancies") == 0
    assert answered is not None
    assert answered >= len({s["reference"] for s in made.values()})
    assert without_news is not None
    polls = [line for line in dispatcher.log_lines() if line.get("event") == "dispatcher.poll"]
    assert polls
    assert {line["outcome"] for line in polls} == {"answered"}
