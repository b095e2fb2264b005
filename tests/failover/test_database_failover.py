"""The worker, the relay and the dispatcher across a PostgreSQL failover, as production runs
the database.

Each scenario runs three workers and a relay on the service's URL over both servers
(``host=a&host=b&target_session_attrs=read-write``) while a plan of orders on hot SKUs, with
cancels and shipments, is published; it changes the servers' places under the load, lets
everything settle, and ends with the product's reconciliation and the lifecycle suite's
comparison with the in-order sequence: none lost, none applied twice, stock and lines as the
in-order sequence leaves them, the invariants held, nothing dead-lettered; the outbox tells
each order's lifecycle once, and every result event reached ``fulfilment.events`` (again only
under its own ``event_id``); no worker restarted, and each exits 0 on SIGTERM. The row of
figures goes to ``FULFILMENT_TEST_FAULT_FIGURES`` with the time to recover and the drain rates.

The hand-off's scenario adds a dispatcher (and the warehouse simulator on a socket): it
follows the primary too, without a restart, and every reservation is one order at the
warehouse, every cancel one accepted cancellation, once the requests have drained.

``FULFILMENT_TEST_FAILOVER_ORDERS`` sets the orders per scenario (default :data:`ORDERS`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import aio_pika
import asyncpg
import pytest
from failoverlib import Load, Primary, Timings, acknowledged, handled_lines, processed, timings
from faultlib import Cluster, assert_outbox_tells_the_lifecycle, declare, record_figures
from harness import put_stock
from postgres_pair import ASYNCHRONOUS, PostgresPair
from pydantic import SecretStr
from relay_harness import RelayProcess, bind_events_queue, spawn_relay, take_events
from test_lifecycle_faults import (
    HOT_SKUS,
    STOCK,
    LifecyclePlan,
    Outcome,
    assert_nothing_lost_nor_applied_twice,
    compare_with_the_in_order_sequence,
    lifecycle_plan,
)
from warehouse_harness import (
    DispatcherProcess,
    SimulatorProcess,
    handoff_env,
    handoff_figures,
    open_requests,
    request_statuses,
)

from fulfilment.contracts.topology import ORDER_CANCELLED, ORDER_PLACED, ORDER_SHIPPED
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.settings import Settings

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(600)]

ORDERS = int(os.environ.get("FULFILMENT_TEST_FAILOVER_ORDERS", "600"))
"""Orders per scenario (with their cancels and shipments, about 1.45 events each): 600 keep
the five scenarios within about 6 minutes on two cores, where the workers handle some 50
events per second between two servers replicating synchronously."""
WORKERS = 3
DELIVERY_LIMIT = 20
"""Above the handful of returns a failover causes, so no innocent delivery is taken for
poison by the broker's own limit."""
PROMOTE_AFTER_SECONDS = 1.0
"""What detecting the dead primary takes before the standby is promoted (CloudNativePG's
instance manager notices in about this)."""
PROMOTED_WITHIN_SECONDS = 5.0
FAULT_AT = 0.35
"""Share of the plan's events processed when the fault comes: mid-load."""

Fault = Callable[[PostgresPair], Awaitable[tuple[str, float, float]]]
"""Changes the servers' places under load; returns what it did, the epoch second it began, and
the one from which a commit is one of the new primary's (the promotion's end)."""


@dataclass
class Result:
    """What a scenario measured, beside the reconciliation."""

    outcome: Outcome
    timings: Timings
    restarts: int
    published_twice: int
    exits: list[int]
    outcomes: Counter[str]
    requeued: int
    retried: int
    paused: int
    handoff: Handoff | None = None


@dataclass
class Handoff:
    """What the hand-off's scenario measured at the warehouse and of its dispatcher."""

    figures: dict[str, int]
    """:func:`warehouse_harness.handoff_figures`: requests lost, duplicate orders, cancels
    applied twice (rate-cap breaches not counted)."""
    fulfilment_orders: Counter[str]
    cancellations: Counter[str]
    dispatcher_restarts: int
    dispatcher_exit: int
    drained_seconds: float
    """From the end of the events' processing to the last request answered."""


