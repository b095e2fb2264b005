"""A small in-memory ``WarehouseRequests`` for the dispatcher's tests (claim, record, expire).

Only what the loop uses is modelled: due rows, leases, per-order order (a cancellation once
its order is accepted, nothing while an earlier request of its order is open), and the
statuses an answer leads to. The lifecycle's side of an answer (stock released, outbox rows)
is the store's and is tested by its contract suite, not here.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from uuid import UUID

from fulfilment.application.ports import WarehouseRequests
from fulfilment.domain.handoff import (
    OPEN_STATUSES,
    Accepted,
    Answer,
    Failed,
    Refused,
    RequestBacklog,
    RequestKind,
    RequestRecord,
    RequestStatus,
    WarehouseRequest,
)


@dataclass
class Row:
    request: WarehouseRequest
    status: RequestStatus = RequestStatus.PENDING
    due: float = 0.0
    answers: list[Answer] = field(default_factory=list)
    retry_ins: list[float | None] = field(default_factory=list)
    claimed_at: list[float] = field(default_factory=list)
    first_attempt: float | None = None


class MemoryWarehouseRequests(WarehouseRequests):
    """Requests in a list, in ``id`` order; ``rows`` for the tests to look at."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.claims: list[tuple[int, int]] = []
        """Each claim's ``(limit, requests claimed)``."""

    def add_order(self, lines: list[tuple[str, int]], order_id: UUID | None = None) -> Row:
        order_id = order_id or uuid.uuid4()
        body = json.dumps(
            {
                "reference": str(order_id),
                "lines": [{"sku": sku, "quantity": quantity} for sku, quantity in lines],
                "requested_at": datetime.now(UTC).isoformat(),
            }
        ).encode()
        return self._add(RequestKind.FULFILMENT_ORDER, order_id, body)

    def add_orders(self, count: int) -> list[Row]:
        """``count`` fulfilment orders of one line each, of 1, 2 ... ``count`` units."""
        return [self.add_order([("85123A", n + 1)]) for n in range(count)]

    def add_cancellation(self, order_id: UUID) -> Row:
        return self._add(RequestKind.CANCELLATION, order_id, b"{}")

    def _add(self, kind: RequestKind, order_id: UUID, body: bytes) -> Row:
        request = WarehouseRequest(
            id=len(self.rows) + 1,
            idempotency_key=uuid.uuid4(),
            kind=kind,
            order_id=order_id,
            causation_id=uuid.uuid4(),
            body=body,
            attempts=0,
            first_attempt_at=datetime.now(UTC),
        )
        row = Row(request)
        self.rows.append(row)
        return row

    def with_status(self, status: RequestStatus) -> list[Row]:
        return [row for row in self.rows if row.status is status]

    async def claim(self, limit: int, *, lease_seconds: float) -> list[WarehouseRequest]:
        now = time.monotonic()
        claimed: list[WarehouseRequest] = []
        blocked: set[UUID] = set()
        for row in self.rows:
            if len(claimed) >= limit:
                break
            order_id = row.request.order_id
            if row.status not in OPEN_STATUSES:
                continue
            if order_id in blocked:
                continue
            blocked.add(order_id)
            if row.due > now:
                continue
            warehouse_id = row.request.warehouse_id
            if row.request.kind is RequestKind.CANCELLATION:
                order = next(
                    r
                    for r in self.rows
                    if r.request.order_id == order_id
                    and r.request.kind is RequestKind.FULFILMENT_ORDER
                )
                if order.status is not RequestStatus.ACCEPTED:
                    continue
                warehouse_id = order.request.warehouse_id
            row.request = replace(
                row.request, attempts=row.request.attempts + 1, warehouse_id=warehouse_id
            )
            row.status = RequestStatus.SENDING
            row.due = now + lease_seconds
            row.claimed_at.append(now)
            row.first_attempt = row.first_attempt or now
            claimed.append(row.request)
        self.claims.append((limit, len(claimed)))
        return claimed

    async def record(
        self, request: WarehouseRequest, answer: Answer, *, retry_in_seconds: float | None = None
    ) -> None:
        row = self.rows[request.id - 1]
        if row.status is not RequestStatus.SENDING:
            return
        row.answers.append(answer)
        row.retry_ins.append(retry_in_seconds)
        match answer:
            case Accepted(warehouse_id=warehouse_id):
                row.status = RequestStatus.ACCEPTED
                if warehouse_id is not None:
                    row.request = replace(row.request, warehouse_id=warehouse_id)
            case Refused():
                row.status = RequestStatus.REFUSED
            case Failed():
                row.status = RequestStatus.FAILED
            case _:
                row.due = time.monotonic() + (retry_in_seconds or 0.0)

    async def expire(self, retention_seconds: float) -> int:
        now = time.monotonic()
        expired = 0
        for row in self.rows:
            if (
                row.status in OPEN_STATUSES
                and row.first_attempt is not None
                and now - row.first_attempt > retention_seconds
            ):
                row.status = RequestStatus.EXPIRED
                expired += 1
        return expired

    async def backlog(self) -> RequestBacklog:
        counts: dict[tuple[RequestKind, RequestStatus], int] = {}
        for row in self.rows:
            key = (row.request.kind, row.status)
            counts[key] = counts.get(key, 0) + 1
        open_rows = [row for row in self.rows if row.status in OPEN_STATUSES]
        return RequestBacklog(len(open_rows), 0.0 if open_rows else None, counts)

    async def find(self, statuses: Collection[RequestStatus], limit: int) -> list[RequestRecord]:
        raise NotImplementedError  # operator reads: the store's contract suite covers them

    async def get(self, idempotency_key: UUID) -> RequestRecord | None:
        raise NotImplementedError  # as find

    async def resend(self, idempotency_key: UUID, *, operator: str) -> bool:
        raise NotImplementedError  # as find
