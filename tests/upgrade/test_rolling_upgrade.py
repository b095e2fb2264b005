"""The previous release runs beside this one, under load, through the migration and a rolling
update, as docs/deploy.md upgrades the service.

The previous release (``releases.toml``, built from its commit and installed with its own lock
file: ``conftest.previous``) migrates a new database, and its worker replicas, relay and
dispatcher serve a steady load of every input event kind: orders on hot SKUs, whole and partial
cancels (some before their order) and shipments (``failoverlib.Load``), with the hand-off on
from the start against the warehouse simulator, which refuses late cancels. Both releases read
one environment (the ConfigMap). While the previous release serves, this tree's ``fulfilment
migrate`` runs (the migration Job), then this tree's dispatcher, workers and relay start beside
them, and the old processes are stopped one at a time by SIGTERM, each after its replacement is
ready, or standing by for the lock (``maxSurge: 1``, ``maxUnavailable: 0``). Then the
warehouse's webhooks go on, as docs/deploy.md says (once no process of the previous release
runs; its dispatcher stops last): this tree's ``fulfilment webhooks`` starts, and the
simulator ships the orders it takes from then on, some in parts, and sends each shipment as a
signed webhook to it. The load goes on meanwhile, then stops, and everything drains. The
checks:

- nothing lost, nothing applied twice, nothing dead-lettered: the product's reconciliation and
  the comparison with the in-order sequence (stock's ``on_hand`` and ``reserved`` and every
  order's lines as the events applied once each, in their logical order, leave them);
- every shipment of the warehouse was applied once, none a discrepancy, and the in-order
  sequence above is followed by the warehouse's shipments (the shop's cancels the warehouse
  refused, or that were withdrawn unsent, changed nothing; those it accepted released their
  units before any shipment);
- the outbox tells each order's lifecycle once, and every result event reached
  ``fulfilment.events`` (a queue bound there), none twice;
- every reservation, by either release's workers, became one order at the warehouse, every
  request was answered, none twice (``warehouse_harness.handoff_figures``), by both releases'
  dispatchers, one at a time: this tree's stood by until the previous one stopped;
- both releases' relays published result events, one at a time, ``stock.cancel_refused``
  among the previous one's;
- every process of either release ran until it was stopped and exited 0, and each said its
  release's version in its start-up line;
- the pause: the longest gap between commits (the inbox's ``processed_at``) and between
  publishes (the outbox's ``published_at``), in the table printed at the end.

A rollback is not a rolling update: docs/deploy.md says so, and why (the previous release's
processes refuse a newer schema); this test covers the way forward only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import asyncpg
import pytest
from pydantic import SecretStr

from fulfilment.contracts.topology import ORDER_CANCELLED, ORDER_PLACED, ORDER_SHIPPED
from fulfilment.contracts.warehouse_events import ShipmentV1
from fulfilment.domain.warehouse_events import RecordShipment, Source
from fulfilment.routes.table import SUBSCRIBED_QUEUES
from fulfilment.settings import BrokerSettings, DatabaseSettings, Settings
from tests.e2e.harness import FAST_SETTINGS, WorkerProcess, put_stock, queue_depth
from tests.e2e.relay_harness import RelayProcess, bind_events_queue, take_events, unpublished
from tests.e2e.warehouse_harness import (
    DispatcherProcess,
    SimulatorProcess,
    handoff_env,
    handoff_figures,
    open_requests,
    request_statuses,
)
from tests.failover.failoverlib import Load, Primary
from tests.faults.faultlib import assert_outbox_tells_the_lifecycle, connect_db, inbox_count
from tests.faults.test_lifecycle_faults import (
    STOCK,
    LifecyclePlan,
    Outcome,
    assert_nothing_lost_nor_applied_twice,
    compare_with_the_in_order_sequence,
    lifecycle_plan,
)
from tests.support.webhooks import SECRET, IntakeProcess, intake_env
from tests.upgrade.upgradelib import (
    TABLES,
    THIS_TREE,
    InstalledRelease,
    head_commit,
    head_version,
    longest_gap,
    table,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.timeout(420)]

WORKERS = 2
"""Worker replicas of each release (the Deployment's ``replicas``)."""
DELIVERY_LIMIT = 20
"""Above the handful of returns the stopped workers' drains cause, so no innocent delivery is
taken for poison; both releases declare the queues with it."""
WAVE_SECONDS = 0.5
"""A wave of 40 orders (with their cancels and shipments) every half second: about 110 events
per second, a steady load that two workers of either release keep up with on two cores."""
PLAN_ORDERS = 20_000
"""More orders than the load ever publishes: it stops when the rollout is over."""
OLD_ALONE_SECONDS = 6.0
"""The previous release alone under the load before the migration."""
DWELL_SECONDS = 2.0
"""Between two steps of the rollout: both releases serve side by side meanwhile."""
AFTER_SECONDS = 6.0
"""The load kept on after the last process of the previous release stopped."""
WAREHOUSE_RATE_PER_SECOND = "200"
"""This tree's dispatcher's cap: high enough that the requests drain with the events."""
PICK_DELAY_SECONDS = 0.3
"""The simulated warehouse picks an order this long after it took it: a cancellation sent
later is refused (``stock.cancel_refused``), by either release's dispatcher."""
LONGEST_PAUSE_SECONDS = 20.0
"""A gap in commits longer than this is a stall, not a rollout's step."""
SPLIT_RATE = 0.5
"""Once the webhooks are on, half the orders the warehouse ships leave in several shipments."""


def release_env(database_url: str, amqp_url: str, simulator: SimulatorProcess) -> dict[str, str]:
    """The environment of either release's processes (one ConfigMap): the suite's short time
    bounds, the delivery limit, the relay polling every 0.2 s, and the hand-off's
    ``FULFILMENT_WAREHOUSE_*`` variables against ``simulator``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
    env.update(FAST_SETTINGS)
    env.update(
        FULFILMENT_DATABASE_URL=database_url,
        FULFILMENT_AMQP_URL=amqp_url,
        FULFILMENT_LOG_LEVEL="INFO",
        FULFILMENT_DELIVERY_LIMIT=str(DELIVERY_LIMIT),
        FULFILMENT_RELAY_POLL_SECONDS="0.2",
    )
    env.update(
        (key, value)
        for key, value in handoff_env(
            {}, simulator, FULFILMENT_WAREHOUSE_RATE_PER_SECOND=WAREHOUSE_RATE_PER_SECOND
        ).items()
        if key.startswith("FULFILMENT_WAREHOUSE_")
    )
    return env


async def migrate(fulfilment: str, env: dict[str, str]) -> float:
    """``fulfilment migrate`` of one release; the seconds it took. Fails the test on an exit
    other than 0."""
    started = time.monotonic()
    done = await asyncio.to_thread(
        subprocess.run, [fulfilment, "migrate"], env=env, capture_output=True, timeout=120
    )
    if done.returncode != 0:
        pytest.fail(
            f"{fulfilment} migrate exited {done.returncode}: "
            f"{(done.stdout + done.stderr).decode(errors='replace')[-2000:]}",
            pytrace=False,
        )
    return time.monotonic() - started


class Fleet:
    """The processes of both releases, by name; what each exited with."""

    def __init__(self) -> None:
        self.processes: dict[str, WorkerProcess] = {}
        self.exits: dict[str, int] = {}
        self.stopped_at: dict[str, float] = {}
        """When each was sent SIGTERM (epoch seconds)."""

    async def start(self, name: str, process: WorkerProcess, *, wait_ready: bool = True) -> None:
        """Start ``process`` (in a thread: the load goes on meanwhile), then check that every
        other one still runs."""
        self.processes[name] = process
        await asyncio.to_thread(process.start, wait_ready=wait_ready)
        self.assert_running()

    async def stop(self, name: str) -> None:
        """SIGTERM ``name`` and wait for its exit; every other one must still run."""
        self.assert_running()
        self.stopped_at[name] = time.time()
        code, _ = await asyncio.to_thread(self.processes[name].terminate)
        self.exits[name] = code

    def assert_running(self) -> None:
        """No process exited before it was stopped (a crash, or a refusal to serve)."""
        for name, process in self.processes.items():
            if name not in self.exits and process.process is not None:
                code = process.process.poll()
                if code is not None:
                    self.exits[name] = code
                    pytest.fail(f"{name} exited {code} unasked: {process.log_tail(10)}")

    def running(self) -> list[str]:
        return [name for name in self.processes if name not in self.exits]

    def kill_all(self) -> None:
        for process in self.processes.values():
            process.stop_quietly()

    def version(self, name: str) -> str:
        """The version ``name`` gave in its start-up line (``<program>.starting``)."""
        for line in self.processes[name].log_lines():
            if str(line.get("event", "")).endswith(".starting"):
                return str(line.get("version"))
        return "none logged"

    def handled(self, prefix: str) -> Counter[str]:
        """Deliveries handled by the workers whose names start with ``prefix``, by outcome."""
        outcomes: Counter[str] = Counter()
        for name, process in self.processes.items():
            if name.startswith(prefix) and "worker" in name:
                for line in process.log_lines():
                    if str(line.get("event", "")).endswith(".handled"):
                        outcomes[str(line.get("outcome")).partition(":")[0]] += 1
        return outcomes

    async def wait_for_role(self, name: str, role: str) -> None:
        """Wait (30 s at most) until the relay or dispatcher ``name`` reports ``role``
        (``standby``, ``active``) on ``/health/ready``."""
        process = self.processes[name]
        assert isinstance(process, RelayProcess | DispatcherProcess), name
        deadline = time.monotonic() + 30
        while (said := await asyncio.to_thread(process.readiness)).get("role") != role:
            self.assert_running()
            if time.monotonic() > deadline:
                pytest.fail(f"{name} not {role} within 30 s: {said}; {process.log_tail(10)}")
            await asyncio.sleep(0.2)


def build_info(port: int) -> str:
    """The ``fulfilment_build_info`` line of the process's ``/metrics`` on ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        text = page.read().decode()
    return next(
        (line for line in text.splitlines() if line.startswith("fulfilment_build_info")), ""
    )


async def settle(
    db: asyncpg.Connection, broker: aio_pika.abc.AbstractConnection, plan: LifecyclePlan
) -> None:
    """Wait (2 minutes at most) until every published event is in the inbox, the queues are
    empty, every warehouse request is answered and every result event is published."""
    deadline = time.monotonic() + 120
    while True:
        depths = [await queue_depth(broker, queue.name) for queue in SUBSCRIBED_QUEUES]
        counts = (await inbox_count(db), await open_requests(db), await unpublished(db))
        if counts[0] >= len(plan.in_order) and not any(depths) and not any(counts[1:]):
            return
        if time.monotonic() > deadline:
            pytest.fail(
                f"not drained in 120 s: {counts[0]} of {len(plan.in_order)} events in the inbox,"
                f" queues {depths}, {counts[1]} requests open, {counts[2]} outbox rows unpublished"
            )
        await asyncio.sleep(0.3)


async def without_cancels_that_changed_nothing(
    db: asyncpg.Connection, plan: LifecyclePlan
) -> LifecyclePlan:
    """``plan`` without the cancels that changed nothing in its in-order sequence: those the
    warehouse refused (the order stays reserved and ships), those withdrawn unsent (the order
    held nothing more to cancel by then), and those that came after the warehouse's shipments
    had shipped the whole order (``cancel_after_ship``); every event is still published and in
    the inbox.

    A cancel the warehouse accepted stays: it refuses the shop's cancels once it began the
    work, so an accepted one released its units before any shipment of the order took the
    rest, even when its answer was recorded after the shipment's ``shipped_at`` (the
    warehouse's clock, not the order in which the service applied the two)."""
    refused = {
        row["causation_id"]
        for row in await db.fetch(
            "SELECT causation_id FROM warehouse_requests"
            " WHERE kind = 'cancellation' AND status IN ('refused', 'withdrawn')"
            " UNION SELECT i.event_id FROM inbox_messages AS i"
            " WHERE i.outcome = 'cancel_after_ship' AND EXISTS (SELECT 1"
            "   FROM warehouse_shipments AS s WHERE s.order_id = i.order_id"
            "   AND s.outcome = 'shipped')"
        )
    }
    return LifecyclePlan(
        [event for event in plan.in_order if event.event_id not in refused],
        plan.early,
        plan.waves,
    )


async def webhooks_on(
    simulator: SimulatorProcess, database_url: str, tmp_path: Path
) -> IntakeProcess:
    """Start this tree's ``fulfilment webhooks`` and have the simulator ship the orders it takes
    from now on (some in parts) and send its shipments there, signed."""
    intake = IntakeProcess(intake_env(database_url), tmp_path / "intake.log")
    await asyncio.to_thread(intake.start)
    simulator.faults(
        ship_delay_seconds=PICK_DELAY_SECONDS,
        split_rate=SPLIT_RATE,
        webhook_url=intake.url,
        webhook_secrets=[SECRET],
    )
    return intake


async def settle_warehouse(
    db: asyncpg.Connection, simulator: SimulatorProcess
) -> list[RecordShipment]:
    """Wait (2 minutes at most) until the warehouse has shipped all it will and every shipment
    is recorded; its shipments, in the order it made them, as commands."""
    deadline = time.monotonic() + 120
    while True:
        record = await asyncio.to_thread(simulator.record)
        recorded = await db.fetchval("SELECT count(*) FROM warehouse_shipments")
        settled = not record["work_pending"] and not record["in_flight"]
        if settled and recorded == len(record["shipments"]):
            return [
                # As the intake parses a webhook's data: strict, from its JSON.
                ShipmentV1.model_validate_json(json.dumps(data)).to_command(
                    webhook_id=None, source=Source.POLL
                )
                for data in record["shipments"]
            ]
        if time.monotonic() > deadline:
            pytest.fail(
                f"the warehouse not settled in 120 s: {len(record['shipments'])} shipments,"
                f" {recorded} recorded, {record['work_pending']} steps of work pending,"
                f" {record['in_flight']} webhooks in flight"
            )
        await asyncio.sleep(0.3)


async def start_previous(
    fleet: Fleet,
    previous: InstalledRelease,
    env: dict[str, str],
    db: asyncpg.Connection,
    tmp_path: Path,
) -> None:
    """The previous release as it ran before the upgrade: its ``migrate`` of the new database,
    the stock, its workers, relay and dispatcher, each ready (the relay and the dispatcher
    active)."""
    old = previous.release.version
    await migrate(previous.fulfilment, env)
    await put_stock(db, STOCK)
    for index in range(WORKERS):
        await fleet.start(
            f"{old} worker {index}",
            WorkerProcess(dict(env), tmp_path / f"old-worker-{index}.log", python=previous.python),
        )
    await fleet.start(
        f"{old} relay", RelayProcess(dict(env), tmp_path / "old-relay.log", python=previous.python)
    )
    await fleet.start(
        f"{old} dispatcher",
        DispatcherProcess(dict(env), tmp_path / "old-dispatcher.log", python=previous.python),
    )
    await fleet.wait_for_role(f"{old} relay", "active")


async def roll_out(fleet: Fleet, old: str, new: str, env: dict[str, str], tmp_path: Path) -> None:
    """The rolling update of the Deployments: each new pod started (and ready, or standing by
    for the lock the old one holds) before an old one is stopped by SIGTERM, one at a time,
    both releases serving in between; the new relay and dispatcher take over the lock."""
    await fleet.start(
        f"{new} dispatcher",
        DispatcherProcess(dict(env), tmp_path / "new-dispatcher.log"),
        wait_ready=False,  # a standby is not ready: the previous release's holds the lock
    )
    await fleet.wait_for_role(f"{new} dispatcher", "standby")
    for index in range(WORKERS):
        await replace_worker(fleet, f"{old} worker {index}", f"{new} worker {index}", env, tmp_path)
    await fleet.start(f"{new} relay", RelayProcess(dict(env), tmp_path / "new-relay.log"))
    await fleet.wait_for_role(f"{new} relay", "standby")
    await asyncio.sleep(DWELL_SECONDS)
    await fleet.stop(f"{old} relay")
    await fleet.wait_for_role(f"{new} relay", "active")
    await fleet.stop(f"{old} dispatcher")
    await fleet.wait_for_role(f"{new} dispatcher", "active")


async def replace_worker(
    fleet: Fleet, old_name: str, new_name: str, env: dict[str, str], tmp_path: Path
) -> None:
    """Start ``new_name``, a worker of this tree on ``env``, then stop ``old_name``."""
    log = tmp_path / f"{new_name.replace(' ', '-')}.log"
    await fleet.start(new_name, WorkerProcess(dict(env), log))
    await asyncio.sleep(DWELL_SECONDS)
    await fleet.stop(old_name)
    await asyncio.sleep(DWELL_SECONDS)


async def test_the_previous_release_runs_beside_this_one_through_a_rolling_update_under_load(  # noqa: PLR0915 - one scenario in reading order
    previous: InstalledRelease,
    upgrade_database: str,
    amqp_url: str,
    simulator: SimulatorProcess,
    tmp_path: Path,
) -> None:
    old, new = previous.release.version, head_version()
    env = release_env(upgrade_database, amqp_url, simulator)
    simulator.faults(pick_delay_seconds=PICK_DELAY_SECONDS)
    fleet = Fleet()
    primary = Primary(upgrade_database)
    db = await connect_db(upgrade_database)
    run = Run()
    load: Load | None = None
    intake: IntakeProcess | None = None
    try:
        await start_previous(fleet, previous, env, db, tmp_path)
        async with await aio_pika.connect(amqp_url) as broker:
            events = await bind_events_queue(broker)
            plan = lifecycle_plan(
                PLAN_ORDERS, cancelled=0.2, shipped=0.2, early=0.05, lag=1, seed=38
            )
            load = Load(plan, broker, primary, interval=WAVE_SECONDS)
            load.start()
            await asyncio.sleep(OLD_ALONE_SECONDS)
            assert await inbox_count(db) > 0, "the previous release processed nothing"
            # The migration Job of this tree's release, while the previous one serves.
            run.migrate_seconds = await migrate(str(Path(THIS_TREE).with_name("fulfilment")), env)
            fleet.assert_running()
            await asyncio.sleep(DWELL_SECONDS)
            started = time.monotonic()
            await roll_out(fleet, old, new, env, tmp_path)
            run.rollout_seconds = time.monotonic() - started
            intake = await webhooks_on(simulator, upgrade_database, tmp_path)
            await asyncio.sleep(AFTER_SECONDS)
            assert load.publishing, "the load ran out before the rollout ended: a longer plan"
            load.stop()
            await load.done()
            plan = load.as_published()
            # The last orders' fulfilment orders go out as the queues drain, and the warehouse
            # ships them after that; their result events are published after that again.
            await settle(db, broker, plan)
            run.shipments = await settle_warehouse(db, simulator)
            await settle(db, broker, plan)
            outbox = {str(row["event_id"]) for row in await db.fetch("SELECT event_id FROM outbox")}
            run.received = await take_events(events, outbox)
            run.metrics = {name: build_info(fleet.processes[name].port) for name in fleet.running()}
        for name in fleet.running():
            await fleet.stop(name)
        run.intake_exit = await asyncio.to_thread(intake.terminate)
        outcome = await compare_with_the_in_order_sequence(
            await without_cancels_that_changed_nothing(db, plan),
            db,
            Settings(
                database=DatabaseSettings(url=SecretStr(upgrade_database)),
                broker=BrokerSettings(amqp_url=SecretStr(amqp_url)),
            ),
            run.shipments,
        )
        run.warehouse = await warehouse_figures(db, run.shipments)
        run.handoff = await handoff_figures(db, simulator)
        run.handover = await handover(db, fleet, old)
        TABLES.append(await figures_table(previous, new, plan, outcome, fleet, db, run))
        await assert_upgraded(plan, outcome, outbox, fleet, db, run, old=old, new=new)
    finally:
        if load is not None:
            await load.cancel()
        if intake is not None:
            intake.stop_quietly()
        fleet.kill_all()
        await primary.close()
        with contextlib.suppress(Exception):
            await db.close()


@dataclass
class Run:
    """What the run measured beside the database."""

    migrate_seconds: float = 0.0
    rollout_seconds: float = 0.0
    received: Counter[str] = field(default_factory=Counter)
    """Every message of the queue bound to ``fulfilment.events``, by ``message_id``."""
    metrics: dict[str, str] = field(default_factory=dict)
    """Each process's ``fulfilment_build_info`` line, read before it stopped."""
    handoff: dict[str, int] = field(default_factory=dict)
    """``warehouse_harness.handoff_figures``."""
    handover: Handover | None = None
    shipments: list[RecordShipment] = field(default_factory=list)
    """The warehouse's shipments, in the order it made them."""
    intake_exit: int | None = None
    warehouse: WarehouseFigures | None = None


@dataclass(frozen=True)
class WarehouseFigures:
    """What the warehouse's shipments came to in the database."""

    shipments: int
    """Shipments the warehouse made."""
    orders: int
    """Orders they shipped (fewer than ``shipments``: some left in parts)."""
    applied: int
    """Shipments recorded, by ``shipment_id``: each once."""
    same_ids: bool
    """The recorded ``shipment_id`` are the warehouse's, none missing, none more."""
    webhooks: int
    """Webhook ids recorded (``webhook_inbox``)."""
    discrepancies: int
    invalid: int
    """Webhooks kept as invalid."""


async def warehouse_figures(
    db: asyncpg.Connection, shipments: list[RecordShipment]
) -> WarehouseFigures:
    """The :class:`WarehouseFigures` of a run."""
    recorded = [
        row["shipment_id"] for row in await db.fetch("SELECT shipment_id FROM warehouse_shipments")
    ]

    async def count(table: str) -> int:
        return int(await db.fetchval(f"SELECT count(*) FROM {table}"))  # noqa: S608

    return WarehouseFigures(
        shipments=len(shipments),
        orders=len({shipment.order_id for shipment in shipments}),
        applied=len(recorded),
        same_ids=sorted(recorded) == sorted(shipment.shipment_id for shipment in shipments),
        webhooks=await count("webhook_inbox"),
        discrepancies=await count("warehouse_discrepancies"),
        invalid=await count("invalid_webhooks"),
    )


@dataclass(frozen=True)
class Handover:
    """The relays' and the dispatchers' work on either side of the previous release's
    stopping (its SIGTERM; what it finished after that counts as after)."""

    published: tuple[int, int]
    """Outbox rows published before and after the previous relay was stopped."""
    refused: tuple[int, int]
    """``stock.cancel_refused`` rows written before and after the previous relay was stopped."""
    answered: tuple[int, int]
    """Warehouse requests answered before and after the previous dispatcher was stopped."""


async def handover(db: asyncpg.Connection, fleet: Fleet, old: str) -> Handover:
    """The :class:`Handover` of a run, from the outbox, the requests and the stop times."""
    relay_stopped = fleet.stopped_at[f"{old} relay"]
    dispatcher_stopped = fleet.stopped_at[f"{old} dispatcher"]

    async def split(sql: str, stopped: float) -> tuple[int, int]:
        row = await db.fetchrow(sql, stopped)
        assert row is not None
        return int(row["before"]), int(row["after"])

    return Handover(
        published=await split(
            "SELECT count(*) FILTER (WHERE published_at < to_timestamp($1)) AS before,"
            " count(*) FILTER (WHERE published_at >= to_timestamp($1)) AS after FROM outbox",
            relay_stopped,
        ),
        refused=await split(
            "SELECT count(*) FILTER (WHERE created_at < to_timestamp($1)) AS before,"
            " count(*) FILTER (WHERE created_at >= to_timestamp($1)) AS after FROM outbox"
            " WHERE routing_key = 'stock.cancel_refused'",
            relay_stopped,
        ),
        answered=await split(
            "SELECT count(*) FILTER (WHERE answered_at < to_timestamp($1)) AS before,"
            " count(*) FILTER (WHERE answered_at >= to_timestamp($1)) AS after"
            " FROM warehouse_requests",
            dispatcher_stopped,
        ),
    )


async def assert_upgraded(
    plan: LifecyclePlan,
    outcome: Outcome,
    outbox: set[str],
    fleet: Fleet,
    db: asyncpg.Connection,
    run: Run,
    *,
    old: str,
    new: str,
) -> None:
    """The checks of the module's docstring."""
    # Nothing lost, applied twice or dead-lettered; stock exact.
    assert_nothing_lost_nor_applied_twice(plan, outcome)
    # Each warehouse shipment applied once; an upstream OrderShipped after the warehouse
    # shipped the whole order writes no event, so the outbox is held to the changes instead.
    figures = run.warehouse
    assert figures is not None
    assert figures.shipments > figures.orders > 0, figures
    assert figures.same_ids, figures
    assert figures.webhooks >= figures.applied, figures
    assert (figures.discrepancies, figures.invalid) == (0, 0), figures
    assert run.intake_exit == 0, run.intake_exit
    await assert_outbox_tells_the_lifecycle(db, placed=plan.count(ORDER_PLACED))
    # Every result event published, none twice, none the outbox does not hold.
    received = run.received
    assert not outbox - set(received), f"{len(outbox - set(received))} never published"
    assert set(received) <= outbox, "events published that the outbox does not hold"
    assert sum(received.values()) == len(received), "result events published twice"
    # Every warehouse request answered, once.
    assert run.handoff == dict.fromkeys(run.handoff, 0), run.handoff
    assert set(await request_statuses(db, "fulfilment_order")) <= {"accepted", "withdrawn"}
    assert set(await request_statuses(db, "cancellation")) <= {"accepted", "withdrawn", "refused"}
    # Each relay and each dispatcher did its share: the previous relay published the refusals
    # of the previous dispatcher's cancels, and the new ones took over.
    assert run.handover is not None
    assert all(run.handover.published), run.handover
    assert run.handover.refused[0] > 0, run.handover
    assert all(run.handover.answered), run.handover
    # Both releases served, each process said its version, every exit was 0.
    assert fleet.handled(old).total() > 0
    assert fleet.handled(new).total() > 0
    versions = {name: fleet.version(name) for name in fleet.processes}
    assert versions == {name: name.split()[0] for name in fleet.processes}, versions
    assert all(f'version="{new}"' in line for line in run.metrics.values()), run.metrics
    assert fleet.exits == dict.fromkeys(fleet.processes, 0), fleet.exits
    pause = await longest_gap(db, "inbox_messages", "processed_at")
    assert pause < LONGEST_PAUSE_SECONDS, f"no commit for {pause} s"


async def figures_table(
    previous: InstalledRelease,
    new: str,
    plan: LifecyclePlan,
    outcome: Outcome,
    fleet: Fleet,
    db: asyncpg.Connection,
    run: Run,
) -> str:
    """The run's figures, as the table the session prints at its end."""
    old = previous.release.version
    reconciliation = outcome.reconciliation
    received, handoff = run.received, run.handoff
    requests = await request_statuses(db, "fulfilment_order") + await request_statuses(
        db, "cancellation"
    )

    def exits(release: str) -> str:
        return ", ".join(
            f"{name.removeprefix(release + ' ')}: {code}"
            for name, code in fleet.exits.items()
            if name.startswith(release + " ")
        )

    placed, cancelled, shipped = (
        plan.count(q) for q in (ORDER_PLACED, ORDER_CANCELLED, ORDER_SHIPPED)
    )
    twice = sum(received.values()) - len(received)
    lost, duplicate = handoff["requests_lost"], handoff["duplicate_orders"]
    assert run.handover is not None
    assert run.warehouse is not None
    warehouse = run.warehouse
    webhooks = warehouse.webhooks
    published, refused, answered = (
        run.handover.published,
        run.handover.refused,
        run.handover.answered,
    )
    return table(
        f"Rolling upgrade {old} ({previous.release.short}) -> {new} ({head_commit()}), "
        f"{os.cpu_count()} cores",
        [
            (
                "events (orders, cancels, shipments)",
                f"{len(plan.in_order)} ({placed}, {cancelled}, {shipped})",
            ),
            (
                f"handled by {old} / by {new}",
                f"{fleet.handled(old).total()} / {fleet.handled(new).total()}",
            ),
            ("lost", len(reconciliation.missing)),
            ("applied twice", outcome.applied_twice),
            ("processed and dead-lettered", len(reconciliation.twice)),
            ("dead-lettered", reconciliation.dead_lettered),
            ("stock exact (on_hand, reserved)", "yes" if not outcome.skus_differing else "no"),
            ("invariants hold", "yes" if reconciliation.invariants_hold else "no"),
            (
                "result events (distinct, received, received twice)",
                f"{len(received)}, {sum(received.values())}, {twice}",
            ),
            (
                "warehouse requests (closed; lost, duplicate, cancelled twice)",
                f"{requests.total()}; {lost}, {duplicate}, {handoff['cancels_applied_twice']}",
            ),
            (
                f"result events published before / after {old}'s relay stopped",
                f"{published[0]} / {published[1]}",
            ),
            (
                f"stock.cancel_refused written before / after {old}'s relay stopped",
                f"{refused[0]} / {refused[1]}",
            ),
            (
                f"warehouse requests answered before / after {old}'s dispatcher stopped",
                f"{answered[0]} / {answered[1]}",
            ),
            (
                "warehouse shipments after the rollout (orders; applied; webhook ids)",
                f"{warehouse.shipments} ({warehouse.orders}); {warehouse.applied}; {webhooks}",
            ),
            (f"{new} migrate under load", f"{run.migrate_seconds:.1f} s"),
            ("rollout (first new start to last old exit)", f"{run.rollout_seconds:.1f} s"),
            (
                "longest gap between commits",
                f"{await longest_gap(db, 'inbox_messages', 'processed_at')} s",
            ),
            (
                "longest gap between publishes",
                f"{await longest_gap(db, 'outbox', 'published_at')} s",
            ),
            (f"exits of {old}", exits(old)),
            (f"exits of {new}", exits(new)),
        ],
    )
