"""Helpers of the hand-off's end-to-end and fault tests: the simulator and the dispatcher as
processes of their own, the warehouse's orders read over its admin endpoints, and the checks
that every reservation became exactly one order there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fulfilment.contracts.order_cancelled import order_cancelled_body
from fulfilment.contracts.order_shipped import order_shipped_body
from fulfilment.contracts.topology import (
    ORDER_CANCELLED_ROUTING_KEY,
    ORDER_SHIPPED_ROUTING_KEY,
)
from tests.e2e.harness import WorkerProcess, free_port, program, publish

SIMULATOR_FOLDER = Path(__file__).parents[2] / "simulator"
TOKEN = "simulator-token"  # noqa: S105 - the simulator's default, not a secret


@dataclass
class SimulatorProcess:
    """``python -m warehouse_simulator`` on a port of its own; read and steered over HTTP."""

    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    options: list[str] = field(default_factory=list)
    """More options of ``python -m warehouse_simulator`` (``--ship-delay-seconds 1`` ...)."""

    @property
    def url(self) -> str:
        """The API's base, as ``FULFILMENT_WAREHOUSE_URL``."""
        return f"http://127.0.0.1:{self.port}/api/v1"

    def start(self) -> None:
        env = {"PYTHONPATH": str(SIMULATOR_FOLDER), "PATH": "/usr/bin:/bin"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "warehouse_simulator",
                    "--port",
                    str(self.port),
                    "--seed",
                    "7",
                    *self.options,
                ],
                env=env,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"simulator exited: {self.log_path.read_text(errors='replace')}")
            try:
                self.stats()
            except OSError:
                time.sleep(0.1)
            else:
                return
        pytest.fail("simulator not answering within 30 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def _admin(self, name: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if changes is None else json.dumps(changes).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/_simulator/{name}",
            data=data,
            method="GET" if data is None else "POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return dict(json.loads(answer.read()))

    def faults(self, **changes: Any) -> dict[str, Any]:
        """Change the knobs (``Faults``' names, ``down_for_seconds``); return them all."""
        return self._admin("faults", changes)

    def load_stock(self, levels: dict[str, int]) -> dict[str, Any]:
        """Put ``levels`` (units on hand by SKU) on the warehouse's shelves, which starts the
        adjustments of its rate knobs; its answer, the first page of its inventory."""
        return self._admin("inventory", {"levels": levels})

    def orders(self) -> list[dict[str, Any]]:
        return list(self._admin("orders")["orders"])

    def cancellations(self) -> list[dict[str, Any]]:
        return list(self._admin("orders")["cancellations"])

    def stats(self) -> dict[str, Any]:
        return self._admin("stats")

    def record(self) -> dict[str, Any]:
        """What the warehouse did and said: its shipments, cancellations and webhooks."""
        return self._admin("webhooks")


@dataclass
class DispatcherProcess(WorkerProcess):
    """One ``fulfilment dispatcher`` child with its own port and log file."""

    def start(self, *, wait_ready: bool = True) -> None:
        self.env["FULFILMENT_DISPATCHER_PORT"] = str(self.port)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                program("dispatcher", self.env, self.python), env=self.env, stdout=log, stderr=log
            )
        if not wait_ready:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"dispatcher exited with {self.process.returncode}: {self.log_tail()}")
            if self.readiness().get("role") == "active":
                return
            time.sleep(0.2)
        pytest.fail(f"dispatcher not active within 60 s: {self.log_tail()}")

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of the sample ``name`` with ``labels`` on its ``/metrics``, or None."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as page:
            text = page.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return None

    def readiness(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/health/ready", timeout=2
            ) as answer:
                return dict(json.loads(answer.read()))
        except urllib.error.HTTPError as refused:
            return dict(json.loads(refused.read()))
        except OSError:
            return {}


