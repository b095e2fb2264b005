"""Every body the wire model accepts is stored by the real database, as it was sent.

Generated bodies cross the boundary of every value the model reads (strings, numbers, times,
sizes, ids). Each one the worker's validation (``parse_order_placed``) accepts goes through the
hot path, ``PostgresStock.place`` on the asyncpg pool into ``place_orders()``, and must
end reserved or rejected as the rule (``decide``) says, with its placed_at, lines and stock
stored as sent: never a database error, which the worker would dead-letter as ``unexpected``.
Each one it refuses must be refused with a one-line reason (dead-lettered ``permanent``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar

import asyncpg
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine, create_pool
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.tables.base import INTEGER_MAX
from fulfilment.contracts.envelope import MAX_BODY_BYTES
from fulfilment.contracts.order_placed import (
    MAX_LINES,
    MAX_QUANTITY,
    MAX_SKU_LENGTH,
    MAX_UNITS_PER_SKU,
)
from fulfilment.domain.model import OrderLine, OutcomeKind, PlaceOrder, StockLevel, decide
from fulfilment.entrypoints.startup import database_options
from fulfilment.routes.handling import MalformedEventError
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.support.builders import parse_order_placed

pytestmark = pytest.mark.postgres

T = TypeVar("T")

REAL_SKUS = ["85123A", "71053", "15056bl", "15056BL", "gift_0001_40", "BANK CHARGES", "D"]
ODD_CHARACTERS = [
    "\x00",  # PostgreSQL text cannot hold it
    "\ud800",  # lone surrogates: JSON escapes that decode to no character
    "\udfff",
    "\x01",
    "\x7f",
    "\ufffe",  # noncharacters, valid UTF-8
    "\uffff",
    "\U0010ffff",  # the last code point, four bytes of UTF-8
    "\u00c4",
    " ",
    "\t",
    "\n",
    "\u00a0",
    "\u2028",
    "\u200b",
]
BOUNDARY_TIMES = [
    "0001-01-01T00:00:00+00:00",  # PostgreSQL's -infinity through asyncpg
    "0001-01-01T00:00:00.000001Z",
    "0001-01-01T00:59:59.999999+01:00",  # before year 1 in UTC
    "0001-01-01T00:00:00-23:59",
    "0000-12-31T23:59:59Z",
    "9999-12-31T23:59:59.999999Z",  # PostgreSQL's infinity through asyncpg
    "9999-12-31T23:59:59.999998+00:00",
    "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
    "9999-12-31T23:59:59.999999+23:59",
    "10000-01-01T00:00:00Z",
    "2010-12-01T08:26:00+23:59",
    "2010-12-01T08:26:00-23:59",
    "2010-12-01T08:26:00+24:00",
    "2010-12-01T08:26:00+05:30:15",
    "2010-12-01T08:26:00.123456789+00:00",
    "2010-12-01T08:26:00",
    "294277-01-01T00:00:00Z",
    "infinity",
    "-infinity",
]
BOUNDARY_QUANTITIES = [0, -1, 1, MAX_QUANTITY, MAX_QUANTITY + 1, INTEGER_MAX, INTEGER_MAX + 1]
PLACEHOLDER_IDS = ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"]


def offsets() -> st.SearchStrategy[timezone]:
    """UTC offsets below a day, in minutes (as ISO 8601 writes them)."""
    return st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m)))


def iso(
    moments: st.SearchStrategy[datetime], zones: st.SearchStrategy[timezone]
) -> st.SearchStrategy[str]:
    return st.builds(lambda moment, zone: moment.replace(tzinfo=zone).isoformat(), moments, zones)


# Naive bounds: hypothesis draws naive datetimes, to which an offset is attached.
FIRST_DAY = datetime(1, 1, 2)  # noqa: DTZ001
LAST_DAY = datetime(9999, 12, 31)  # noqa: DTZ001

USUAL: dict[str, st.SearchStrategy[Any]] = {
    "event_id": st.uuids().map(str),
    "order_id": st.uuids().map(str),
    "placed_at": iso(st.datetimes(min_value=FIRST_DAY, max_value=LAST_DAY), offsets()),
    "sku": st.sampled_from(REAL_SKUS),
    "quantity": st.integers(1, 10),
}
"""Values well inside the contract."""

odd_text = st.text(st.sampled_from(ODD_CHARACTERS), max_size=2)
EDGES: dict[str, st.SearchStrategy[Any]] = {
    "event_id": st.uuids().map(lambda u: u.hex) | st.sampled_from([*PLACEHOLDER_IDS, "x", ""]),
    "order_id": st.uuids().map(lambda u: u.hex) | st.sampled_from([*PLACEHOLDER_IDS, "x", ""]),
    "placed_at": st.one_of(
        iso(
            st.datetimes(max_value=FIRST_DAY) | st.datetimes(min_value=LAST_DAY),
            offsets() | st.integers(-86_399, 86_399).map(lambda s: timezone(timedelta(seconds=s))),
        ),
        st.sampled_from(BOUNDARY_TIMES),
    ),
    "sku": st.one_of(
        st.builds(lambda a, sku, b: a + sku + b, odd_text, st.sampled_from(REAL_SKUS), odd_text),
        st.text(st.sampled_from(ODD_CHARACTERS) | st.characters(), max_size=MAX_SKU_LENGTH + 2),
        st.sampled_from([MAX_SKU_LENGTH, MAX_SKU_LENGTH + 1]).map(lambda n: "\U0010ffff" * n),
    ),
    "quantity": st.one_of(
        st.sampled_from(BOUNDARY_QUANTITIES),
        st.integers(),
        st.sampled_from([1.0, True, "1", None]),
    ),
}
"""Values at and across each boundary: some storable, some not."""


@st.composite
def wire_bodies(draw: st.DrawFn) -> bytes:
    """An ``OrderPlaced`` v1 body whose values are usual but for one field or size, drawn at
    its boundary, as UTF-8 JSON (strings escaped to ASCII, or raw, where a lone surrogate is
    not UTF-8)."""
    pushed = draw(st.sampled_from([None, *EDGES, "lines", "size"]))
    event(f"at its boundary: {pushed or 'nothing'}")

    def value(field: str) -> Any:
        return draw(EDGES[field] if field == pushed else USUAL[field])

    def line() -> dict[str, Any]:
        return {"sku": value("sku"), "quantity": value("quantity")}

    lines = [line() for _ in range(draw(st.integers(1, 3)))]
    if pushed == "lines":
        # None at all, or the same SKU at its largest quantity on the most lines there may be
        # (its demand at the largest an order can ask), or one line more.
        count = draw(st.sampled_from([0, MAX_LINES, MAX_LINES + 1]))
        lines = [{"sku": draw(USUAL["sku"]), "quantity": MAX_QUANTITY}] * count
    document: dict[str, Any] = {
        "version": 1,
        "event_id": value("event_id"),
        "order_id": value("order_id"),
        "placed_at": value("placed_at"),
        "lines": lines,
    }
    ascii_only = draw(st.booleans())
    if pushed == "size":
        # An unknown field, ignored but counted: the body at the limit exactly, or a byte over.
        document["note"] = ""
        unpadded = len(
            json.dumps(document, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
        )
        document["note"] = "x" * (MAX_BODY_BYTES - unpadded + draw(st.sampled_from([0, 1])))
    return json.dumps(document, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@dataclass
class HotPath:
    """The worker's reservation path on the session database, on a loop of this module."""

    loop: asyncio.AbstractEventLoop
    stock: PostgresStock
    pool: asyncpg.Pool

    def run(self, work: Awaitable[T]) -> T:
        return self.loop.run_until_complete(work)


