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

from fakes import InMemoryWarehouse

RequestRow = tuple[str, Any, Any, tuple[tuple[str, int], ...] | None, str, str | None]

_REQUESTS = (
    "SELECT kind, order_id, causation_id, lines, status, traceparent"
    " FROM warehouse_requests ORDER BY id"
)


async def requests_in_database(connection: asyncpg.Connection | asyncpg.Pool) -> list[RequestRow]:
    """The requests PostgreSQL holds, in ``id`` order."""
    rows = await connection.fetch(_REQUESTS)
    return [
        (
            row["kind"],
            row["order_id"],
            row["causation_id"],
            None
            if row["lines"] is None
            else tuple((line["sku"], line["quantity"]) for line in json.loads(row["lines"])),
            row["status"],
            row["traceparent"],
        )
        for row in rows
    ]


def requests_in_fake(fake: InMemoryWarehouse) -> list[RequestRow]:
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
