"""PostgreSQL chores of the command line: create the database, open the stock store, reconcile."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from uuid import UUID

import asyncpg
from sqlalchemy import bindparam, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from fulfilment.adapters.postgres.engine import DatabaseOptions, asyncpg_dsn, create_engine
from fulfilment.adapters.postgres.errors import (
    INSUFFICIENT_PRIVILEGE,
    DatabaseRefusedError,
    connection_failure,
)
from fulfilment.adapters.postgres.retry import sqlstate_of
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.tables import metadata
from fulfilment.adapters.postgres.tables.stock import (
    inbox_messages,
    outbox,
    reservations,
    stock_levels,
)
from fulfilment.domain.lifecycle import OrderStatus

CONNECT_SECONDS = 5.0
"""How long the command line waits for PostgreSQL before calling it unreachable."""


async def ensure_database(database_url: str) -> bool:
    """Create the database named in ``database_url`` if it does not exist; True if created.

    Connects to the server's ``postgres`` maintenance database to do so, which needs the
    ``CREATEDB`` privilege only when the database is missing.

    Raises:
        DatabaseUnavailableError: the server does not answer, or (a ``DatabaseRefusedError``)
            refuses the user, its login or the creation of the database.
    """
    url = make_url(asyncpg_dsn(database_url))
    try:
        connection = await asyncpg.connect(asyncpg_dsn(database_url), timeout=CONNECT_SECONDS)
    except asyncpg.InvalidCatalogNameError:
        pass
    except (OSError, TimeoutError, asyncpg.PostgresError) as error:
        raise connection_failure(database_url, error, timeout_seconds=CONNECT_SECONDS) from error
    else:
        await connection.close()
        return False
    maintenance = url.set(database="postgres").render_as_string(hide_password=False)
    try:
        connection = await asyncpg.connect(maintenance, timeout=CONNECT_SECONDS)
    except (OSError, TimeoutError, asyncpg.PostgresError) as error:
        raise connection_failure(database_url, error, timeout_seconds=CONNECT_SECONDS) from error
    name = url.database or ""
    try:
        await connection.execute(f"CREATE DATABASE {_quote_identifier(name)}")
    except asyncpg.DuplicateDatabaseError:
        return False
    except asyncpg.InsufficientPrivilegeError as error:
        where = make_url(database_url).render_as_string(hide_password=True)
        msg = (
            f"PostgreSQL at {where} has no database {name!r} and refused user"
            f" {url.username or ''!r} to create it: {type(error).__name__}: {error}"
        )
        raise DatabaseRefusedError(msg) from error
    finally:
        await connection.close()
    return True


def _quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@contextlib.asynccontextmanager
async def stock_session(options: DatabaseOptions, *, consumer: str) -> AsyncIterator[PostgresStock]:
    """A :class:`PostgresStock` on a fresh engine, checked reachable, disposed on exit.

    ``consumer`` is its inbox namespace; it retries for ``options.retry_budget_seconds``.

    Raises:
        DatabaseUnavailableError: the server does not answer, or (a ``DatabaseRefusedError``)
            refuses the user or has no such database.
    """
    engine = create_engine(options)
    try:
        try:
            async with engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        except (OSError, OperationalError, DBAPIError) as error:
            raise connection_failure(
                options.url, error, timeout_seconds=options.connect_timeout_seconds
            ) from error
        yield PostgresStock(
            engine, consumer=consumer, retry_budget_seconds=options.retry_budget_seconds
        )
    finally:
        await engine.dispose()


async def processed_event_ids(
    stock: PostgresStock, consumer: str, event_ids: Collection[UUID]
) -> set[UUID]:
    """Those of ``event_ids`` that the inbox of ``consumer`` has recorded as processed."""
    query = select(inbox_messages.c.event_id).where(
        inbox_messages.c.consumer == consumer,
        inbox_messages.c.event_id.in_(bindparam("ids", expanding=True)),
    )
    async with stock.engine.connect() as connection:
        rows = await connection.execute(query, {"ids": list(event_ids)})
        return {row[0] for row in rows}


RESET_TABLES = (
    "inbox_messages",
    "inbox_pruned",
    "reservation_lines",
    "reservations",
    "tombstone_lines",
    "stock_levels",
    "delivery_attempts",
    "outbox",
    "warehouse_requests",
    "webhook_inbox",
    "warehouse_shipments",
    "warehouse_shipment_lines",
    "warehouse_cancellations",
    "warehouse_cancellation_lines",
    "warehouse_discrepancies",
    "invalid_webhooks",
    "warehouse_adjustments",
)
"""The tables ``demo --reset`` empties: every table of the service's state.
``warehouse_requests`` goes with the reservations that recorded them: the demo's order ids
are derived from its data, so a kept row would refuse the same order's next reservation
(``warehouse_requests_one_fulfilment_order_idx``) and dead-letter it; the warehouse's
shipments, cancellations and discrepancies go with the orders they name (each run of the demo
has a new simulator, whose ids start again: a kept row would take its next shipment for a
duplicate), its adjustments with the stock levels they changed (likewise for an adjustment
id), and the kept invalid webhooks as the DLQs' messages do. ``dead_letter_audit`` stays, and
records what the reset purged from the DLQs; ``warehouse_request_audit`` and
``invalid_webhook_audit`` stay too, operators' records like it."""