def handoff_env(
    worker_env: dict[str, str], simulator: SimulatorProcess, **extra: str
) -> dict[str, str]:
    """A worker's environment with the hand-off on, against ``simulator``."""
    return {
        **worker_env,
        "FULFILMENT_LOG_LEVEL": "INFO",
        "FULFILMENT_WAREHOUSE_URL": simulator.url,
        "FULFILMENT_WAREHOUSE_TOKEN": TOKEN,
        "FULFILMENT_WAREHOUSE_TIMEOUT_SECONDS": "2",
        "FULFILMENT_WAREHOUSE_RATE_PER_SECOND": "50",
        "FULFILMENT_WAREHOUSE_CONCURRENCY": "8",
        **extra,
    }


def warehouse_env(simulator: SimulatorProcess, **extra: str) -> dict[str, str]:
    """The hand-off's variables alone, for ``faultlib.Cluster.start`` (its env is the
    worker's) and beside a worker's environment."""
    return {
        key: value
        for key, value in handoff_env({}, simulator, **extra).items()
        if key.startswith("FULFILMENT_")
    }


def start_dispatcher(
    dispatchers: list[DispatcherProcess], env: dict[str, str], tmp_path: Path, **extra: str
) -> DispatcherProcess:
    """Start one more dispatcher with ``env`` and ``extra`` (not waiting until it is active),
    its log ``dispatcher-<n>.log`` in ``tmp_path``; add it to ``dispatchers``."""
    dispatcher = DispatcherProcess(
        {**env, **extra}, tmp_path / f"dispatcher-{len(dispatchers)}.log"
    )
    dispatchers.append(dispatcher)
    dispatcher.start(wait_ready=False)
    return dispatcher


def order_id_of(event_id: uuid.UUID) -> uuid.UUID:
    """The order id ``harness.order_event`` gives the order of ``event_id``."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"order:{event_id}")


async def cancel(
    broker: aio_pika.abc.AbstractConnection,
    order_id: uuid.UUID,
    lines: list[tuple[str, int]] | None = None,
) -> uuid.UUID:
    """Publish an OrderCancelled of ``order_id`` (``lines`` None: the whole order); its id."""
    event_id = uuid.uuid4()
    body = order_cancelled_body(
        event_id=event_id, order_id=order_id, cancelled_at=datetime.now(UTC), lines=lines
    )
    await publish(broker, body, message_id=str(event_id), routing_key=ORDER_CANCELLED_ROUTING_KEY)
    return event_id


async def ship(broker: aio_pika.abc.AbstractConnection, order_id: uuid.UUID) -> uuid.UUID:
    """Publish an OrderShipped of ``order_id``; its event id."""
    event_id = uuid.uuid4()
    body = order_shipped_body(event_id=event_id, order_id=order_id, shipped_at=datetime.now(UTC))
    await publish(broker, body, message_id=str(event_id), routing_key=ORDER_SHIPPED_ROUTING_KEY)
    return event_id


async def request_statuses(db: asyncpg.Connection, kind: str = "fulfilment_order") -> Counter[str]:
    """The requests of ``kind`` by status."""
    rows = await db.fetch("SELECT status FROM warehouse_requests WHERE kind = $1", kind)
    return Counter(row["status"] for row in rows)


async def open_requests(db: asyncpg.Connection) -> int:
    return int(
        await db.fetchval(
            "SELECT count(*) FROM warehouse_requests WHERE status IN ('pending', 'sending')"
        )
    )


async def reserved_lines(db: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    """Each order that was reserved (any status since), with the lines of its reservation,
    merged per SKU and sorted as the request's body has them."""
    rows = await db.fetch(
        "SELECT order_id::text AS order_id, lines FROM warehouse_requests"
        " WHERE kind = 'fulfilment_order'"
    )
    return {row["order_id"]: json.loads(row["lines"]) for row in rows}


def duplicate_orders(orders: list[dict[str, Any]]) -> int:
    """Orders at the warehouse beyond the first for the same reference (the service's order)."""
    counts = Counter(order["reference"] for order in orders)
    return sum(count - 1 for count in counts.values())


async def outbox_counts(db: asyncpg.Connection) -> Counter[str]:
    rows = await db.fetch("SELECT routing_key, count(*) AS n FROM outbox GROUP BY routing_key")
    return Counter({row["routing_key"]: int(row["n"]) for row in rows})


