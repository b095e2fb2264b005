"""Helpers of the fault suite: worker clusters, synthetic orders, reconciliation, figures."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from fulfilment.adapters.rabbitmq.publishing import OutgoingEvent, publish_events
from fulfilment.contracts.order_placed import order_placed_body
from fulfilment.contracts.result_events import StockReleasedV1, StockShippedV1, parse_result_event
from fulfilment.contracts.topology import (
    ORDER_PLACED_DEAD_LETTER_QUEUE,
    ORDER_PLACED_QUEUE,
    ORDER_PLACED_ROUTING_KEY,
    ORDERS_EXCHANGE,
)
from fulfilment.domain.warehouse_events import warehouse_event_id
from fulfilment.entrypoints.cli.options import tool_options
from fulfilment.settings import Settings
from fulfilment.tools.report import Reconciliation, reconcile
from fulfilment.worker.topology import Topology, declare_topology
from tests.e2e.harness import FAST_SETTINGS, WorkerProcess, queue_depth


@dataclass(frozen=True)
class Order:
    event_id: uuid.UUID
    lines: tuple[tuple[str, int], ...]

    def event(self) -> OutgoingEvent:
        body = order_placed_body(
            event_id=self.event_id,
            order_id=uuid.uuid5(uuid.NAMESPACE_OID, str(self.event_id)),
            placed_at=datetime.now(UTC),
            lines=list(self.lines),
        )
        return OutgoingEvent(body, str(self.event_id))


SYNTHETIC_SKUS = 40
"""SKUs ``synthetic_orders`` draws from by default: ``synthetic_sku(0)`` to ``(39)``."""

LIMIT = int(FAST_SETTINGS["FULFILMENT_DELIVERY_LIMIT"])
"""The delivery limit the workers of the suite run with (``harness.FAST_SETTINGS``)."""


def synthetic_sku(index: int) -> str:
    """The code of the ``index``-th synthetic SKU, e.g. ``SKU007``."""
    return f"SKU{index:03d}"


AMPLE_STOCK = {synthetic_sku(i): 1_000_000 for i in range(SYNTHETIC_SKUS)}
"""Far more of every synthetic SKU than any scenario orders: nothing is rejected."""


def synthetic_orders(count: int, skus: int = SYNTHETIC_SKUS, seed: int = 7) -> list[Order]:
    """``count`` orders of 1-3 lines over ``skus`` SKUs, the same for the same seed."""
    rng = random.Random(seed)
    return [
        Order(
            uuid.UUID(int=rng.getrandbits(128), version=4),
            tuple(
                (synthetic_sku(rng.randrange(skus)), rng.randint(1, 3))
                for _ in range(rng.randint(1, 3))
            ),
        )
        for _ in range(count)
    ]


@dataclass
class Cluster:
    """Worker processes over one database and vhost, restarted when they die."""

    env: dict[str, str]
    tmp_path: Path
    workers: list[WorkerProcess] = field(default_factory=list)
    starts: int = 0

    def start(self, count: int = 1, *, wait_ready: bool = False, **env: str) -> list[WorkerProcess]:
        started = []
        for _ in range(count):
            worker = WorkerProcess({**self.env, **env}, self.tmp_path / f"worker-{self.starts}.log")
            self.starts += 1
            worker.start(wait_ready=wait_ready)
            self.workers.append(worker)
            started.append(worker)
        return started

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.process is not None and w.process.poll() is None]

    def restart_dead(self) -> int:
        """Start one worker for each that died since; return how many were restarted."""
        dead = [w for w in self.workers if w.process is not None and w.process.poll() is not None]
        for worker in dead:
            self.workers.remove(worker)
        for worker in dead:
            self.start(1, **{k: v for k, v in worker.env.items() if k.startswith("FULFILMENT_")})
        return len(dead)

    def log_events(self, name: str) -> list[dict[str, Any]]:
        lines = []
        for path in sorted(self.tmp_path.glob("worker-*.log")):
            lines += [
                line for line in WorkerProcess({}, path).log_lines() if line.get("event") == name
            ]
        return lines

    def stop_all(self) -> list[int]:
        codes = []
        for worker in self.alive():
            code, _ = worker.terminate()
            codes.append(code)
        return codes

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.stop_quietly()


async def declare(amqp_url: str, delivery_limit: int) -> None:
    """Declare the topology as a worker with ``delivery_limit`` will, so a backlog can wait."""
    await declare_topology(amqp_url, Topology(delivery_limit))


async def publish(
    connection: aio_pika.abc.AbstractConnection, orders: list[Order] | list[OutgoingEvent]
) -> None:
    events = [o.event() if isinstance(o, Order) else o for o in orders]
    await publish_events(
        connection, events, exchange=ORDERS_EXCHANGE, routing_key=ORDER_PLACED_ROUTING_KEY
    )


async def settled(db: asyncpg.Connection, broker: aio_pika.abc.AbstractConnection) -> int:
    """Events processed (inbox rows) plus events dead-lettered (DLQ depth)."""
    return await inbox_count(db) + await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE)


async def run_until_settled(
    cluster: Cluster,
    db: asyncpg.Connection,
    broker: aio_pika.abc.AbstractConnection,
    expected: int,
    *,
    timeout: float = 240,
    restart: bool = True,
) -> int:
    """Restart dead workers until ``expected`` events are settled; return the restarts."""
    restarts = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if restart:
            restarts += cluster.restart_dead()
        if (
            await settled(db, broker) >= expected
            and await queue_depth(broker, ORDER_PLACED_QUEUE) == 0
        ):
            return restarts
        await asyncio.sleep(0.3)
    pytest.fail(
        f"only {await settled(db, broker)} of {expected} events settled in {timeout:g} s "
        f"({restarts} restarts)"
    )


async def assert_reconciled(
    settings: Settings, orders: list[Order], *, dead_lettered: int = 0
) -> Reconciliation:
    result = await reconcile(tool_options(settings), [order.event_id for order in orders])
    assert result.missing == frozenset(), result.describe()
    assert result.twice == frozenset(), result.describe()
    assert result.invariants_hold, result.describe()
    assert result.dead_lettered == dead_lettered, result.describe()
    assert result.processed == len(orders) - dead_lettered, result.describe()
    return result


def record_figures(scenario: str, injected: str, result: Reconciliation, **extra: Any) -> None:
    """Append one row of the Guarantees table to ``FULFILMENT_TEST_FAULT_FIGURES`` (JSON lines)."""
    target = os.environ.get("FULFILMENT_TEST_FAULT_FIGURES")
    if not target:
        return
    row = {
        "scenario": scenario,
        "injected": injected,
        "orders": result.published,
        "lost": len(result.missing),
        "applied_twice": result.reserved_mismatches,
        "processed_and_dead_lettered": len(result.twice),
        "dead_lettered": result.dead_lettered,
        **extra,
    }
    with Path(target).open("a", encoding="utf-8") as figures:
        figures.write(json.dumps(row) + "\n")


async def connect_db(database_url: str) -> asyncpg.Connection:
    """A plain asyncpg connection to the session's database (``postgresql+asyncpg`` URL)."""
    from sqlalchemy.engine import make_url  # noqa: PLC0415

    url = make_url(database_url).set(drivername="postgresql")
    return await asyncpg.connect(url.render_as_string(hide_password=False))