@pytest.fixture(scope="module")
def hot_path(database_url: str) -> Iterator[HotPath]:
    """One pool and warehouse for every example, as hypothesis calls the test synchronously."""
    loop = asyncio.new_event_loop()
    database = database_options(DatabaseSettings(url=SecretStr(database_url)), DeadlineSettings())
    engine = create_engine(database)
    pool = loop.run_until_complete(create_pool(database))
    stock = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0, pool=pool)
    try:
        assert loop.run_until_complete(pool.fetchval("SHOW server_encoding")) == "UTF8"
        yield HotPath(loop, stock, pool)
    finally:
        loop.run_until_complete(pool.close())
        loop.run_until_complete(engine.dispose())
        loop.close()


STOCK_KINDS = ("unknown", "short", "exact", "full")
"""Per SKU of an order: not stocked, one unit short, exactly enough, or ``on_hand`` at the
largest ``integer``."""
RESERVED_KINDS = ("none", "all", "fits", "misses")
"""Per stocked SKU: nothing reserved, everything, as much as lets the demand just fit, one more."""

stock_plans = st.lists(
    st.tuples(st.sampled_from(STOCK_KINDS), st.sampled_from(RESERVED_KINDS)), max_size=4
)


def stock_for(demand: dict[str, int], plan: list[tuple[str, str]]) -> dict[str, StockLevel]:
    """The stock of ``demand``'s SKUs, each as the plan says (cycled; enough when it is empty)."""
    stock: dict[str, StockLevel] = {}
    for index, (sku, units) in enumerate(demand.items()):
        kind, reserved_kind = plan[index % len(plan)] if plan else ("exact", "none")
        if kind == "unknown":
            continue
        on_hand = {"short": units - 1, "exact": units, "full": INTEGER_MAX}[kind]
        reserved = {
            "none": 0,
            "all": on_hand,
            "fits": max(0, on_hand - units),
            "misses": max(0, on_hand - units + 1),
        }[reserved_kind]
        stock[sku] = StockLevel(on_hand, reserved)
    return stock


