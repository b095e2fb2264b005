"""The outbox's reads and writes for the relay and its retention (migration 0008's ``outbox``).

Every function takes a plain asyncpg connection: the relay runs them all on the one session
that holds its advisory lock (``relay.service``), so a relay whose session ended, and with it
its lock, can no longer read or mark rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

NOTIFY_CHANNEL = "fulfilment_outbox"
"""The channel the SQL functions ``pg_notify`` after writing outbox rows."""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One unpublished result event, as the relay publishes it.

    The ids come as text and the body as UTF-8 bytes, as the message carries them: the relay
    publishes them without converting anything.

    Attributes:
        id: publishing order (``outbox.id``).
        event_id: the event's id (a UUID's text), the message's ``message_id``.
        order_id: the order it reports on (a UUID's text); None for an event about a SKU.
        routing_key: ``stock.reserved`` ... ``stock.shortage``, also the message's ``type``.
        body: the JSON text of ``outbox.body`` in UTF-8, published as it is.
        traceparent: W3C trace context of the span that wrote it (the delivery's span of the
            event that caused it; with tracing off, that event's incoming ``traceparent``), or
            None.
        age_seconds: seconds from its commit (``created_at``) to its read by the relay.
        sku: the SKU an event about a SKU reports on (``stock.adjusted``, ``stock.shortage``,
            migration 0016); None for an event about an order.
    """

    id: int
    event_id: str
    order_id: str | None
    routing_key: str
    body: bytes
    traceparent: str | None
    age_seconds: float = 0.0
    sku: str | None = None

    @property
    def subject(self) -> str:
        """What it reports on: the order's id, or the SKU.

        The message's ``correlation_id``, and what the relay keeps the publishing order of
        (:func:`next_batch`).
        """
        return self.order_id if self.order_id is not None else (self.sku or "")


async def next_batch(connection: asyncpg.Connection, limit: int) -> list[OutboxRow]:
    """The oldest unpublished rows in ``id`` order, at most ``limit``, one per order or SKU.

    A row whose order (or SKU, for an event about a SKU) already has an earlier row in the
    batch is left for a later batch: the rows of a batch are published at once, so a later row
    of an order must never travel beside an earlier one that the broker might return or refuse
    (docs/design.md, "Result events and the relay": in order per order, and per SKU). The rows
    left out stay first in line for the next batch.
    """
    # The columns in OutboxRow's order, which is built from them by position.
    records = await connection.fetch(
        "SELECT id, event_id::text, order_id::text, routing_key,"
        " convert_to(body::text, 'UTF8'), traceparent,"
        " extract(epoch FROM clock_timestamp() - created_at)::float8, sku"
        " FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1",
        limit,
    )
    batch: list[OutboxRow] = []
    # An order's id and a SKU are kept apart: a SKU spelled as a UUID is not that order.
    subjects: set[tuple[bool, str]] = set()
    for record in records:
        row = OutboxRow(*record)
        subject = (row.order_id is None, row.subject)
        if subject not in subjects:
            subjects.add(subject)
            batch.append(row)
    return batch


async def mark_published(connection: asyncpg.Connection, ids: list[int]) -> list[tuple[str, float]]:
    """Set ``published_at`` of the rows ``ids`` that are not marked yet, in one statement.

    Returns ``(routing_key, seconds from created_at to published_at)`` per row marked; a row a
    relay marked already (it published it too, before losing its lock) is left as it was.
    """
    records = await connection.fetch(
        "UPDATE outbox SET published_at = clock_timestamp()"
        " WHERE id = ANY($1::bigint[]) AND published_at IS NULL"
        " RETURNING routing_key, extract(epoch FROM published_at - created_at)::float8 AS lag",
        ids,
    )
    return [(record["routing_key"], record["lag"]) for record in records]


async def backlog(connection: asyncpg.Connection) -> tuple[int, float]:
    """``(unpublished rows, age in seconds of the oldest of them)``; the age is 0 when none.

    Reads the partial index of unpublished rows only.
    """
    record = await connection.fetchrow(
        "SELECT count(*) AS rows, coalesce(extract(epoch FROM clock_timestamp()"
        " - min(created_at)), 0)::float8 AS age FROM outbox WHERE published_at IS NULL"
    )
    assert record is not None  # noqa: S101 - an aggregate without GROUP BY returns one row
    return int(record["rows"]), max(0.0, float(record["age"]))


async def prune_published(
    connection: asyncpg.Connection, *, older_than_seconds: float, batch_size: int
) -> int:
    """Delete published rows whose ``published_at`` is older than ``older_than_seconds``.

    One transaction per ``batch_size`` rows (found through the partial index on
    ``published_at``), so the retention never holds a long transaction or a large lock while
    the service writes new rows. Unpublished rows are never deleted. Returns the rows deleted.
    """
    total = 0
    while True:
        deleted = await connection.fetchval(
            "WITH doomed AS (SELECT id FROM outbox WHERE published_at IS NOT NULL"
            " AND published_at < clock_timestamp() - make_interval(secs => $1)"
            " ORDER BY published_at LIMIT $2)"
            " , gone AS (DELETE FROM outbox WHERE id IN (SELECT id FROM doomed) RETURNING 1)"
            " SELECT count(*) FROM gone",
            older_than_seconds,
            batch_size,
        )
        total += int(deleted)
        if deleted < batch_size:
            return total