DEMO_DATABASE_MARK = "fulfilment demo database"
"""How the comment of a database the demo made or found empty begins (``COMMENT ON
DATABASE``, shown by ``\\l+``): ``demo --reset`` empties such a database without asking twice."""


SERVICE_TABLES = frozenset({*metadata.tables, "alembic_version"})
"""Every table the migrations create: any other table in the schema belongs to something else."""


@dataclass(frozen=True, slots=True)
class DemoDatabase:
    """What ``demo --reset`` needs to know about the database before emptying it.

    Attributes:
        name: the database's name (``current_database()``).
        user: the user connected (``current_user``).
        comment: the database's comment, if any.
        holds: the tables that hold a row, of :data:`RESET_TABLES` and ``dead_letter_audit``
            (those that exist: before the first migration, none).
        foreign: the tables of the schema that are not the service's (another application's).
    """

    name: str
    user: str
    comment: str | None
    holds: tuple[str, ...]
    foreign: tuple[str, ...] = ()

    @property
    def marked(self) -> bool:
        """The demo made this database, or found it empty (its comment says so)."""
        return (self.comment or "").startswith(DEMO_DATABASE_MARK)

    @property
    def empty(self) -> bool:
        """No table of the service holds a row, the audit included, and no other table exists."""
        return not self.holds and not self.foreign


async def demo_database(stock: PostgresStock) -> DemoDatabase:
    """The database's name, user, comment, the service's tables that hold rows, other tables.

    Safe on a database not migrated yet (or not the service's at all): only tables that exist
    are read, so ``demo --reset`` can refuse before the migration changes anything.
    """
    async with stock.engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    "SELECT current_database() AS name, current_user AS who,"
                    " shobj_description(d.oid, 'pg_database') AS comment,"
                    " ARRAY(SELECT c.relname::text FROM pg_class AS c"
                    "  WHERE c.relnamespace = current_schema()::regnamespace"
                    "  AND c.relkind IN ('r', 'p')) AS tables"
                    " FROM pg_database AS d WHERE d.datname = current_database()"
                )
            )
        ).one()
        mapping = row._mapping  # noqa: SLF001 - SQLAlchemy's documented access by column name
        present = set(mapping["tables"])
        holds = [
            table
            for table in (*RESET_TABLES, "dead_letter_audit")
            if table in present
            and await connection.scalar(text(f"SELECT EXISTS (SELECT FROM {table})"))  # noqa: S608 - names of RESET_TABLES
        ]
    return DemoDatabase(
        name=str(mapping["name"]),
        user=str(mapping["who"]),
        comment=mapping["comment"],
        holds=tuple(holds),
        foreign=tuple(sorted(present - SERVICE_TABLES)),
    )


async def mark_demo_database(stock: PostgresStock, comment: str) -> bool:
    """Set the database's comment to ``comment`` (which starts with :data:`DEMO_DATABASE_MARK`).

    Returns False when the user may not (only the database's owner may comment on it); the
    database is then not marked.
    """
    async with stock.engine.begin() as connection:
        statement = await connection.scalar(
            text(
                "SELECT format('COMMENT ON DATABASE %I IS %L', current_database(),"
                " CAST(:comment AS text))"
            ),
            {"comment": comment},
        )
        try:
            async with connection.begin_nested():
                await connection.execute(text(str(statement)))
        except DBAPIError as error:
            if sqlstate_of(error) == INSUFFICIENT_PRIVILEGE:
                return False
            raise
    return True


async def reset_tables(stock: PostgresStock) -> dict[str, int]:
    """Empty the tables of :data:`RESET_TABLES`; return the rows each held.

    For ``demo --reset``. The outbox goes too, published or not: its result events tell of
    the orders removed; and so do the counts of pruned inbox rows (``inbox_pruned``), which
    the invariant check adds to the inbox's. One transaction: the counts are those the
    ``TRUNCATE`` removed.
    """
    async with stock.engine.begin() as connection:
        # Locked first, so that nothing is written between the counts and the TRUNCATE.
        await connection.execute(
            text(f"LOCK TABLE {', '.join(RESET_TABLES)} IN ACCESS EXCLUSIVE MODE")
        )
        counts = {
            table: int(await connection.scalar(text(f"SELECT count(*) FROM {table}")) or 0)  # noqa: S608 - names of RESET_TABLES
            for table in RESET_TABLES
        }
        await connection.execute(text(f"TRUNCATE {', '.join(RESET_TABLES)}"))
    return counts


