from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from uuid import uuid4

import asyncpg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine

from fulfilment.adapters.postgres import schema
from fulfilment.adapters.postgres.retry import sqlstate_of
from fulfilment.adapters.postgres.tables import metadata
from fulfilment.routes.table import ROUTES
from tests.support.services import throwaway_database

pytestmark = pytest.mark.postgres

CHECK_VIOLATION = "23514"
FUNCTIONS = {route.function.name for route in ROUTES} | {
    "stock_shortage_event",
    "shipped_order_lines",
}
"""The functions of the schema at head: each route's (0013 dropped the unused reserve_orders()),
and the trigger functions of stock_levels (0016) and reservations (0018)."""
assert {"place_orders", "cancel_orders", "ship_orders"} <= FUNCTIONS


@pytest.fixture
async def engine(clean_database):
    engine = create_async_engine(clean_database)
    try:
        yield engine
    finally:
        await engine.dispose()


def _schema_differences(connection, target):
    context = MigrationContext.configure(
        connection, opts={"compare_type": True, "compare_server_default": True}
    )
    return compare_metadata(context, target)


async def test_the_migrated_schema_matches_the_tables_module(engine):
    async with engine.connect() as connection:
        differences = await connection.run_sync(_schema_differences, metadata)

    assert differences == []


async def test_the_schema_comparison_would_notice_a_difference(engine):
    changed = sa.MetaData()
    for table in metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["stock_levels"].append_column(sa.Column("location", sa.Text))

    async with engine.connect() as connection:
        differences = await connection.run_sync(_schema_differences, changed)

    assert [difference[0] for difference in differences] == ["add_column"]


async def test_the_migrated_check_constraints_are_those_of_the_tables_module(engine):
    # alembic's comparison does not look at CHECK constraints; compare their names here.
    expected = {
        (table.name, constraint.name)
        for table in metadata.tables.values()
        for constraint in table.constraints
        if isinstance(constraint, sa.CheckConstraint)
    }
    async with engine.connect() as connection:
        rows = await connection.execute(
            sa.text(
                "SELECT conrelid::regclass::text, conname FROM pg_constraint"
                " WHERE contype = 'c' AND connamespace = 'public'::regnamespace"
            )
        )
        actual = {(table, name) for table, name in rows}

    assert actual == expected


async def _violation(engine, sql, parameters=None):
    with pytest.raises(IntegrityError) as raised:
        async with engine.begin() as connection:
            await connection.execute(sa.text(sql), parameters or {})
    return raised.value


async def test_the_database_keeps_a_short_sku_and_announces_each_change_of_its_shortfall(engine):
    async with engine.begin() as connection:
        await connection.execute(
            sa.text("INSERT INTO stock_levels (sku, on_hand, reserved) VALUES ('A', 5, 5)")
        )
        await connection.execute(sa.text("UPDATE stock_levels SET on_hand = 2 WHERE sku = 'A'"))
        await connection.execute(sa.text("UPDATE stock_levels SET on_hand = 1 WHERE sku = 'A'"))
        # Not a change of the shortfall: reserved and on_hand go down together.
        await connection.execute(
            sa.text("UPDATE stock_levels SET on_hand = 0, reserved = 4 WHERE sku = 'A'")
        )
        await connection.execute(sa.text("UPDATE stock_levels SET on_hand = 9 WHERE sku = 'A'"))
        events = await connection.execute(
            sa.text(
                "SELECT order_id, sku, body->>'on_hand', body->>'reserved', body->>'short'"
                " FROM outbox WHERE routing_key = 'stock.shortage' ORDER BY id"
            )
        )

    assert [tuple(row) for row in events] == [
        (None, "A", "2", "5", "3"),
        (None, "A", "1", "5", "4"),
        (None, "A", "9", "4", "0"),
    ]


