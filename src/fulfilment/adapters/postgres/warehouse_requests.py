"""``PostgresWarehouseRequests``: the dispatcher's store of requests to the warehouse system.

The rows of ``warehouse_requests`` (migration 0011) are recorded by ``place_orders()`` and
``cancel_orders()`` v3 (``PostgresWarehouse(..., handoff=True)``); this adapter claims them
for sending, records the answers, and serves the operator's reads and re-sends. The rule it
applies to an answer is that of :mod:`fulfilment.domain.handoff` (the in-memory fake of the
tests runs the same functions), and both pass
``tests/contract/test_warehouse_requests_contract.py``.

Locks: :meth:`PostgresWarehouseRequests.record` takes the order's ``reservations`` row first,
then the request rows, then the stock rows in ``COLLATE "C"`` order, as ``cancel_orders()``
takes them (reservations, stock, requests of the same order, whose ``reservations`` row both
hold first), so the two wait for each other instead of deadlocking. The claim locks only
request rows, with ``SKIP LOCKED``, and so never waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from fulfilment.adapters.postgres.retry import RetryHook, call_with_retry
from fulfilment.adapters.postgres.tables import warehouse_requests
from fulfilment.application.ports import WarehouseRequests
from fulfilment.contracts.warehouse_bodies import request_body
from fulfilment.domain.handoff import (
    Accepted,
    Answer,
    Answered,
    CredentialsRefused,
    RateLimited,
    Refused,
    RequestBacklog,
    RequestKind,
    RequestRecord,
    RequestStatus,
    Retry,
    WarehouseRequest,
    cancellation_accepted,
    cancellation_to_send,
    fulfilment_order_failed,
)
from fulfilment.domain.lifecycle import CancelKind, OrderState, OrderStatus
from fulfilment.domain.model import OrderLine

__all__ = ["PostgresWarehouseRequests"]

T = TypeVar("T")

_TEXT_ARRAY = postgresql.ARRAY(sa.Text)

# Due, open, and allowed by the per-order rule: nothing earlier of the same order still open,
# and a cancellation only once its order's fulfilment order is accepted. The subqueries read
# without locking; a row another claimer holds is skipped, never waited for. The plan walks
# warehouse_requests_due_idx (next_attempt_at, id) in order and stops at the limit (migration
# 0012); the order's fulfilment order is a scalar subquery on its unique index, because an
# EXISTS there was planned as a hash of every accepted request, built by a scan of the table.
# A cancellation's body is fixed at its first send from the order as it is then
# (fulfilment.domain.handoff.cancellation_to_send): its status and lines come with it.
_CLAIM_DUE = sa.text(
    "SELECT w.id, w.kind, w.order_id, w.lines, w.body, w.created_at,"
    "       CASE WHEN w.kind = 'cancellation' AND w.body IS NULL THEN"
    "            (SELECT r.status FROM reservations AS r WHERE r.order_id = w.order_id)"
    "       END AS order_status,"
    "       CASE WHEN w.kind = 'cancellation' AND w.body IS NULL THEN"
    "            (SELECT jsonb_object_agg(l.sku, l.quantity) FROM reservation_lines AS l"
    "              WHERE l.order_id = w.order_id)"
    "       END AS order_lines"
    " FROM warehouse_requests AS w"
    " WHERE w.status IN ('pending', 'sending') AND w.next_attempt_at <= now()"
    "   AND NOT EXISTS (SELECT 1 FROM warehouse_requests AS e"
    "                   WHERE e.order_id = w.order_id AND e.id < w.id"
    "                     AND e.status IN ('pending', 'sending'))"
    "   AND (w.kind = 'fulfilment_order' OR ("
    "        SELECT f.status FROM warehouse_requests AS f"
    "         WHERE f.order_id = w.order_id AND f.kind = 'fulfilment_order') = 'accepted')"
    " ORDER BY w.next_attempt_at, w.id"
    " LIMIT :limit"
    " FOR UPDATE OF w SKIP LOCKED"
)

# The plan above only while the table's statistics are fresh: a backlog that grew since the
# last ANALYZE (an outage's, exactly when the claim must keep up) is estimated at a few rows,
# and PostgreSQL then reads every open request by bitmap, runs the per-order rule on each and
# sorts them (22 ms per claim with 9,000 open requests never analysed, against 0.5 ms). Off for
# the claim's transaction only, the ordered index scan is the plan whatever the estimate.
_CLAIM_PLAN = sa.text(
    "SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true)"
)

_CLAIM_TAKE = sa.text(
    "UPDATE warehouse_requests AS w"
    " SET attempts = w.attempts + 1, status = 'sending',"
    "     first_attempt_at = coalesce(w.first_attempt_at, now()), last_attempt_at = now(),"
    "     body = coalesce(w.body, b.body),"
    "     next_attempt_at = now() + make_interval(secs => :lease_seconds),"
    "     warehouse_id = coalesce(w.warehouse_id, ("
    "         SELECT f.warehouse_id FROM warehouse_requests AS f"
    "          WHERE f.order_id = w.order_id AND f.kind = 'fulfilment_order'))"
    " FROM unnest(CAST(:ids AS bigint[]), CAST(:bodies AS bytea[])) AS b(id, body)"
    " WHERE w.id = b.id"
    " RETURNING w.id, w.idempotency_key, w.kind, w.order_id, w.causation_id, w.body,"
    "           w.attempts, w.first_attempt_at, w.warehouse_id, w.traceparent"
).bindparams(
    sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)),
    sa.bindparam("bodies", type_=postgresql.ARRAY(sa.LargeBinary)),
    sa.bindparam("lease_seconds", type_=sa.Float),
)

_WITHDRAW_UNSENT = sa.text(
    "UPDATE warehouse_requests SET status = 'withdrawn', answered_at = now()"
    " WHERE id = ANY (CAST(:ids AS bigint[]))"
).bindparams(sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)))

_LOCK_ORDER = sa.text("SELECT status FROM reservations WHERE order_id = :order_id FOR UPDATE")

_LOCK_REQUEST = sa.text(
    "SELECT id, kind, status, order_id, causation_id, lines, warehouse_id, traceparent"
    " FROM warehouse_requests WHERE id = :id FOR UPDATE"
)

_WAITING_CANCELLATIONS = sa.text(
    "SELECT id, causation_id, lines, traceparent FROM warehouse_requests"
    " WHERE order_id = :order_id AND kind = 'cancellation' AND status IN ('pending', 'sending')"
    " ORDER BY id FOR UPDATE"
)

# The answers that change the request's row only (_changes_the_request_only), one or many:
# the order rows first, in order_id order as cancel_orders() takes them, then the requests
# still sending, in id order; nothing else is locked.
_LOCK_ORDERS = sa.text(
    "SELECT order_id FROM reservations WHERE order_id = ANY (CAST(:order_ids AS uuid[]))"
    " ORDER BY order_id FOR UPDATE"
).bindparams(sa.bindparam("order_ids", type_=postgresql.ARRAY(sa.Uuid)))

_LOCK_SENDING = sa.text(
    "SELECT id FROM warehouse_requests"
    " WHERE id = ANY (CAST(:ids AS bigint[])) AND status = 'sending' ORDER BY id FOR UPDATE"
).bindparams(sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)))

# Final answers, one or many: each request's status, answer and the warehouse's id.
_ANSWERED = sa.text(
    "UPDATE warehouse_requests AS w"
    " SET status = b.status, answered_at = now(), last_status_code = b.status_code,"
    "     last_answer = b.answer, warehouse_id = coalesce(b.warehouse_id, w.warehouse_id)"
    " FROM unnest(CAST(:ids AS bigint[]), CAST(:statuses AS text[]),"
    "             CAST(:status_codes AS integer[]), CAST(:answers AS text[]),"
    "             CAST(:warehouse_ids AS text[]))"
    "      AS b(id, status, status_code, answer, warehouse_id)"
    " WHERE w.id = b.id"
).bindparams(
    sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)),
    sa.bindparam("statuses", type_=_TEXT_ARRAY),
    sa.bindparam("status_codes", type_=postgresql.ARRAY(sa.Integer)),
    sa.bindparam("answers", type_=_TEXT_ARRAY),
    sa.bindparam("warehouse_ids", type_=_TEXT_ARRAY),
)

_RETRY_LATER_MANY = sa.text(
    "UPDATE warehouse_requests AS w"
    " SET next_attempt_at = now() + make_interval(secs => b.seconds),"
    "     last_status_code = b.status_code, last_answer = b.answer"
    " FROM unnest(CAST(:ids AS bigint[]), CAST(:seconds AS float8[]),"
    "             CAST(:status_codes AS integer[]), CAST(:answers AS text[]))"
    "      AS b(id, seconds, status_code, answer)"
    " WHERE w.id = b.id"
).bindparams(
    sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)),
    sa.bindparam("seconds", type_=postgresql.ARRAY(sa.Float)),
    sa.bindparam("status_codes", type_=postgresql.ARRAY(sa.Integer)),
    sa.bindparam("answers", type_=_TEXT_ARRAY),
)

_WITHDRAW = sa.text(
    "UPDATE warehouse_requests SET status = 'withdrawn' WHERE id = ANY (CAST(:ids AS bigint[]))"
).bindparams(sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)))

_RELEASED_ORDER = sa.text("UPDATE warehouse_requests SET released_order = true WHERE id = :id")

_ORDER_LINES = sa.text(
    "SELECT sku, quantity FROM reservation_lines WHERE order_id = :order_id"
    ' ORDER BY sku COLLATE "C"'
)

_LOCK_STOCK = sa.text(
    "SELECT sku FROM stock_levels WHERE sku = ANY (CAST(:skus AS text[]))"
    ' ORDER BY sku COLLATE "C" FOR UPDATE'
).bindparams(sa.bindparam("skus", type_=postgresql.ARRAY(sa.Text)))

_RELEASE_STOCK = sa.text(
    "UPDATE stock_levels AS t SET reserved = t.reserved - c.quantity, updated_at = now()"
    " FROM unnest(CAST(:skus AS text[]), CAST(:quantities AS integer[])) AS c(sku, quantity)"
    " WHERE t.sku = c.sku"
).bindparams(
    sa.bindparam("skus", type_=postgresql.ARRAY(sa.Text)),
    sa.bindparam("quantities", type_=postgresql.ARRAY(sa.Integer)),
)

_CLEAR_LINES = sa.text("DELETE FROM reservation_lines WHERE order_id = :order_id")

_WRITE_LINES = sa.text(
    "INSERT INTO reservation_lines (order_id, sku, quantity)"
    " SELECT :order_id, l.sku, l.quantity"
    " FROM unnest(CAST(:skus AS text[]), CAST(:quantities AS integer[])) AS l(sku, quantity)"
).bindparams(
    sa.bindparam("skus", type_=postgresql.ARRAY(sa.Text)),
    sa.bindparam("quantities", type_=postgresql.ARRAY(sa.Integer)),
)

_ORDER_STATUS = sa.text(
    "UPDATE reservations SET status = :status, cancelled_at = now() WHERE order_id = :order_id"
)

# The result events, built as the SQL functions build theirs: event_id minted here once and
# written as the column and in the body, occurred_at the transaction's time.
_STOCK_RELEASED = sa.text(
    "INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)"
    " SELECT e.event_id, :order_id, 'stock.released',"
    "        jsonb_build_object('version', 1, 'event_id', e.event_id,"
    "                           'causation_id', CAST(:causation_id AS uuid),"
    "                           'order_id', CAST(:order_id AS uuid),"
    "                           'occurred_at', now(), 'lines', CAST(:lines AS jsonb),"
    "                           'order_status', CAST(:order_status AS text)),"
    "        :traceparent"
    " FROM (SELECT gen_random_uuid() AS event_id) AS e"
).bindparams(sa.bindparam("lines", type_=postgresql.JSONB))

_STOCK_CANCEL_REFUSED = sa.text(
    "INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)"
    " SELECT e.event_id, :order_id, 'stock.cancel_refused',"
    "        jsonb_build_object('version', 1, 'event_id', e.event_id,"
    "                           'causation_id', CAST(:causation_id AS uuid),"
    "                           'order_id', CAST(:order_id AS uuid),"
    "                           'occurred_at', now(), 'lines', CAST(:lines AS jsonb),"
    "                           'warehouse_id', CAST(:warehouse_id AS text)),"
    "        :traceparent"
    " FROM (SELECT gen_random_uuid() AS event_id) AS e"
).bindparams(sa.bindparam("lines", type_=postgresql.JSONB))

_NOTIFY_RELAY = sa.text("SELECT pg_notify('fulfilment_outbox', '')")

_EXPIRE = sa.text(
    "UPDATE warehouse_requests SET status = 'expired'"
    " WHERE status IN ('pending', 'sending')"
    "   AND first_attempt_at < now() - make_interval(secs => :retention_seconds)"
).bindparams(sa.bindparam("retention_seconds", type_=sa.Float))

_BACKLOG = sa.text(
    "SELECT kind, status, count(*), extract(epoch FROM now() - min(created_at))::float8"
    " FROM warehouse_requests GROUP BY kind, status"
)

_FIND = (
    sa.select(warehouse_requests)
    .where(warehouse_requests.c.status == sa.any_(sa.bindparam("statuses", type_=_TEXT_ARRAY)))
    .order_by(warehouse_requests.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)

_GET = sa.select(warehouse_requests).where(
    warehouse_requests.c.idempotency_key == sa.bindparam("key", type_=sa.Uuid)
)

_LOCK_FOR_RESEND = sa.text(
    "SELECT r.status FROM reservations AS r"
    " WHERE r.order_id = (SELECT w.order_id FROM warehouse_requests AS w"
    "                      WHERE w.idempotency_key = :key)"
    " FOR UPDATE"
)

_RESEND_CANDIDATE = sa.text(
    "SELECT w.id, w.kind, w.status,"
    "       EXISTS (SELECT 1 FROM warehouse_requests AS c"
    "                WHERE c.order_id = w.order_id AND c.kind = 'cancellation'"
    "                  AND c.status = 'withdrawn') AS cancelled_locally"
    " FROM warehouse_requests AS w WHERE w.idempotency_key = :key FOR UPDATE OF w"
)

_RESEND = sa.text(
    "UPDATE warehouse_requests"
    " SET status = 'sending', next_attempt_at = now(), answered_at = NULL WHERE id = :id"
)

_AUDIT_RESEND = sa.text(
    "INSERT INTO warehouse_request_audit (idempotency_key, action, status_before, operator)"
    " VALUES (:key, 'resent', :status_before, :operator)"
)

_RESENDABLE = frozenset({RequestStatus.FAILED, RequestStatus.EXPIRED})


class PostgresWarehouseRequests(WarehouseRequests):
    """The requests to the warehouse system in PostgreSQL; see the port for the guarantees.

    Args:
        engine: an asyncpg engine (``adapters.postgres.engine.create_engine``); not owned.
        retry_budget_seconds: total time each call may spend retrying transient errors
            (``FULFILMENT_RETRY_BUDGET_SECONDS``); see ``adapters.postgres.retry``.
        on_retry: called with the error before each retry, e.g. to count retries in a metric.

    Every method is one transaction, retried whole under that policy, and then raises
    :class:`~fulfilment.application.ports.TransientError`; other database errors propagate.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        retry_budget_seconds: float,
        on_retry: RetryHook | None = None,
    ) -> None:
        self._engine = engine
        self._retry_budget_seconds = retry_budget_seconds
        self._on_retry = on_retry

    async def _in_transaction(
        self, operation: str, work: Callable[[AsyncConnection], Awaitable[T]]
    ) -> T:
        """``work`` in a transaction of its own, retried whole under the adapter's policy."""

        async def attempt() -> T:
            async with self._engine.begin() as connection:
                return await work(connection)

        return await call_with_retry(
            attempt,
            operation=operation,
            budget_seconds=self._retry_budget_seconds,
            on_retry=self._on_retry,
        )

    async def claim(self, limit: int, *, lease_seconds: float) -> list[WarehouseRequest]:
        """Claim up to ``limit`` due requests (see the port); bodies are frozen here.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
            ValueError: ``limit`` is below 1 or ``lease_seconds`` is not positive.
        """
        if limit < 1 or lease_seconds <= 0:
            msg = f"limit {limit} must be >= 1 and lease_seconds {lease_seconds} > 0"
            raise ValueError(msg)

        async def work(connection: AsyncConnection) -> list[WarehouseRequest]:
            await connection.execute(_CLAIM_PLAN)
            due = (await connection.execute(_CLAIM_DUE, {"limit": limit})).all()
            ids: list[int] = []
            bodies: list[bytes] = []
            unsent: list[int] = []
            for row in due:
                body = row.body if row.body is not None else _first_body(row)
                if body is None:
                    unsent.append(row.id)
                else:
                    ids.append(row.id)
                    bodies.append(body)
            if unsent:
                await connection.execute(_WITHDRAW_UNSENT, {"ids": unsent})
            if not ids:
                return []
            taken = await connection.execute(
                _CLAIM_TAKE,
                {"ids": ids, "bodies": bodies, "lease_seconds": lease_seconds},
            )
            claimed = [
                WarehouseRequest(
                    id=row.id,
                    idempotency_key=row.idempotency_key,
                    kind=RequestKind(row.kind),
                    order_id=row.order_id,
                    causation_id=row.causation_id,
                    body=bytes(row.body),
                    attempts=row.attempts,
                    first_attempt_at=row.first_attempt_at,
                    warehouse_id=row.warehouse_id,
                    traceparent=row.traceparent,
                )
                for row in taken
            ]
            return sorted(claimed, key=lambda request: request.id)

        return await self._in_transaction("claim_requests", work)

    async def record(
        self,
        request: WarehouseRequest,
        answer: Answer,
        *,
        retry_in_seconds: float | None = None,
    ) -> None:
        """Record ``answer`` to ``request`` and apply it, in one transaction (see the port).

        An answer that changes the request's row only is written as a batch of one
        (:meth:`record_answers`).

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """
        answered = Answered(request, answer, retry_in_seconds)
        if _changes_the_request_only(answered):
            await self._record_request_only([answered])
            return

        async def work(connection: AsyncConnection) -> None:
            await connection.execute(_LOCK_ORDER, {"order_id": request.order_id})
            row = (await connection.execute(_LOCK_REQUEST, {"id": request.id})).one_or_none()
            if row is None or row.status != RequestStatus.SENDING:
                return  # answered already, expired, or withdrawn: the answer changes nothing
            kind = RequestKind(row.kind)
            if isinstance(answer, Accepted):  # a cancellation's: a fulfilment order's is above
                await _answered(connection, [(row.id, RequestStatus.ACCEPTED, answer)])
                await _apply_cancels(
                    connection,
                    request.order_id,
                    [(row.id, row.causation_id, row.lines, row.traceparent)],
                    one_by_one=False,
                )
                return
            if isinstance(answer, Refused) and kind is RequestKind.CANCELLATION:
                await _answered(connection, [(row.id, RequestStatus.REFUSED, answer)])
                await connection.execute(
                    _STOCK_CANCEL_REFUSED,
                    {
                        "order_id": row.order_id,
                        "causation_id": row.causation_id,
                        "lines": row.lines,
                        "warehouse_id": row.warehouse_id,
                        "traceparent": row.traceparent,
                    },
                )
                await connection.execute(_NOTIFY_RELAY)
                return
            # Failed, or a Refused that only a cancellation can get: terminal.
            await _answered(connection, [(row.id, RequestStatus.FAILED, answer)])
            if kind is RequestKind.FULFILMENT_ORDER:
                waiting = (
                    await connection.execute(_WAITING_CANCELLATIONS, {"order_id": request.order_id})
                ).all()
                if waiting:
                    # Withdrawn first: the CHECK allows ``released_order`` only once they are.
                    await connection.execute(_WITHDRAW, {"ids": [w.id for w in waiting]})
                    await _apply_cancels(
                        connection,
                        request.order_id,
                        [(w.id, w.causation_id, w.lines, w.traceparent) for w in waiting],
                        one_by_one=True,
                    )

        await self._in_transaction("record_answer", work)

    async def record_answers(self, answers: Sequence[Answered]) -> None:
        """Record ``answers`` as :meth:`record` would; the common ones in one transaction.

        An accepted fulfilment order and an answer that sends its request again change only
        the request's row: all of those are written by two statements in one transaction,
        under the locks :meth:`record` takes (the orders' rows, then the requests'). The
        others (a cancellation's answer, a failure) release stock or write result events and
        get a transaction each, after the batch. One request answered twice in the batch
        (its lease ran out while its first send was in flight) is recorded twice, in order.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """
        batch: list[Answered] = []
        alone: list[Answered] = []
        batched: set[int] = set()
        for answered in answers:
            if _changes_the_request_only(answered) and answered.request.id not in batched:
                batched.add(answered.request.id)
                batch.append(answered)
            else:
                alone.append(answered)

        if batch:
            await self._record_request_only(batch)
        for answered in alone:
            await self.record(
                answered.request, answered.answer, retry_in_seconds=answered.retry_in_seconds
            )

    async def _record_request_only(self, batch: Sequence[Answered]) -> None:
        """Write ``batch`` in one transaction: answers that change the request's row only.

        One answer per request; the accepted fulfilment orders by one statement (as
        :func:`_answered` records any final answer), the answers that send again by another.
        """

        async def work(connection: AsyncConnection) -> None:
            orders = sorted({answered.request.order_id for answered in batch})
            await connection.execute(_LOCK_ORDERS, {"order_ids": orders})
            ids = [answered.request.id for answered in batch]
            sending = set((await connection.execute(_LOCK_SENDING, {"ids": ids})).scalars())
            open_ = [answered for answered in batch if answered.request.id in sending]
            accepted = [
                (a.request.id, RequestStatus.ACCEPTED, a.answer)
                for a in open_
                if isinstance(a.answer, Accepted)
            ]
            later = [a for a in open_ if not isinstance(a.answer, Accepted)]
            if accepted:
                await _answered(connection, accepted)
            if later:
                await connection.execute(
                    _RETRY_LATER_MANY,
                    {
                        "ids": [a.request.id for a in later],
                        "seconds": [a.retry_in_seconds or 0.0 for a in later],
                        "status_codes": [a.answer.status_code for a in later],
                        "answers": [a.answer.answer for a in later],
                    },
                )

        await self._in_transaction("record_answers", work)

    async def expire(self, retention_seconds: float) -> int:
        """Expire open requests first attempted over ``retention_seconds`` ago; how many.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """

        async def work(connection: AsyncConnection) -> int:
            result = await connection.execute(_EXPIRE, {"retention_seconds": retention_seconds})
            return int(result.rowcount)

        return await self._in_transaction("expire_requests", work)

    async def backlog(self) -> RequestBacklog:
        """Open requests, the oldest one's age (seconds), and counts by kind and status.

        One scan of the table, grouped: rows are never deleted, so the cost grows with
        every request ever recorded.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """

        async def work(connection: AsyncConnection) -> RequestBacklog:
            rows = (await connection.execute(_BACKLOG)).all()
            counts = {
                (RequestKind(kind), RequestStatus(status)): int(count)
                for kind, status, count, _ in rows
            }
            open_rows = [row for row in rows if RequestStatus(row[1]) in _OPEN_STATUSES]
            return RequestBacklog(
                open_count=sum(int(row[2]) for row in open_rows),
                oldest_open_age_seconds=max((float(row[3]) for row in open_rows), default=None),
                by_kind_and_status=counts,
            )

        return await self._in_transaction("request_backlog", work)

    async def find(self, statuses: Collection[RequestStatus], limit: int) -> list[RequestRecord]:
        """Up to ``limit`` requests in one of ``statuses``, oldest first.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """

        async def work(connection: AsyncConnection) -> list[RequestRecord]:
            rows = await connection.execute(
                _FIND, {"statuses": [str(status) for status in statuses], "limit": limit}
            )
            return [_to_record(row) for row in rows]

        return await self._in_transaction("find_requests", work)

    async def get(self, idempotency_key: UUID) -> RequestRecord | None:
        """The request with ``idempotency_key``, or None.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """

        async def work(connection: AsyncConnection) -> RequestRecord | None:
            row = (await connection.execute(_GET, {"key": idempotency_key})).one_or_none()
            return None if row is None else _to_record(row)

        return await self._in_transaction("get_request", work)

    async def resend(self, idempotency_key: UUID, *, operator: str) -> bool:
        """Send a failed or expired request again, same key and body, audited (see the port).

        A fulfilment order is not re-sent once its order is no longer ``reserved``, or once
        cancels were applied to it locally after it failed: its frozen body would hand the
        warehouse units the order no longer holds. Returns False then too.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """

        async def work(connection: AsyncConnection) -> bool:
            order_status = (
                await connection.execute(_LOCK_FOR_RESEND, {"key": idempotency_key})
            ).scalar_one_or_none()
            row = (
                await connection.execute(_RESEND_CANDIDATE, {"key": idempotency_key})
            ).one_or_none()
            if row is None or RequestStatus(row.status) not in _RESENDABLE:
                return False
            if RequestKind(row.kind) is RequestKind.FULFILMENT_ORDER and (
                order_status != OrderStatus.RESERVED or row.cancelled_locally
            ):
                return False
            await connection.execute(_RESEND, {"id": row.id})
            await connection.execute(
                _AUDIT_RESEND,
                {"key": idempotency_key, "status_before": row.status, "operator": operator},
            )
            return True

        return await self._in_transaction("resend_request", work)


