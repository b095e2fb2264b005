"""The dispatcher's claim reads a bounded part of the table, whatever the backlog and statistics.

The claim is the loop's hottest statement: it runs several times a second, and most of all
while a backlog drains after an outage, when the table's statistics still say that almost
nothing is open. These tests build that case (5,000 open requests written since the table was
last analysed, emptied) and read the plan PostgreSQL runs for the claim, with the adapter's
settings, from ``EXPLAIN (ANALYZE, FORMAT JSON)``. Without those settings PostgreSQL reads
every open request by bitmap and sorts them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres import warehouse_requests as adapter
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests

pytestmark = pytest.mark.postgres

BACKLOG = 5_000
LIMIT = 32

_FILL = sa.text(
    "INSERT INTO warehouse_requests"
    " (idempotency_key, kind, order_id, causation_id, lines, status, attempts, body,"
    "  first_attempt_at, next_attempt_at)"
    " SELECT gen_random_uuid(), 'fulfilment_order', gen_random_uuid(), gen_random_uuid(),"
    "        '[{\"sku\": \"A\", \"quantity\": 1}]', 'accepted', 1, '\\x7b7d', now(),"
    "        now() - make_interval(secs => :count - g)"
    " FROM generate_series(1, :count) AS g"
)

# Cancellations of the first orders, which wait for nothing: their fulfilment orders are
# accepted. Each makes the claim look up its order's fulfilment order.
_CANCELLATIONS = sa.text(
    "INSERT INTO warehouse_requests"
    " (idempotency_key, kind, order_id, causation_id, status, next_attempt_at)"
    " SELECT gen_random_uuid(), 'cancellation', order_id, gen_random_uuid(), 'pending',"
    "        next_attempt_at"
    " FROM warehouse_requests WHERE kind = 'fulfilment_order' ORDER BY id LIMIT 10"
)


@pytest.fixture
async def stale_backlog(engine: AsyncEngine) -> None:
    """5,000 fulfilment orders and 10 cancellations open, none of them analysed."""
    async with engine.begin() as connection:
        await connection.execute(_FILL, {"count": BACKLOG})
        # The fulfilment orders of the first ten stay accepted, for their cancellations.
        await connection.execute(
            sa.text(
                "UPDATE warehouse_requests SET status = 'pending', attempts = 0, body = NULL,"
                " first_attempt_at = NULL"
                " WHERE id > (SELECT min(id) + 9 FROM warehouse_requests)"
            )
        )
        await connection.execute(_CANCELLATIONS)


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


async def claim_plan(engine: AsyncEngine) -> dict[str, Any]:
    """The claim's plan as executed, with the settings the adapter applies; rolled back."""
    async with engine.connect() as connection:
        transaction = await connection.begin()
        try:
            await connection.execute(adapter._CLAIM_PLAN)
            explain = sa.text("EXPLAIN (ANALYZE, FORMAT JSON) " + adapter._CLAIM_DUE.text)
            [[document]] = (await connection.execute(explain, {"limit": LIMIT})).all()
        finally:
            await transaction.rollback()
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


@pytest.mark.usefixtures("stale_backlog")
async def test_the_claim_walks_the_due_index_in_order_and_stops_at_its_limit(
    engine: AsyncEngine,
) -> None:
    plan = list(nodes(await claim_plan(engine)))
    types = {node["Node Type"] for node in plan}
    assert "Sort" not in types
    assert "Seq Scan" not in types
    assert "Bitmap Heap Scan" not in types
    [due] = [
        node
        for node in plan
        if node.get("Alias") == "w" and node.get("Index Name") == "warehouse_requests_due_idx"
    ]
    # Read up to the limit, not the backlog (rows skipped as blocked would count here too).
    assert due["Actual Rows"] * due["Actual Loops"] <= 2 * LIMIT


@pytest.mark.usefixtures("stale_backlog")
async def test_the_claim_takes_the_earliest_due_requests_of_the_backlog(
    engine: AsyncEngine,
) -> None:
    async with engine.connect() as connection:
        due = (
            await connection.execute(
                sa.text(
                    "SELECT id FROM warehouse_requests WHERE status = 'pending'"
                    " ORDER BY next_attempt_at, id LIMIT :limit"
                ),
                {"limit": LIMIT},
            )
        ).scalars()
        expected = sorted(due)
    store = PostgresWarehouseRequests(engine, retry_budget_seconds=2.0)

    claimed = await store.claim(LIMIT, lease_seconds=30)

    assert [request.id for request in claimed] == expected
