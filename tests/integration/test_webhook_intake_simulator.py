"""The warehouse simulator's webhooks, faults and all, into a real intake on PostgreSQL.

The simulator ships and cancels the fulfilment orders it is given, in one or several
shipments, and sends each change as webhooks signed by the ``standardwebhooks`` package, as a
real sender does: retried on a non-2xx under the same ``webhook-id``, some sent twice, some
again under a new id, some held back, some attempts signed with a wrong secret or with a stale
timestamp. Once it has settled, every change it made is applied exactly once, and the stock
is what the shipments took.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.domain.model import OutcomeKind
from tests.support.builders import order
from tests.support.simulated_warehouse import TOKEN, order_body
from tests.support.webhooks import SECOND_SECRET, IntakeProcess, running_intake
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator

pytestmark = pytest.mark.postgres

ORDERS = 40
LOADED = 1000


@pytest.fixture(scope="module")
def intake(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IntakeProcess]:
    with running_intake(database_url, tmp_path_factory.mktemp("simulated")) as process:
        yield process


@pytest.fixture
async def simulator(intake: IntakeProcess) -> AsyncIterator[SimulatorServer]:
    faults = Faults(
        token=TOKEN,
        ship_delay_seconds=0.0,
        split_rate=0.6,
        max_shipments=3,
        cancel_rate=0.3,
        webhook_url=intake.url,
        webhook_secrets=(SECOND_SECRET,),
        webhook_retry_seconds=(0.05, 0.1),
        webhook_duplicate_rate=0.3,
        webhook_resend_rate=0.3,
        webhook_reorder_rate=0.2,
        webhook_hold_seconds=0.3,
        webhook_wrong_secret_rate=0.2,
        webhook_stale_rate=0.2,
    )
    async with SimulatorServer(WarehouseSimulator(faults, seed=36)) as running:
        yield running


async def test_every_change_of_the_simulator_is_applied_once_whatever_its_webhooks_did(
    simulator, stock: PostgresStock, db
) -> None:
    skus = ["85123A", "71053", "22423"]
    await stock.put_stock(dict.fromkeys(skus, LOADED))
    placed = [order((skus[n % 3], 1 + n % 4), (skus[(n + 1) % 3], 2)) for n in range(ORDERS)]
    for placement in placed:
        assert (await stock.apply(placement)).kind is OutcomeKind.RESERVED
    async with httpx.AsyncClient(
        base_url=simulator.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ) as http:
        for placement in placed:
            lines = [(line.sku, line.quantity) for line in placement.lines]
            answer = await http.post(
                "/fulfilment-orders",
                content=order_body(placement.order_id, lines),
                headers={"Idempotency-Key": str(uuid.uuid4())},
            )
            assert answer.status_code == 201, answer.text
    await simulator.simulator.settled(timeout=60)

    record = simulator.simulator.record()
    attempts = [attempt for webhook in record["webhooks"] for attempt in webhook["attempts"]]
    assert any(attempt["wrong_secret"] for attempt in attempts)
    assert any(attempt["stale"] for attempt in attempts)
    refused = [attempt for attempt in attempts if attempt["wrong_secret"] or attempt["stale"]]
    assert {attempt["status"] for attempt in refused} == {401}
    assert {webhook["fate"] for webhook in record["webhooks"]} == {"delivered"}
    shipments = {shipment["shipment_id"] for shipment in record["shipments"]}
    cancellations = {c["cancellation_id"] for c in record["cancellations"]}
    assert len(shipments) > ORDERS
    assert cancellations
    applied_shipments = await db.fetch("SELECT shipment_id FROM warehouse_shipments")
    applied_cancellations = await db.fetch("SELECT cancellation_id FROM warehouse_cancellations")
    assert sorted(row[0] for row in applied_shipments) == sorted(shipments)
    assert sorted(row[0] for row in applied_cancellations) == sorted(cancellations)
    assert await db.fetchval("SELECT count(*) FROM warehouse_discrepancies") == 0
    assert await db.fetchval("SELECT count(*) FROM invalid_webhooks") == 0
    taken = dict(
        await db.fetch("SELECT sku, sum(taken) FROM warehouse_shipment_lines GROUP BY sku")
    )
    held = dict(
        await db.fetch("SELECT sku, sum(quantity - shipped) FROM reservation_lines GROUP BY sku")
    )
    levels = {
        row["sku"]: (row["on_hand"], row["reserved"])
        for row in await db.fetch("SELECT sku, on_hand, reserved FROM stock_levels")
    }
    assert levels == {sku: (LOADED - taken.get(sku, 0), held.get(sku, 0)) for sku in skus}


async def test_every_adjustment_of_the_simulator_is_applied_once_whatever_its_webhooks_did(
    simulator, stock: PostgresStock, db
) -> None:
    # Issue 37 through the intake: the simulator's adjustments, sent as signed
    # inventory.adjusted webhooks with the same faults as its shipments, change on hand once each.
    skus = ["85123A", "71053"]
    await stock.put_stock(dict.fromkeys(skus, 20))
    held = order(("85123A", 12))
    assert (await stock.apply(held)).kind is OutcomeKind.RESERVED
    simulator.simulator.load_stock(dict.fromkeys(skus, 20))
    sent = [("85123A", -10, "damaged"), ("71053", 5, "received"), ("85123A", 4, "returned")]
    sent += [("71053", -2, "lost")] * 3
    admin = httpx.URL(simulator.url).copy_with(path="/_simulator/adjustments")
    async with httpx.AsyncClient(timeout=10) as http:
        for sku, delta, reason in sent:
            answer = await http.post(admin, json={"sku": sku, "delta": delta, "reason": reason})
            assert answer.status_code == 201, answer.text
    await simulator.simulator.settled(timeout=60)

    record = simulator.simulator.record()
    made = {adjustment["adjustment_id"]: adjustment for adjustment in record["adjustments"]}
    assert len(made) >= len(sent)
    applied = await db.fetch("SELECT adjustment_id, sku, delta FROM warehouse_adjustments")
    assert sorted(row["adjustment_id"] for row in applied) == sorted(made)
    assert {webhook["fate"] for webhook in record["webhooks"]} == {"delivered"}
    levels = dict(await db.fetch("SELECT sku, on_hand FROM stock_levels"))
    for sku in skus:
        deltas = sum(row["delta"] for row in applied if row["sku"] == sku)
        assert levels[sku] == 20 + deltas, sku
    # 12 of 85123A are held: losing 10 made it short by 2; the returns of 4 settled it.
    shortages = await db.fetch(
        "SELECT body->>'short' AS short FROM outbox WHERE routing_key = 'stock.shortage'"
        " AND sku = '85123A' ORDER BY id"
    )
    assert [row["short"] for row in shortages][:1] == ["2"]
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '85123A'") == 12
