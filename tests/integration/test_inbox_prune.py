"""``fulfilment prune``'s inbox part against the real PostgreSQL: which processed ids go, and
which of the warehouse's webhook ids."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from fulfilment.adapters.postgres.inbox import prune_processed
from fulfilment.adapters.postgres.outcomes import outcome_report
from fulfilment.adapters.postgres.webhook_inbox import prune_webhook_ids

pytestmark = pytest.mark.postgres

FULFILMENT = str(Path(sys.executable).with_name("fulfilment"))
CONSUMER = "fulfilment"


async def order(db: asyncpg.Connection, status: str) -> uuid.UUID:
    """A reservation row of ``status`` (a ``cancelled`` one is a tombstone of some lines)."""
    order_id = uuid.uuid4()
    placed = status != "cancelled"
    await db.execute(
        "INSERT INTO reservations (order_id, event_id, status, reason, placed_at, tombstone,"
        " shipped_at) VALUES ($1, $2, $3, $4, CASE WHEN $5 THEN now() END, $6,"
        " CASE WHEN $3 = 'shipped' THEN now() END)",
        order_id,
        uuid.uuid4() if placed else None,
        status,
        "insufficient_stock" if status == "rejected" else None,
        placed,
        None if placed else "lines",
    )
    return order_id


async def processed(
    db: asyncpg.Connection, order_id: uuid.UUID, outcome: str, *, days_ago: float = 40
) -> uuid.UUID:
    event_id = uuid.uuid4()
    await db.execute(
        "INSERT INTO inbox_messages (consumer, event_id, order_id, outcome, processed_at)"
        " VALUES ($1, $2, $3, $4, now() - make_interval(secs => $5))",
        CONSUMER,
        event_id,
        order_id,
        outcome,
        days_ago * 86_400,
    )
    return event_id


async def test_only_processed_ids_whose_event_could_change_nothing_again_are_pruned(
    clean_database: str, db: asyncpg.Connection
) -> None:
    still_reserved = await order(db, "reserved")
    shipped = await order(db, "shipped")
    released = await order(db, "released")
    rejected = await order(db, "rejected")
    tombstone = await order(db, "cancelled")
    gone = {
        await processed(db, still_reserved, "reserved"),  # placed again: duplicate:order
        await processed(db, shipped, "reserved"),
        await processed(db, shipped, "partially_released"),  # final: ignored again
        await processed(db, shipped, "shipped"),
        await processed(db, released, "released"),
        await processed(db, rejected, "rejected"),
        await processed(db, rejected, "cancel_ignored"),
    }
    kept = {
        # A partial cancel of an order still reserved would release its units twice.
        await processed(db, still_reserved, "partially_released"),
        # A cancel before its order: the tombstone would remember its lines twice.
        await processed(db, tombstone, "tombstoned"),
        # Younger than the retention, whatever it did.
        await processed(db, shipped, "duplicate_order", days_ago=1),
    }
    engine = create_async_engine(clean_database)
    try:
        before = await outcome_report(engine)
        deleted = await prune_processed(
            db, consumer=CONSUMER, older_than_seconds=30 * 86_400, batch_size=2
        )
        after = await outcome_report(engine)
    finally:
        await engine.dispose()

    assert deleted == len(gone)
    left = {row["event_id"] for row in await db.fetch("SELECT event_id FROM inbox_messages")}
    assert left == kept
    pruned = dict(await db.fetch("SELECT outcome, rows FROM inbox_pruned ORDER BY outcome"))
    assert pruned == {
        "cancel_ignored": 1,
        "partially_released": 1,
        "rejected": 1,
        "released": 1,
        "reserved": 2,
        "shipped": 1,
    }
    # The report still counts every processed event, and the invariant check is unchanged.
    assert after.processed == before.processed
    assert after.inbox_total == before.inbox_total
    assert after.invariants == before.invariants


async def test_the_prune_command_prunes_the_outbox_and_the_inbox_by_their_settings(
    clean_database: str, db: asyncpg.Connection
) -> None:
    shipped = await order(db, "shipped")
    old = await processed(db, shipped, "shipped", days_ago=3)
    young = await processed(db, shipped, "duplicate_order", days_ago=1)
    env = {
        "PATH": "/usr/bin:/bin",
        "FULFILMENT_DATABASE_URL": clean_database,
        "FULFILMENT_OUTBOX_RETENTION_SECONDS": "3600",
        "FULFILMENT_DEAD_LETTER_TTL_SECONDS": "3600",
        "FULFILMENT_PROCESSED_ID_RETENTION_SECONDS": "172800",
    }

    result = await asyncio.to_thread(
        subprocess.run, [FULFILMENT, "prune"], env=env, capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "outbox prune: 0 published rows older than 3600 s deleted",
        "inbox prune: 1 processed ids older than 172800 s deleted (consumer fulfilment)",
        "webhook inbox prune: 0 webhook ids older than 604800 s deleted (consumer fulfilment)",
    ]
    left = {row["event_id"] for row in await db.fetch("SELECT event_id FROM inbox_messages")}
    assert left == {young}
    assert old not in left


async def test_the_prune_command_refuses_a_retention_shorter_than_the_dead_letter_queue_s(
    clean_database: str,
) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "FULFILMENT_DATABASE_URL": clean_database,
        "FULFILMENT_PROCESSED_ID_RETENTION_SECONDS": "86400",
    }

    result = await asyncio.to_thread(
        subprocess.run, [FULFILMENT, "prune"], env=env, capture_output=True, text=True, check=False
    )

    assert result.returncode == 2, result.stdout
    assert "FULFILMENT_DEAD_LETTER_TTL_SECONDS=1209600 must be less than " in result.stderr
    assert "FULFILMENT_PROCESSED_ID_RETENTION_SECONDS=86400" in result.stderr


async def webhook_received(
    db: asyncpg.Connection, webhook_id: str, *, days_ago: float, consumer: str = CONSUMER
) -> None:
    await db.execute(
        "INSERT INTO webhook_inbox (consumer, webhook_id, type, outcome, received_at)"
        " VALUES ($1, $2, 'shipment.shipped', 'shipped', now() - make_interval(secs => $3))",
        consumer,
        webhook_id,
        days_ago * 86_400,
    )


async def test_the_prune_command_prunes_the_consumer_s_webhook_ids_past_their_retention_only(
    clean_database: str, db: asyncpg.Connection
) -> None:
    await webhook_received(db, "msg_old", days_ago=8)
    await webhook_received(db, "msg_retried_lately", days_ago=3.5)
    await webhook_received(db, "msg_of_another", days_ago=8, consumer="other")
    await db.execute(
        "INSERT INTO warehouse_shipments (shipment_id, order_id, fulfilment_order_id,"
        " webhook_id, source, shipped_at, tracking_numbers, outcome, recorded_at)"
        " VALUES ('SHP-old', $1, 'FO-1', 'msg_old', 'webhook', now(), '{}', 'shipped',"
        " now() - interval '30 days')",
        uuid.uuid4(),
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "FULFILMENT_DATABASE_URL": clean_database,
        "FULFILMENT_WEBHOOK_INBOX_RETENTION_SECONDS": str(4 * 86_400),
    }

    result = await asyncio.to_thread(
        subprocess.run, [FULFILMENT, "prune"], env=env, capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "webhook inbox prune: 1 webhook ids older than 345600 s deleted (consumer fulfilment)"
    )
    left = {
        (row["consumer"], row["webhook_id"])
        for row in await db.fetch("SELECT consumer, webhook_id FROM webhook_inbox")
    }
    assert left == {(CONSUMER, "msg_retried_lately"), ("other", "msg_of_another")}
    # The shipment stays, the record by which it is applied once whatever webhook brings it.
    assert await db.fetchval("SELECT count(*) FROM warehouse_shipments") == 1


@pytest.mark.usefixtures("clean_database")
async def test_webhook_ids_are_pruned_in_batches_until_none_is_past_the_retention(
    db: asyncpg.Connection,
) -> None:
    for number in range(7):
        await webhook_received(db, f"msg_{number}", days_ago=8)
    await webhook_received(db, "msg_young", days_ago=1)

    deleted = await prune_webhook_ids(
        db, consumer=CONSUMER, older_than_seconds=7 * 86_400, batch_size=3
    )

    assert deleted == 7
    assert await db.fetchval("SELECT array_agg(webhook_id) FROM webhook_inbox") == ["msg_young"]