async def inbox_outcomes(
    stock: PostgresStock, consumer: str, event_ids: Collection[UUID]
) -> dict[UUID, str]:
    """``inbox_messages.outcome`` of those of ``event_ids`` the inbox of ``consumer`` holds.

    The outcome is that of the event's first processing (``reserved``, ``released``,
    ``shipped``...): a duplicate delivery changes nothing, its row included.
    """
    if not event_ids:
        return {}
    query = select(inbox_messages.c.event_id, inbox_messages.c.outcome).where(
        inbox_messages.c.consumer == consumer,
        inbox_messages.c.event_id.in_(bindparam("ids", expanding=True)),
    )
    async with stock.engine.connect() as connection:
        rows = await connection.execute(query, {"ids": list(event_ids)})
        return {row.event_id: row.outcome for row in rows}


async def order_statuses(
    stock: PostgresStock, order_ids: Collection[UUID]
) -> dict[UUID, OrderStatus]:
    """The status of those of ``order_ids`` that have a ``reservations`` row."""
    if not order_ids:
        return {}
    query = select(reservations.c.order_id, reservations.c.status).where(
        reservations.c.order_id.in_(bindparam("ids", expanding=True))
    )
    async with stock.engine.connect() as connection:
        rows = await connection.execute(query, {"ids": list(order_ids)})
        return {row.order_id: OrderStatus(row.status) for row in rows}


@dataclass(frozen=True, slots=True)
class StockTotals:
    """Units summed over every SKU of ``stock_levels``."""

    on_hand: int
    reserved: int


async def stock_totals(stock: PostgresStock) -> StockTotals:
    """``on_hand`` and ``reserved`` summed over every SKU (0 and 0 without stock levels)."""
    query = select(
        func.coalesce(func.sum(stock_levels.c.on_hand), 0),
        func.coalesce(func.sum(stock_levels.c.reserved), 0),
    )
    async with stock.engine.connect() as connection:
        on_hand, reserved = (await connection.execute(query)).one()
        return StockTotals(on_hand=int(on_hand), reserved=int(reserved))


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One ``outbox`` row without its body: what the demo checks a received result event by.

    Attributes:
        id: the publishing order (``outbox.id``).
        event_id: the event's id, also the message's ``message_id``.
        order_id: the order it reports on; None for an event about a SKU.
        routing_key: the result event's (``stock.reserved`` ... ``stock.shortage``).
        sku: the SKU an event about a SKU reports on (``stock.adjusted``,
            ``stock.shortage``); None for an event about an order.
    """

    id: int
    event_id: UUID
    order_id: UUID | None
    routing_key: str
    sku: str | None = None

    @property
    def subject(self) -> str:
        """What it reports on, as its message's ``correlation_id``: the order or the SKU."""
        return str(self.order_id) if self.order_id is not None else (self.sku or "")


async def outbox_last_id(stock: PostgresStock) -> int:
    """The highest ``outbox.id`` written so far, 0 for an empty outbox.

    Read before anything writes (the demo, before it starts its worker), every row written
    later has a higher id: the identity only grows, and no transaction was in flight.
    """
    async with stock.engine.connect() as connection:
        last = await connection.scalar(select(func.coalesce(func.max(outbox.c.id), 0)))
        return int(last or 0)


async def outbox_unpublished_after(stock: PostgresStock, after_id: int) -> int:
    """How many rows with an ``id`` above ``after_id`` the relay has not published yet."""
    query = select(func.count()).where(outbox.c.id > after_id, outbox.c.published_at.is_(None))
    async with stock.engine.connect() as connection:
        return int(await connection.scalar(query) or 0)


async def outbox_entries_after(stock: PostgresStock, after_id: int) -> list[OutboxEntry]:
    """The rows with an ``id`` above ``after_id``, in ``id`` order, without their bodies."""
    query = (
        select(
            outbox.c.id, outbox.c.event_id, outbox.c.order_id, outbox.c.routing_key, outbox.c.sku
        )
        .where(outbox.c.id > after_id)
        .order_by(outbox.c.id)
    )
    async with stock.engine.connect() as connection:
        rows = await connection.execute(query)
        return [
            OutboxEntry(row.id, row.event_id, row.order_id, row.routing_key, row.sku)
            for row in rows
        ]