_OPEN_STATUSES = frozenset({RequestStatus.PENDING, RequestStatus.SENDING})


def _first_body(row: sa.Row[Any]) -> bytes | None:
    """The body a due request is first sent with; None for a cancellation not to be sent."""
    kind = RequestKind(row.kind)
    lines: Mapping[str, int] | None = _units(row.lines)
    if kind is RequestKind.CANCELLATION:
        state = None
        if row.order_status is not None:
            held = {str(sku): int(units) for sku, units in (row.order_lines or {}).items()}
            state = OrderState(OrderStatus(row.order_status), held)
        to_send = cancellation_to_send(state, lines)
        if not to_send.send:
            return None
        lines = to_send.lines
    return request_body(kind, row.order_id, lines, row.created_at)


async def _answered(
    connection: AsyncConnection, answers: Sequence[tuple[int, RequestStatus, Answer]]
) -> None:
    """Record final ``answers`` (request id, its new status, the answer) by one statement."""
    await connection.execute(
        _ANSWERED,
        {
            "ids": [request_id for request_id, _, _ in answers],
            "statuses": [str(status) for _, status, _ in answers],
            "status_codes": [answer.status_code for _, _, answer in answers],
            "answers": [answer.answer for _, _, answer in answers],
            "warehouse_ids": [
                answer.warehouse_id if isinstance(answer, Accepted) else None
                for _, _, answer in answers
            ],
        },
    )


