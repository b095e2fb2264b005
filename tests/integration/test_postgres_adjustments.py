"""Adjustments among the lifecycle's events: PostgreSQL agrees with the rule, and stock stays
exact (issue 37's property).

Random histories of orders (placed, cancelled by the shop and the warehouse, shipped by the
warehouse and upstream) interleaved with adjustments of the same SKUs (receipts and losses,
some larger than on hand, some of SKUs never stocked), in any arrival order with copies, are
applied one after the other to the fake and in runs (group commit) to PostgreSQL. Both give the
same outcomes, stock, rows and result events (per order and per SKU, in order), and:

- ``on_hand`` = loaded + the units adjustments applied − the units shipments took, each
  shipment taking ``on_hand`` to 0 at the lowest (a short SKU shipping units reported lost);
- ``reserved`` = the units the orders hold;
- a SKU is short only after a loss of it was reported;
- no order is reserved while a SKU it asks for is short.

Then hot SKUs under concurrent adjustments and reservations from several stock stores: no
invariant violation, every adjustment applied once.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Self

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.outcomes import outcome_report
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.domain.lifecycle import ShipKind, ShipOutcome
from fulfilment.domain.model import OutcomeKind, PlaceOrder, RejectionReason
from fulfilment.domain.warehouse_events import (
    AdjustmentKind,
    AdjustmentOutcome,
    AdjustmentReason,
    RecordAdjustment,
    ShipmentKind,
    ShipmentOutcome,
    Source,
    warehouse_event_id,
)
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.integration.test_postgres_warehouse_lifecycle import (
    WarehouseDatabase,
    _apply_in_runs,
    _recorded,
)
from tests.support.builders import order
from tests.support.fakes import FakeStock, RecordedEvent
from tests.support.warehouse_commands import WAREHOUSE_ADJUSTED_AT
from tests.support.warehouse_event_rows import adjustments, order_lines
from tests.support.warehouse_histories import (
    SKUS,
    Event,
    any_arrival,
    mixed_histories,
)

pytestmark = pytest.mark.postgres

NEW_SKU = "N"
"""A SKU no stock load names: a receipt creates it, a loss of it is all a discrepancy."""

PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def adjustment(sku: str, delta: int) -> RecordAdjustment:
    """A new adjustment of ``delta`` units of ``sku``, brought by a new webhook."""
    adjustment_id = f"ADJ-{uuid.uuid4().hex[:12]}"
    return RecordAdjustment(
        event_id=warehouse_event_id("adjustment", adjustment_id),
        adjustment_id=adjustment_id,
        webhook_id=f"msg_{uuid.uuid4().hex}",
        sku=sku,
        delta=delta,
        reason=AdjustmentReason.RECEIVED if delta > 0 else AdjustmentReason.DAMAGED,
        occurred_at=WAREHOUSE_ADJUSTED_AT,
        source=Source.WEBHOOK,
    )


@st.composite
def with_adjustments(draw: st.DrawFn) -> list[Event | RecordAdjustment]:
    """An arrival of mixed histories with adjustments (and copies of some) anywhere in it."""
    events: list[Event | RecordAdjustment] = list(draw(any_arrival(draw(mixed_histories()))))
    delta = st.integers(-6, 4).filter(bool)
    for _ in range(draw(st.integers(1, 6))):
        sku = draw(st.sampled_from([*SKUS, NEW_SKU]))
        events.insert(draw(st.integers(0, len(events))), adjustment(sku, draw(delta)))
    for index in range(len(events)):
        if isinstance(events[index], RecordAdjustment) and draw(st.integers(0, 4)) == 0:
            again = events[index]
            assert isinstance(again, RecordAdjustment)
            copy = (
                again
                if draw(st.booleans())
                else RecordAdjustment(**{**_fields(again), "webhook_id": f"msg_{uuid.uuid4().hex}"})
            )
            events.insert(draw(st.integers(index + 1, len(events))), copy)
    return events


def _fields(command: RecordAdjustment) -> dict[str, object]:
    return {name: getattr(command, name) for name in RecordAdjustment.__dataclass_fields__}


def by_subject(events: Sequence[RecordedEvent]) -> dict[str, list[RecordedEvent]]:
    """The result events per order or SKU, in the order written: what the relay keeps."""
    grouped: dict[str, list[RecordedEvent]] = defaultdict(list)
    for event in events:
        subject = event.body.get("order_id") or f"sku:{event.body['sku']}"
        grouped[str(subject)].append(RecordedEvent(event.routing_key, event.body, None))
    return dict(grouped)


class AdjustmentsDatabase(WarehouseDatabase):
    """The lifecycle's test database with the adjustments emptied too."""

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        await self.pool.execute("TRUNCATE warehouse_adjustments")
        return self