HANDOFF_LAG_WAVES = 4
"""Waves (a quarter of a second each) between an order and its late cancels and shipment in
the hand-off's scenario."""
HANDOFF_RATE_PER_SECOND = 200
"""The hand-off scenario's cap: high enough that the requests drain with the events."""


async def run_scenario(
    fault: Fault,
    *,
    pair: PostgresPair,
    url: str,
    workers: Cluster,
    relays: list[RelayProcess],
    env: dict[str, str],
    amqp_url: str,
    tmp_path: Path,
    seed: int,
    lost_allowed: bool = False,
    simulator: SimulatorProcess | None = None,
    lag: int = 0,
) -> tuple[str, Result, LifecyclePlan]:
    primary = Primary(url)
    handoff = warehouse_variables(simulator)
    dispatcher: DispatcherProcess | None = None
    try:
        db = await primary.connection()
        await put_stock(db, STOCK)
        await declare(amqp_url, DELIVERY_LIMIT)
        plan = lifecycle_plan(ORDERS, cancelled=0.2, shipped=0.2, early=0.1, lag=lag, seed=seed)
        total = len(plan.in_order)
        async with await aio_pika.connect(amqp_url) as broker:
            events = await bind_events_queue(broker)
            workers.start(
                WORKERS,
                wait_ready=True,
                FULFILMENT_DELIVERY_LIMIT=str(DELIVERY_LIMIT),
                **handoff,
            )
            relay = spawn_relay(relays, env | handoff, tmp_path)
            if simulator is not None:
                dispatcher = DispatcherProcess(env | handoff, tmp_path / "dispatcher.log")
                dispatcher.start(wait_ready=True)
            load = Load(plan, broker, primary)
            load.start()
            deadline = time.monotonic() + 120
            while await processed(primary) < FAULT_AT * total:
                assert time.monotonic() < deadline, "the workers did not start processing"
                await asyncio.sleep(0.2)

            injected, began, promoted = await fault(pair)
            await load.done()
            restarts = await settle(workers, primary, broker, total, lost_allowed=lost_allowed)
            ended = time.time()
            if dispatcher is not None:
                await settle_requests(primary, dispatcher)
                drained_seconds = time.time() - ended

            db = await primary.connection()
            outbox = {str(row["event_id"]) for row in await db.fetch("SELECT event_id FROM outbox")}
            received = await take_events(events, outbox)
        outcome = await compare_with_the_in_order_sequence(
            plan, db, Settings(database_url=SecretStr(url), amqp_url=SecretStr(amqp_url))
        )
        if not lost_allowed:
            assert_nothing_lost_nor_applied_twice(plan, outcome)
            await assert_outbox_tells_the_lifecycle(
                db, placed=plan.count(ORDER_PLACED), shipped=plan.count(ORDER_SHIPPED)
            )
            missing = outbox - set(received)
            unpublished = await db.fetchval(
                "SELECT count(*) FROM outbox WHERE published_at IS NULL"
            )
            assert not missing, (
                f"{len(missing)} result events never reached fulfilment.events "
                f"({unpublished} outbox rows unpublished; the relay: {relay.log_tail()})"
            )
            assert set(received) <= outbox, "events published that the outbox does not hold"
        if dispatcher is not None:
            assert simulator is not None
            measured = await measure_handoff(db, simulator, dispatcher, drained_seconds)
    finally:
        await primary.close()
        if dispatcher is not None:
            dispatcher.stop_quietly()
    exits = [*workers.stop_all(), relay.terminate()[0]]
    return (
        injected,
        Result(
            outcome=outcome,
            timings=timings(workers, began, promoted, ended),
            restarts=restarts,
            published_twice=sum(received.values()) - len(received),
            exits=exits,
            outcomes=Counter(
                str(line.get("outcome")).partition(":")[0]
                for queue in SUBSCRIBED_QUEUES
                for line in workers.log_events(f"{queue.event}.handled")
            ),
            requeued=sum(
                len(workers.log_events(f"{queue.event}.requeued")) for queue in SUBSCRIBED_QUEUES
            ),
            retried=len(workers.log_events("database_retry")),
            paused=len(workers.log_events("consumer.paused")),
            handoff=measured if dispatcher is not None else None,
        ),
        plan,
    )