async def _apply_cancels(
    connection: AsyncConnection,
    order_id: UUID,
    cancels: Sequence[tuple[int, UUID, Any, str | None]],
    *,
    one_by_one: bool,
) -> None:
    """Apply ``cancels`` (request id, cause, asked lines as stored, trace context), order locked.

    By the lifecycle (``fulfilment.domain.handoff``): an accepted cancellation on the order
    as it is now, or a failed fulfilment order's waiting cancellations one after the other.
    Each that releases stock writes its ``stock.released`` event, caused by its cancel. The
    one that leaves the order ``released`` (at most one: later ones find nothing to release)
    is marked ``released_order``, for no inbox ``released`` row records that release.
    """
    status = (await connection.execute(_LOCK_ORDER, {"order_id": order_id})).scalar_one()
    rows = await connection.execute(_ORDER_LINES, {"order_id": order_id})
    held = {str(sku): int(quantity) for sku, quantity in rows}
    state = OrderState(OrderStatus(status), held)
    asked = [_units(lines) for _, _, lines, _ in cancels]
    if one_by_one:
        state_after, results = fulfilment_order_failed(state, asked)
    else:
        results = [cancellation_accepted(state, asked[0])]
        state_after = results[0].state
    for (request_id, _, _, _), cancellation in zip(cancels, results, strict=True):
        if cancellation.kind is CancelKind.RELEASED:
            await connection.execute(_RELEASED_ORDER, {"id": request_id})
    released: dict[str, int] = {}
    for cancellation in results:
        for sku, units in cancellation.lines.items():
            released[sku] = released.get(sku, 0) + units
    if not released:
        return
    skus = sorted(released)
    await connection.execute(_LOCK_STOCK, {"skus": skus})
    await connection.execute(
        _RELEASE_STOCK, {"skus": skus, "quantities": [released[sku] for sku in skus]}
    )
    await connection.execute(_CLEAR_LINES, {"order_id": order_id})
    remaining = sorted(state_after.lines)
    if remaining:
        await connection.execute(
            _WRITE_LINES,
            {
                "order_id": order_id,
                "skus": remaining,
                "quantities": [state_after.lines[sku] for sku in remaining],
            },
        )
    await connection.execute(
        _ORDER_STATUS, {"order_id": order_id, "status": str(state_after.status)}
    )
    for (_, causation_id, _, traceparent), cancellation in zip(cancels, results, strict=True):
        if cancellation.lines:
            await connection.execute(
                _STOCK_RELEASED,
                {
                    "order_id": order_id,
                    "causation_id": causation_id,
                    "lines": _as_json(cancellation.lines),
                    "order_status": str(cancellation.state.status),
                    "traceparent": traceparent,
                },
            )
    await connection.execute(_NOTIFY_RELAY)


