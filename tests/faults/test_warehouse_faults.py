"""The hand-off under faults: a dispatcher killed mid-request, a warehouse down under load, a
429 storm, and workers and dispatchers killed at random with cancels and ships in the mix.

Each scenario runs real worker, relay and dispatcher processes against the warehouse
simulator on a socket, counts at the simulator, and appends its row of the fault table
(``warehouse_harness.handoff_figures``) to ``FULFILMENT_TEST_FAULT_FIGURES``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.topology import ORDER_SHIPPED_DEAD_LETTER_QUEUE
from tests.e2e.harness import put_stock, queue_depth, wait_for
from tests.e2e.warehouse_harness import (
    DispatcherProcess,
    SimulatorProcess,
    assert_handed_off_once,
    cancel,
    open_requests,
    outbox_counts,
    record_handoff_figures,
    request_statuses,
    ship,
    start_dispatcher,
    stock_equals_the_lines,
    warehouse_env,
)
from tests.faults.faultlib import (
    AMPLE_STOCK,
    LIMIT,
    Cluster,
    Order,
    declare,
    inbox_count,
    publish,
    synthetic_orders,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

OUTAGE_SECONDS = float(os.environ.get("FULFILMENT_TEST_WAREHOUSE_OUTAGE_SECONDS", "60"))
"""How long the warehouse is down under load (the issue's 60 s; raise it to soak)."""

LOAD_ORDERS = int(os.environ.get("FULFILMENT_TEST_WAREHOUSE_LOAD_ORDERS", "1000"))
"""Orders of each drain of the outage scenario: a few seconds of the worker on 2 cores."""


def order_id(order: Order) -> uuid.UUID:
    """The order id ``faultlib.Order.event`` gives ``order``."""
    return uuid.uuid5(uuid.NAMESPACE_OID, str(order.event_id))


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[SimulatorProcess]:
    running = SimulatorProcess(tmp_path / "simulator.log")
    running.start()
    yield running
    running.stop()


async def drain_seconds(db: asyncpg.Connection, event_ids: list[uuid.UUID]) -> float:
    """Seconds from the first to the last of ``event_ids`` the inbox recorded."""
    first, last = await db.fetchrow(
        "SELECT min(processed_at), max(processed_at) FROM inbox_messages"
        " WHERE event_id = ANY($1::uuid[])",
        event_ids,
    )
    return max((last - first).total_seconds(), 1e-3)


async def test_a_dispatcher_killed_after_sending_and_before_recording_leaves_one_order_each(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    simulator: SimulatorProcess,
    dispatchers: list[DispatcherProcess],
    tmp_path: Path,
) -> None:
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(10, seed=21)
    env = warehouse_env(
        simulator,
        FULFILMENT_WAREHOUSE_TIMEOUT_SECONDS="5",
        FULFILMENT_WAREHOUSE_CONCURRENCY="10",
    )
    cluster.start(1, wait_ready=True, **env)
    await publish(broker, orders)

    async def recorded() -> bool:
        return (await request_statuses(db))["pending"] == len(orders)

    await wait_for(recorded, what="10 pending requests")
    # Each request takes 2 s at the warehouse before it commits: the kill lands in between.
    simulator.faults(latency_seconds=2.0)
    first = start_dispatcher(dispatchers, cluster.env | env, tmp_path)

    async def all_arrived() -> bool:
        return int(simulator.stats()["requests_total"]) >= len(orders)

    await wait_for(all_arrived, timeout=30, what="10 requests at the warehouse")
    first.kill()
    rows = await db.fetch("SELECT status, last_status_code FROM warehouse_requests")
    assert {(row["status"], row["last_status_code"]) for row in rows} == {("sending", None)}

    async def committed() -> bool:
        return len(simulator.orders()) == len(orders)

    # The warehouse finishes the work of a request whose client went away.
    await wait_for(committed, timeout=30, what="10 orders committed at the warehouse")
    simulator.faults(latency_seconds=0.0)
    start_dispatcher(dispatchers, cluster.env | env, tmp_path)

    async def accepted() -> bool:
        return (await request_statuses(db))["accepted"] == len(orders)

    # The first one's lease ends, then the same keys and bodies are sent again.
    await wait_for(accepted, timeout=60, what="10 fulfilment orders accepted")
    stats = simulator.stats()
    assert stats["statuses"].get("200", 0) == len(orders), stats  # every retry a replay
    figures = await assert_handed_off_once(db, simulator)
    assert len(simulator.orders()) == len(orders)
    record_handoff_figures(
        "dispatcher kill -9 mid-request",
        "SIGKILL of the dispatcher after sending, before recording (warehouse latency 2 s)",
        figures,
        orders=len(orders),
        replays=stats["statuses"].get("200", 0),
    )


async def test_a_429_storm_is_waited_out_and_the_rate_cap_holds_every_second(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    simulator: SimulatorProcess,
    dispatchers: list[DispatcherProcess],
    tmp_path: Path,
) -> None:
    cap = 10
    await put_stock(db, AMPLE_STOCK)
    orders = synthetic_orders(60, seed=22)
    # The warehouse allows 4 a second, the dispatcher's cap 10: it keeps being told to wait.
    simulator.faults(rate_limit_per_second=4, retry_after_seconds=1.0)
    env = warehouse_env(simulator, FULFILMENT_WAREHOUSE_RATE_PER_SECOND=str(cap))
    cluster.start(1, wait_ready=True, **env)
    start_dispatcher(dispatchers, cluster.env | env, tmp_path)
    await publish(broker, orders)

    async def accepted() -> bool:
        return (await request_statuses(db))["accepted"] == len(orders)

    await wait_for(accepted, timeout=120, what="60 fulfilment orders accepted")
    stats = simulator.stats()
    assert stats["statuses"].get("429", 0) > 0, stats  # the storm happened
    assert stats["early_requests"] == 0, stats  # nothing before a Retry-After ended
    assert stats["max_requests_per_second"] <= cap, stats
    figures = await assert_handed_off_once(db, simulator, cap=cap)
    record_handoff_figures(
        "429 storm",
        f"warehouse allows 4/s with Retry-After 1 s, cap {cap}/s",
        figures,
        orders=len(orders),
        answered_429=stats["statuses"]["429"],
        early_requests=stats["early_requests"],
        max_requests_per_second=stats["max_requests_per_second"],
    )


async def test_a_warehouse_down_under_load_slows_no_drain_and_the_backlog_drains_at_the_cap(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    simulator: SimulatorProcess,
    dispatchers: list[DispatcherProcess],
    amqp_url: str,
    tmp_path: Path,
) -> None:
    cap = 50
    await put_stock(db, AMPLE_STOCK)
    await declare(amqp_url, LIMIT)
    without = synthetic_orders(LOAD_ORDERS, seed=31)
    with_handoff = synthetic_orders(LOAD_ORDERS, seed=32)

    # The drain without the warehouse configured, as the reference.
    await publish(broker, without)
    (plain,) = cluster.start(1, wait_ready=True)

    async def drained(count: int) -> bool:
        return await inbox_count(db) >= count

    await wait_for(lambda: drained(LOAD_ORDERS), timeout=180, what="the first drain")
    plain.terminate()
    assert await open_requests(db) == 0  # without the URL the worker records nothing
    reference_rate = LOAD_ORDERS / await drain_seconds(db, [o.event_id for o in without])

    # The warehouse goes down; the worker with the hand-off drains a backlog as large.
    simulator.faults(down_for_seconds=OUTAGE_SECONDS)
    outage_ends = time.monotonic() + OUTAGE_SECONDS
    env = warehouse_env(simulator, FULFILMENT_WAREHOUSE_RATE_PER_SECOND=str(cap))
    start_dispatcher(dispatchers, cluster.env | env, tmp_path)
    await publish(broker, with_handoff)
    cluster.start(1, wait_ready=True, **env)
    await wait_for(
        lambda: drained(2 * LOAD_ORDERS), timeout=180, what="the drain during the outage"
    )
    handoff_rate = LOAD_ORDERS / await drain_seconds(db, [o.event_id for o in with_handoff])
    assert time.monotonic() < outage_ends, "the drain outlasted the outage: raise it"
    assert await open_requests(db) == LOAD_ORDERS  # piled up, none lost, none answered
    assert simulator.orders() == []
    # Loosely (the machine is shared): a worker that waited on the warehouse would drain at
    # most a request's worth during the outage, not thousands of orders a second's worth.
    assert handoff_rate >= 0.25 * reference_rate, (handoff_rate, reference_rate)
    during_outage = int(simulator.stats()["requests_total"])

    async def backlog_drained() -> bool:
        return await open_requests(db) == 0

    await asyncio.sleep(max(0.0, outage_ends - time.monotonic()))
    probes = int(simulator.stats()["requests_total"])
    back_at = time.monotonic()
    await wait_for(backlog_drained, timeout=LOAD_ORDERS / cap * 4 + 60, what="the backlog drained")
    drain_after = time.monotonic() - back_at
    stats = simulator.stats()
    assert stats["max_requests_per_second"] <= cap, stats
    assert (await request_statuses(db))["accepted"] == LOAD_ORDERS
    figures = await assert_handed_off_once(db, simulator, cap=cap, reserved_before=LOAD_ORDERS)
    # The busiest seconds reach the cap: it drains at the cap, not below it by much.
    busiest = sorted(stats["requests_per_second"].values())[-3:]
    assert min(busiest) >= 0.6 * cap, stats["requests_per_second"]
    record_handoff_figures(
        "warehouse down under load",
        f"warehouse answering 503 for {OUTAGE_SECONDS:g} s while {LOAD_ORDERS} orders drain",
        figures,
        orders=LOAD_ORDERS,
        drain_rate_without_warehouse=round(reference_rate, 1),
        drain_rate_with_handoff=round(handoff_rate, 1),
        requests_during_outage=probes,
        requests_while_the_worker_drained=during_outage,
        backlog_drained_seconds=round(drain_after, 1),
        cap_per_second=cap,
        max_requests_per_second=stats["max_requests_per_second"],
    )


async def test_random_kills_of_workers_and_dispatchers_with_cancels_and_ships_hand_off_once(  # noqa: PLR0915 - one scenario, its checks in reading order
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractRobustConnection,
    simulator: SimulatorProcess,
    dispatchers: list[DispatcherProcess],
    amqp_url: str,
    tmp_path: Path,
) -> None:
    rng = random.Random(41)
    orders = synthetic_orders(240, seed=42)
    await put_stock(db, AMPLE_STOCK)
    await declare(amqp_url, 20)
    # Picked 1.5 s after creation: some cancels are accepted, some refused too_late.
    simulator.faults(latency_seconds=0.05, pick_delay_seconds=1.5)
    env = warehouse_env(
        simulator,
        FULFILMENT_WAREHOUSE_TIMEOUT_SECONDS="3",
        FULFILMENT_DELIVERY_LIMIT="20",
    )
    cluster.start(2, **env)
    for _ in range(2):
        start_dispatcher(dispatchers, cluster.env | env, tmp_path)
    cancelled = rng.sample(orders, 80)
    shipped = rng.sample([o for o in orders if o not in cancelled], 60)
    extra_events = 0
    kills = 0
    deadline = time.monotonic() + 60
    for start in range(0, len(orders), 40):
        await publish(broker, orders[start : start + 40])
        await asyncio.sleep(rng.uniform(0.2, 0.8))
        for order in cancelled[start // 3 : start // 3 + 13]:
            whole = rng.random() < 0.5
            lines = None if whole else [(order.lines[0][0], 1)]
            await cancel(broker, order_id(order), lines)
            extra_events += 1
        for order in shipped[start // 4 : start // 4 + 10]:
            await ship(broker, order_id(order))
            extra_events += 1
        victims = [
            *cluster.alive(),
            *(d for d in dispatchers if d.process and d.process.poll() is None),
        ]
        rng.choice(victims).kill()
        kills += 1
        cluster.restart_dead()
        for dead in [
            d for d in dispatchers if d.process is not None and d.process.poll() is not None
        ]:
            dispatchers.remove(dead)
            start_dispatcher(dispatchers, cluster.env | env, tmp_path)
        assert time.monotonic() < deadline

    total = len(orders) + extra_events

    async def processed() -> int:
        # A ship that overtook its order is dead-lettered (order_not_reserved, by the
        # lifecycle's table) and not recorded in the inbox: the orders are published in waves
        # and the ships are drawn from all of them.
        return await inbox_count(db) + await queue_depth(broker, ORDER_SHIPPED_DEAD_LETTER_QUEUE)

    async def settled() -> bool:
        cluster.restart_dead()
        return await processed() >= total and await open_requests(db) == 0

    deadline = time.monotonic() + 180
    while not await settled():
        if time.monotonic() > deadline:
            left = await db.fetch(
                "SELECT kind, status, count(*) AS n FROM warehouse_requests"
                " WHERE status IN ('pending', 'sending') GROUP BY 1, 2"
            )
            pytest.fail(
                f"{await processed()} of {total} events processed; open requests"
                f" {[tuple(row) for row in left]}; "
                + " | ".join(d.log_tail(2) for d in dispatchers)
            )
        await asyncio.sleep(0.5)
    assert kills >= 5
    statuses = await request_statuses(db, "fulfilment_order")
    assert set(statuses) <= {"accepted", "withdrawn"}, statuses
    figures = await assert_handed_off_once(db, simulator)
    assert await stock_equals_the_lines(db) == []
    cancellations = await request_statuses(db, "cancellation")
    assert set(cancellations) <= {"accepted", "refused", "withdrawn"}, cancellations
    # Each accepted cancellation released once, unless its order shipped before the answer.
    unreleased = await db.fetchval(
        "SELECT count(*) FROM warehouse_requests w JOIN reservations r USING (order_id)"
        " WHERE w.kind = 'cancellation' AND w.status = 'accepted' AND r.shipped_at IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.routing_key = 'stock.released'"
        " AND (o.body->>'causation_id')::uuid = w.causation_id)"
    )
    assert unreleased == 0
    refused = await outbox_counts(db)
    assert refused["stock.cancel_refused"] == cancellations["refused"]
    held = {o["reference"] for o in simulator.orders()}
    accepted = await db.fetch(
        "SELECT order_id::text AS reference FROM warehouse_requests"
        " WHERE kind = 'fulfilment_order' AND status = 'accepted'"
    )
    assert held == {row["reference"] for row in accepted}
    record_handoff_figures(
        "random kills with cancels and ships",
        f"SIGKILL of workers and dispatchers at random ({kills} kills)",
        figures,
        orders=len(orders),
        cancels=len(cancelled),
        ships=len(shipped),
        cancellations=dict(cancellations),
    )
