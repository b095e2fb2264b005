"""The webhook inbox's retention: deleting webhook ids past every retry (``fulfilment prune``).

A ``webhook_inbox`` row is the webhook id that makes the sender's retry of a webhook a
duplicate by its webhook (``DuplicateBy.WEBHOOK``). The sender retries a webhook it got no 2xx
for on a schedule of its own: ShipBob for up to 24 hours, the Standard Webhooks schedule for
about 3 days. ``FULFILMENT_WEBHOOK_INBOX_RETENTION_SECONDS`` (7 days) outlives both, and past
it a row is deleted whatever its outcome: a webhook of that id coming even later still changes
nothing, for the shipment or cancellation it brings is recorded by its own id
(``warehouse_shipments``, ``warehouse_cancellations``), which is never pruned, so it is a
duplicate by its change (``DuplicateBy.CHANGE``) and only its webhook id is recorded again.
"""

from __future__ import annotations

import asyncpg

# now(), not clock_timestamp(): a volatile bound cannot be an index condition, and each batch
# is a transaction of its own, whose start now() is. On webhook_inbox_received_at_idx the last
# batch, and a run that finds nothing past the retention, reads no more than the index's edge
# instead of every row (migration 0017).
_PRUNE_BATCH = """
WITH doomed AS (
    SELECT w.webhook_id
      FROM webhook_inbox AS w
     WHERE w.consumer = $1
       AND w.received_at < now() - make_interval(secs => $2)
     LIMIT $3
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM webhook_inbox AS w
     USING doomed
     WHERE w.consumer = $1 AND w.webhook_id = doomed.webhook_id
    RETURNING 1
)
SELECT count(*) FROM gone
"""


async def prune_webhook_ids(
    connection: asyncpg.Connection, *, consumer: str, older_than_seconds: float, batch_size: int
) -> int:
    """Delete the ``webhook_inbox`` rows of ``consumer`` received over ``older_than_seconds`` ago.

    One transaction per ``batch_size`` rows (each a statement of its own, autocommitted), as
    ``adapters.postgres.inbox.prune_processed``; rows an intake holds locked are skipped and
    left for the next run. Returns the rows deleted.
    """
    total = 0
    while True:
        deleted = await connection.fetchval(_PRUNE_BATCH, consumer, older_than_seconds, batch_size)
        total += int(deleted)
        if deleted < batch_size:
            return total