async def test_the_database_refuses_a_negative_reservation_or_stock(engine):
    negative_reserved = await _violation(
        engine, "INSERT INTO stock_levels (sku, on_hand, reserved) VALUES ('A', 5, -1)"
    )
    negative_on_hand = await _violation(
        engine, "INSERT INTO stock_levels (sku, on_hand) VALUES ('A', -1)"
    )

    assert sqlstate_of(negative_reserved) == CHECK_VIOLATION
    assert sqlstate_of(negative_on_hand) == CHECK_VIOLATION
    assert "stock_levels_within_bounds" in str(negative_on_hand.orig)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ("reserved", "unknown_sku"),
        ("rejected", None),
        ("lost", None),
        ("rejected", "late"),
        ("released", "cancelled"),
        ("shipped", "insufficient_stock"),
    ],
)
async def test_the_database_refuses_a_reason_that_does_not_fit_the_status(engine, status, reason):
    error = await _violation(
        engine,
        "INSERT INTO reservations (order_id, event_id, status, reason, placed_at)"
        " VALUES (gen_random_uuid(), gen_random_uuid(), :status, :reason, now())",
        {"status": status, "reason": reason},
    )

    assert sqlstate_of(error) == CHECK_VIOLATION


@pytest.mark.parametrize(
    ("status", "placed", "tombstone", "shipped"),
    [
        # A tombstone says what it cancelled, and has no placing event or time.
        ("cancelled", False, None, False),
        ("cancelled", True, "order", False),
        ("cancelled", False, "some", False),
        # Only a placed order has its event, and only a shipped one its shipping time.
        ("reserved", False, None, False),
        ("reserved", True, None, True),
        ("shipped", True, None, False),
    ],
)
async def test_the_database_refuses_a_row_that_does_not_fit_its_lifecycle_status(
    engine, status, placed, tombstone, shipped
):
    error = await _violation(
        engine,
        "INSERT INTO reservations (order_id, status, event_id, placed_at, tombstone, shipped_at)"
        " VALUES (gen_random_uuid(), :status, CASE WHEN :placed THEN gen_random_uuid() END,"
        " CASE WHEN :placed THEN now() END, :tombstone, CASE WHEN :shipped THEN now() END)",
        {"status": status, "placed": placed, "tombstone": tombstone, "shipped": shipped},
    )

    assert sqlstate_of(error) == CHECK_VIOLATION


async def test_the_database_keeps_every_lifecycle_status(engine):
    async with engine.begin() as connection:
        await connection.execute(
            sa.text(
                "INSERT INTO reservations"
                " (order_id, status, reason, event_id, placed_at, tombstone, shipped_at)"
                " VALUES (gen_random_uuid(), 'cancelled', NULL, NULL, NULL, 'lines', NULL),"
                " (gen_random_uuid(), 'rejected', 'cancelled', gen_random_uuid(), now(),"
                "  'order', NULL),"
                " (gen_random_uuid(), 'released', NULL, gen_random_uuid(), now(), NULL, NULL),"
                " (gen_random_uuid(), 'shipped', NULL, gen_random_uuid(), now(), NULL, now())"
            )
        )
        count = await connection.scalar(sa.text("SELECT count(*) FROM reservations"))

    assert count == 4


async def test_the_database_refuses_an_unknown_inbox_outcome(engine):
    error = await _violation(
        engine,
        "INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)"
        " VALUES ('c', gen_random_uuid(), gen_random_uuid(), 'duplicate')",
    )

    assert sqlstate_of(error) == CHECK_VIOLATION


async def _reserve(connection, event_id, order_id, skus, quantities):
    """One order, alone in its call of place_orders()."""
    result = await connection.execute(
        sa.text(
            "SELECT outcome, reason, skus FROM place_orders('fulfilment',"
            " CAST(:events AS uuid[]), CAST(:orders AS uuid[]), CAST(:placed AS timestamptz[]),"
            " CAST(:line_orders AS integer[]), CAST(:skus AS text[]),"
            " CAST(:quantities AS integer[]))"
        ),
        {
            "events": [event_id],
            "orders": [order_id],
            "placed": [datetime(2010, 12, 1, 8, 26, tzinfo=UTC)],
            "line_orders": [1] * len(skus),
            "skus": skus,
            "quantities": quantities,
        },
    )
    return tuple(result.one())


