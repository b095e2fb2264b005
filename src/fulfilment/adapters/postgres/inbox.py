"""The inbox's retention: deleting processed ids that can no longer matter (``fulfilment prune``).

An inbox row (``inbox_messages``) is the processed id that makes a redelivered or replayed
event a counted duplicate. It must be kept as long as the event can come back: a redelivery,
a dead letter (at most the DLQ's message TTL, then a replay, which refuses one older than the
retention), or a producer re-sending it (its outbox retention). ``processed_id_retention``
outlives all of them (``settings``). Past it, a row is deleted only where a second application
of its event would change nothing even if it came, judged by its outcome and its order's
status now (docs/design.md, "The reservation lifecycle"):

- an ``OrderPlaced`` (``reserved``, ``rejected``, ``duplicate_order``): its order has a
  reservation row, so the event again is ``duplicate:order``, whatever the order's status;
- any event of an order that is ``rejected``, ``released`` or ``shipped``: those states are
  final, and every event again changes nothing there (a cancel is ignored or
  ``cancel_after_ship``, a shipment ignored or dead-lettered ``order_not_reserved``).

Kept, whatever their age: a partial cancel (``partially_released``) of an order still
``reserved``, which again would release the same units a second time; and a cancel that came
before its order (``tombstoned``) while the order is a tombstone (``cancelled``) or reserved,
which again would make the tombstone remember, or the reservation release, the lines twice;
and a cancel waiting for the warehouse system's answer (``cancel_requested``) while its order
is reserved, which again would record a second cancellation request. They go once their
order reaches a final state.

Each deleted row is counted in ``inbox_pruned`` (per consumer and outcome) in the same
transaction, so ``fulfilment report`` and the invariant check (``outcomes``) still count every
event ever processed.
"""

from __future__ import annotations

import asyncpg

PLACED_OUTCOMES = ("reserved", "rejected", "duplicate_order")
"""Outcomes of an ``OrderPlaced``: its order's reservation row answers it again."""

FINAL_STATUSES = ("rejected", "released", "shipped")
"""Order statuses no event changes any more."""

_PRUNE_BATCH = """
WITH doomed AS (
    SELECT i.event_id
      FROM inbox_messages AS i
      LEFT JOIN reservations AS r ON r.order_id = i.order_id
     WHERE i.consumer = $1
       AND i.processed_at < clock_timestamp() - make_interval(secs => $2)
       AND (i.outcome = ANY($4::text[]) OR r.status = ANY($5::text[]))
     LIMIT $3
       FOR UPDATE OF i SKIP LOCKED
), gone AS (
    DELETE FROM inbox_messages AS i
     USING doomed
     WHERE i.consumer = $1 AND i.event_id = doomed.event_id
    RETURNING i.outcome
), counted AS (
    INSERT INTO inbox_pruned AS p (consumer, outcome, rows)
    SELECT $1, outcome, count(*) FROM gone GROUP BY outcome
    ON CONFLICT (consumer, outcome) DO UPDATE SET rows = p.rows + excluded.rows
)
SELECT count(*) FROM gone
"""


async def prune_processed(
    connection: asyncpg.Connection, *, consumer: str, older_than_seconds: float, batch_size: int
) -> int:
    """Delete the inbox rows of ``consumer`` older than ``older_than_seconds`` that are safe.

    Safe as the module's text says. One transaction per ``batch_size`` rows (each a statement
    of its own, autocommitted), so the retention never holds a long transaction; rows a worker
    holds locked are skipped and left for the next run. Returns the rows deleted.
    """
    total = 0
    while True:
        deleted = await connection.fetchval(
            _PRUNE_BATCH,
            consumer,
            older_than_seconds,
            batch_size,
            list(PLACED_OUTCOMES),
            list(FINAL_STATUSES),
        )
        total += int(deleted)
        if deleted < batch_size:
            return total
