"""Many writers at once against the real database: no oversell, no double reservation, no
deadlock, also with cancels and shipments among the orders. The assertions are on the final
state, not on timing."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import UTC, datetime
from uuid import uuid4

import pytest
from pydantic import SecretStr

from builders import cancellation, order, shipment
from fakes import InMemoryWarehouse
from fulfilment.adapters.postgres.engine import create_pool
from fulfilment.adapters.postgres.outcomes import outcome_report
from fulfilment.adapters.postgres.retry import sqlstate_of
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.domain.handoff import Accepted, Failed, Refused, RequestKind
from fulfilment.domain.lifecycle import CancelOrder, ShipKind
from fulfilment.domain.model import (
    DuplicateOf,
    OutcomeKind,
    RejectionReason,
    ReserveStock,
)
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import Settings

pytestmark = pytest.mark.postgres

CONNECTIONS = 20
DEADLOCK_DETECTED = "40P01"
LOCK_TIMEOUT = "55P03"


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

    outcomes = await asyncio.gather(*(warehouse.apply(command) for command in orders))

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

    outcomes = await asyncio.gather(*(warehouse.apply(command) for _ in range(50)))

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

    outcomes = await asyncio.gather(*(warehouse.apply(command) for command in commands))

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

    outcomes = await asyncio.gather(*(warehouse.apply(command) for command in orders))

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
        asyncio.gather(*(warehouse.apply(command) for command in orders)), loads()
    )

    assert {outcome.kind for outcome in outcomes} == {OutcomeKind.RESERVED}
    assert DEADLOCK_DETECTED not in {sqlstate_of(error) for error in retries}
    levels = await warehouse.stock(skus)
    assert {level.reserved for level in levels.values()} == {100}


@pytest.mark.parametrize("orders_per_call", [1, 3])
async def test_the_function_locks_in_one_order_whatever_order_it_is_sent(pool, orders_per_call):
    # The warehouse already sends SKUs sorted; other callers of place_orders() may not.
    skus = ["A", "B", "C", "a", "b"]
    await pool.execute(
        "INSERT INTO stock_levels (sku, on_hand) SELECT unnest($1::text[]), 10000", skus
    )
    rng = random.Random(11)
    calls = [[rng.sample(skus, len(skus)) for _ in range(orders_per_call)] for _ in range(300)]

    async def reserve(call):
        rows = await pool.fetch(
            "SELECT outcome FROM place_orders('fulfilment', $1, $2, $3, $4, $5, $6)",
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


def _history(rng, skus, *, kind):
    """An order's events, in order: placed, then cancelled whole (kind 0), cancelled in part
    once or twice (1), shipped (2), or nothing more (3)."""
    lines = [(sku, rng.randint(1, 4)) for sku in rng.sample(skus, rng.randint(1, len(skus)))]
    placed = order(*lines)
    history = [placed]
    if kind == 0:
        history.append(cancellation(placed.order_id))
    elif kind == 1:
        for _ in range(rng.randint(1, 2)):
            sku, units = rng.choice(lines)
            history.append(cancellation(placed.order_id, (sku, rng.randint(1, units))))
    elif kind == 2:
        history.append(shipment(placed.order_id))
    return history


async def _apply(target, event):
    if isinstance(event, ReserveStock):
        return await target.apply(event)
    if isinstance(event, CancelOrder):
        return await target.apply(event)
    return await target.apply(event)


async def test_cancels_shipments_and_orders_on_the_same_hot_skus_never_deadlock(
    warehouse, pool, retries
):
    # Every event of 300 orders at once, in a shuffled order, on five hot SKUs: cancels often
    # come before their orders (tombstones), and transactions of the three kinds lock the same
    # reservations and stock rows. Shipments go only to orders without cancels (a cancel and a
    # shipment do not commute); one that comes before its order is replayed at the end, as an
    # operator would. With enough stock the end is the in-order sequence's.
    hot = dict.fromkeys(["85123A", "22423", "47566", "84879", "a"], 100_000)
    await warehouse.put_stock(hot)
    rng = random.Random(20101202)
    histories = [_history(rng, sorted(hot), kind=i % 4) for i in range(300)]
    events = [event for history in histories for event in history]
    rng.shuffle(events)

    outcomes = await asyncio.gather(*(_apply(warehouse, event) for event in events))
    early = [
        event
        for event, outcome in zip(events, outcomes, strict=True)
        if getattr(outcome, "kind", None) is ShipKind.NOT_RESERVED
    ]
    replayed = await asyncio.gather(*(warehouse.apply(event) for event in early))

    expected = InMemoryWarehouse()
    await expected.put_stock(hot)
    for history in histories:
        for event in history:
            await _apply(expected, event)
    # A deadlock shows as either: the sessions' lock_timeout (1 s) is also the server's
    # deadlock_timeout, so the first to give up may be a lock timeout.
    assert {DEADLOCK_DETECTED, LOCK_TIMEOUT}.isdisjoint(sqlstate_of(error) for error in retries)
    assert {outcome.kind for outcome in replayed} <= {ShipKind.SHIPPED}
    assert await warehouse.stock(hot) == {sku: expected.levels[sku] for sku in hot}
    held = {
        (row["order_id"], row["sku"]): row["quantity"]
        for row in await pool.fetch(
            "SELECT l.order_id, l.sku, l.quantity FROM reservation_lines AS l"
            " JOIN reservations AS r USING (order_id) WHERE r.status IN ('reserved', 'shipped')"
        )
    }
    assert held == {
        (order_id, sku): units
        for order_id, r in expected.reservations.items()
        if r.status in {"reserved", "shipped"}
        for sku, units in r.lines.items()
    }
    statuses = Counter(row["status"] for row in await pool.fetch("SELECT status FROM reservations"))
    assert statuses["shipped"] == 75
    assert statuses["released"] + statuses["rejected"] >= 75
    assert pool.get_size() >= 16, "the events must have run on many connections"


async def test_cancels_and_shipments_lock_in_one_order_whatever_order_they_are_sent(pool):
    # Orders reserved together, then cancelled (lines in any order) and shipped in calls that
    # each name several of them in a shuffled order, concurrently with new reservations.
    skus = ["A", "B", "C", "a", "b"]
    await pool.execute(
        "INSERT INTO stock_levels (sku, on_hand) SELECT unnest($1::text[]), 100000", skus
    )
    rng = random.Random(13)
    order_ids = [uuid4() for _ in range(240)]
    now = datetime.now(UTC)
    await pool.fetch(
        "SELECT outcome FROM place_orders('fulfilment', $1, $2, $3, $4, $5, $6)",
        [uuid4() for _ in order_ids],
        order_ids,
        [now] * len(order_ids),
        [ordinal for ordinal in range(1, len(order_ids) + 1) for _ in skus],
        skus * len(order_ids),
        [2] * len(skus) * len(order_ids),
    )
    shuffled = rng.sample(order_ids, len(order_ids))
    cancel_calls = [shuffled[i : i + 3] for i in range(0, 120, 3)]
    ship_calls = [shuffled[i : i + 3] for i in range(120, 240, 3)]

    cancelled = Counter()

    async def cancel(call, lines):
        await pool.fetch(
            "SELECT outcome FROM cancel_orders('fulfilment', $1, $2, $3, $4, $5, $6, $7)",
            [uuid4() for _ in call],
            call,
            [now] * len(call),
            [False] * len(call),
            [ordinal for ordinal, sequence in enumerate(lines, 1) for _ in sequence],
            [sku for sequence in lines for sku in sequence],
            [1] * 3 * len(call),
        )

    async def ship(call):
        await pool.fetch(
            "SELECT outcome FROM ship_orders('fulfilment', $1, $2, $3)",
            [uuid4() for _ in call],
            call,
            [now] * len(call),
        )

    async def reserve():
        await pool.fetch(
            "SELECT outcome FROM place_orders('fulfilment', $1, $2, $3, $4, $5, $6)",
            [uuid4()],
            [uuid4()],
            [now],
            [1] * len(skus),
            rng.sample(skus, len(skus)),
            [1] * len(skus),
        )

    calls = []
    for call in cancel_calls:
        lines = [rng.sample(skus, 3) for _ in call]
        cancelled.update(sku for sequence in lines for sku in sequence)
        calls.append(cancel(call, lines))
    calls += [ship(call) for call in ship_calls]
    calls += [reserve() for _ in range(40)]
    rng.shuffle(calls)
    await asyncio.gather(*calls)

    levels = {
        row["sku"]: (row["on_hand"], row["reserved"])
        for row in await pool.fetch("SELECT sku, on_hand, reserved FROM stock_levels")
    }
    # 240 orders of 2 units per SKU: 120 shipped, 120 cancelled a unit of 3 SKUs each; 40 new.
    assert levels == {sku: (100_000 - 120 * 2, 120 * 2 - cancelled[sku] + 40) for sku in skus}


async def test_with_the_handoff_the_dispatcher_and_the_worker_never_deadlock_nor_lose_units(
    engine, pool, retries
):
    # The worker's three kinds of transactions with the hand-off on, and two dispatchers at
    # once claiming and answering (fulfilment orders accepted, or failed for every tenth
    # order; cancellations accepted or refused), all on five hot SKUs. Cancels, answers and
    # shipments race: the stock must stay the sum of what the reserved orders hold, every
    # placed order must have exactly one fulfilment order, and nothing may deadlock.
    warehouse = PostgresWarehouse(
        engine,
        consumer="fulfilment",
        retry_budget_seconds=5.0,
        on_retry=retries.append,
        pool=pool,
        pool_size=CONNECTIONS - 4,
        batch_max=4,
        handoff=True,
    )
    requests = PostgresWarehouseRequests(engine, retry_budget_seconds=5.0, on_retry=retries.append)
    hot = dict.fromkeys(["85123A", "22423", "47566", "84879", "a"], 100_000)
    await warehouse.put_stock(hot)
    rng = random.Random(20261202)
    histories = [_history(rng, sorted(hot), kind=i % 4) for i in range(160)]
    failing = {history[0].order_id for history in histories[::10]}
    events = [event for history in histories for event in history]
    rng.shuffle(events)
    done = asyncio.Event()

    async def dispatcher(seed: int) -> int:
        answers = random.Random(seed)
        recorded = 0
        while True:
            finished = done.is_set()
            claimed = await requests.claim(8, lease_seconds=30.0)
            for request in claimed:
                if request.kind is RequestKind.CANCELLATION:
                    answer = (
                        Accepted(201, '{"status": "cancelled"}')
                        if answers.random() < 0.7
                        else Refused(409, '{"error": "too_late"}')
                    )
                elif request.order_id in failing:
                    answer = Failed("refused", '{"error": "unknown sku"}', 422)
                else:
                    answer = Accepted(201, "{}", f"WH-{request.id}")
                await requests.record(request, answer)
                recorded += 1
            if finished and not claimed:
                return recorded
            if not claimed:
                await asyncio.sleep(0.01)

    async def worker():
        outcomes = await asyncio.gather(*(_apply(warehouse, event) for event in events))
        early = [
            event
            for event, outcome in zip(events, outcomes, strict=True)
            if getattr(outcome, "kind", None) is ShipKind.NOT_RESERVED
        ]
        await asyncio.gather(*(warehouse.apply(event) for event in early))
        done.set()

    _, first, second = await asyncio.gather(worker(), dispatcher(1), dispatcher(2))

    assert {DEADLOCK_DETECTED, LOCK_TIMEOUT}.isdisjoint(sqlstate_of(error) for error in retries)
    assert first + second > 0
    levels = await warehouse.stock(hot)
    held = Counter[str]()
    for row in await pool.fetch(
        "SELECT l.sku, l.quantity FROM reservation_lines AS l"
        " JOIN reservations AS r USING (order_id) WHERE r.status = 'reserved'"
    ):
        held[row["sku"]] += row["quantity"]
    assert {sku: level.reserved for sku, level in levels.items()} == {sku: held[sku] for sku in hot}
    assert all(0 <= level.reserved <= level.on_hand for level in levels.values())
    per_order = Counter(
        row["order_id"]
        for row in await pool.fetch(
            "SELECT order_id FROM warehouse_requests WHERE kind = 'fulfilment_order'"
        )
    )
    placed = {
        row["order_id"]
        for row in await pool.fetch(
            "SELECT order_id FROM reservations WHERE status IN ('reserved', 'shipped', 'released')"
            " AND reason IS NULL"
        )
    }
    assert set(per_order) == placed
    assert set(per_order.values()) == {1}
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM warehouse_requests WHERE status IN ('pending', 'sending')"
        )
        == 0
    )
    # Every cancellation released at most once: one stock.released per cancel at most.
    causes = Counter(
        row["causation_id"]
        for row in await pool.fetch(
            "SELECT body->>'causation_id' AS causation_id FROM outbox"
            " WHERE routing_key = 'stock.released'"
        )
    )
    assert set(causes.values()) <= {1}
