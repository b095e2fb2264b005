"""``PostgresWarehouse``: the :class:`~fulfilment.application.ports.Warehouse` on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

import asyncpg
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.errors import StockBelowReservedError
from fulfilment.adapters.postgres.group_commit import GroupCommit, UnreadableOutcomesError
from fulfilment.adapters.postgres.retry import RetryHook, call_with_retry
from fulfilment.adapters.postgres.tables import INTEGER_MAX, stock_levels
from fulfilment.application.ports import Warehouse
from fulfilment.domain.lifecycle import (
    CancelKind,
    CancelOrder,
    CancelOutcome,
    OrderStatus,
    ShipKind,
    ShipOrder,
    ShipOutcome,
)
from fulfilment.domain.model import (
    DuplicateOf,
    OrderLine,
    OutcomeKind,
    RejectionReason,
    ReservationOutcome,
    ReserveStock,
    StockLevel,
)
from fulfilment.observability.tracing import current_span, current_traceparent, traceparent_of

__all__ = [
    "MAX_ON_HAND",
    "PostgresWarehouse",
    "StockBelowReservedError",
    "cancel_orders_statement",
    "reserve_orders_statement",
    "ship_orders_statement",
]

MAX_ON_HAND = INTEGER_MAX
"""Largest ``on_hand`` the column holds."""

DEFAULT_POOL_SIZE = 2
"""Default of ``pool_size``: two reservation transactions at once (docs/performance.md), as
``FULFILMENT_DATABASE_POOL_SIZE`` by default."""

DEFAULT_BATCH_MAX = 64
"""Default of ``batch_max``: every delivery the default prefetch lets in flight, as
``FULFILMENT_RESERVATION_BATCH_MAX`` by default."""

tracer = trace.get_tracer("fulfilment.postgres")

_BATCH_FUNCTIONS = {"reserve": "place_orders", "cancel": "cancel_orders", "ship": "ship_orders"}
"""The SQL function of each batch operation, the name of its database span."""

_TEXT_ARRAY = postgresql.ARRAY(sa.Text)
_INTEGER_ARRAY = postgresql.ARRAY(sa.Integer)

_PLACE_ORDERS = sa.text(
    "SELECT ordinal, outcome, reason, skus FROM place_orders(:consumer, :event_ids, :order_ids,"
    " :placed_at, :line_orders, :line_skus, :line_quantities, :traceparents, :handoff)"
).bindparams(
    sa.bindparam("consumer", type_=sa.Text),
    sa.bindparam("event_ids", type_=postgresql.ARRAY(sa.Uuid)),
    sa.bindparam("order_ids", type_=postgresql.ARRAY(sa.Uuid)),
    sa.bindparam("placed_at", type_=postgresql.ARRAY(sa.DateTime(timezone=True))),
    sa.bindparam("line_orders", type_=_INTEGER_ARRAY),
    sa.bindparam("line_skus", type_=_TEXT_ARRAY),
    sa.bindparam("line_quantities", type_=_INTEGER_ARRAY),
    sa.bindparam("traceparents", type_=_TEXT_ARRAY),
    sa.bindparam("handoff", type_=sa.Boolean),
)
"""One statement, one round trip (``migrations/sql/place_orders/``), through the engine."""

_PLACE_ORDERS_ON_POOL = (
    "SELECT ordinal, outcome, reason, skus FROM place_orders($1, $2, $3, $4, $5, $6, $7, $8, $9)"
)
"""The same call on the asyncpg pool: the hot path (asyncpg prepares it once per connection)."""

_CANCEL_ORDERS = sa.text(
    "SELECT ordinal, outcome, status, skus, quantities FROM cancel_orders(:consumer,"
    " :event_ids, :order_ids, :cancelled_at, :whole, :line_orders, :line_skus, :line_quantities,"
    " :traceparents, :handoff)"
).bindparams(
    sa.bindparam("consumer", type_=sa.Text),
    sa.bindparam("event_ids", type_=postgresql.ARRAY(sa.Uuid)),
    sa.bindparam("order_ids", type_=postgresql.ARRAY(sa.Uuid)),
    sa.bindparam("cancelled_at", type_=postgresql.ARRAY(sa.DateTime(timezone=True))),
    sa.bindparam("whole", type_=postgresql.ARRAY(sa.Boolean)),
    sa.bindparam("line_orders", type_=_INTEGER_ARRAY),
    sa.bindparam("line_skus", type_=_TEXT_ARRAY),
    sa.bindparam("line_quantities", type_=_INTEGER_ARRAY),
    sa.bindparam("traceparents", type_=_TEXT_ARRAY),
    sa.bindparam("handoff", type_=sa.Boolean),
)
"""A batch of cancels in one statement (``migrations/sql/cancel_orders/``), through the engine."""

_CANCEL_ORDERS_ON_POOL = (
    "SELECT ordinal, outcome, status, skus, quantities"
    " FROM cancel_orders($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
)

_SHIP_ORDERS = sa.text(
    "SELECT ordinal, outcome, status, skus, quantities"
    " FROM ship_orders(:consumer, :event_ids, :order_ids, :shipped_at, :traceparents)"
).bindparams(
    sa.bindparam("consumer", type_=sa.Text),
    sa.bindparam("event_ids", type_=postgresql.ARRAY(sa.Uuid)),
    sa.bindparam("order_ids", type_=postgresql.ARRAY(sa.Uuid)),
    sa.bindparam("shipped_at", type_=postgresql.ARRAY(sa.DateTime(timezone=True))),
    sa.bindparam("traceparents", type_=_TEXT_ARRAY),
)
"""A batch of shipments in one statement (``migrations/sql/ship_orders/``), through the engine."""

_SHIP_ORDERS_ON_POOL = (
    "SELECT ordinal, outcome, status, skus, quantities FROM ship_orders($1, $2, $3, $4, $5)"
)

# The column keeps the name message_key although it holds the event id (as text, the form
# both releases write): workers of the previous release still write it under that name during
# a rolling update, and would fail on a renamed column.
_COUNT_REDELIVERY = sa.text(
    "INSERT INTO delivery_attempts AS a (consumer, message_key, redeliveries)"
    " VALUES (:consumer, :event_id, 1)"
    " ON CONFLICT (consumer, message_key) DO UPDATE"
    " SET redeliveries = a.redeliveries + 1, last_redelivered_at = now()"
    " RETURNING a.redeliveries"
)

# Rows are upserted in code-point order, the lock order of place_orders, so that a stock load
# and reservations running at once wait for each other instead of deadlocking. Existing rows
# whose reserved units exceed the new on_hand are skipped by the WHERE (and so not returned).
_PUT_STOCK = sa.text(
    "INSERT INTO stock_levels AS s (sku, on_hand)"
    " SELECT n.sku, n.on_hand FROM unnest(:skus, :on_hand) AS n(sku, on_hand)"
    ' ORDER BY n.sku COLLATE "C"'
    " ON CONFLICT (sku) DO UPDATE SET on_hand = excluded.on_hand, updated_at = now()"
    " WHERE s.reserved <= excluded.on_hand"
    " RETURNING s.sku"
).bindparams(
    sa.bindparam("skus", type_=_TEXT_ARRAY),
    sa.bindparam("on_hand", type_=_INTEGER_ARRAY),
)

# One array parameter rather than IN (...): the same statement (and prepared statement) for
# any number of SKUs.
_STOCK = sa.select(stock_levels.c.sku, stock_levels.c.on_hand, stock_levels.c.reserved).where(
    stock_levels.c.sku == sa.any_(sa.bindparam("skus", type_=_TEXT_ARRAY))
)


class PostgresWarehouse(Warehouse):
    """Stock and reservations in PostgreSQL; see :class:`Warehouse` for the guarantees.

    Args:
        engine: an asyncpg engine (``adapters.postgres.engine.create_engine``); not owned.
        consumer: the inbox namespace (``FULFILMENT_CONSUMER_NAME``).
        retry_budget_seconds: total time each call may spend retrying transient errors
            (``FULFILMENT_RETRY_BUDGET_SECONDS``); see ``adapters.postgres.retry``.
        on_retry: called with the error before each retry, e.g. to count retries in a metric.
        pool: the asyncpg pool of :meth:`reserve`, :meth:`cancel` and :meth:`ship`
            (``adapters.postgres.engine.create_pool``), not owned; without one, they take a
            connection of ``engine``. Either way a batch of events is one call of
            ``place_orders()``, ``cancel_orders()`` or ``ship_orders()`` in autocommit; the
            pool skips SQLAlchemy's execution machinery (16 % of the worker's CPU in a
            profile).
        pool_size: most such transactions running at once, of the three kinds together, each
            on a connection of its own: the size of ``pool``
            (``FULFILMENT_DATABASE_POOL_SIZE``).
        batch_max: most events one transaction applies
            (``FULFILMENT_RESERVATION_BATCH_MAX``); 1 commits every event on its own.
        handoff: record the requests to the warehouse system (``warehouse_requests``) in the
            transactions of the changes, and defer the cancels of orders it may hold
            (``fulfilment.domain.handoff``): ``p_handoff`` of ``place_orders()`` and
            ``cancel_orders()`` v3. False (the default): the lifecycle without the hand-off.

    Every method retries transient errors under the same policy and then raises
    :class:`~fulfilment.application.ports.TransientError`; other database errors propagate.
    """

    def __init__(  # noqa: PLR0913 - the composition root passes each collaborator by name
        self,
        engine: AsyncEngine,
        *,
        consumer: str,
        retry_budget_seconds: float,
        on_retry: RetryHook | None = None,
        pool: asyncpg.Pool | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        batch_max: int = DEFAULT_BATCH_MAX,
        handoff: bool = False,
    ) -> None:
        self._engine = engine
        self._handoff = handoff
        self._pool = pool
        # A single autocommit statement: the place_orders function body is the transaction,
        # and no BEGIN/COMMIT round trips surround it.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._consumer = consumer
        self._retry_budget_seconds = retry_budget_seconds
        self._on_retry = on_retry
        self._group_commit = GroupCommit(pool_size=pool_size, batch_max=batch_max)

    async def _batch_rows(
        self,
        on_pool: str,
        statement: sa.TextClause,
        parameters: dict[str, Any],
        *,
        operation: str,
        size: int,
    ) -> Sequence[Sequence[Any]]:
        """One call of a batch function under the retry policy: its rows, one per event.

        Each attempt is a ``CLIENT`` span (``SELECT <function>``, OpenTelemetry's database
        conventions) in the current one, the group commit's.

        Raises ``UnreadableOutcomesError`` unless the rows are ordinals 1 to ``size``.
        """
        function = _BATCH_FUNCTIONS[operation]

        async def attempt() -> Sequence[Sequence[Any]]:
            with current_span(
                tracer,
                f"SELECT {function}",
                kind=SpanKind.CLIENT,
                attributes=lambda: {
                    "db.system": "postgresql",
                    "db.system.name": "postgresql",
                    "db.operation.name": "SELECT",
                    "db.stored_procedure.name": function,
                    "db.query.summary": f"SELECT {function}",
                    "db.operation.batch.size": size,
                },
            ):
                return await statement_rows()

        async def statement_rows() -> Sequence[Sequence[Any]]:
            if self._pool is not None:
                async with self._pool.acquire(timeout=self._retry_budget_seconds) as connection:
                    try:
                        rows: list[Sequence[Any]] = await connection.fetch(
                            on_pool, *parameters.values()
                        )
                    except (asyncpg.InterfaceError, OSError, asyncpg.ReadOnlySQLTransactionError):
                        # The connection, not the server, failed (a failover kills connections
                        # under running statements), stopped answering (the pool's
                        # command_timeout raised TimeoutError, an OSError), or is on a server
                        # that became a standby (25006): never hand it out again; the retry
                        # policy decides whether to try on a new one.
                        connection.terminate()
                        raise
                    return rows
            async with self._autocommit.connect() as connection:
                result = await connection.execute(statement, parameters)
                return result.all()

        rows = await call_with_retry(
            attempt,
            operation=operation,
            budget_seconds=self._retry_budget_seconds,
            on_retry=self._on_retry,
        )
        ordinals = [row[0] for row in rows]
        if ordinals != list(range(1, size + 1)):
            msg = f"ordinals {ordinals[:10]} for {size} events"
            raise UnreadableOutcomesError(msg)
        return rows

    async def _reserve_batch(
        self, commands: Sequence[ReserveStock], spans: Sequence[SpanContext]
    ) -> list[ReservationOutcome]:
        """Reserve ``commands`` in one ``place_orders()`` call (see ``group_commit``)."""
        rows = await self._batch_rows(
            _PLACE_ORDERS_ON_POOL,
            _PLACE_ORDERS,
            _arguments(self._consumer, commands, _traceparents(spans), handoff=self._handoff),
            operation="reserve",
            size=len(commands),
        )
        try:
            return [
                _to_outcome(command, outcome, reason, skus)
                for command, (_, outcome, reason, skus) in zip(commands, rows, strict=True)
            ]
        except ValueError as error:  # an outcome, reason or SKU list this code does not know
            raise UnreadableOutcomesError(str(error)) from error

    async def _cancel_batch(
        self, commands: Sequence[CancelOrder], spans: Sequence[SpanContext]
    ) -> list[CancelOutcome]:
        """Apply ``commands`` in one ``cancel_orders()`` call (see ``group_commit``)."""
        rows = await self._batch_rows(
            _CANCEL_ORDERS_ON_POOL,
            _CANCEL_ORDERS,
            _cancel_arguments(
                self._consumer, commands, _traceparents(spans), handoff=self._handoff
            ),
            operation="cancel",
            size=len(commands),
        )
        try:
            return [
                CancelOutcome(
                    CancelKind(outcome),
                    command.order_id,
                    command.event_id,
                    _lines(skus, quantities),
                    None if status is None else OrderStatus(status),
                )
                for command, (_, outcome, status, skus, quantities) in zip(
                    commands, rows, strict=True
                )
            ]
        except ValueError as error:  # an outcome, status or line this code does not know
            raise UnreadableOutcomesError(str(error)) from error

    async def _ship_batch(
        self, commands: Sequence[ShipOrder], spans: Sequence[SpanContext]
    ) -> list[ShipOutcome]:
        """Apply ``commands`` in one ``ship_orders()`` call (see ``group_commit``)."""
        rows = await self._batch_rows(
            _SHIP_ORDERS_ON_POOL,
            _SHIP_ORDERS,
            _ship_arguments(self._consumer, commands, _traceparents(spans)),
            operation="ship",
            size=len(commands),
        )
        try:
            return [
                ShipOutcome(
                    ShipKind(outcome),
                    command.order_id,
                    command.event_id,
                    _lines(skus, quantities),
                    None if status is None else OrderStatus(status),
                )
                for command, (_, outcome, status, skus, quantities) in zip(
                    commands, rows, strict=True
                )
            ]
        except ValueError as error:  # an outcome, status or line this code does not know
            raise UnreadableOutcomesError(str(error)) from error

    async def count_redelivery(self, event_id: UUID) -> int:
        """Record one more redelivery of ``event_id``; return the redeliveries so far (>= 1).

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """
        parameters = {"consumer": self._consumer, "event_id": str(event_id)}

        async def attempt() -> int:
            async with self._autocommit.connect() as connection:
                result = await connection.execute(_COUNT_REDELIVERY, parameters)
                return int(result.scalar_one())

        return await call_with_retry(
            attempt,
            operation="count_redelivery",
            budget_seconds=self._retry_budget_seconds,
            on_retry=self._on_retry,
        )

    @property
    def engine(self) -> AsyncEngine:
        """The engine this warehouse runs on (for the command line's reports and chores)."""
        return self._engine

    async def reserve(self, command: ReserveStock) -> ReservationOutcome:
        """Reserve ``command``'s demand in a ``place_orders()`` transaction (group commit).

        The orders reserved at the same moment share the transaction (``group_commit``); each
        gets the outcome it would get in a transaction of its own after the calls before it.

        When a connection drops after the function committed but before its answer arrived, the
        retry finds the inbox rows and answers ``duplicate:event`` for every order of the
        batch, rejected ones too: each was still applied exactly once, but its outcome label
        (and metric) says duplicate, and the real outcome is in ``reservations``.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
            ValueError: the command has no lines.
        """
        if not command.lines:
            msg = f"order {command.order_id} has no lines"
            raise ValueError(msg)
        return await self._group_commit.run(self._reserve_batch, command)

    async def cancel(self, command: CancelOrder) -> CancelOutcome:
        """Cancel ``command``'s order in a ``cancel_orders()`` transaction (group commit).

        The cancels waiting at the same moment share the transaction, as reservations do
        (``group_commit``); each gets the outcome it would get in a transaction of its own
        after the calls before it. A dropped connection after the commit makes the retry
        answer ``duplicate``, as for :meth:`reserve`.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
            ValueError: the command cancels lines, but names none.
        """
        if command.lines is not None and not command.lines:
            msg = f"the cancel of order {command.order_id} names no lines"
            raise ValueError(msg)
        return await self._group_commit.run(self._cancel_batch, command)

    async def ship(self, command: ShipOrder) -> ShipOutcome:
        """Ship ``command``'s order in a ``ship_orders()`` transaction (group commit).

        Batched like :meth:`cancel`. A ``not_reserved`` shipment leaves no inbox row, so a
        retry (or a replay) decides it again.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """
        return await self._group_commit.run(self._ship_batch, command)

    async def put_stock(self, on_hand: Mapping[str, int]) -> None:
        """Upsert ``on_hand`` per SKU in one transaction; ``reserved`` is never changed.

        Raises:
            StockBelowReservedError: some new ``on_hand`` is below that SKU's ``reserved``;
                nothing was changed.
            ValueError: an ``on_hand`` is negative or larger than :data:`MAX_ON_HAND`.
            TransientError: a transient database error outlasted the retry budget.
        """
        bad = sorted(sku for sku, units in on_hand.items() if not 0 <= units <= MAX_ON_HAND)
        if bad:
            msg = f"on_hand must be between 0 and {MAX_ON_HAND}; not so for {bad[:10]}"
            raise ValueError(msg)
        if not on_hand:
            return
        parameters = {"skus": list(on_hand), "on_hand": list(on_hand.values())}

        async def attempt() -> set[str]:
            async with self._engine.begin() as connection:
                result = await connection.execute(_PUT_STOCK, parameters)
                written = set(result.scalars())
                if len(written) < len(on_hand):
                    # Leaving the block with an exception rolls the whole load back.
                    raise StockBelowReservedError(set(on_hand) - written)
                return written

        await call_with_retry(
            attempt,
            operation="put_stock",
            budget_seconds=self._retry_budget_seconds,
            on_retry=self._on_retry,
        )

    async def stock(self, skus: Iterable[str]) -> dict[str, StockLevel]:
        """Current levels of the known SKUs among ``skus`` (unknown ones are absent).

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """
        wanted = list(dict.fromkeys(skus))
        if not wanted:
            return {}

        async def attempt() -> dict[str, StockLevel]:
            async with self._autocommit.connect() as connection:
                rows = await connection.execute(_STOCK, {"skus": wanted})
                return {sku: StockLevel(on_hand, reserved) for sku, on_hand, reserved in rows}

        return await call_with_retry(
            attempt,
            operation="stock",
            budget_seconds=self._retry_budget_seconds,
            on_retry=self._on_retry,
        )


def reserve_orders_statement(
    consumer: str, commands: Sequence[ReserveStock], *, handoff: bool = False
) -> tuple[sa.TextClause, dict[str, Any]]:
    """``place_orders()`` of ``commands`` for ``consumer``: the statement and its arguments.

    For a connection of the engine (``connection.execute(statement, arguments)``), in a
    transaction of the caller's; every command must have at least one line. ``handoff`` as
    for :class:`PostgresWarehouse`. The result events (and the warehouse requests) carry the
    current span's trace context.
    """
    return _PLACE_ORDERS, _arguments(
        consumer, commands, [current_traceparent()] * len(commands), handoff=handoff
    )


def cancel_orders_statement(
    consumer: str, commands: Sequence[CancelOrder], *, handoff: bool = False
) -> tuple[sa.TextClause, dict[str, Any]]:
    """``cancel_orders()`` of ``commands`` for ``consumer``: the statement and its arguments.

    As :func:`reserve_orders_statement`; a command that cancels lines must name at least one.
    """
    return _CANCEL_ORDERS, _cancel_arguments(
        consumer, commands, [current_traceparent()] * len(commands), handoff=handoff
    )


def ship_orders_statement(
    consumer: str, commands: Sequence[ShipOrder]
) -> tuple[sa.TextClause, dict[str, Any]]:
    """``ship_orders()`` of ``commands`` for ``consumer``: the statement and its arguments.

    As :func:`reserve_orders_statement`.
    """
    return _SHIP_ORDERS, _ship_arguments(
        consumer, commands, [current_traceparent()] * len(commands)
    )


def _arguments(
    consumer: str,
    commands: Sequence[ReserveStock],
    traceparents: Sequence[str | None],
    *,
    handoff: bool,
) -> dict[str, Any]:
    """The arguments of ``place_orders()``, by name and in its order."""
    line_orders: list[int] = []
    line_skus: list[str] = []
    line_quantities: list[int] = []
    # reserve() has refused orders without lines, so every ordinal gets at least one.
    for ordinal, command in enumerate(commands, start=1):
        demand = command.demand()
        line_orders.extend([ordinal] * len(demand))
        line_skus.extend(demand)
        line_quantities.extend(demand.values())
    return {
        "consumer": consumer,
        "event_ids": [command.event_id for command in commands],
        "order_ids": [command.order_id for command in commands],
        "placed_at": [command.placed_at for command in commands],
        "line_orders": line_orders,
        "line_skus": line_skus,
        "line_quantities": line_quantities,
        "traceparents": list(traceparents),
        "handoff": handoff,
    }


def _cancel_arguments(
    consumer: str,
    commands: Sequence[CancelOrder],
    traceparents: Sequence[str | None],
    *,
    handoff: bool,
) -> dict[str, Any]:
    """The arguments of ``cancel_orders()``, by name and in its order."""
    line_orders: list[int] = []
    line_skus: list[str] = []
    line_quantities: list[int] = []
    for ordinal, command in enumerate(commands, start=1):
        cancelled = command.cancelled() or {}
        line_orders.extend([ordinal] * len(cancelled))
        line_skus.extend(cancelled)
        line_quantities.extend(cancelled.values())
    return {
        "consumer": consumer,
        "event_ids": [command.event_id for command in commands],
        "order_ids": [command.order_id for command in commands],
        "cancelled_at": [command.cancelled_at for command in commands],
        "whole": [command.lines is None for command in commands],
        "line_orders": line_orders,
        "line_skus": line_skus,
        "line_quantities": line_quantities,
        "traceparents": list(traceparents),
        "handoff": handoff,
    }


def _ship_arguments(
    consumer: str, commands: Sequence[ShipOrder], traceparents: Sequence[str | None]
) -> dict[str, Any]:
    """The arguments of ``ship_orders()``, by name and in its order."""
    return {
        "consumer": consumer,
        "event_ids": [command.event_id for command in commands],
        "order_ids": [command.order_id for command in commands],
        "shipped_at": [command.shipped_at for command in commands],
        "traceparents": list(traceparents),
    }


def _traceparents(spans: Sequence[SpanContext]) -> list[str | None]:
    """Per command, the ``traceparent`` its result events carry: the span that wrote them."""
    return [traceparent_of(span) for span in spans]


def _lines(skus: Sequence[str], quantities: Sequence[int]) -> tuple[OrderLine, ...]:
    return tuple(OrderLine(sku, quantity) for sku, quantity in zip(skus, quantities, strict=True))


def _to_outcome(
    command: ReserveStock, outcome: str, reason: str | None, skus: Sequence[str] | None
) -> ReservationOutcome:
    kind = OutcomeKind(outcome)
    if kind is OutcomeKind.DUPLICATE:
        return ReservationOutcome(
            kind=kind,
            order_id=command.order_id,
            event_id=command.event_id,
            duplicate_of=DuplicateOf(str(reason)),
        )
    return ReservationOutcome(
        kind=kind,
        order_id=command.order_id,
        event_id=command.event_id,
        reason=None if reason is None else RejectionReason(reason),
        skus=tuple(skus or ()),
    )