async def test_place_orders_records_the_reservation_its_summed_lines_and_the_inbox(engine):
    reserved_order, rejected_order = uuid4(), uuid4()
    first_event, second_event, third_event = uuid4(), uuid4(), uuid4()
    async with engine.begin() as connection:
        await connection.execute(
            sa.text("INSERT INTO stock_levels (sku, on_hand) VALUES ('A', 10), ('B', 1)")
        )
        reserved = await _reserve(
            connection, first_event, reserved_order, ["B", "A", "A"], [1, 2, 3]
        )
        rejected = await _reserve(connection, second_event, rejected_order, ["A", "B"], [1, 1])
        duplicate = await _reserve(connection, third_event, reserved_order, ["A"], [1])
        queries = {
            "reservations": "SELECT order_id, event_id, status, reason, skus FROM reservations"
            " ORDER BY status DESC",
            "lines": "SELECT order_id, sku, quantity FROM reservation_lines"
            " ORDER BY order_id = :first DESC, sku",
            "inbox": "SELECT event_id, order_id, outcome FROM inbox_messages",
            "stock": "SELECT sku, on_hand, reserved FROM stock_levels ORDER BY sku",
        }
        rows = {
            name: (await connection.execute(sa.text(sql), {"first": reserved_order})).all()
            for name, sql in queries.items()
        }

    assert reserved == ("reserved", None, [])
    assert rejected == ("rejected", "insufficient_stock", ["B"])
    assert duplicate == ("duplicate", "order", [])
    assert [tuple(row) for row in rows["reservations"]] == [
        (reserved_order, first_event, "reserved", None, []),
        (rejected_order, second_event, "rejected", "insufficient_stock", ["B"]),
    ]
    assert rows["lines"] == [
        (reserved_order, "A", 5),
        (reserved_order, "B", 1),
        (rejected_order, "A", 1),
        (rejected_order, "B", 1),
    ]
    assert set(rows["inbox"]) == {
        (first_event, reserved_order, "reserved"),
        (second_event, rejected_order, "rejected"),
        (third_event, reserved_order, "duplicate_order"),
    }
    assert rows["stock"] == [("A", 10, 5), ("B", 1, 1)]


@pytest.mark.parametrize(
    ("orders", "line_orders", "skus", "quantities", "sqlstate"),
    [
        (0, [], [], [], "22004"),  # no order
        (1, [], [], [], "22023"),  # no line
        (2, [1], ["A"], [1], "22023"),  # an order without lines
        (1, [1, 2], ["A", "B"], [1, 1], "22023"),  # a line of no order
        (1, [1], ["A"], [0], "22023"),
        (1, [1], ["A"], [-1], "22023"),
        (1, [1], [None], [1], "22023"),
        (1, [1, 1], ["A", "B"], [1], "22023"),  # arrays of different lengths
        (1, [1], ["A"], [], "22023"),
    ],
)
async def test_place_orders_refuses_malformed_batches_and_writes_nothing(
    engine, orders, line_orders, skus, quantities, sqlstate
):
    with pytest.raises(sa.exc.DBAPIError) as raised:
        async with engine.begin() as connection:
            await connection.execute(
                sa.text(
                    "SELECT * FROM place_orders('fulfilment', CAST(:events AS uuid[]),"
                    " CAST(:orders AS uuid[]), CAST(:placed AS timestamptz[]),"
                    " CAST(:line_orders AS integer[]), CAST(:skus AS text[]),"
                    " CAST(:quantities AS integer[]))"
                ),
                {
                    "events": [uuid4() for _ in range(orders)],
                    "orders": [uuid4() for _ in range(orders)],
                    "placed": [datetime(2010, 12, 1, tzinfo=UTC)] * orders,
                    "line_orders": line_orders,
                    "skus": skus,
                    "quantities": quantities,
                },
            )

    assert sqlstate_of(raised.value) == sqlstate
    async with engine.connect() as connection:
        assert await connection.scalar(sa.text("SELECT count(*) FROM inbox_messages")) == 0