def warehouse_variables(simulator: SimulatorProcess | None) -> dict[str, str]:
    """The hand-off's ``FULFILMENT_WAREHOUSE_*`` variables against ``simulator``; none without."""
    if simulator is None:
        return {}
    return {
        key: value
        for key, value in handoff_env(
            {}, simulator, FULFILMENT_WAREHOUSE_RATE_PER_SECOND=str(HANDOFF_RATE_PER_SECOND)
        ).items()
        if key.startswith("FULFILMENT_WAREHOUSE_")
    }


async def measure_handoff(
    db: asyncpg.Connection,
    simulator: SimulatorProcess,
    dispatcher: DispatcherProcess,
    drained_seconds: float,
) -> Handoff:
    """The hand-off's figures once every request is answered; the dispatcher stopped."""
    alive = dispatcher.process is not None and dispatcher.process.poll() is None
    return Handoff(
        figures=await handoff_figures(db, simulator),
        fulfilment_orders=await request_statuses(db, "fulfilment_order"),
        cancellations=await request_statuses(db, "cancellation"),
        dispatcher_restarts=0 if alive else 1,
        dispatcher_exit=dispatcher.terminate()[0],
        drained_seconds=round(drained_seconds, 2),
    )


async def settle_requests(
    primary: Primary, dispatcher: DispatcherProcess, timeout: float = 120
) -> None:
    """Wait until the dispatcher answered every request (none pending or sending)."""
    deadline = time.monotonic() + timeout
    while True:
        db = await primary.connection()
        left = await open_requests(db)
        if left == 0:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{left} requests still open after {timeout:g} s: {dispatcher.log_tail()}")
        await asyncio.sleep(0.3)


async def settle(
    workers: Cluster,
    primary: Primary,
    broker: aio_pika.abc.AbstractConnection,
    total: int,
    *,
    lost_allowed: bool,
    timeout: float = 180,
) -> int:
    """Wait until every event is processed (or, when some may be lost, until the queues are
    empty and the inbox stopped growing); restart dead workers, return how many."""
    restarts = 0
    deadline = time.monotonic() + timeout
    last, still_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        restarts += workers.restart_dead()
        count = await processed(primary)
        depths = [await depth(broker, queue.name) for queue in SUBSCRIBED_QUEUES]
        if count >= total and not any(depths):
            return restarts
        if count != last:
            last, still_since = count, time.monotonic()
        elif lost_allowed and not any(depths) and time.monotonic() - still_since > 5:
            return restarts
        await asyncio.sleep(0.3)
    pytest.fail(f"{await processed(primary)} of {total} events processed in {timeout:g} s")


async def depth(broker: aio_pika.abc.AbstractConnection, name: str) -> int:
    channel = await broker.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
        return int(queue.declaration_result.message_count or 0)
    finally:
        await channel.close()


def record(name: str, injected: str, result: Result, plan: LifecyclePlan, **extra: object) -> None:
    reconciliation = result.outcome.reconciliation
    record_figures(
        name,
        f"{plan.count(ORDER_PLACED)} orders on {len(HOT_SKUS)} hot SKUs, "
        f"{plan.count(ORDER_CANCELLED)} cancels, {plan.count(ORDER_SHIPPED)} shipments; "
        f"3 workers and a relay; {injected}",
        reconciliation,
        applied_twice=result.outcome.applied_twice,
        oversold=0 if reconciliation.invariants_hold else 1,
        stock_right=not result.outcome.skus_differing,
        worker_restarts=result.restarts,
        published_twice=result.published_twice,
        duplicates=result.outcomes["duplicate"],
        requeued=result.requeued,
        consumer_paused=result.paused,
        database_retries=result.retried,
        exits=result.exits,
        **asdict(result.timings),
        **(handoff_row(result.handoff) if result.handoff else {}),
        **extra,
    )