async def inbox_count(db: asyncpg.Connection) -> int:
    """Events the inbox has recorded as processed."""
    return int(await db.fetchval("SELECT count(*) FROM inbox_messages"))


async def wait_until_processing(db: asyncpg.Connection, at_least: int = 100) -> None:
    """Wait (60 s at most) until the workers have processed ``at_least`` events."""
    deadline = time.monotonic() + 60
    while await inbox_count(db) < at_least:
        assert time.monotonic() < deadline, "the worker did not start processing"
        await asyncio.sleep(0.1)


INBOX_OUTCOME_EVENTS = {
    "reserved": "stock.reserved",
    "rejected": "stock.rejected",
    "released": "stock.released",
    "partially_released": "stock.released",
    "shipped": "stock.shipped",
}
"""The result event each inbox outcome writes in its transaction (product contract, "Result
events"); the other outcomes (a tombstone, a duplicate, a cancel or shipment that changed
nothing) write none."""

CANCELLATION_ANSWER_EVENTS = {"accepted": "stock.released", "refused": "stock.cancel_refused"}
"""The result event a cancellation request's answer writes (product contract, "The warehouse
system"): a release once accepted, a refusal once refused."""

NEXT_STATUS = {
    (None, "stock.reserved"): "reserved",
    (None, "stock.rejected"): "rejected",
    ("reserved", "stock.shipped"): "shipped",
}
"""The status an order's result event leads to from the status before it; ``stock.released``
leads from ``reserved`` to its ``order_status``. No event follows ``rejected``, ``released``
or ``shipped``."""


