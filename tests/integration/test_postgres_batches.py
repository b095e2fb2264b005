"""place_orders(): a batch in one transaction decides like its orders one after the other."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from builders import PLACED_AT
from fakes import InMemoryWarehouse
from fulfilment.adapters.postgres import schema
from fulfilment.adapters.postgres.engine import create_engine, create_pool
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.domain.model import OrderLine, OutcomeKind, ReserveStock, StockLevel
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import Settings
from services import throwaway_database
from warehouse_rows import requests_in_database, requests_in_fake

pytestmark = pytest.mark.postgres

SKUS = ("A", "B", "a", "85123A")


@st.composite
def batches(draw):
    """Stock for a few SKUs (some unknown) and up to 20 orders: new ones, redeliveries of an
    earlier event, and earlier orders under a new event."""
    stock = draw(st.dictionaries(st.sampled_from(SKUS), st.integers(0, 8), max_size=len(SKUS)))
    line = st.tuples(st.sampled_from((*SKUS, "UNKNOWN")), st.integers(1, 4))
    commands: list[ReserveStock] = []
    for _ in range(draw(st.integers(1, 20))):
        kind = draw(st.sampled_from(["new", "new", "new", "same event", "same order"]))
        if kind == "same event" and commands:
            commands.append(draw(st.sampled_from(commands)))
            continue
        lines = tuple(OrderLine(sku, n) for sku, n in draw(st.lists(line, min_size=1, max_size=4)))
        order_id = (
            draw(st.sampled_from(commands)).order_id
            if kind == "same order" and commands
            else uuid.uuid4()
        )
        commands.append(ReserveStock(uuid.uuid4(), order_id, PLACED_AT, lines))
    return stock, commands


async def reserve_together(database_url: str, stock, commands, consumer: str, *, handoff=False):
    database = database_options(Settings(database_url=SecretStr(database_url)))
    engine = create_engine(database)
    pool = await create_pool(database)
    try:
        await pool.execute(
            "TRUNCATE inbox_messages, reservation_lines, reservations, stock_levels,"
            " warehouse_requests"
        )
        warehouse = PostgresWarehouse(
            engine,
            consumer=consumer,
            retry_budget_seconds=2.0,
            pool=pool,
            pool_size=1,
            handoff=handoff,
        )
        await warehouse.put_stock(stock)
        outcomes = await asyncio.gather(*(warehouse.apply(command) for command in commands))
        levels = await warehouse.stock(SKUS)
        inbox = dict(await pool.fetch("SELECT event_id, outcome FROM inbox_messages"))
        transactions = await pool.fetchval(
            "SELECT count(DISTINCT processed_at) FROM inbox_messages"
        )
        rows = await pool.fetch("SELECT order_id, event_id, reason, skus FROM reservations")
        lines = await pool.fetch("SELECT order_id, sku, quantity FROM reservation_lines")
        requests = await requests_in_database(pool)
        return outcomes, levels, inbox, transactions, rows, lines, requests
    finally:
        await pool.close()
        await engine.dispose()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=batches(), handoff=st.booleans())
def test_one_transaction_gives_every_order_the_outcome_it_gets_one_after_the_other(
    clean_database, batch, handoff
):
    # With the hand-off, each order reserved also records its fulfilment-order request (pending,
    # the reserved lines, caused by its OrderPlaced), in arrival order.
    stock, commands = batch
    expected = InMemoryWarehouse(handoff=handoff)

    async def one_after_the_other():
        await expected.put_stock(stock)
        return [await expected.apply(command) for command in commands]

    expected_outcomes = asyncio.run(one_after_the_other())

    outcomes, levels, inbox, transactions, rows, lines, requests = asyncio.run(
        reserve_together(clean_database, stock, commands, expected.consumer, handoff=handoff)
    )

    assert outcomes == expected_outcomes
    assert levels == {sku: expected.levels[sku] for sku in stock}
    assert transactions == 1, "the orders must have shared one transaction"
    assert inbox == {event_id: outcome for (_, event_id), outcome in expected.inbox.items()}
    assert {
        row["order_id"]: (row["event_id"], row["reason"], tuple(row["skus"])) for row in rows
    } == {order_id: (r.event_id, r.reason, r.skus) for order_id, r in expected.reservations.items()}
    assert {(row["order_id"], row["sku"]): row["quantity"] for row in lines} == {
        (order_id, sku): units
        for order_id, r in expected.reservations.items()
        for sku, units in r.lines.items()
    }
    assert requests == requests_in_fake(expected)
    assert bool(requests) == (handoff and OutcomeKind.RESERVED in {o.kind for o in outcomes})


async def test_an_order_the_database_refuses_fails_alone_and_its_batch_is_reserved(
    clean_database,
):
    # A constraint standing in for an order whose data the database refuses (not transient).
    url = (
        make_url(clean_database).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    admin = await asyncpg.connect(url)
    database = database_options(Settings(database_url=SecretStr(clean_database)))
    engine = create_engine(database)
    pool = await create_pool(database)
    try:
        await admin.execute(
            "ALTER TABLE reservation_lines ADD CONSTRAINT no_poison CHECK (sku <> 'POISON')"
        )
        warehouse = PostgresWarehouse(
            engine, consumer="fulfilment", retry_budget_seconds=2.0, pool=pool, pool_size=1
        )
        await warehouse.put_stock({"A": 10, "POISON": 10})
        commands = [
            ReserveStock(uuid.uuid4(), uuid.uuid4(), PLACED_AT, (OrderLine(sku, 1),))
            for sku in ("A", "POISON", "A")
        ]

        results = await asyncio.gather(
            *(warehouse.apply(command) for command in commands), return_exceptions=True
        )

        assert [getattr(result, "kind", None) for result in results] == [
            OutcomeKind.RESERVED,
            None,
            OutcomeKind.RESERVED,
        ]
        assert isinstance(results[1], asyncpg.CheckViolationError)
        assert await warehouse.stock(["A", "POISON"]) == {
            "A": StockLevel(10, 2),
            "POISON": StockLevel(10, 0),
        }
        assert await pool.fetchval("SELECT count(*) FROM inbox_messages") == 2
    finally:
        await admin.execute("ALTER TABLE reservation_lines DROP CONSTRAINT IF EXISTS no_poison")
        await admin.close()
        await pool.close()
        await engine.dispose()


# The session database stands for "PostgreSQL answers" (and fails the test under CI if not).
@pytest.mark.usefixtures("database_url")
def test_offending_skus_are_in_code_point_order_on_a_database_of_another_collation():
    # In en-US order "a" sorts before "B"; the contract (and decide) say code-point order.
    async def reserve_short_skus(url):
        plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        connection = await asyncpg.connect(plain)
        try:
            await connection.execute(
                "INSERT INTO stock_levels (sku, on_hand) VALUES ('B', 1), ('a', 1), ('C', 5)"
            )
            one = await connection.fetchrow(
                "SELECT outcome, reason, skus FROM place_orders('fulfilment', $1, $2, $3,"
                " ARRAY[1, 1, 1], ARRAY['a', 'C', 'B'], ARRAY[2, 1, 2])",
                [uuid.uuid4()],
                [uuid.uuid4()],
                [PLACED_AT],
            )
            batch = await connection.fetch(
                "SELECT outcome, reason, skus FROM place_orders('fulfilment', $1, $2, $3,"
                " ARRAY[1, 1, 1, 2, 2], ARRAY['a', 'C', 'B', 'b', 'A'], ARRAY[2, 1, 2, 1, 1])",
                [uuid.uuid4(), uuid.uuid4()],
                [uuid.uuid4(), uuid.uuid4()],
                [PLACED_AT, PLACED_AT],
            )
            stored = await connection.fetch("SELECT skus FROM reservations ORDER BY skus")
            return one, batch, stored
        finally:
            await connection.close()

    icu = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
    with throwaway_database("fulfilment_test_icu", icu) as url:
        schema.migrate(url)
        one, batch, stored = asyncio.run(reserve_short_skus(url))

    assert tuple(one) == ("rejected", "insufficient_stock", ["B", "a"])
    assert [tuple(row) for row in batch] == [
        ("rejected", "insufficient_stock", ["B", "a"]),
        ("rejected", "unknown_sku", ["A", "b"]),
    ]
    assert sorted(row["skus"] for row in stored) == [["A", "b"], ["B", "a"], ["B", "a"]]