def handoff_row(handoff: Handoff) -> dict[str, object]:
    """The hand-off's columns of a figures row (``scripts/failover-timings``' second table)."""
    return {
        **{f"handoff_{name}": count for name, count in handoff.figures.items()},
        "fulfilment_orders": dict(handoff.fulfilment_orders),
        "cancellations": dict(handoff.cancellations),
        "dispatcher_restarts": handoff.dispatcher_restarts,
        "dispatcher_exit": handoff.dispatcher_exit,
        "requests_drained_seconds": handoff.drained_seconds,
    }


def assert_the_service_carried_on(result: Result) -> None:
    assert result.restarts == 0, f"{result.restarts} workers had to be restarted"
    assert result.exits == [0] * (WORKERS + 1), result.exits
    assert result.outcome.reconciliation.dead_lettered == 0


# --- faults ---------------------------------------------------------------------------------


async def kill_and_promote(pair: PostgresPair) -> tuple[str, float, float]:
    """SIGKILL the primary, promote the standby after the detection time, rebuild the old
    primary (pg_rewind) while the load goes on."""
    killed = pair.primary.name
    began = time.time()
    await asyncio.to_thread(pair.kill, pair.primary)
    await asyncio.sleep(PROMOTE_AFTER_SECONDS)
    await asyncio.to_thread(pair.promote)
    promoted = time.time()
    assert promoted - began < PROMOTED_WITHIN_SECONDS, promoted - began
    await asyncio.to_thread(pair.rebuild)
    injected = (
        f"SIGKILL of the primary ({killed}), {pair.primary.name} promoted "
        f"{promoted - began:.1f} s later, {pair.rebuilt[-1]}"
    )
    return injected, began, promoted


async def switch_over(pair: PostgresPair) -> tuple[str, float, float]:
    """``pg_ctl stop -m fast`` on the primary, then promote the standby and rebuild."""
    stopped = pair.primary.name
    began = time.time()
    await asyncio.to_thread(pair.stop, pair.primary, "fast")
    took = await asyncio.to_thread(pair.promote)
    promoted = time.time()
    await asyncio.to_thread(pair.rebuild)
    injected = (
        f"switchover: pg_ctl stop -m fast of {stopped}, {pair.primary.name} promoted in "
        f"{took:.1f} s, {pair.rebuilt[-1]}"
    )
    return injected, began, promoted


STANDBY_DOWN_SECONDS = 15.0


async def standby_down(pair: PostgresPair) -> tuple[str, float, float]:
    """Stop the synchronous standby for :data:`STANDBY_DOWN_SECONDS`, then start it again."""
    standby = pair.standby
    began = time.time()
    await asyncio.to_thread(pair.stop, standby, "fast")
    await asyncio.sleep(STANDBY_DOWN_SECONDS)
    await asyncio.to_thread(pair.start, standby)
    await asyncio.to_thread(pair.wait_streaming)
    injected = f"synchronous standby ({standby.name}) stopped for {STANDBY_DOWN_SECONDS:g} s"
    return injected, began, began


# --- scenarios ------------------------------------------------------------------------------


@pytest.fixture
def scenario(postgres_pair, failover_url, workers, relays, failover_env, amqp_url, tmp_path):
    async def run(
        fault: Fault,
        seed: int,
        *,
        lost_allowed: bool = False,
        simulator: SimulatorProcess | None = None,
        lag: int = 0,
    ) -> tuple[str, Result, LifecyclePlan]:
        return await run_scenario(
            fault,
            pair=postgres_pair,
            url=failover_url,
            workers=workers,
            relays=relays,
            env=failover_env,
            amqp_url=amqp_url,
            tmp_path=tmp_path,
            seed=seed,
            lost_allowed=lost_allowed,
            simulator=simulator,
            lag=lag,
        )

    return run


async def test_the_primary_killed_under_load_loses_nothing_and_applies_nothing_twice(scenario):
    injected, result, plan = await scenario(kill_and_promote, seed=41)
    record("database failover: primary killed (synchronous)", injected, result, plan)
    assert_the_service_carried_on(result)