def a_body(**changes: Any) -> bytes:
    document: dict[str, Any] = {
        "version": 1,
        "event_id": "6f1c0d2e-8f0b-4b7e-9a57-2f1f0c6b9e11",
        "order_id": "0b6e3c9a-55d4-4f7e-8a59-0c1d2e3f4a5b",
        "placed_at": "2010-12-01T08:26:00+00:00",
        "lines": [{"sku": "85123A", "quantity": 6}],
    }
    document.update(changes)
    return json.dumps(document).encode()


async def store(
    hot_path: HotPath, command: PlaceOrder, stock: dict[str, StockLevel]
) -> tuple[Any, ...]:
    pool = hot_path.pool
    await pool.execute(
        "TRUNCATE inbox_messages, reservation_lines, reservations, stock_levels, delivery_attempts"
    )
    await pool.executemany(
        "INSERT INTO stock_levels (sku, on_hand, reserved) VALUES ($1, $2, $3)",
        [(sku, level.on_hand, level.reserved) for sku, level in stock.items()],
    )
    outcome = await hot_path.stock.apply(command)
    row = await pool.fetchrow("SELECT event_id, placed_at FROM reservations")
    lines = dict(await pool.fetch("SELECT sku, quantity FROM reservation_lines"))
    levels = {
        sku: StockLevel(on_hand, reserved)
        for sku, on_hand, reserved in await pool.fetch(
            "SELECT sku, on_hand, reserved FROM stock_levels"
        )
    }
    return outcome, row, lines, levels


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(raw=wire_bodies(), plan=stock_plans)
@example(raw=a_body(lines=[{"sku": "85123A\x00", "quantity": 6}]), plan=[])
@example(raw=a_body(placed_at="0001-01-01T00:00:00+00:00"), plan=[])
@example(raw=a_body(placed_at="9999-12-31T23:59:59-01:00"), plan=[])
@example(raw=a_body(event_id=PLACEHOLDER_IDS[0]), plan=[])
@example(
    raw=a_body(lines=[{"sku": "85123A", "quantity": MAX_QUANTITY}] * MAX_LINES),
    plan=[("full", "fits")],
)
@example(
    raw=a_body(lines=[{"sku": "85123A", "quantity": MAX_QUANTITY}] * MAX_LINES),
    plan=[("full", "misses")],
)
def test_every_body_the_model_accepts_is_stored_as_sent_and_any_other_is_refused_with_a_reason(
    hot_path: HotPath, raw: bytes, plan: list[tuple[str, str]]
) -> None:
    try:
        placed = parse_order_placed(raw, "application/json")
    except MalformedEventError as error:
        reason = str(error)
        assert reason
        assert "\n" not in reason
        where = reason.removeprefix("invalid OrderPlaced v1: ").split(":")[0]
        event(f"refused: {'body size' if 'exceeds the limit' in where else where}")
        return
    command = placed.to_command()
    demand = command.demand()
    assert all(units <= MAX_UNITS_PER_SKU for units in demand.values())
    stock = stock_for(demand, plan)

    outcome, row, lines, levels = hot_path.run(store(hot_path, command, stock))

    decision = decide(demand, stock)
    event(f"stored: {outcome.label}")
    assert outcome.kind is (
        OutcomeKind.RESERVED if decision.reason is None else OutcomeKind.REJECTED
    )
    assert (outcome.reason, outcome.skus) == (decision.reason, decision.skus)
    assert row["event_id"] == command.event_id
    assert row["placed_at"] == command.placed_at
    assert row["placed_at"].tzinfo is not None, "stored as PostgreSQL's infinity"
    assert lines == demand
    taken = demand if decision.reason is None else {}
    assert levels == {
        sku: StockLevel(level.on_hand, level.reserved + taken.get(sku, 0))
        for sku, level in stock.items()
    }


def test_orders_that_would_take_reserved_past_the_integer_column_are_rejected_for_stock(
    hot_path: HotPath,
) -> None:
    # on_hand is at the column's largest; each order asks for the most one SKU can. The third
    # would take reserved to 3,000,000,000, beyond integer: it is a business "no", not an error.
    sku = "85123A"

    async def three_at_once() -> tuple[list[Any], int]:
        await hot_path.pool.execute(
            "TRUNCATE inbox_messages, reservation_lines, reservations, stock_levels"
        )
        await hot_path.stock.put_stock({sku: INTEGER_MAX})
        commands = [
            PlaceOrder(
                uuid.uuid4(),
                uuid.uuid4(),
                datetime(2010, 12, 1, tzinfo=UTC),
                (OrderLine(sku, MAX_QUANTITY),) * MAX_LINES,
            )
            for _ in range(3)
        ]
        outcomes = await asyncio.gather(*(hot_path.stock.apply(c) for c in commands))
        reserved = await hot_path.pool.fetchval(
            "SELECT reserved FROM stock_levels WHERE sku = $1", sku
        )
        return [outcome.label for outcome in outcomes], reserved

    labels, reserved = hot_path.run(three_at_once())

    assert labels == ["reserved", "reserved", "rejected:insufficient_stock"]
    assert reserved == 2 * MAX_UNITS_PER_SKU