CATALOG_QUERIES = {
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, column_default
        FROM information_schema.columns WHERE table_schema = 'public'
        ORDER BY table_name, column_name""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace
        ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
        ORDER BY 1, 2""",
    "functions": """
        SELECT p.oid::regprocedure::text, md5(pg_get_functiondef(p.oid))
        FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace ORDER BY 1""",
    "grants": """
        SELECT grantee, table_name, privilege_type FROM information_schema.role_table_grants
        WHERE table_schema = 'public' ORDER BY 1, 2, 3""",
    # The row's xmin is the transaction that last wrote it: a migration that rewrote the
    # version (even to the same value) would change it.
    "version": "SELECT version_num, xmin::text FROM alembic_version",
}


def _catalog(database_url: str) -> dict[str, list[tuple[object, ...]]]:
    """What the schema is made of, query by query (``CATALOG_QUERIES``), as sorted rows."""
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)

    async def read() -> dict[str, list[tuple[object, ...]]]:
        connection = await asyncpg.connect(dsn)
        try:
            return {
                name: [tuple(row) for row in await connection.fetch(query)]
                for name, query in CATALOG_QUERIES.items()
            }
        finally:
            await connection.close()

    return asyncio.run(read())


def test_migrating_an_up_to_date_database_changes_nothing(database_url):
    schema.migrate(database_url)
    before = _catalog(database_url)

    schema.migrate(database_url)

    after = _catalog(database_url)
    assert all(before.values())  # every query sees the schema it compares
    assert after == before


async def test_migrate_refuses_to_block_a_running_event_loop(database_url):
    with pytest.raises(RuntimeError, match="to_thread"):
        schema.migrate(database_url)

    await asyncio.to_thread(schema.migrate, database_url)


def test_migrate_names_where_it_looked_when_the_migrations_are_missing(tmp_path):
    with pytest.raises(schema.MigrationsNotFoundError, match=str(tmp_path)):
        schema.migrate("postgresql://nowhere/none", script_location=tmp_path)


def test_the_migrations_are_found_from_the_source_tree():
    assert (schema.migrations_location() / "versions").is_dir()


# The session database stands for "PostgreSQL answers" (and fails the test under CI if not).
@pytest.mark.usefixtures("database_url")
def test_downgrading_to_base_drops_everything_and_upgrading_restores_it():
    async def objects():
        connection = await asyncpg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            tables = await connection.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            )
            functions = await connection.fetch(
                "SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
            )
            return {row[0] for row in tables}, {row[0] for row in functions}
        finally:
            await connection.close()

    with throwaway_database("fulfilment_test") as url:
        schema.migrate(url)
        assert asyncio.run(objects()) == (
            {"alembic_version", *metadata.tables},
            FUNCTIONS,
        )
        command.downgrade(schema.alembic_config(url), "base")
        assert asyncio.run(objects()) == ({"alembic_version"}, set())
        schema.migrate(url)
        assert asyncio.run(objects())[1] == FUNCTIONS


async def _function_definitions(url):
    connection = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        rows = await connection.fetch(
            "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid),"
            " obj_description(p.oid, 'pg_proc')"
            " FROM pg_proc AS p WHERE p.pronamespace = 'public'::regnamespace ORDER BY 1"
        )
        return {name: (definition, comment) for name, definition, comment in rows}
    finally:
        await connection.close()


# The session database stands for "PostgreSQL answers" (and fails the test under CI if not).
@pytest.mark.usefixtures("database_url")
def test_downgrading_0006_restores_reserve_order_as_0002_created_it():
    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0005")
        created = asyncio.run(_function_definitions(url))
        command.upgrade(config, "0006")
        dropped = asyncio.run(_function_definitions(url))
        command.downgrade(config, "0005")
        restored = asyncio.run(_function_definitions(url))

    assert {name.split("(")[0] for name in created} == {"reserve_order", "reserve_orders"}
    assert dropped == {
        name: created[name] for name in created if name.startswith("reserve_orders(")
    }
    assert restored == created


# The session database stands for "PostgreSQL answers" (and fails the test under CI if not).
@pytest.mark.usefixtures("database_url")
def test_downgrading_0013_restores_reserve_orders_as_0005_created_it():
    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0012")
        kept = asyncio.run(_function_definitions(url))
        command.upgrade(config, "0013")
        dropped = asyncio.run(_function_definitions(url))
        command.downgrade(config, "0012")
        restored = asyncio.run(_function_definitions(url))

    assert "reserve_orders" in {name.split("(")[0] for name in kept}
    assert dropped == {name: kept[name] for name in kept if not name.startswith("reserve_orders(")}
    assert restored == kept


async def _schema_objects(url):
    connection = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        columns = await connection.fetch(
            "SELECT table_name, column_name, is_nullable, data_type FROM information_schema.columns"
            " WHERE table_schema = 'public' ORDER BY 1, 2"
        )
        checks = await connection.fetch(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2"
        )
        return [tuple(row) for row in columns], [tuple(row) for row in checks]
    finally:
        await connection.close()


# The session database stands for "PostgreSQL answers" (and fails the test under CI if not).
@pytest.mark.usefixtures("database_url")
def test_downgrading_0007_restores_the_schema_and_the_functions_of_0006():
    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0006")
        before = asyncio.run(_schema_objects(url)), asyncio.run(_function_definitions(url))
        command.upgrade(config, "0007")
        command.downgrade(config, "0006")
        after = asyncio.run(_schema_objects(url)), asyncio.run(_function_definitions(url))

    assert after == before


# The session database stands for "PostgreSQL answers" (and fails the test under CI if not).
@pytest.mark.usefixtures("database_url")
def test_downgrading_0007_is_refused_while_an_order_of_the_lifecycle_is_stored():
    async def tombstone(url):
        connection = await asyncpg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            await connection.fetch(
                "SELECT * FROM cancel_orders('fulfilment', $1, $2, $3, ARRAY[true],"
                " '{}', '{}', '{}')",
                [uuid4()],
                [uuid4()],
                [datetime(2010, 12, 1, tzinfo=UTC)],
            )
        finally:
            await connection.close()

    with throwaway_database("fulfilment_test") as url:
        schema.migrate(url)
        asyncio.run(tombstone(url))
        with pytest.raises(sa.exc.DBAPIError, match="lifecycle are stored"):
            command.downgrade(schema.alembic_config(url), "0006")
        functions = {name.split("(")[0] for name in asyncio.run(_function_definitions(url))}

    assert functions == FUNCTIONS


# The session database stands for "PostgreSQL answers" (and fails the test under CI if not).
@pytest.mark.usefixtures("database_url")
def test_a_worker_of_the_release_before_0007_keeps_reserving_until_0013():
    # During a rolling update, workers of the release before 0007 call reserve_orders() v1,
    # which 0007 leaves as it was (0013 drops it), against the new schema: it must still
    # reserve, reject and answer duplicates, and take a tombstoned order for a duplicate of
    # the order.
    with throwaway_database("fulfilment_test") as url:
        command.upgrade(schema.alembic_config(url), "0012")
        plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        asyncio.run(_reserve_orders_v1_on_the_lifecycle(plain))


async def _reserve_orders_v1_on_the_lifecycle(plain):
    placed = datetime(2010, 12, 1, tzinfo=UTC)
    connection = await asyncpg.connect(plain)
    try:
        await connection.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('A', 5)")
        tombstoned = uuid4()
        await connection.fetch(
            "SELECT * FROM cancel_orders('fulfilment', $1, $2, $3, ARRAY[false],"
            " ARRAY[1], ARRAY['A'], ARRAY[1])",
            [uuid4()],
            [tombstoned],
            [placed],
        )
        reserved, short = uuid4(), uuid4()

        rows = await connection.fetch(
            "SELECT outcome, reason FROM reserve_orders('fulfilment', $1, $2, $3,"
            " ARRAY[1, 2, 3], ARRAY['A', 'A', 'A'], ARRAY[3, 9, 1])",
            [uuid4(), uuid4(), uuid4()],
            [reserved, short, tombstoned],
            [placed] * 3,
        )
        statuses = dict(await connection.fetch("SELECT order_id, status FROM reservations"))
        stock = await connection.fetchrow("SELECT on_hand, reserved FROM stock_levels")
        released = await connection.fetch(
            "SELECT outcome, status FROM cancel_orders('fulfilment', $1, $2, $3, ARRAY[true],"
            " '{}', '{}', '{}')",
            [uuid4()],
            [reserved],
            [placed],
        )
    finally:
        await connection.close()

    assert [tuple(row) for row in rows] == [
        ("reserved", None),
        ("rejected", "insufficient_stock"),
        ("duplicate", "order"),
    ]
    assert statuses == {reserved: "reserved", short: "rejected", tombstoned: "cancelled"}
    assert tuple(stock) == (5, 3)
    assert [tuple(row) for row in released] == [("released", "released")]


# The session database stands for "PostgreSQL answers" (and fails the test under CI if not).
@pytest.mark.usefixtures("database_url")
def test_downgrading_0009_restores_the_functions_of_0008():
    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0008")
        before = asyncio.run(_function_definitions(url))
        command.upgrade(config, "0009")
        upgraded = asyncio.run(_function_definitions(url))
        command.downgrade(config, "0008")
        after = asyncio.run(_function_definitions(url))

    assert after == before
    assert sorted(upgraded) == [
        (
            "cancel_orders(text,uuid[],uuid[],timestamp with time zone[],boolean[],integer[],"
            "text[],integer[],text[])"
        ),
        (
            "place_orders(text,uuid[],uuid[],timestamp with time zone[],integer[],text[],"
            "integer[],text[])"
        ),
        "reserve_orders(text,uuid[],uuid[],timestamp with time zone[],integer[],text[],integer[])",
        "ship_orders(text,uuid[],uuid[],timestamp with time zone[],text[])",
    ]


# The session database stands for "PostgreSQL answers" (and fails the test under CI if not).
@pytest.mark.usefixtures("database_url")
def test_a_worker_of_the_previous_release_writes_result_events_once_0009_is_in():
    # During the rolling update of 0009, workers of the previous release keep the statements
    # they prepared against v1 (asyncpg prepares each once per connection) and pass v1's
    # arguments: PostgreSQL plans them again against v2, whose new parameter defaults to NULL.
    placed = datetime(2010, 12, 1, tzinfo=UTC)

    async def across_the_upgrade(url, config):
        connection = await asyncpg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            await connection.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('A', 5)")
            statement = await connection.prepare(
                "SELECT ordinal, outcome, reason, skus"
                " FROM place_orders('fulfilment', $1, $2, $3, $4, $5, $6)"
            )
            before = [
                tuple(row)
                for row in await statement.fetch([uuid4()], [uuid4()], [placed], [1], ["A"], [1])
            ]
            await asyncio.to_thread(command.upgrade, config, "0009")
            after = [
                tuple(row)
                for row in await statement.fetch([uuid4()], [uuid4()], [placed], [1], ["A"], [1])
            ]
            outbox = await connection.fetch("SELECT routing_key, traceparent FROM outbox")
        finally:
            await connection.close()
        return before, after, [tuple(row) for row in outbox]

    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0008")
        before, after, outbox = asyncio.run(across_the_upgrade(url, config))

    assert before == after == [(1, "reserved", None, [])]
    assert outbox == [("stock.reserved", None)]


@pytest.mark.usefixtures("database_url")
def test_downgrading_0011_restores_the_functions_and_checks_of_0010():
    async def checks(url):
        connection = await asyncpg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            rows = await connection.fetch(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conname IN ('inbox_messages_outcome_valid', 'outbox_routing_key_valid')"
            )
            return dict(rows)
        finally:
            await connection.close()

    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0010")
        before = asyncio.run(_function_definitions(url)), asyncio.run(checks(url))
        command.upgrade(config, "0011")
        upgraded = asyncio.run(_function_definitions(url))
        command.downgrade(config, "0010")
        after = asyncio.run(_function_definitions(url)), asyncio.run(checks(url))

    assert after == before
    assert sorted(upgraded) == [
        (
            "cancel_orders(text,uuid[],uuid[],timestamp with time zone[],boolean[],integer[],"
            "text[],integer[],text[],boolean)"
        ),
        (
            "place_orders(text,uuid[],uuid[],timestamp with time zone[],integer[],text[],"
            "integer[],text[],boolean)"
        ),
        "reserve_orders(text,uuid[],uuid[],timestamp with time zone[],integer[],text[],integer[])",
        "ship_orders(text,uuid[],uuid[],timestamp with time zone[],text[])",
    ]


@pytest.mark.usefixtures("database_url")
def test_a_worker_of_the_previous_release_calls_v3_without_the_handoff_once_0011_is_in():
    # Its prepared statements pass v2's arguments; v3's p_handoff defaults to false: no request.
    placed = datetime(2010, 12, 1, tzinfo=UTC)

    async def across_the_upgrade(url, config):
        connection = await asyncpg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            await connection.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('A', 5)")
            statement = await connection.prepare(
                "SELECT ordinal, outcome, reason, skus"
                " FROM place_orders('fulfilment', $1, $2, $3, $4, $5, $6, $7)"
            )
            arguments = ([placed], [1], ["A"], [1], [None])
            before = [tuple(row) for row in await statement.fetch([uuid4()], [uuid4()], *arguments)]
            await asyncio.to_thread(command.upgrade, config, "0011")
            after = [tuple(row) for row in await statement.fetch([uuid4()], [uuid4()], *arguments)]
            requests = await connection.fetchval("SELECT count(*) FROM warehouse_requests")
        finally:
            await connection.close()
        return before, after, requests

    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0010")
        before, after, requests = asyncio.run(across_the_upgrade(url, config))

    assert before == after == [(1, "reserved", None, [])]
    assert requests == 0


@pytest.mark.usefixtures("database_url")
def test_0014_keeps_the_lines_of_the_orders_shipped_before_it_as_shipped():
    placed = datetime(2010, 12, 1, tzinfo=UTC)

    async def place_and_ship(url):
        connection = await asyncpg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            await connection.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('A', 9)")
            shipped, held = uuid4(), uuid4()
            await connection.execute(
                "SELECT * FROM place_orders('fulfilment', $1, $2, $3, $4, $5, $6)",
                [uuid4(), uuid4()],
                [shipped, held],
                [placed, placed],
                [1, 2],
                ["A", "A"],
                [3, 2],
            )
            await connection.execute(
                "SELECT * FROM ship_orders('fulfilment', $1, $2, $3)",
                [uuid4()],
                [shipped],
                [placed],
            )
            return shipped, held
        finally:
            await connection.close()

    async def lines(url):
        connection = await asyncpg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            rows = await connection.fetch(
                "SELECT order_id, quantity, shipped FROM reservation_lines"
            )
            return {row[0]: (row[1], row[2]) for row in rows}
        finally:
            await connection.close()

    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0013")
        shipped, held = asyncio.run(place_and_ship(url))
        command.upgrade(config, "0014")
        after = asyncio.run(lines(url))

    assert after == {shipped: (3, 3), held: (2, 0)}


@pytest.mark.usefixtures("database_url")
def test_downgrading_0015_restores_the_functions_of_0014():
    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0014")
        before = asyncio.run(_function_definitions(url))
        command.upgrade(config, "0015")
        upgraded = asyncio.run(_function_definitions(url))
        command.downgrade(config, "0014")
        after = asyncio.run(_function_definitions(url))

    assert after == before
    assert set(upgraded) - set(before) == {
        (
            "record_shipments(text,uuid[],text[],text[],text[],text[],uuid[],"
            "timestamp with time zone[],text[],text[],integer[],text[],integer[],text[],"
            "integer[],text[])"
        ),
        (
            "record_warehouse_cancellations(text,uuid[],text[],text[],text[],text[],uuid[],"
            "timestamp with time zone[],text[],boolean[],integer[],text[],integer[],text[])"
        ),
    }
    assert {name.split("(")[0] for name in before if upgraded[name] != before[name]} == {
        "cancel_orders",
        "ship_orders",
    }


@pytest.mark.usefixtures("database_url")
def test_downgrading_0014_is_refused_while_an_order_is_shipped_in_part():
    async def ship_in_part(url):
        connection = await asyncpg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            order_id = uuid4()
            await connection.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('A', 9)")
            await connection.execute(
                "SELECT * FROM place_orders('fulfilment', $1, $2, $3, $4, $5, $6)",
                [uuid4()],
                [order_id],
                [datetime(2010, 12, 1, tzinfo=UTC)],
                [1],
                ["A"],
                [3],
            )
            await connection.execute(
                "UPDATE reservation_lines SET shipped = 1 WHERE order_id = $1", order_id
            )
        finally:
            await connection.close()

    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0014")
        asyncio.run(ship_in_part(url))
        with pytest.raises(sa.exc.DBAPIError, match="orders shipped in part are stored"):
            command.downgrade(config, "0013")


@pytest.mark.usefixtures("database_url")
def test_downgrading_0016_restores_the_functions_of_0015():
    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0015")
        before = asyncio.run(_function_definitions(url))
        command.upgrade(config, "0016")
        upgraded = asyncio.run(_function_definitions(url))
        command.downgrade(config, "0015")
        after = asyncio.run(_function_definitions(url))

    assert after == before
    assert set(upgraded) - set(before) == {
        (
            "record_adjustments(text,uuid[],text[],text[],text[],text[],integer[],text[],"
            "timestamp with time zone[],text[],text[],text[],text[],text[])"
        ),
        "stock_shortage_event()",
    }
    assert {name.split("(")[0] for name in before if upgraded[name] != before[name]} == {
        "record_shipments",
        "ship_orders",
    }


@pytest.mark.usefixtures("database_url")
def test_downgrading_0016_is_refused_while_a_sku_is_short():
    async def make_short(url):
        connection = await asyncpg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            await connection.execute(
                "INSERT INTO stock_levels (sku, on_hand, reserved) VALUES ('A', 1, 3)"
            )
        finally:
            await connection.close()

    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0016")
        asyncio.run(make_short(url))
        with pytest.raises(sa.exc.DBAPIError, match="short SKUs are stored"):
            command.downgrade(config, "0015")


async def _index_definitions(url):
    connection = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        rows = await connection.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
        )
    finally:
        await connection.close()
    return {row["indexname"]: row["indexdef"] for row in rows}


@pytest.mark.usefixtures("database_url")
def test_0017_adds_the_prune_and_poll_indexes_and_its_downgrade_drops_only_them():
    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0016")
        before = asyncio.run(_index_definitions(url))
        command.upgrade(config, "0017")
        upgraded = asyncio.run(_index_definitions(url))
        command.downgrade(config, "0016")
        after = asyncio.run(_index_definitions(url))

    assert after == before
    assert {name: upgraded[name] for name in set(upgraded) - set(before)} == {
        "webhook_inbox_received_at_idx": (
            "CREATE INDEX webhook_inbox_received_at_idx"
            " ON public.webhook_inbox USING btree (received_at)"
        ),
        "reservations_reserved_idx": (
            "CREATE INDEX reservations_reserved_idx ON public.reservations USING btree (order_id)"
            " WHERE (status = 'reserved'::text)"
        ),
    }


@pytest.mark.usefixtures("database_url")
def test_an_order_the_previous_release_ships_across_the_upgrade_has_its_lines_shipped():
    # PostgreSQL runs a call to its end with the body it began with: a worker of the previous
    # release whose ship_orders() call began before the upgrade committed ships its order with
    # version 2 after 0014 set the shipped orders' lines. Here the call waits for its inbox
    # row, which another transaction inserted and holds until the upgrade is in.
    placed = datetime(2010, 12, 1, tzinfo=UTC)
    order_id, event_id = uuid4(), uuid4()

    async def across_the_upgrade(url, config):
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        worker, holder = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
        try:
            await worker.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('A', 9)")
            await worker.execute(
                "SELECT * FROM place_orders('fulfilment', $1, $2, $3, $4, $5, $6)",
                [uuid4()],
                [order_id],
                [placed],
                [1],
                ["A"],
                [3],
            )
            holding = holder.transaction()
            await holding.start()
            await holder.execute(
                "INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)"
                " VALUES ('fulfilment', $1, $2, 'shipped')",
                event_id,
                order_id,
            )
            shipping = asyncio.create_task(
                worker.execute(
                    "SELECT * FROM ship_orders('fulfilment', $1, $2, $3)",
                    [event_id],
                    [order_id],
                    [placed],
                )
            )
            for _ in range(250):
                waiting = await holder.fetchval(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                    worker.get_server_pid(),
                )
                if waiting:
                    break
                await asyncio.sleep(0.02)
            assert waiting, "ship_orders() did not wait for its inbox row"
            await asyncio.to_thread(command.upgrade, config, "head")
            await holding.rollback()
            await asyncio.wait_for(shipping, timeout=10)
            status = await worker.fetchval(
                "SELECT status FROM reservations WHERE order_id = $1", order_id
            )
            lines = await worker.fetch(
                "SELECT quantity, shipped FROM reservation_lines WHERE order_id = $1", order_id
            )
            stock = await worker.fetchrow("SELECT on_hand, reserved, shipped FROM stock_levels")
            return status, [tuple(row) for row in lines], tuple(stock)
        finally:
            await holder.close()
            await worker.close()

    with throwaway_database("fulfilment_test") as url:
        config = schema.alembic_config(url)
        command.upgrade(config, "0013")
        status, lines, stock = asyncio.run(across_the_upgrade(url, config))

    assert (status, stock) == ("shipped", (6, 0, 3))
    assert lines == [(3, 3)]