async def test_the_dispatcher_follows_the_primary_and_hands_each_order_off_once(
    scenario, tmp_path: Path
):
    simulator = SimulatorProcess(tmp_path / "simulator.log")
    simulator.start()
    try:
        # Cancels and shipments a second behind their orders: most orders are at the
        # warehouse by then, so their cancellations wait for its answer, across the failover.
        injected, result, plan = await scenario(
            kill_and_promote, seed=46, simulator=simulator, lag=HANDOFF_LAG_WAVES
        )
    finally:
        simulator.stop()
    record("database failover with the warehouse hand-off", injected, result, plan)
    assert_the_service_carried_on(result)
    handoff = result.handoff
    assert handoff is not None
    # Requests lost, duplicate orders at the warehouse, cancels applied twice: all 0.
    assert handoff.figures == dict.fromkeys(handoff.figures, 0), handoff.figures
    assert set(handoff.fulfilment_orders) <= {"accepted", "withdrawn"}, handoff.fulfilment_orders
    # The simulator never picks an order here, so every cancellation sent is accepted.
    assert set(handoff.cancellations) <= {"accepted", "withdrawn"}, handoff.cancellations
    assert handoff.cancellations["accepted"] > 0, "no cancellation waited for the warehouse"
    assert (handoff.dispatcher_restarts, handoff.dispatcher_exit) == (0, 0)


async def test_a_second_failover_back_to_the_rebuilt_server_loses_nothing(scenario, postgres_pair):
    if not postgres_pair.rebuilt:  # run alone: make the primary a rebuilt server first
        await kill_and_promote(postgres_pair)
    rebuilt = postgres_pair.rebuilt[-1].split(":")[0]
    # The rebuilt server is the standby: the failover goes back to it.
    assert postgres_pair.standby.name == rebuilt
    injected, result, plan = await scenario(kill_and_promote, seed=42)
    assert postgres_pair.primary.name == rebuilt
    record("database failover back to the rebuilt server", injected, result, plan)
    assert_the_service_carried_on(result)


async def test_a_planned_switchover_loses_nothing_and_reports_its_pause(scenario):
    injected, result, plan = await scenario(switch_over, seed=43)
    record("database switchover (pg_ctl stop -m fast, promote)", injected, result, plan)
    assert_the_service_carried_on(result)
    assert result.timings.longest_pause_seconds < 30, result.timings


async def test_the_synchronous_standby_down_holds_commits_and_dead_letters_nothing(scenario):
    injected, result, plan = await scenario(standby_down, seed=44)
    record("synchronous standby down, then back", injected, result, plan)
    assert_the_service_carried_on(result)
    # Nothing was acknowledged while no standby confirmed commits: the waiting commits held
    # their rows and inbox entries, so the deliveries behind them ran out of their deadline,
    # went back to the queue, and the consumers paused; the redeliveries of the waiting ones
    # came back as duplicates once the standby confirmed them.
    assert result.timings.longest_pause_seconds >= STANDBY_DOWN_SECONDS - 1, result.timings
    assert result.requeued > 0
    assert result.paused > 0


async def test_asynchronous_replication_loses_what_the_standby_had_not_received(
    scenario, postgres_pair, workers
):
    postgres_pair.replication = ASYNCHRONOUS
    try:
        await asyncio.to_thread(postgres_pair.heal)
        injected, result, plan = await scenario(kill_and_promote, seed=45, lost_allowed=True)
    finally:
        postgres_pair.replication = "'*'"
    reconciliation = result.outcome.reconciliation
    # Lost: deliveries a worker acknowledged whose change the promoted standby never received;
    # the broker forgot them at the acknowledgement, so nothing brings them back.
    lost = acknowledged(workers) & set(reconciliation.missing)
    assert set(reconciliation.missing) == lost, "missing events that no worker acknowledged"
    record(
        "database failover with asynchronous replication (loss measured)",
        injected,
        result,
        plan,
        acknowledged_and_lost=len(lost),
        acknowledged=len(handled_lines(workers)),
        replication="asynchronous",
    )
    assert result.restarts == 0
    assert result.exits == [0] * (WORKERS + 1), result.exits
    assert DEAD_LETTER_QUEUES  # reconcile read every DLQ: a lost event is not a dead letter
