"""``PostgresStock``: the :class:`~fulfilment.application.ports.Stock` on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cache, partial
from typing import Any
from uuid import UUID

import asyncpg
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.errors import StockBelowReservedError
from fulfilment.adapters.postgres.group_commit import (
    CommitBatch,
    GroupCommit,
    UnreadableOutcomesError,
)
from fulfilment.adapters.postgres.retry import RetryHook, call_with_retry
from fulfilment.adapters.postgres.tables.base import INTEGER_MAX
from fulfilment.adapters.postgres.tables.stock import stock_levels
from fulfilment.application.ports import OutcomeT, Stock
from fulfilment.domain.model import Command, StockLevel
from fulfilment.observability.tracing import current_span, current_traceparent, traceparent_of
from fulfilment.routes.route import BatchFunction
from fulfilment.routes.table import FUNCTIONS

__all__ = [
    "MAX_ON_HAND",
    "PostgresStock",
    "StockBelowReservedError",
    "apply_statement",
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

_TEXT_ARRAY = postgresql.ARRAY(sa.Text)
_INTEGER_ARRAY = postgresql.ARRAY(sa.Integer)


@cache
def _on_pool(function: str, count: int) -> str:
    """The call of ``function`` with ``count`` positional parameters, for the asyncpg pool.

    The hot path: asyncpg prepares it once per connection.
    """
    placeholders = ", ".join(f"${number}" for number in range(1, count + 1))
    return f"SELECT * FROM {function}({placeholders})"  # noqa: S608 - a route's name, not input


@cache
def _on_engine(function: str, names: tuple[str, ...]) -> sa.TextClause:
    """The same call with named parameters, for a connection of the engine.

    The server types each parameter from the function's signature.
    """
    parameters = ", ".join(":" + name for name in names)
    return sa.text(f"SELECT * FROM {function}({parameters})")  # noqa: S608 - a route's name, not input


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


class PostgresStock(Stock):
    """Stock and reservations in PostgreSQL; see :class:`Stock` for the guarantees.

    Args:
        engine: an asyncpg engine (``adapters.postgres.engine.create_engine``); not owned.
        consumer: the inbox namespace (``FULFILMENT_CONSUMER_NAME``).
        retry_budget_seconds: total time each call may spend retrying transient errors
            (``FULFILMENT_RETRY_BUDGET_SECONDS``); see ``adapters.postgres.retry``.
        on_retry: called with the error before each retry, e.g. to count retries in a metric.
        pool: the asyncpg pool of :meth:`apply` (``adapters.postgres.engine.create_pool``),
            not owned; without one, it takes a connection of ``engine``. Either way a batch of
            commands is one call of their kind's SQL function in autocommit; the pool skips
            SQLAlchemy's execution machinery (16 % of the worker's CPU in a profile).
        pool_size: most such transactions running at once, of every kind together, each
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
        # A single autocommit statement: the SQL function's body is the transaction,
        # and no BEGIN/COMMIT round trips surround it.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._consumer = consumer
        self._retry_budget_seconds = retry_budget_seconds
        self._on_retry = on_retry
        self._group_commit = GroupCommit(pool_size=pool_size, batch_max=batch_max)
        # One function per kind, made once: the group commit batches the calls passing the
        # same one.
        self._commit_batches: dict[type[Any], CommitBatch[Any, Any]] = {
            command: partial(self._commit_batch, function)
            for command, function in FUNCTIONS.items()
        }

    async def _commit_batch(
        self,
        function: BatchFunction[Any, Any],
        commands: Sequence[Command[Any]],
        spans: Sequence[SpanContext],
    ) -> list[Any]:
        """Apply ``commands``, of one kind, in one call of ``function`` (see ``group_commit``).

        Raises ``UnreadableOutcomesError`` when a row cannot be read as its command's outcome.
        """
        arguments = _arguments(
            function, self._consumer, commands, _traceparents(spans), handoff=self._handoff
        )
        rows = await self._batch_rows(function, arguments, size=len(commands))
        try:
            return [
                function.outcome(command, row[1:])
                for command, row in zip(commands, rows, strict=True)
            ]
        except ValueError as error:  # an outcome, reason, status or line this code does not know
            raise UnreadableOutcomesError(str(error)) from error

    async def _batch_rows(
        self, function: BatchFunction[Any, Any], parameters: dict[str, Any], *, size: int
    ) -> Sequence[Sequence[Any]]:
        """One call of a batch function under the retry policy: its rows, one per command.

        Each attempt is a ``CLIENT`` span (``SELECT <function>``, OpenTelemetry's database
        conventions) in the current one, the group commit's.

        Raises ``UnreadableOutcomesError`` unless the rows are ordinals 1 to ``size``.
        """
        name = function.name

        async def attempt() -> Sequence[Sequence[Any]]:
            with current_span(
                tracer,
                f"SELECT {name}",
                kind=SpanKind.CLIENT,
                attributes=lambda: {
                    "db.system": "postgresql",
                    "db.system.name": "postgresql",
                    "db.operation.name": "SELECT",
                    "db.stored_procedure.name": name,
                    "db.query.summary": f"SELECT {name}",
                    "db.operation.batch.size": size,
                },
            ):
                return await statement_rows()

        async def statement_rows() -> Sequence[Sequence[Any]]:
            if self._pool is not None:
                async with self._pool.acquire(timeout=self._retry_budget_seconds) as connection:
                    try:
                        rows: list[Sequence[Any]] = await connection.fetch(
                            _on_pool(name, len(parameters)), *parameters.values()
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
                result = await connection.execute(_on_engine(name, tuple(parameters)), parameters)
                return result.all()

        rows = await call_with_retry(
            attempt,
            operation=name,
            budget_seconds=self._retry_budget_seconds,
            on_retry=self._on_retry,
        )
        ordinals = [row[0] for row in rows]
        if ordinals != list(range(1, size + 1)):
            msg = f"ordinals {ordinals[:10]} for {size} events"
            raise UnreadableOutcomesError(msg)
        return rows

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
        """The engine this stock store runs on (for the command line's reports and chores)."""
        return self._engine

    async def apply(self, command: Command[OutcomeT]) -> OutcomeT:
        """Apply ``command`` in a transaction of its kind's SQL function (group commit).

        The function is the one the command's route names (``place_orders()``,
        ``cancel_orders()``, ``ship_orders()``, and for the warehouse's events
        ``record_shipments()`` and ``record_warehouse_cancellations()``:
        ``fulfilment.routes.table.FUNCTIONS``, found by the command's type). The commands of
        one kind waiting at the same moment share the transaction (``group_commit``); each
        gets the outcome it would get in a transaction of its own after the calls before it.

        When a connection drops after the function committed but before its answer arrived,
        the retry finds the inbox rows and answers ``duplicate`` for every command of the
        batch, a rejected order too: each was still applied exactly once, but its outcome
        label (and metric) says duplicate, and the real outcome is in ``reservations``. A
        ``not_reserved`` shipment leaves no inbox row, so a retry (or a replay) decides it
        again.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
            ValueError: the function refuses the command (``BatchFunction.check``: an order
                without lines, a cancel of lines that names none, a shipment without lines).
            LookupError: no route's command is of the command's type.
        """
        commit_batch = self._commit_batches.get(type(command))
        if commit_batch is None:
            msg = f"no route applies a {type(command).__name__}"
            raise LookupError(msg)
        FUNCTIONS[type(command)].check(command)
        outcome: OutcomeT = await self._group_commit.run(commit_batch, command)
        return outcome

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

    async def levels_of(self, skus: Iterable[str]) -> dict[str, StockLevel]:
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


def apply_statement(
    consumer: str, commands: Sequence[Command[Any]], *, handoff: bool = False
) -> tuple[sa.TextClause, dict[str, Any]]:
    """The SQL function call applying ``commands`` for ``consumer``: statement and arguments.

    ``commands`` are of one kind, at least one; the function is their route's, as for
    :meth:`PostgresStock.apply`. For a connection of the engine
    (``connection.execute(statement, arguments)``), in a transaction of the caller's, without
    the function's check. ``handoff`` as for :class:`PostgresStock` (for the functions
    that take it). The result events (and the warehouse requests) carry the current span's
    trace context.

    Raises:
        LookupError: no route's command is of their type.
    """
    kind = type(commands[0])
    function = FUNCTIONS.get(kind)
    if function is None:
        msg = f"no route applies a {kind.__name__}"
        raise LookupError(msg)
    arguments = _arguments(
        function, consumer, commands, [current_traceparent()] * len(commands), handoff=handoff
    )
    return _on_engine(function.name, tuple(arguments)), arguments


def _arguments(
    function: BatchFunction[Any, Any],
    consumer: str,
    commands: Sequence[Command[Any]],
    traceparents: Sequence[str | None],
    *,
    handoff: bool,
) -> dict[str, Any]:
    """The arguments of ``function``, by name and in its order (:class:`BatchFunction`)."""
    arguments: dict[str, Any] = {"consumer": consumer}
    arguments.update(function.arguments(commands))
    arguments["traceparents"] = list(traceparents)
    if function.handoff:
        arguments["handoff"] = handoff
    return arguments


def _traceparents(spans: Sequence[SpanContext]) -> list[str | None]:
    """Per command, the ``traceparent`` its result events carry: the span that wrote them."""
    return [traceparent_of(span) for span in spans]
