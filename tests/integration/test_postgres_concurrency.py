"""Many writers at once against the real database: no oversell, no double reservation, no
deadlock. The assertions are on the final state, not on timing."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import UTC, datetime
from uuid import uuid4

import pytest
from pydantic import SecretStr

from builders import order
from fulfilment.adapters.postgres.engine import create_engine, create_pool
from fulfilment.adapters.postgres.outcomes import outcome_report
from fulfilment.adapters.postgres.retry import sqlstate_of
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.composition import database_options
from fulfilment.domain.model import (
    DuplicateOf,
    OutcomeKind,
    RejectionReason,
    ReserveStock,
)
from fulfilment.settings import Settings

pytestmark = pytest.mark.postgres

CONNECTIONS = 20
DEADLOCK_DETECTED = "40P01"


@pytest.fixture
async def engine(clean_database):
    engine = create_engine(database_options(Settings(database_url=SecretStr(clean_database))))
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
async def pool(clean_database):
    pool = await create_pool(
        database_options(
            Settings(database_url=SecretStr(clean_database), database_pool_size=CONNECTIONS)
        )
    )
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def retries():
    return []


@pytest.fixture
def warehouse(engine, pool, retries):
    # Many transactions of a few orders each: orders contend within and across transactions.
    return PostgresWarehouse(
        engine,
        consumer="fulfilment",
        retry_budget_seconds=5.0,
        on_retry=retries.append,
        pool=pool,
        pool_size=CONNECTIONS,
        batch_max=4,
    )


async def test_hot_skus_are_never_oversold_by_many_concurrent_orders(
    warehouse, engine, pool, retries
):
    hot = {"85123A": 120, "22423": 90, "47566": 60, "84879": 150, "BANK CHARGES": 40}
    await warehouse.put_stock(hot)
    rng = random.Random(20101201)
    orders = []
    for _ in range(400):
        skus = rng.sample(sorted(hot), rng.randint(1, 3))
        lines = [(sku, rng.randint(1, 4)) for sku in skus]
        if rng.random() < 0.2:  # the same SKU on a second line
            lines.append((lines[0][0], 1))
        rng.shuffle(lines)
        orders.append(order(*lines))
    demanded = Counter()
    for command in orders:
        demanded.update(command.demand())
    assert all(demanded[sku] > units for sku, units in hot.items()), "demand must exceed stock"

    outcomes = await asyncio.gather(*(warehouse.reserve(command) for command in orders))

    levels = await warehouse.stock(hot)
    reserved_demand = Counter()
    for command, outcome in zip(orders, outcomes, strict=True):
        if outcome.kind is OutcomeKind.RESERVED:
            reserved_demand.update(command.demand())
    assert {sku: level.reserved for sku, level in levels.items()} == {
        sku: reserved_demand[sku] for sku in hot
    }
    assert all(level.reserved <= level.on_hand for level in levels.values())
    # Available units only shrink, so every rejection must still be justified at the end: an
    # order turned away while it would have fitted would show up here.
    for command, outcome in zip(orders, outcomes, strict=True):
        if outcome.kind is OutcomeKind.REJECTED:
            assert outcome.reason is RejectionReason.INSUFFICIENT_STOCK
            assert outcome.skus
            assert all(levels[sku].available < command.demand()[sku] for sku in outcome.skus), (
                outcome
            )
    kinds = Counter(outcome.kind for outcome in outcomes)
    assert kinds[OutcomeKind.RESERVED] > 0
    assert kinds[OutcomeKind.REJECTED] > 0
    assert kinds[OutcomeKind.RESERVED] + kinds[OutcomeKind.REJECTED] == len(orders)
    assert DEADLOCK_DETECTED not in {sqlstate_of(error) for error in retries}
    assert pool.get_size() >= 16, "the orders must have run on many connections"
    report = await outcome_report(engine)
    assert report.ok, report
    assert report.reserved == kinds[OutcomeKind.RESERVED]


async def test_fifty_concurrent_deliveries_of_one_event_reserve_it_once(warehouse):
    await warehouse.put_stock({"A": 100})
    command = order(("A", 3), ("A", 2))

    outcomes = await asyncio.gather(*(warehouse.reserve(command) for _ in range(50)))

    assert Counter(outcome.label for outcome in outcomes) == {
        "reserved": 1,
        "duplicate:event": 49,
    }
    assert (await warehouse.stock(["A"]))["A"].reserved == 5


async def test_fifty_concurrent_events_of_one_order_reserve_it_once(warehouse):
    await warehouse.put_stock({"A": 100})
    first = order(("A", 5))
    commands = [
        ReserveStock(uuid4(), first.order_id, first.placed_at, first.lines) for _ in range(50)
    ]

    outcomes = await asyncio.gather(*(warehouse.reserve(command) for command in commands))

    assert Counter(outcome.label for outcome in outcomes) == {
        "reserved": 1,
        f"duplicate:{DuplicateOf.ORDER}": 49,
    }
    assert (await warehouse.stock(["A"]))["A"].reserved == 5


async def test_orders_locking_the_same_skus_in_opposite_orders_never_deadlock(warehouse, retries):
    skus = ["A", "B", "C", "a", "b"]
    await warehouse.put_stock(dict.fromkeys(skus, 10_000))
    rng = random.Random(7)
    orders = []
    for i in range(300):
        lines = [(sku, 1) for sku in skus]
        # Forward, backward, and shuffled: the lock order must not depend on the line order.
        if i % 3 == 0:
            lines.reverse()
        elif i % 3 == 1:
            rng.shuffle(lines)
        orders.append(order(*lines))

    outcomes = await asyncio.gather(*(warehouse.reserve(command) for command in orders))

    assert {outcome.kind for outcome in outcomes} == {OutcomeKind.RESERVED}
    assert DEADLOCK_DETECTED not in {sqlstate_of(error) for error in retries}
    levels = await warehouse.stock(skus)
    assert {sku: level.reserved for sku, level in levels.items()} == dict.fromkeys(skus, 300)


async def test_a_stock_load_running_with_reservations_neither_deadlocks_nor_loses_units(
    warehouse, retries
):
    skus = [f"S{i:02d}" for i in range(10)]
    await warehouse.put_stock(dict.fromkeys(skus, 1_000))
    orders = [order(*((sku, 1) for sku in reversed(skus))) for _ in range(100)]

    async def loads():
        for on_hand in range(1_000, 1_200, 10):
            await warehouse.put_stock(dict.fromkeys(reversed(skus), on_hand))

    outcomes, _ = await asyncio.gather(
        asyncio.gather(*(warehouse.reserve(command) for command in orders)), loads()
    )

    assert {outcome.kind for outcome in outcomes} == {OutcomeKind.RESERVED}
    assert DEADLOCK_DETECTED not in {sqlstate_of(error) for error in retries}
    levels = await warehouse.stock(skus)
    assert {level.reserved for level in levels.values()} == {100}


@pytest.mark.parametrize("orders_per_call", [1, 3])
async def test_the_function_locks_in_one_order_whatever_order_it_is_sent(pool, orders_per_call):
    # The warehouse already sends SKUs sorted; other callers of reserve_orders() may not.
    skus = ["A", "B", "C", "a", "b"]
    await pool.execute(
        "INSERT INTO stock_levels (sku, on_hand) SELECT unnest($1::text[]), 10000", skus
    )
    rng = random.Random(11)
    calls = [[rng.sample(skus, len(skus)) for _ in range(orders_per_call)] for _ in range(300)]

    async def reserve(call):
        rows = await pool.fetch(
            "SELECT outcome FROM reserve_orders('fulfilment', $1, $2, $3, $4, $5, $6)",
            [uuid4() for _ in call],
            [uuid4() for _ in call],
            [datetime.now(UTC) for _ in call],
            [ordinal for ordinal, sequence in enumerate(call, 1) for _ in sequence],
            [sku for sequence in call for sku in sequence],
            [1] * len(skus) * len(call),
        )
        return [row["outcome"] for row in rows]

    outcomes = await asyncio.gather(*(reserve(call) for call in calls))

    assert {outcome for call in outcomes for outcome in call} == {"reserved"}
