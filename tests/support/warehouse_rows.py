"""The rows of ``warehouse_requests`` as the tests compare them, from PostgreSQL or the fake.

One row is ``(kind, order_id, causation_id, lines, status, traceparent)``; ``lines`` is a
tuple of ``(sku, quantity)`` pairs in the order stored (PostgreSQL's ``jsonb`` array keeps
it, so a comparison with the fake's, sorted by code point, checks the functions' sorting),
or None for a cancellation of the whole order. Rows are in ``id`` order; the ids, keys and
times, which no two stores share, are left out.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import sqlalchemy as sa

from fulfilment.adapters.postgres.stock import PostgresStock
from tests.support.fakes import FakeStock

RequestRow = tuple[str, Any, Any, tuple[tuple[str, int], ...] | None, str, str | None]

_REQUESTS = (
    "SELECT kind, order_id, causation_id, lines, status, traceparent"
    " FROM warehouse_requests ORDER BY id"
)


def _row(kind, order_id, causation_id, lines, status, traceparent) -> RequestRow:
    if isinstance(lines, str):  # asyncpg hands jsonb over as text, SQLAlchemy decoded
        lines = json.loads(lines)
    pairs = None if lines is None else tuple((line["sku"], line["quantity"]) for line in lines)
    return (kind, order_id, causation_id, pairs, status, traceparent)


async def requests_in_database(connection: asyncpg.Connection | asyncpg.Pool) -> list[RequestRow]:
    """The requests PostgreSQL holds, in ``id`` order (on an asyncpg connection or pool)."""
    return [_row(*row) for row in await connection.fetch(_REQUESTS)]


async def requests_of(stock: FakeStock | PostgresStock) -> list[RequestRow]:
    """The requests ``warehouse`` recorded, in ``id`` order, from the fake or PostgreSQL."""
    if isinstance(stock, FakeStock):
        return requests_in_fake(stock)
    async with stock.engine.connect() as connection:
        return [_row(*row) for row in await connection.execute(sa.text(_REQUESTS))]


def requests_in_fake(fake: FakeStock) -> list[RequestRow]:
    """The requests the fake holds, in ``id`` order, lines sorted by code point."""
    return [
        (
            str(request.kind),
            request.order_id,
            request.causation_id,
            None if request.lines is None else tuple(sorted(request.lines.items())),
            str(request.status),
            request.traceparent,
        )
        for request in fake.requests
    ]