def _changes_the_request_only(answered: Answered) -> bool:
    """Whether recording ``answered`` writes the request's row and nothing else (see record)."""
    match answered.answer:
        case Retry() | RateLimited() | CredentialsRefused():
            return True
        case Accepted():
            return answered.request.kind is RequestKind.FULFILMENT_ORDER
        case _:
            return False


def _units(lines: Sequence[Mapping[str, Any]] | None) -> dict[str, int] | None:
    """Stored ``lines`` (``[{"sku", "quantity"}]``) as units per SKU; None stays None."""
    if lines is None:
        return None
    return {str(line["sku"]): int(line["quantity"]) for line in lines}


def _as_json(units: Mapping[str, int]) -> list[dict[str, object]]:
    return [{"sku": sku, "quantity": units[sku]} for sku in sorted(units)]


def _to_record(row: sa.Row[Any]) -> RequestRecord:
    lines = _units(row.lines)
    return RequestRecord(
        id=row.id,
        idempotency_key=row.idempotency_key,
        kind=RequestKind(row.kind),
        order_id=row.order_id,
        causation_id=row.causation_id,
        status=RequestStatus(row.status),
        lines=None
        if lines is None
        else tuple(OrderLine(sku, units) for sku, units in sorted(lines.items())),
        body=None if row.body is None else bytes(row.body),
        attempts=row.attempts,
        created_at=row.created_at,
        next_attempt_at=row.next_attempt_at,
        first_attempt_at=row.first_attempt_at,
        last_attempt_at=row.last_attempt_at,
        answered_at=row.answered_at,
        warehouse_id=row.warehouse_id,
        last_status_code=row.last_status_code,
        last_answer=row.last_answer,
        traceparent=row.traceparent,
    )