async def one_after_the_other(
    stock: dict[str, int], events: Sequence[Event | RecordAdjustment]
) -> tuple[FakeStock, list[object]]:
    """The fake after ``events`` one by one; checks that no order is reserved while short."""
    fake = FakeStock()
    await fake.put_stock(stock)
    outcomes: list[object] = []
    for event in events:
        short_before = {sku for sku, level in fake.levels.items() if level.short}
        outcome = await fake.apply(event)  # type: ignore[arg-type]
        if isinstance(event, PlaceOrder) and short_before & set(event.demand()):
            assert outcome.kind is not OutcomeKind.RESERVED, (event, fake.levels)
            if outcome.kind is OutcomeKind.REJECTED:
                assert outcome.reason in {
                    RejectionReason.INSUFFICIENT_STOCK,
                    RejectionReason.CANCELLED,
                }
        outcomes.append(outcome)
    return fake, outcomes


def expected_on_hand(stock: dict[str, int], outcomes: Sequence[object]) -> dict[str, int]:
    """``on_hand`` per SKU as the outcomes say, in arrival order: loaded, plus what each
    adjustment applied, less what each shipment took but never below 0."""
    on_hand = dict(stock)
    for outcome in outcomes:
        # A loss of a SKU never stocked creates no row: it applied nothing.
        if isinstance(outcome, AdjustmentOutcome) and outcome.applied:
            on_hand[outcome.sku] = on_hand.get(outcome.sku, 0) + outcome.applied
        shipped = (isinstance(outcome, ShipOutcome) and outcome.kind is ShipKind.SHIPPED) or (
            isinstance(outcome, ShipmentOutcome) and outcome.kind is ShipmentKind.SHIPPED
        )
        if shipped:
            assert isinstance(outcome, ShipOutcome | ShipmentOutcome)
            for line in outcome.lines:
                on_hand[line.sku] = max(0, on_hand[line.sku] - line.quantity)
    return on_hand


@PROPERTY
@given(data=st.data())
def test_adjustments_among_the_lifecycle_agree_with_the_rule_and_keep_stock_exact(
    clean_database, data
):
    events = data.draw(with_adjustments())
    stock = data.draw(st.fixed_dictionaries({sku: st.integers(0, 6) for sku in SKUS}))

    fake, expected = asyncio.run(one_after_the_other(stock, events))

    async def on_postgresql():
        async with AdjustmentsDatabase(clean_database) as database:
            await database.stock.put_stock(stock)
            outcomes = await _apply_in_runs(database.stock, events)  # type: ignore[arg-type]
            levels, _, _ = await database.state()
            return (
                outcomes,
                levels,
                await database.recorded(),
                await adjustments(database.pool),
                await database.result_bodies(),
                await outcome_report(database.stock.engine),
            )

    outcomes, levels, recorded, adjusted, result_events, report = asyncio.run(on_postgresql())

    assert outcomes == expected
    assert levels == dict(fake.levels)
    assert recorded == asyncio.run(_recorded(fake))
    assert adjusted == asyncio.run(adjustments(fake))
    assert by_subject(result_events) == by_subject(fake.result_events)
    # on_hand = loaded + adjustments - units shipped and taken; reserved = held lines.
    assert {sku: level.on_hand for sku, level in levels.items()} == expected_on_hand(
        stock, outcomes
    )
    rows = asyncio.run(_order_rows(fake))
    held: Counter[str] = Counter()
    for status, lines in rows.values():
        if status == "reserved":
            held.update({sku: quantity - out for sku, (quantity, out) in lines.items()})
    assert {sku: level.reserved for sku, level in levels.items()} == {
        sku: held[sku] for sku in levels
    }
    # A SKU is short only after a reported loss of it; short SKUs are no violation.
    losses = {
        outcome.sku
        for outcome in outcomes
        if isinstance(outcome, AdjustmentOutcome) and outcome.applied < 0
    }
    short = {sku for sku, level in levels.items() if level.short}
    assert short <= losses
    assert report.ok, report.invariants
    assert (report.shortage.skus, report.shortage.units) == (
        len(short),
        sum(levels[sku].short for sku in short),
    )


