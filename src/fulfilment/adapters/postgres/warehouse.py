"""``PostgresWarehouse``: the :class:`~fulfilment.application.ports.Warehouse` on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.errors import StockBelowReservedError
from fulfilment.adapters.postgres.group_commit import GroupCommit, UnreadableOutcomesError
from fulfilment.adapters.postgres.retry import RetryHook, call_with_retry
from fulfilment.adapters.postgres.tables import INTEGER_MAX, stock_levels
from fulfilment.application.ports import Warehouse
from fulfilment.domain.lifecycle import CancelOrder, CancelOutcome, ShipOrder, ShipOutcome
from fulfilment.domain.model import (
    DuplicateOf,
    OutcomeKind,
    RejectionReason,
    ReservationOutcome,
    ReserveStock,
    StockLevel,
)

__all__ = [
    "MAX_ON_HAND",
    "PostgresWarehouse",
    "StockBelowReservedError",
    "reserve_orders_statement",
]

MAX_ON_HAND = INTEGER_MAX
"""Largest ``on_hand`` the column holds."""

DEFAULT_POOL_SIZE = 2
"""Default of ``pool_size``: two reservation transactions at once (README, "Performance"), as
``FULFILMENT_DATABASE_POOL_SIZE`` by default."""

DEFAULT_BATCH_MAX = 32
"""Default of ``batch_max``: every delivery the default prefetch lets in flight, as
``FULFILMENT_RESERVATION_BATCH_MAX`` by default."""

_TEXT_ARRAY = postgresql.ARRAY(sa.Text)
_INTEGER_ARRAY = postgresql.ARRAY(sa.Integer)

_RESERVE_ORDERS = sa.text(
    "SELECT ordinal, outcome, reason, skus FROM reserve_orders("
    ":consumer, :event_ids, :order_ids, :placed_at, :line_orders, :line_skus, :line_quantities)"
).bindparams(
    sa.bindparam("consumer", type_=sa.Text),
    sa.bindparam("event_ids", type_=postgresql.ARRAY(sa.Uuid)),
    sa.bindparam("order_ids", type_=postgresql.ARRAY(sa.Uuid)),
    sa.bindparam("placed_at", type_=postgresql.ARRAY(sa.DateTime(timezone=True))),
    sa.bindparam("line_orders", type_=_INTEGER_ARRAY),
    sa.bindparam("line_skus", type_=_TEXT_ARRAY),
    sa.bindparam("line_quantities", type_=_INTEGER_ARRAY),
)
"""One statement, one round trip (``migrations/sql/reserve_orders/``), through the engine."""

_RESERVE_ORDERS_ON_POOL = (
    "SELECT ordinal, outcome, reason, skus FROM reserve_orders($1, $2, $3, $4, $5, $6, $7)"
)
"""The same call on the asyncpg pool: the hot path (asyncpg prepares it once per connection)."""

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

# Rows are upserted in code-point order, the lock order of reserve_orders, so that a stock load
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
        pool: the asyncpg pool of :meth:`reserve` (``adapters.postgres.engine.create_pool``),
            not owned; without one, reservations take a connection of ``engine``. Either way a
            batch of reservations is one ``reserve_orders()`` call in autocommit; the pool
            skips SQLAlchemy's execution machinery (16 % of the worker's CPU in a profile).
        pool_size: most reservation transactions running at once, each on a connection of its
            own: the size of ``pool`` (``FULFILMENT_DATABASE_POOL_SIZE``).
        batch_max: most orders one transaction reserves
            (``FULFILMENT_RESERVATION_BATCH_MAX``); 1 commits every order on its own.

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
    ) -> None:
        self._engine = engine
        self._pool = pool
        # A single autocommit statement: the reserve_orders function body is the transaction,
        # and no BEGIN/COMMIT round trips surround it.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._consumer = consumer
        self._retry_budget_seconds = retry_budget_seconds
        self._on_retry = on_retry
        self._group_commit = GroupCommit(
            self._commit_batch, pool_size=pool_size, batch_max=batch_max
        )

    async def _commit_batch(self, commands: Sequence[ReserveStock]) -> list[ReservationOutcome]:
        """Reserve ``commands`` in one ``reserve_orders()`` call (see ``group_commit``)."""
        parameters = _arguments(self._consumer, commands)

        async def attempt() -> Sequence[Sequence[Any]]:
            if self._pool is not None:
                async with self._pool.acquire(timeout=self._retry_budget_seconds) as connection:
                    try:
                        rows: list[Sequence[Any]] = await connection.fetch(
                            _RESERVE_ORDERS_ON_POOL, *parameters.values()
                        )
                    except (asyncpg.InterfaceError, OSError):
                        # The connection, not the server, failed (a failover kills connections
                        # under running statements), or stopped answering (the pool's
                        # command_timeout raised TimeoutError, an OSError): never hand it out
                        # again; the retry policy decides whether to try on a new one.
                        connection.terminate()
                        raise
                    return rows
            async with self._autocommit.connect() as connection:
                result = await connection.execute(_RESERVE_ORDERS, parameters)
                return result.all()

        rows = await call_with_retry(
            attempt,
            operation="reserve",
            budget_seconds=self._retry_budget_seconds,
            on_retry=self._on_retry,
        )
        ordinals = [row[0] for row in rows]
        if ordinals != list(range(1, len(commands) + 1)):
            msg = f"ordinals {ordinals[:10]} for {len(commands)} orders"
            raise UnreadableOutcomesError(msg)
        try:
            return [
                _to_outcome(command, outcome, reason, skus)
                for command, (_, outcome, reason, skus) in zip(commands, rows, strict=True)
            ]
        except ValueError as error:  # an outcome, reason or SKU list this code does not know
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
        """Reserve ``command``'s demand in a ``reserve_orders()`` transaction (group commit).

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
        return await self._group_commit.reserve(command)

    async def cancel(self, command: CancelOrder) -> CancelOutcome:
        """Not yet stored in PostgreSQL: ``cancel_orders()`` comes with migration 0007.

        Raises:
            NotImplementedError: always.
        """
        msg = f"cancelling order {command.order_id} needs migration 0007"
        raise NotImplementedError(msg)

    async def ship(self, command: ShipOrder) -> ShipOutcome:
        """Not yet stored in PostgreSQL: ``ship_orders()`` comes with migration 0007.

        Raises:
            NotImplementedError: always.
        """
        msg = f"shipping order {command.order_id} needs migration 0007"
        raise NotImplementedError(msg)

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
    consumer: str, commands: Sequence[ReserveStock]
) -> tuple[sa.TextClause, dict[str, Any]]:
    """``reserve_orders()`` of ``commands`` for ``consumer``: the statement and its arguments.

    For a connection of the engine (``connection.execute(statement, arguments)``), in a
    transaction of the caller's; every command must have at least one line.
    """
    return _RESERVE_ORDERS, _arguments(consumer, commands)


def _arguments(consumer: str, commands: Sequence[ReserveStock]) -> dict[str, Any]:
    """The arguments of ``reserve_orders()``, by name and in its order."""
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
    }


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
