"""PostgreSQL restarts, kills the worker's sessions, or holds its stock rows under load.

A transient database failure is retried inside the handler's deadline by the adapter's one
retry policy; what outlasts it goes back to the queue while the consumer pauses until the
database answers. So none of these scenarios dead-letters anything.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from fulfilment.settings import Settings
from tests.e2e.harness import FAST_SETTINGS, put_stock
from tests.faults.faultlib import (
    AMPLE_STOCK,
    LIMIT,
    Cluster,
    assert_reconciled,
    connect_db,
    declare,
    inbox_count,
    publish,
    record_figures,
    run_until_settled,
    synthetic_orders,
    wait_until_processing,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

ORDERS = 5_000
"""Enough for a worker at prefetch 64 to still be busy when the restart or the last kill lands."""
SESSIONS_TO_KILL = 5
RETRY_BUDGET = float(FAST_SETTINGS["FULFILMENT_RETRY_BUDGET_SECONDS"])


def restart_postgres() -> None:
    version = min(p.name for p in Path("/etc/postgresql").iterdir())
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )


async def test_a_database_restart_under_load_dead_letters_nothing(
    cluster: Cluster,
    clean_database: str,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    db = await connect_db(clean_database)
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(ORDERS, seed=31)
    await declare(amqp_url, LIMIT)
    await publish(broker, orders)
    cluster.start(1, wait_ready=True)
    await wait_until_processing(db)
    await db.close()

    await asyncio.to_thread(restart_postgres)

    db = await connect_db(clean_database)
    try:
        restarts = await run_until_settled(cluster, db, broker, ORDERS, timeout=120)
    finally:
        await db.close()
    assert restarts == 0
    retried = cluster.log_events("database_retry")
    requeued = cluster.log_events("order_placed.requeued")
    assert retried or requeued, "the restart went unnoticed: nothing was retried"
    result = await assert_reconciled(settings, orders)
    record_figures(
        "database restart",
        f"pg_ctlcluster restart under load ({len(retried)} retries, {len(requeued)} requeued)",
        result,
    )


async def test_killed_database_sessions_are_retried_and_dead_letter_nothing(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(ORDERS, seed=32)
    await declare(amqp_url, LIMIT)
    await publish(broker, orders)
    cluster.start(1, wait_ready=True)
    await wait_until_processing(db)

    # Kill until enough sessions have died, not a fixed number of rounds: a pool reconnects
    # only when it next needs a session, so a round can find none, and a fast worker can
    # finish a fixed schedule's orders before its last kill.
    terminated = 0
    deadline = time.monotonic() + 30
    while terminated < SESSIONS_TO_KILL:
        assert time.monotonic() < deadline, f"only {terminated} sessions were found to kill"
        terminated += int(
            await db.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'fulfilment' AND datname = current_database()"
            )
        )
        await asyncio.sleep(0.2)
    processed_when_killed = await inbox_count(db)

    await run_until_settled(cluster, db, broker, ORDERS, timeout=120, restart=False)
    assert processed_when_killed < ORDERS, "the kills landed after the load"
    result = await assert_reconciled(settings, orders)
    record_figures(
        "database sessions killed",
        f"pg_terminate_backend on {terminated} worker sessions under load",
        result,
    )


async def test_a_stock_row_locked_longer_than_the_retry_budget_dead_letters_nothing(
    cluster: Cluster,
    db: asyncpg.Connection,
    clean_database: str,
    broker: aio_pika.abc.AbstractRobustConnection,
    settings: Settings,
    amqp_url: str,
) -> None:
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(600, skus=4, seed=33)  # every order touches one of 4 hot rows
    await declare(amqp_url, LIMIT)
    cluster.start(1, wait_ready=True)

    holder = await connect_db(clean_database)
    held = RETRY_BUDGET + 3
    async with holder.transaction():
        await holder.execute("SELECT 1 FROM stock_levels WHERE sku = 'SKU000' FOR UPDATE")
        await publish(broker, orders)
        await asyncio.sleep(held)
    await holder.close()

    await run_until_settled(cluster, db, broker, len(orders), timeout=120, restart=False)
    requeued = cluster.log_events("order_placed.requeued")
    assert requeued, "the lock outlasted the retry budget, so deliveries should be requeued"
    result = await assert_reconciled(settings, orders)
    record_figures(
        "stock row locked past the retry budget",
        f"SELECT ... FOR UPDATE held {held:g} s on a hot SKU ({len(requeued)} requeued)",
        result,
    )
