"""The hand-off end to end: worker, relay and dispatcher processes against the warehouse
simulator on a socket, over the session's PostgreSQL and RabbitMQ.

The counts are taken at the simulator (its ``/_simulator/orders``): what the warehouse holds,
not what the service believes it sent.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from tests.e2e.harness import WorkerProcess, order_event, publish, put_stock, spawn, wait_for
from tests.e2e.relay_harness import RelayProcess, bind_events_queue, spawn_relay, take
from tests.e2e.warehouse_harness import (
    DispatcherProcess,
    SimulatorProcess,
    assert_handed_off_once,
    cancel,
    duplicate_orders,
    handoff_env,
    open_requests,
    order_id_of,
    outbox_counts,
    record_handoff_figures,
    request_statuses,
    reserved_lines,
    ship,
    stock_equals_the_lines,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[SimulatorProcess]:
    running = SimulatorProcess(tmp_path / "simulator.log")
    running.start()
    yield running
    running.stop()


@pytest.fixture
def dispatchers() -> Iterator[list[DispatcherProcess]]:
    started: list[DispatcherProcess] = []
    yield started
    for dispatcher in started:
        dispatcher.stop_quietly()


def spawn_dispatcher(
    dispatchers: list[DispatcherProcess], env: dict[str, str], tmp_path: Path
) -> DispatcherProcess:
    dispatcher = DispatcherProcess(dict(env), tmp_path / f"dispatcher-{len(dispatchers)}.log")
    dispatchers.append(dispatcher)
    dispatcher.start()
    return dispatcher


async def place(broker: aio_pika.abc.AbstractConnection, lines: list[tuple[str, int]]) -> uuid.UUID:
    """Publish an OrderPlaced; its order id."""
    body, event_id = order_event(lines)
    await publish(broker, body, message_id=event_id)
    return order_id_of(uuid.UUID(event_id))


async def first_event(
    queue: aio_pika.abc.AbstractQueue, routing_key: str
) -> aio_pika.abc.AbstractIncomingMessage:
    """The first result event of ``routing_key`` on ``queue`` (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (message,) = await take(queue, 1, timeout=max(0.1, deadline - time.monotonic()))
        if message.routing_key == routing_key:
            return message
    pytest.fail(f"no {routing_key} within 30 s")


async def request_of(
    db: asyncpg.Connection, order_id: uuid.UUID, kind: str
) -> asyncpg.Record | None:
    return await db.fetchrow(
        "SELECT * FROM warehouse_requests WHERE order_id = $1 AND kind = $2"
        " ORDER BY id DESC LIMIT 1",
        order_id,
        kind,
    )


async def status_of(
    db: asyncpg.Connection, order_id: uuid.UUID, kind: str = "fulfilment_order"
) -> str | None:
    row = await request_of(db, order_id, kind)
    return None if row is None else str(row["status"])


async def order_status(db: asyncpg.Connection, order_id: uuid.UUID) -> str | None:
    value = await db.fetchval("SELECT status FROM reservations WHERE order_id = $1", order_id)
    return None if value is None else str(value)


async def test_each_reservation_becomes_exactly_one_order_at_the_warehouse_with_its_lines(
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    worker_env: dict[str, str],
    simulator: SimulatorProcess,
    workers: list[WorkerProcess],
    relays: list[RelayProcess],
    dispatchers: list[DispatcherProcess],
    tmp_path: Path,
) -> None:
    env = handoff_env(worker_env, simulator)
    await put_stock(db, {"A": 100, "B": 100, "SCARCE": 1})
    spawn(workers, env, tmp_path)
    spawn_relay(relays, env, tmp_path)
    spawn_dispatcher(dispatchers, env, tmp_path)
    placed = [await place(broker, [("A", 1 + i % 3), ("B", 2), ("A", 1)]) for i in range(20)]
    rejected = await place(broker, [("SCARCE", 5)])  # more than on hand: no reservation

    async def all_accepted() -> bool:
        return (await request_statuses(db))["accepted"] == len(placed) and not await open_requests(
            db
        )

    await wait_for(all_accepted, timeout=60, what="20 fulfilment orders accepted")
    orders = simulator.orders()
    assert len(orders) == len(placed)
    assert duplicate_orders(orders) == 0
    by_reference = {order["reference"]: order for order in orders}
    assert set(by_reference) == {str(order_id) for order_id in placed}
    assert str(rejected) not in by_reference
    lines = await reserved_lines(db)
    for index, order_id in enumerate(placed):
        # The reservation's lines, merged per SKU and sorted by SKU, as the warehouse got them.
        expected = [{"sku": "A", "quantity": 2 + index % 3}, {"sku": "B", "quantity": 2}]
        assert by_reference[str(order_id)]["lines"] == expected
        assert lines[str(order_id)] == expected
    warehouse_ids = await db.fetch(
        "SELECT order_id::text AS reference, warehouse_id FROM warehouse_requests"
    )
    assert {row["reference"]: row["warehouse_id"] for row in warehouse_ids} == {
        reference: order["id"] for reference, order in by_reference.items()
    }
    figures = await assert_handed_off_once(db, simulator)
    record_handoff_figures("hand-off", "none: 20 orders, 1 rejected", figures)


async def test_a_timeout_after_the_warehouse_committed_is_answered_as_a_replay_and_one_order_stays(
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    worker_env: dict[str, str],
    simulator: SimulatorProcess,
    workers: list[WorkerProcess],
    dispatchers: list[DispatcherProcess],
    tmp_path: Path,
) -> None:
    env = handoff_env(worker_env, simulator)
    await put_stock(db, {"A": 100})
    # Every request commits, then stalls beyond the dispatcher's 2 s timeout.
    simulator.faults(stall_after_commit_rate=1.0, stall_seconds=4.0)
    spawn(workers, env, tmp_path)
    spawn_dispatcher(dispatchers, env, tmp_path)
    placed = [await place(broker, [("A", 1)]) for _ in range(5)]

    async def committed() -> bool:
        return len(simulator.orders()) == len(placed)

    await wait_for(committed, timeout=30, what="5 orders committed at the warehouse")
    simulator.faults(stall_after_commit_rate=0.0)

    async def accepted() -> bool:
        return (await request_statuses(db))["accepted"] == len(placed)

    await wait_for(accepted, timeout=60, what="5 fulfilment orders accepted")
    stats = simulator.stats()
    assert stats["statuses"].get("200", 0) >= len(placed), stats  # each retry a replay
    orders = simulator.orders()
    assert len(orders) == len(placed)
    assert duplicate_orders(orders) == 0
    attempts = await db.fetch("SELECT attempts FROM warehouse_requests")
    assert all(row["attempts"] >= 2 for row in attempts)
    figures = await assert_handed_off_once(db, simulator)
    record_handoff_figures(
        "timeout after commit",
        "every request committed, then stalled past the 2 s timeout",
        figures,
    )


async def test_a_poison_order_is_failed_and_visible_and_the_orders_after_it_are_accepted(
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    worker_env: dict[str, str],
    simulator: SimulatorProcess,
    workers: list[WorkerProcess],
    dispatchers: list[DispatcherProcess],
    tmp_path: Path,
) -> None:
    env = handoff_env(worker_env, simulator)
    await put_stock(db, {"A": 100, "POISON": 10})
    simulator.faults(refused_skus=["POISON"])
    spawn(workers, env, tmp_path)
    before = [await place(broker, [("A", 1)]) for _ in range(3)]
    poison = await place(broker, [("A", 1), ("POISON", 1)])
    after = [await place(broker, [("A", 1)]) for _ in range(3)]

    async def recorded() -> bool:
        return sum((await request_statuses(db)).values()) == 7

    await wait_for(recorded, what="7 requests recorded")
    spawn_dispatcher(dispatchers, env, tmp_path)

    async def answered() -> bool:
        return not await open_requests(db)

    await wait_for(answered, timeout=60, what="every request answered")
    row = await request_of(db, poison, "fulfilment_order")
    assert row is not None
    assert row["status"] == "failed"
    assert row["last_status_code"] == 422
    assert json.loads(row["last_answer"])["error"] == "sku_not_stocked"
    for order_id in [*before, *after]:
        assert await status_of(db, order_id) == "accepted"
    references = {order["reference"] for order in simulator.orders()}
    assert references == {str(order_id) for order_id in [*before, *after]}
    assert await order_status(db, poison) == "reserved"  # failed there, held here for operators
    figures = await assert_handed_off_once(db, simulator)
    record_handoff_figures(
        "poison order", "a SKU the warehouse refuses (422) amid 6 orders", figures
    )


async def test_a_cancel_before_the_send_withdraws_the_request_and_it_is_never_sent(
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    worker_env: dict[str, str],
    simulator: SimulatorProcess,
    workers: list[WorkerProcess],
    relays: list[RelayProcess],
    dispatchers: list[DispatcherProcess],
    tmp_path: Path,
) -> None:
    env = handoff_env(worker_env, simulator)
    await put_stock(db, {"A": 10})
    spawn(workers, env, tmp_path)
    spawn_relay(relays, env, tmp_path)
    withdrawn = await place(broker, [("A", 3)])
    shrunk = await place(broker, [("A", 4)])

    async def both_pending() -> bool:
        return (await request_statuses(db))["pending"] == 2

    await wait_for(both_pending, what="two pending requests")
    # No dispatcher runs yet: the cancels meet requests never sent, and release at once.
    await cancel(broker, withdrawn)
    await cancel(broker, shrunk, [("A", 1)])

    async def released() -> bool:
        return (await outbox_counts(db))["stock.released"] == 2

    await wait_for(released, what="two stock.released")
    assert await status_of(db, withdrawn) == "withdrawn"
    assert await order_status(db, withdrawn) == "released"
    spawn_dispatcher(dispatchers, env, tmp_path)

    async def shrunk_accepted() -> bool:
        return await status_of(db, shrunk) == "accepted"

    await wait_for(shrunk_accepted, timeout=30, what="the shrunk order accepted")
    orders = simulator.orders()
    assert [order["reference"] for order in orders] == [str(shrunk)]
    assert orders[0]["lines"] == [{"sku": "A", "quantity": 3}]
    assert simulator.stats()["requests_total"] == 1  # the withdrawn one never left
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = 'A'") == 3
    assert await stock_equals_the_lines(db) == []
    figures = await assert_handed_off_once(db, simulator)
    record_handoff_figures(
        "cancel before the send", "a whole and a partial cancel before any dispatcher ran", figures
    )


async def test_a_cancel_while_the_order_is_in_flight_waits_for_its_answer_then_releases_once(
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    worker_env: dict[str, str],
    simulator: SimulatorProcess,
    workers: list[WorkerProcess],
    relays: list[RelayProcess],
    dispatchers: list[DispatcherProcess],
    tmp_path: Path,
) -> None:
    env = handoff_env(worker_env, simulator, FULFILMENT_WAREHOUSE_TIMEOUT_SECONDS="8")
    await put_stock(db, {"A": 10})
    events = await bind_events_queue(broker)  # every key: the relay sends in order
    simulator.faults(latency_seconds=3.0)  # the send takes 3 s: the cancel lands inside it
    spawn(workers, env, tmp_path)
    spawn_relay(relays, env, tmp_path)
    spawn_dispatcher(dispatchers, env, tmp_path)
    order_id = await place(broker, [("A", 4)])

    async def sending() -> bool:
        return await status_of(db, order_id) == "sending"

    await wait_for(sending, what="the fulfilment order in flight")
    cancel_id = await cancel(broker, order_id)

    async def requested() -> bool:
        return await status_of(db, order_id, "cancellation") is not None

    await wait_for(requested, what="the cancellation recorded")
    # Sent, so nothing is released before the warehouse answers the cancellation.
    assert await status_of(db, order_id) == "sending"
    assert await order_status(db, order_id) == "reserved"
    assert (await outbox_counts(db))["stock.released"] == 0
    outcome = await db.fetchval("SELECT outcome FROM inbox_messages WHERE event_id = $1", cancel_id)
    assert outcome == "cancel_requested"
    simulator.faults(latency_seconds=0.0)

    async def cancelled() -> bool:
        return await status_of(db, order_id, "cancellation") == "accepted"

    await wait_for(cancelled, timeout=40, what="the cancellation accepted")
    assert await order_status(db, order_id) == "released"
    message = await first_event(events, "stock.released")
    assert json.loads(message.body)["causation_id"] == str(cancel_id)
    assert (await outbox_counts(db))["stock.released"] == 1
    cancellations = simulator.cancellations()
    assert [c["status"] for c in cancellations] == ["cancelled"]
    assert len(simulator.orders()) == 1
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = 'A'") == 0
    assert await stock_equals_the_lines(db) == []
    figures = await assert_handed_off_once(db, simulator)
    record_handoff_figures(
        "cancel while in flight", "a cancel during a 3 s answer of the warehouse", figures
    )


async def test_a_partial_cancel_of_an_accepted_order_releases_its_lines_when_the_warehouse_accepts(
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    worker_env: dict[str, str],
    simulator: SimulatorProcess,
    workers: list[WorkerProcess],
    relays: list[RelayProcess],
    dispatchers: list[DispatcherProcess],
    tmp_path: Path,
) -> None:
    env = handoff_env(worker_env, simulator)
    await put_stock(db, {"A": 10, "B": 10})
    events = await bind_events_queue(broker)  # every key: the relay sends in order
    spawn(workers, env, tmp_path)
    spawn_relay(relays, env, tmp_path)
    spawn_dispatcher(dispatchers, env, tmp_path)
    order_id = await place(broker, [("A", 4), ("B", 2)])

    async def accepted() -> bool:
        return await status_of(db, order_id) == "accepted"

    await wait_for(accepted, what="the fulfilment order accepted")
    cancel_id = await cancel(broker, order_id, [("A", 3)])

    async def cancelled() -> bool:
        return await status_of(db, order_id, "cancellation") == "accepted"

    await wait_for(cancelled, what="the cancellation accepted")
    message = await first_event(events, "stock.released")
    event = json.loads(message.body)
    assert event["causation_id"] == str(cancel_id)
    assert event["lines"] == [{"sku": "A", "quantity": 3}]
    assert (await outbox_counts(db))["stock.released"] == 1
    assert [c["status"] for c in simulator.cancellations()] == ["partially_cancelled"]
    assert await order_status(db, order_id) == "reserved"
    levels = dict(await db.fetch("SELECT sku, reserved FROM stock_levels ORDER BY sku"))
    assert levels == {"A": 1, "B": 2}
    assert await stock_equals_the_lines(db) == []
    figures = await assert_handed_off_once(db, simulator)
    record_handoff_figures("cancel accepted", "a partial cancel of an accepted order", figures)


async def test_a_refused_cancel_keeps_the_order_reserved_tells_the_shop_and_the_order_ships(
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    worker_env: dict[str, str],
    simulator: SimulatorProcess,
    workers: list[WorkerProcess],
    relays: list[RelayProcess],
    dispatchers: list[DispatcherProcess],
    tmp_path: Path,
) -> None:
    env = handoff_env(worker_env, simulator)
    await put_stock(db, {"A": 10})
    events = await bind_events_queue(broker)  # every key: the relay sends in order
    simulator.faults(pick_delay_seconds=0.3)
    spawn(workers, env, tmp_path)
    spawn_relay(relays, env, tmp_path)
    spawn_dispatcher(dispatchers, env, tmp_path)
    order_id = await place(broker, [("A", 4)])

    async def accepted() -> bool:
        return await status_of(db, order_id) == "accepted"

    await wait_for(accepted, what="the fulfilment order accepted")
    await cancel(broker, order_id, [("A", 1)])

    async def refused() -> bool:
        return await status_of(db, order_id, "cancellation") == "refused"

    await wait_for(refused, what="the cancellation refused too_late")
    message = await first_event(events, "stock.cancel_refused")
    document = json.loads(message.body)
    assert document["lines"] == [{"sku": "A", "quantity": 1}]
    assert document["warehouse_id"] == simulator.orders()[0]["id"]
    assert await order_status(db, order_id) == "reserved"
    assert (await outbox_counts(db))["stock.released"] == 0
    await ship(broker, order_id)

    async def shipped() -> bool:
        return await order_status(db, order_id) == "shipped"

    await wait_for(shipped, what="the order shipped")
    level = await db.fetchrow("SELECT on_hand, reserved FROM stock_levels WHERE sku = 'A'")
    assert (level["on_hand"], level["reserved"]) == (6, 0)
    assert await stock_equals_the_lines(db) == []
    figures = await assert_handed_off_once(db, simulator)
    record_handoff_figures(
        "cancel refused", "a cancel after the pick (too_late), then the ship", figures
    )