async def stock_equals_the_lines(db: asyncpg.Connection) -> list[str]:
    """SKUs whose ``reserved`` is not what the orders still ``reserved`` hold, their lines less
    what the warehouse's shipments took (empty: the stock is right)."""
    rows = await db.fetch(
        "SELECT s.sku, s.reserved, coalesce(sum(l.quantity - l.shipped) FILTER"
        " (WHERE r.status = 'reserved'), 0) AS held"
        " FROM stock_levels s LEFT JOIN reservation_lines l ON l.sku = s.sku"
        " LEFT JOIN reservations r ON r.order_id = l.order_id"
        " GROUP BY s.sku, s.reserved HAVING s.reserved <>"
        " coalesce(sum(l.quantity - l.shipped) FILTER (WHERE r.status = 'reserved'), 0)"
    )
    return [f"{row['sku']}: reserved {row['reserved']}, lines {row['held']}" for row in rows]


async def handoff_figures(
    db: asyncpg.Connection,
    simulator: SimulatorProcess,
    *,
    cap: float | None = None,
    reserved_before: int = 0,
) -> dict[str, int]:
    """The fault table's four counts after a run (each must be 0), from the database and from
    what the simulator holds and counted:

    - ``requests_lost``: reservations without a fulfilment-order request, requests still open
      or expired, and accepted fulfilment orders the warehouse does not hold;
    - ``duplicate_orders``: orders at the warehouse beyond one per reservation, and orders
      there for a request that was withdrawn (never to be sent);
    - ``cancels_applied_twice``: cancels with more than one ``stock.released``;
    - ``rate_cap_breaches``: whole seconds in which the simulator got more than ``cap``
      requests (None: not counted).

    ``reserved_before``: reservations made with the hand-off off, which record no request.
    """
    held = Counter(order["reference"] for order in simulator.orders())
    requests = await db.fetch(
        "SELECT order_id::text AS reference, kind, status FROM warehouse_requests"
    )
    orders = [row for row in requests if row["kind"] == "fulfilment_order"]
    reserved = int(
        await db.fetchval("SELECT count(*) FROM inbox_messages WHERE outcome = 'reserved'")
    )
    lost = (
        max(0, reserved - reserved_before - len(orders))
        + sum(1 for row in requests if row["status"] in {"pending", "sending", "expired"})
        + sum(1 for row in orders if row["status"] == "accepted" and not held[row["reference"]])
    )
    duplicates = duplicate_orders(simulator.orders()) + sum(
        1 for row in orders if row["status"] == "withdrawn" and held[row["reference"]]
    )
    twice = int(
        await db.fetchval(
            "SELECT count(*) FROM (SELECT body->>'causation_id' FROM outbox"
            " WHERE routing_key = 'stock.released' GROUP BY 1 HAVING count(*) > 1) AS twice"
        )
    )
    per_second = simulator.stats()["requests_per_second"].values()
    breaches = 0 if cap is None else sum(1 for count in per_second if count > cap)
    return {
        "requests_lost": lost,
        "duplicate_orders": duplicates,
        "cancels_applied_twice": twice,
        "rate_cap_breaches": breaches,
    }


def record_handoff_figures(
    scenario: str, injected: str, figures: dict[str, int], **extra: Any
) -> None:
    """Append one row of the hand-off's fault table to ``FULFILMENT_TEST_FAULT_FIGURES``
    (JSON lines, beside the fault suite's rows), if set."""
    target = os.environ.get("FULFILMENT_TEST_FAULT_FIGURES")
    if not target:
        return
    row = {"scenario": scenario, "injected": injected, **figures, **extra}
    with Path(target).open("a", encoding="utf-8") as lines:
        lines.write(json.dumps(row) + "\n")


async def assert_handed_off_once(
    db: asyncpg.Connection,
    simulator: SimulatorProcess,
    *,
    cap: float | None = None,
    reserved_before: int = 0,
) -> dict[str, int]:
    """:func:`handoff_figures`, each asserted 0; returns them for the figures file."""
    figures = await handoff_figures(db, simulator, cap=cap, reserved_before=reserved_before)
    assert figures == dict.fromkeys(figures, 0), figures
    return figures
