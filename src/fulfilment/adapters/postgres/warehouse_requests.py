"""``PostgresWarehouseRequests``: the dispatcher's store of requests to the warehouse system.

The rows of ``warehouse_requests`` (migration 0011) are recorded by ``place_orders()`` and
``cancel_orders()`` v3 (``PostgresStock(..., handoff=True)``); this adapter claims them
for sending and records the answers; the operators' reads and re-sends are those of
``adapters.postgres.warehouse_request_reads``, which it extends. Its statements are the files
of ``sql/warehouse_requests/``, loaded once at import. The rule it applies to an answer is
that of :mod:`fulfilment.domain.handoff` (the in-memory fake of the tests runs the same
functions), and both pass ``tests/contract/test_warehouse_requests_contract.py``.

Locks: :meth:`PostgresWarehouseRequests.record` takes the order's ``reservations`` row first,
then the request rows, then the stock rows in ``COLLATE "C"`` order, as ``cancel_orders()``
takes them (reservations, stock, requests of the same order, whose ``reservations`` row both
hold first), so the two wait for each other instead of deadlocking. The claim locks only
request rows, with ``SKIP LOCKED``, and so never waits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from fulfilment.adapters.postgres.sql import statement
from fulfilment.adapters.postgres.warehouse_request_reads import (
    PostgresWarehouseRequestReads,
    stored_units,
)
from fulfilment.application.ports import FulfilmentOrderPolls, WarehouseRequests
from fulfilment.contracts.warehouse_bodies import request_body
from fulfilment.domain.handoff import (
    Accepted,
    Answer,
    Answered,
    CredentialsRefused,
    RateLimited,
    Refused,
    RequestKind,
    RequestStatus,
    Retry,
    WarehouseRequest,
    cancellation_accepted,
    cancellation_to_send,
    fulfilment_order_failed,
)
from fulfilment.domain.lifecycle import CancelKind, OrderState, OrderStatus
from fulfilment.domain.polls import FulfilmentOrderToPoll

__all__ = ["PostgresWarehouseRequests"]


_TEXT_ARRAY = postgresql.ARRAY(sa.Text)


def _sql(name: str) -> sa.TextClause:
    return statement("warehouse_requests", name)


_CLAIM_DUE = _sql("claim_due")

_CLAIM_PLAN = _sql("claim_plan")

_CLAIM_TAKE = _sql("claim_take").bindparams(
    sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)),
    sa.bindparam("bodies", type_=postgresql.ARRAY(sa.LargeBinary)),
    sa.bindparam("lease_seconds", type_=sa.Float),
)

_WITHDRAW_UNSENT = _sql("withdraw_unsent").bindparams(
    sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger))
)

_LOCK_ORDER = _sql("lock_order")

_LOCK_REQUEST = _sql("lock_request")

_WAITING_CANCELLATIONS = _sql("waiting_cancellations")

_LOCK_ORDERS = _sql("lock_orders").bindparams(
    sa.bindparam("order_ids", type_=postgresql.ARRAY(sa.Uuid))
)

_LOCK_SENDING = _sql("lock_sending").bindparams(
    sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger))
)

_ANSWERED = _sql("answered").bindparams(
    sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)),
    sa.bindparam("statuses", type_=_TEXT_ARRAY),
    sa.bindparam("status_codes", type_=postgresql.ARRAY(sa.Integer)),
    sa.bindparam("answers", type_=_TEXT_ARRAY),
    sa.bindparam("warehouse_ids", type_=_TEXT_ARRAY),
)

_RETRY_LATER_MANY = _sql("retry_later_many").bindparams(
    sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)),
    sa.bindparam("seconds", type_=postgresql.ARRAY(sa.Float)),
    sa.bindparam("status_codes", type_=postgresql.ARRAY(sa.Integer)),
    sa.bindparam("answers", type_=_TEXT_ARRAY),
)

_WITHDRAW = _sql("withdraw").bindparams(sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)))

_RELEASED_ORDER = _sql("released_order")

_ORDER_LINES = _sql("order_lines")

_LOCK_STOCK = _sql("lock_stock").bindparams(sa.bindparam("skus", type_=postgresql.ARRAY(sa.Text)))

_RELEASE_STOCK = _sql("release_stock").bindparams(
    sa.bindparam("skus", type_=postgresql.ARRAY(sa.Text)),
    sa.bindparam("quantities", type_=postgresql.ARRAY(sa.Integer)),
)

_DELETE_RELEASED_LINES = _sql("delete_released_lines").bindparams(
    sa.bindparam("skus", type_=postgresql.ARRAY(sa.Text)),
    sa.bindparam("quantities", type_=postgresql.ARRAY(sa.Integer)),
)

_SHRINK_LINES = _sql("shrink_lines").bindparams(
    sa.bindparam("skus", type_=postgresql.ARRAY(sa.Text)),
    sa.bindparam("quantities", type_=postgresql.ARRAY(sa.Integer)),
)

_ORDER_STATUS = _sql("order_status")

_STOCK_RELEASED = _sql("stock_released").bindparams(sa.bindparam("lines", type_=postgresql.JSONB))

_STOCK_CANCEL_REFUSED = _sql("stock_cancel_refused").bindparams(
    sa.bindparam("lines", type_=postgresql.JSONB)
)

_NOTIFY_RELAY = _sql("notify_relay")

_EXPIRE = _sql("expire").bindparams(sa.bindparam("retention_seconds", type_=sa.Float))

_POLLS_DUE = _sql("polls_due").bindparams(
    sa.bindparam("after_seconds", type_=sa.Float),
    sa.bindparam("excluding", type_=postgresql.ARRAY(sa.BigInteger)),
)

_POLLED = _sql("polled").bindparams(sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)))

_WITHOUT_NEWS = _sql("without_news").bindparams(sa.bindparam("after_seconds", type_=sa.Float))


class PostgresWarehouseRequests(
    PostgresWarehouseRequestReads, WarehouseRequests, FulfilmentOrderPolls
):
    """The requests to the warehouse system in PostgreSQL; see the ports for the guarantees.

    Takes the arguments of :class:`PostgresWarehouseRequestReads`, whose reads it has (the
    dispatcher reports its backlog), and is also the store of the poll of fulfilment orders
    (``FulfilmentOrderPolls``). Every method is one transaction, retried whole under the
    retry policy, and then raises :class:`~fulfilment.application.ports.TransientError`;
    other database errors propagate.
    """

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

    async def due_polls(
        self, limit: int, *, after_seconds: float, excluding: Collection[int] = ()
    ) -> list[FulfilmentOrderToPoll]:
        """Up to ``limit`` fulfilment orders due to be asked about (see the port).

        Raises:
            TransientError: a transient database error outlasted the retry budget.
            ValueError: ``limit`` is below 1 or ``after_seconds`` is not positive.
        """
        if limit < 1 or after_seconds <= 0:
            msg = f"limit {limit} must be >= 1 and after_seconds {after_seconds} > 0"
            raise ValueError(msg)

        async def work(connection: AsyncConnection) -> list[FulfilmentOrderToPoll]:
            rows = await connection.execute(
                _POLLS_DUE,
                {"limit": limit, "after_seconds": after_seconds, "excluding": list(excluding)},
            )
            return [
                FulfilmentOrderToPoll(
                    request_id=row.id, order_id=row.order_id, warehouse_id=row.warehouse_id
                )
                for row in rows
            ]

        return await self._in_transaction("due_polls", work)

    async def record_polls(self, request_ids: Collection[int]) -> None:
        """Set ``polled_at`` to now on ``request_ids`` (see the port).

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """
        if not request_ids:
            return

        async def work(connection: AsyncConnection) -> None:
            await connection.execute(_POLLED, {"ids": sorted(request_ids)})

        await self._in_transaction("record_polls", work)

    async def orders_without_news(self, after_seconds: float) -> int:
        """Accepted fulfilment orders holding units with no news for ``after_seconds`` (the port).

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """

        async def work(connection: AsyncConnection) -> int:
            result = await connection.execute(_WITHOUT_NEWS, {"after_seconds": after_seconds})
            return int(result.scalar_one())

        return await self._in_transaction("orders_without_news", work)


def _first_body(row: sa.Row[Any]) -> bytes | None:
    """The body a due request is first sent with; None for a cancellation not to be sent."""
    kind = RequestKind(row.kind)
    lines: Mapping[str, int] | None = stored_units(row.lines)
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
    The order holds, per SKU, its line less what the warehouse's shipments took of it: only
    that is released, and an order left holding nothing is ``shipped`` when some of it
    shipped, else ``released``. Each that releases stock writes its ``stock.released`` event,
    caused by its cancel. The one that leaves the order holding nothing (at most one: later
    ones find nothing to release) is marked ``released_order``, for no inbox ``released`` row
    records that release.
    """
    status = (await connection.execute(_LOCK_ORDER, {"order_id": order_id})).scalar_one()
    rows = (await connection.execute(_ORDER_LINES, {"order_id": order_id})).all()
    held = {str(row.sku): int(row.held) for row in rows if row.held > 0}
    shipped_some = any(row.shipped > 0 for row in rows)
    state = OrderState(OrderStatus(status), held)
    asked = [stored_units(lines) for _, _, lines, _ in cancels]
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
    lines = {"order_id": order_id, "skus": skus, "quantities": [released[sku] for sku in skus]}
    await connection.execute(_LOCK_STOCK, {"skus": skus})
    await connection.execute(_RELEASE_STOCK, lines)
    await connection.execute(_DELETE_RELEASED_LINES, lines)
    await connection.execute(_SHRINK_LINES, lines)
    await connection.execute(
        _ORDER_STATUS,
        {
            "order_id": order_id,
            "status": str(_status(state_after.status, shipped_some=shipped_some)),
        },
    )
    for (_, causation_id, _, traceparent), cancellation in zip(cancels, results, strict=True):
        if cancellation.lines:
            await connection.execute(
                _STOCK_RELEASED,
                {
                    "order_id": order_id,
                    "causation_id": causation_id,
                    "lines": _as_json(cancellation.lines),
                    "order_status": str(
                        _status(cancellation.state.status, shipped_some=shipped_some)
                    ),
                    "traceparent": traceparent,
                },
            )
    await connection.execute(_NOTIFY_RELAY)


def _status(status: OrderStatus, *, shipped_some: bool) -> OrderStatus:
    """The order's status once a release left it in ``status`` (of its held units alone).

    An order that holds nothing is ``shipped`` when some of it shipped, not ``released``
    (product contract, "Hearing back from the warehouse").
    """
    if status is OrderStatus.RELEASED and shipped_some:
        return OrderStatus.SHIPPED
    return status


def _changes_the_request_only(answered: Answered) -> bool:
    """Whether recording ``answered`` writes the request's row and nothing else (see record)."""
    match answered.answer:
        case Retry() | RateLimited() | CredentialsRefused():
            return True
        case Accepted():
            return answered.request.kind is RequestKind.FULFILMENT_ORDER
        case _:
            return False


def _as_json(units: Mapping[str, int]) -> list[dict[str, object]]:
    return [{"sku": sku, "quantity": units[sku]} for sku in sorted(units)]