async def assert_outbox_tells_the_lifecycle(
    db: asyncpg.Connection, *, placed: int, shipped: int | None = None
) -> Counter[str]:
    """Check the ``outbox`` after a run against the inbox and the reservations; return its rows
    per routing key.

    - each inbox row whose outcome changed an order (``INBOX_OUTCOME_EVENTS``) has exactly one
      outbox row of its kind caused by it (``causation_id``), and no other row exists: so one
      ``stock.reserved`` or ``stock.rejected`` per placed order (``placed`` of them), one
      ``stock.shipped`` per shipment (``shipped`` of them, when given), ``stock.released`` only
      for the cancels that gave stock back, and no duplicate from a crash (the rows are written
      in the transaction of the change);
    - every body is valid (``parse_result_event``) and carries its row's ``event_id`` and
      ``order_id``;
    - with the hand-off, each cancellation request the warehouse answered has its event
      (``CANCELLATION_ANSWER_EVENTS``), caused by its cancel;
    - each shipment of the warehouse that took units has its ``stock.shipped``, and each of
      its cancellations that released units its ``stock.released``, caused by its event id;
    - per order, in ``id`` order, the events follow the lifecycle (``NEXT_STATUS``: reserved
      or rejected first, released or shipped after reserved, a refused cancel while reserved,
      nothing after the end but a refused cancel of a shipped order; a shipment's
      ``order_status``, when it says one, is where it leads) and end in the order's status in
      ``reservations``.
    """
    rows = await db.fetch(
        "SELECT id, event_id, order_id, routing_key, body::text AS body FROM outbox ORDER BY id"
    )
    inbox = await db.fetch("SELECT event_id, order_id, outcome FROM inbox_messages")
    expected = Counter(
        (row["event_id"], row["order_id"], INBOX_OUTCOME_EVENTS[row["outcome"]])
        for row in inbox
        if row["outcome"] in INBOX_OUTCOME_EVENTS
    )
    # With the hand-off, a cancel of an order the warehouse holds changes nothing in its own
    # transaction (inbox outcome cancel_requested): its stock.released comes with the
    # warehouse's acceptance, unless the order had shipped by then, and its
    # stock.cancel_refused with a refusal.
    answered = await db.fetch(
        "SELECT w.causation_id, w.order_id, w.status FROM warehouse_requests AS w"
        " JOIN reservations AS r USING (order_id)"
        " WHERE w.kind = 'cancellation' AND (w.status = 'refused' OR (w.status = 'accepted'"
        "   AND (r.shipped_at IS NULL OR r.shipped_at > w.answered_at)))"
    )
    expected.update(
        (row["causation_id"], row["order_id"], CANCELLATION_ANSWER_EVENTS[row["status"]])
        for row in answered
    )
    for kind, table, outcome, key in (
        ("shipment", "warehouse_shipments", "shipped", "stock.shipped"),
        ("cancellation", "warehouse_cancellations", "released", "stock.released"),
    ):
        changes = await db.fetch(
            f"SELECT {kind}_id AS id, order_id FROM {table} WHERE outcome = $1",  # noqa: S608
            outcome,
        )
        expected.update(
            (warehouse_event_id(kind, row["id"]), row["order_id"], key) for row in changes
        )
    statuses: dict[uuid.UUID, str | None] = {}
    written: Counter[tuple[uuid.UUID, uuid.UUID, str]] = Counter()
    for row in rows:
        event = parse_result_event(row["routing_key"], row["body"])
        assert (event.event_id, event.order_id) == (row["event_id"], row["order_id"]), row
        written[(event.causation_id, event.order_id, row["routing_key"])] += 1
        before = statuses.get(event.order_id)
        if isinstance(event, StockReleasedV1):
            after = event.order_status if before == "reserved" else None
        elif row["routing_key"] == "stock.cancel_refused":
            # The warehouse may ship the order (its webhook) before it refuses the cancel.
            after = before if before in {"reserved", "shipped"} else None
        elif isinstance(event, StockShippedV1) and event.order_status is not None:
            after = event.order_status if before == "reserved" else None
        else:
            after = NEXT_STATUS.get((before, row["routing_key"]))
        assert after is not None, (
            f"order {event.order_id}: {row['routing_key']} (outbox id {row['id']}) after "
            f"{before or 'nothing'}"
        )
        statuses[event.order_id] = after

    assert written == expected, (
        f"outbox rows without their change: {written - expected}; "
        f"changes without their outbox row: {expected - written}"
    )
    kinds = Counter(row["routing_key"] for row in rows)
    assert kinds["stock.reserved"] + kinds["stock.rejected"] == placed, kinds
    if shipped is not None:
        assert kinds["stock.shipped"] == shipped, kinds
    final = {
        row["order_id"]: row["status"]
        for row in await db.fetch("SELECT order_id, status FROM reservations")
    }
    differing = {
        order_id: (status, final.get(order_id))
        for order_id, status in statuses.items()
        if status != final.get(order_id)
    }
    assert differing == {}, f"orders whose events end elsewhere than their status: {differing}"
    return kinds