async def _order_rows(fake: FakeStock):
    return await order_lines(fake)


# --- Hot SKUs under concurrent adjustments and reservations ------------------------------------

STORES = 3
HOT = ("H1", "H2")


async def test_hot_skus_under_concurrent_adjustments_and_reservations_stay_exact(
    clean_database,
):
    options = database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    engines = [create_engine(options) for _ in range(STORES)]
    stores = [
        PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=30.0, batch_max=8)
        for engine in engines
    ]
    rng = random.Random(37)
    loaded = {"H1": 40, "H2": 40}
    adjustments_sent = [
        adjustment(rng.choice(HOT), rng.choice([-5, -3, -1, 2, 4])) for _ in range(120)
    ]
    orders = [order((rng.choice(HOT), rng.randint(1, 3))) for _ in range(120)]
    try:
        await stores[0].put_stock(loaded)

        async def send(index: int, command: object) -> object:
            # Each command goes to one store, its copy to another: the same adjustment at two
            # replicas of the intake at once.
            first = stores[index % STORES].apply(command)  # type: ignore[arg-type]
            if isinstance(command, RecordAdjustment) and index % 4 == 0:
                again = stores[(index + 1) % STORES].apply(command)
                results = await asyncio.gather(first, again)
                return results[0] if results[0].kind is AdjustmentKind.ADJUSTED else results[1]
            return await first

        mixed: list[object] = [*adjustments_sent, *orders]
        rng.shuffle(mixed)
        outcomes = await asyncio.gather(*(send(i, c) for i, c in enumerate(mixed)))
        report = await outcome_report(engines[0])
        levels = await stores[0].levels_of(HOT)
        async with engines[0].connect() as connection:
            raw = await connection.get_raw_connection()
            counted = await raw.driver_connection.fetch(  # type: ignore[union-attr]
                "SELECT count(*) AS rows, count(DISTINCT adjustment_id) AS ids,"
                " coalesce(sum(applied), 0) AS applied FROM warehouse_adjustments"
            )
            reserved_units = await raw.driver_connection.fetchval(  # type: ignore[union-attr]
                "SELECT coalesce(sum(quantity - shipped), 0) FROM reservation_lines AS l"
                " JOIN reservations AS r USING (order_id) WHERE r.status = 'reserved'"
            )
            events = await raw.driver_connection.fetch(  # type: ignore[union-attr]
                "SELECT routing_key, body FROM outbox WHERE sku IS NOT NULL ORDER BY id"
            )
    finally:
        for engine in engines:
            await engine.dispose()

    applied = [o for o in outcomes if isinstance(o, AdjustmentOutcome)]
    assert all(o.kind is AdjustmentKind.ADJUSTED for o in applied)
    assert (counted[0]["rows"], counted[0]["ids"]) == (len(adjustments_sent),) * 2
    assert report.ok, report.invariants
    on_hand = {sku: loaded[sku] for sku in HOT}
    for outcome in applied:
        on_hand[outcome.sku] += outcome.applied
    assert {sku: level.on_hand for sku, level in levels.items()} == on_hand
    assert sum(level.reserved for level in levels.values()) == reserved_units
    assert sum(o.applied for o in applied) == counted[0]["applied"]
    # Every reservation was taken while the SKU had the units: never from a short SKU.
    placed = [o for o in outcomes if not isinstance(o, AdjustmentOutcome)]
    assert {o.kind for o in placed} <= {OutcomeKind.RESERVED, OutcomeKind.REJECTED}
    assert sum(1 for row in events if row["routing_key"] == "stock.adjusted") == len(applied)
    assert all(level.on_hand >= 0 and level.reserved >= 0 for level in levels.values())
    shortages = [row["body"] for row in events if row["routing_key"] == "stock.shortage"]
    last = {body["sku"]: body["short"] for body in shortages}
    assert all(last.get(sku, 0) == levels[sku].short for sku in HOT)
