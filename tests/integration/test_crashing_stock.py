"""The ``in_transaction`` crash point of every kind of event, on the real database.

The warehouse is the fault suite's (``tests/faults/crash_plan.py``). The point runs the
event's function in a transaction of its own and kills the process before ``COMMIT``; here
``crash`` raises instead of killing, so the test sees what PostgreSQL kept.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.domain.lifecycle import CancelKind, ShipKind
from fulfilment.domain.model import OutcomeKind, StockLevel
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.faults import crash_plan
from tests.faults.crash_plan import CrashingStock, CrashPoint, FaultPlan
from tests.support.builders import cancellation, order, shipment

pytestmark = pytest.mark.postgres


class Crashed(Exception):  # noqa: N818 - stands for the SIGKILL of the process
    """Raised where the crash point would kill the process."""


@pytest.fixture
async def stores(clean_database, monkeypatch):
    """The PostgreSQL warehouse, and it wrapped with an ``in_transaction`` crash every time."""
    crashes: list[tuple[CrashPoint, object]] = []

    def crash(point, command):
        crashes.append((point, command))
        raise Crashed

    monkeypatch.setattr(crash_plan, "crash", crash)
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    inner = PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0)
    plan = FaultPlan({CrashPoint.IN_TRANSACTION: 1.0})
    crashing = CrashingStock(inner, plan, engine=engine, consumer="fulfilment")
    try:
        yield inner, crashing, crashes
    finally:
        await engine.dispose()


async def _written(inner):
    """The inbox's event ids, and the last ``outbox.id`` handed out (committed or not)."""
    async with inner.engine.connect() as connection:
        inbox = set(
            (await connection.execute(sa.text("SELECT event_id FROM inbox_messages"))).scalars()
        )
        last_id = (
            await connection.execute(
                sa.text("SELECT last_value FROM pg_sequences WHERE sequencename LIKE 'outbox_id%'")
            )
        ).scalar_one()
    return inbox, last_id


@pytest.mark.parametrize("kind", ["place", "cancel", "ship"])
async def test_a_crash_in_the_transaction_of_any_event_leaves_nothing_of_it(stores, kind):
    inner, crashing, crashes = stores
    await inner.put_stock({"A": 10})
    placed = order(("A", 3))
    if kind != "place":
        assert (await inner.apply(placed)).kind is OutcomeKind.RESERVED
    command = {
        "place": placed,
        "cancel": cancellation(placed.order_id, ("A", 1)),
        "ship": shipment(placed.order_id),
    }[kind]
    inbox_before, last_id_before = await _written(inner)

    with pytest.raises(Crashed):
        await crashing.apply(command)

    assert crashes == [(CrashPoint.IN_TRANSACTION, command.event_id)]
    inbox_after, last_id_after = await _written(inner)
    # The function ran to its outbox row (an identity value is not given back by a rollback),
    # and nothing of it was committed.
    assert last_id_after == (last_id_before or 0) + 1
    assert inbox_after == inbox_before
    assert command.event_id not in inbox_after
    reserved = 0 if kind == "place" else 3
    assert await inner.levels_of(["A"]) == {"A": StockLevel(10, reserved)}
    applied = await inner.apply(command)
    assert applied.kind in {OutcomeKind.RESERVED, CancelKind.PARTIALLY_RELEASED, ShipKind.SHIPPED}
