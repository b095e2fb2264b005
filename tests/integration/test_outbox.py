"""The outbox's queries of the relay and its retention, against the real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from fulfilment.adapters.postgres.advisory_lock import RELAY_LOCK_KEY, try_advisory_lock
from fulfilment.adapters.postgres.outbox import (
    backlog,
    mark_published,
    next_batch,
    prune_published,
)
from fulfilment.contracts.result_events import RESULT_EVENTS, RESULT_ROUTING_KEYS
from fulfilment.observability.relay_metrics import UNKNOWN_ROUTING_KEY, RelayMetrics

pytestmark = pytest.mark.postgres

FULFILMENT = str(Path(sys.executable).with_name("fulfilment"))


async def insert(db: asyncpg.Connection, order_id: uuid.UUID, routing_key: str) -> int:
    event_id = uuid.uuid4()
    body = {"version": 1, "event_id": str(event_id), "order_id": str(order_id)}
    return int(
        await db.fetchval(
            "INSERT INTO outbox (event_id, order_id, routing_key, body)"
            " VALUES ($1, $2, $3, $4::jsonb) RETURNING id",
            event_id,
            order_id,
            routing_key,
            json.dumps(body),
        )
    )


async def test_a_batch_holds_one_row_per_order_in_id_order_and_leaves_the_rest_first_in_line(
    db: asyncpg.Connection,
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    a1 = await insert(db, a, "stock.reserved")
    a2 = await insert(db, a, "stock.released")
    b1 = await insert(db, b, "stock.reserved")
    a3 = await insert(db, a, "stock.shipped")

    first = await next_batch(db, 10)
    assert [row.id for row in first] == [a1, b1]
    assert json.loads(first[0].body)["order_id"] == str(a)

    await mark_published(db, [a1, b1])
    assert [row.id for row in await next_batch(db, 10)] == [a2]
    await mark_published(db, [a2])
    assert [row.id for row in await next_batch(db, 10)] == [a3]


async def insert_about_sku(db: asyncpg.Connection, sku: str, routing_key: str) -> int:
    event_id = uuid.uuid4()
    body = {"version": 1, "event_id": str(event_id), "sku": sku}
    return int(
        await db.fetchval(
            "INSERT INTO outbox (event_id, sku, routing_key, body)"
            " VALUES ($1, $2, $3, $4::jsonb) RETURNING id",
            event_id,
            sku,
            routing_key,
            json.dumps(body),
        )
    )


async def test_a_batch_holds_one_row_per_sku_of_the_events_about_a_sku(
    db: asyncpg.Connection,
) -> None:
    order = uuid.uuid4()
    a1 = await insert_about_sku(db, "A", "stock.shortage")
    a2 = await insert_about_sku(db, "A", "stock.adjusted")
    b1 = await insert_about_sku(db, "B", "stock.adjusted")
    # A SKU spelled as the order's id is another subject than the order.
    o1 = await insert(db, order, "stock.reserved")
    s1 = await insert_about_sku(db, str(order), "stock.adjusted")

    first = await next_batch(db, 10)

    assert [row.id for row in first] == [a1, b1, o1, s1]
    assert [(row.order_id, row.sku, row.subject) for row in first] == [
        (None, "A", "A"),
        (None, "B", "B"),
        (str(order), None, str(order)),
        (None, str(order), str(order)),
    ]
    await mark_published(db, [row.id for row in first])
    assert [row.id for row in await next_batch(db, 10)] == [a2]


async def test_the_outbox_refuses_a_row_about_both_an_order_and_a_sku_or_neither(
    db: asyncpg.Connection,
) -> None:
    for order_id, sku in ((uuid.uuid4(), "A"), (None, None)):
        with pytest.raises(asyncpg.CheckViolationError, match="outbox_order_or_sku"):
            await db.execute(
                "INSERT INTO outbox (event_id, order_id, sku, routing_key, body)"
                " VALUES ($1, $2, $3, 'stock.adjusted', '{}')",
                uuid.uuid4(),
                order_id,
                sku,
            )


def test_the_relay_counts_a_routing_key_it_does_not_know_instead_of_stopping() -> None:
    metrics = RelayMetrics(RESULT_ROUTING_KEYS)

    metrics.record_published([("stock.reserved", 0.1), ("stock.recounted", 0.2)])

    assert metrics.published["stock.reserved"]._value.get() == 1
    assert metrics.published[UNKNOWN_ROUTING_KEY]._value.get() == 1


async def test_marking_sets_published_at_once_and_reports_the_commit_to_confirm_lag(
    db: asyncpg.Connection,
) -> None:
    row = await insert(db, uuid.uuid4(), "stock.reserved")

    [(routing_key, lag)] = await mark_published(db, [row])
    assert routing_key == "stock.reserved"
    assert lag >= 0
    assert await mark_published(db, [row]) == []  # marked already: left as it was
    assert await backlog(db) == (0, 0.0)


async def test_every_result_event_is_stored_relayed_and_counted_by_its_routing_key(
    db: asyncpg.Connection,
) -> None:
    # The relay publishes each row with its own routing key; stock.cancel_refused (the
    # hand-off's) among them: the outbox accepts it and the relay's metrics count it.
    metrics = RelayMetrics(RESULT_ROUTING_KEYS)
    rows = [await insert(db, uuid.uuid4(), routing_key) for routing_key in RESULT_EVENTS]

    batch = await next_batch(db, 10)
    marked = await mark_published(db, [row.id for row in batch])
    metrics.record_published(marked)

    assert [row.id for row in batch] == rows
    assert [row.routing_key for row in batch] == list(RESULT_EVENTS)
    assert "stock.cancel_refused" in RESULT_EVENTS
    assert sorted(key for key, _ in marked) == sorted(RESULT_EVENTS)
    assert all(metrics.published[key]._value.get() == 1 for key in RESULT_EVENTS)


async def test_the_backlog_counts_unpublished_rows_and_ages_the_oldest(
    db: asyncpg.Connection,
) -> None:
    await insert(db, uuid.uuid4(), "stock.reserved")
    await db.execute("UPDATE outbox SET created_at = now() - interval '90 seconds'")
    await insert(db, uuid.uuid4(), "stock.rejected")

    rows, age = await backlog(db)
    assert rows == 2
    assert 90 <= age < 120


async def test_prune_deletes_old_published_rows_in_batches_and_never_an_unpublished_one(
    db: asyncpg.Connection,
) -> None:
    for _ in range(5):
        await insert(db, uuid.uuid4(), "stock.reserved")
    fresh = await insert(db, uuid.uuid4(), "stock.shipped")
    waiting = await insert(db, uuid.uuid4(), "stock.released")
    await db.execute(
        "UPDATE outbox SET created_at = now() - interval '9 days',"
        " published_at = now() - interval '8 days' WHERE id < $1",
        fresh,
    )
    await db.execute("UPDATE outbox SET published_at = now() WHERE id = $1", fresh)
    await db.execute(
        "UPDATE outbox SET created_at = now() - interval '9 days' WHERE id = $1", waiting
    )

    deleted = await prune_published(db, older_than_seconds=7 * 86400, batch_size=2)

    assert deleted == 5
    assert sorted(await db.fetchval("SELECT array_agg(id) FROM outbox")) == [fresh, waiting]


async def test_only_one_session_holds_the_relay_lock_until_it_ends(
    clean_database: str, db: asyncpg.Connection
) -> None:
    url = (
        make_url(clean_database).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    holder = await asyncpg.connect(url)
    try:
        assert await try_advisory_lock(holder, RELAY_LOCK_KEY)
        assert not await try_advisory_lock(db, RELAY_LOCK_KEY)
    finally:
        await holder.close()
    assert await try_advisory_lock(db, RELAY_LOCK_KEY)
    await db.execute("SELECT pg_advisory_unlock_all()")


async def test_the_prune_command_deletes_by_the_retention_setting(
    clean_database: str, db: asyncpg.Connection
) -> None:
    old = await insert(db, uuid.uuid4(), "stock.reserved")
    await db.execute(
        "UPDATE outbox SET published_at = now() - interval '2 hours' WHERE id = $1", old
    )
    kept = await insert(db, uuid.uuid4(), "stock.reserved")
    await db.execute("UPDATE outbox SET published_at = now() WHERE id = $1", kept)
    env = {
        "PATH": "/usr/bin:/bin",
        "FULFILMENT_DATABASE_URL": clean_database,
        "FULFILMENT_OUTBOX_RETENTION_SECONDS": "3600",
    }

    result = await asyncio.to_thread(
        subprocess.run,
        [FULFILMENT, "outbox", "prune"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "outbox prune: 1 published rows older than 3600 s deleted"
    assert await db.fetchval("SELECT array_agg(id) FROM outbox") == [kept]
