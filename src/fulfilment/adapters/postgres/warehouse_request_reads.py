"""``PostgresWarehouseRequestReads``: the operators' reads of the warehouse requests, and re-send.

``fulfilment warehouse list|show|resend``, ``fulfilment report`` and the demo read
``warehouse_requests`` through it: the backlog, requests by status or key, and the audited
re-send of a failed or expired request. The dispatcher's store
(``adapters.postgres.warehouse_requests.PostgresWarehouseRequests``) extends it, since the
dispatcher reports its backlog too. The statements are in ``sql/warehouse_requests/``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from fulfilment.adapters.postgres.retry import RetryHook, call_with_retry
from fulfilment.adapters.postgres.sql import statement
from fulfilment.adapters.postgres.tables.handoff import warehouse_requests
from fulfilment.domain.handoff import RequestBacklog, RequestKind, RequestRecord, RequestStatus
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.model import OrderLine

__all__ = ["PostgresWarehouseRequestReads", "stored_units"]

T = TypeVar("T")

_TEXT_ARRAY = postgresql.ARRAY(sa.Text)


def _sql(name: str) -> sa.TextClause:
    return statement("warehouse_requests", name)


_BACKLOG = _sql("backlog")

_FIND = (
    sa.select(warehouse_requests)
    .where(warehouse_requests.c.status == sa.any_(sa.bindparam("statuses", type_=_TEXT_ARRAY)))
    .order_by(warehouse_requests.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)

_GET = sa.select(warehouse_requests).where(
    warehouse_requests.c.idempotency_key == sa.bindparam("key", type_=sa.Uuid)
)

_LOCK_FOR_RESEND = _sql("lock_for_resend")

_RESEND_CANDIDATE = _sql("resend_candidate")

_RESEND = _sql("resend")

_AUDIT_RESEND = _sql("audit_resend")

_RESENDABLE = frozenset({RequestStatus.FAILED, RequestStatus.EXPIRED})


_OPEN_STATUSES = frozenset({RequestStatus.PENDING, RequestStatus.SENDING})


class PostgresWarehouseRequestReads:
    """The operators' reads of the requests to the warehouse system in PostgreSQL, and re-send.

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


def stored_units(lines: Sequence[Mapping[str, Any]] | None) -> dict[str, int] | None:
    """Stored ``lines`` (``[{"sku", "quantity"}]``) as units per SKU; None stays None."""
    if lines is None:
        return None
    return {str(line["sku"]): int(line["quantity"]) for line in lines}


def _to_record(row: sa.Row[Any]) -> RequestRecord:
    lines = stored_units(row.lines)
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
