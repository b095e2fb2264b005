"""A real Prometheus scrapes a real worker; the dashboard's and the alerts' queries return data.

The test starts Debian's ``prometheus`` binary on a free loopback port with a temporary
configuration (scrape and rule evaluation every second, the repository's alert rules) and
data folder, runs orders, rejections, a duplicate, malformed events, a cancel and shipments
through the worker, then runs every query of the Grafana dashboard against it. Without the
binary it is skipped on a developer's machine and fails under ``CI=true`` (``.ci/run``
installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Awaitable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.order_cancelled import order_cancelled_body
from fulfilment.contracts.order_shipped import order_shipped_body
from fulfilment.contracts.topology import ORDER_CANCELLED_ROUTING_KEY, ORDER_SHIPPED_ROUTING_KEY
from tests.e2e.harness import WorkerProcess, order_event, publish, spawn, wait_for
from tests.e2e.relay_harness import (
    RelayProcess,
    bind_events_queue,
    insert_outbox,
    lifecycle_rows,
    spawn_relay,
)
from tests.e2e.warehouse_harness import (
    DispatcherProcess,
    SimulatorProcess,
    handoff_env,
    open_requests,
    request_statuses,
)
from tests.support.webhooks import IntakeProcess, intake_env

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/alerts.yml"
DASHBOARD = ROOT / "deploy/grafana/dashboards/fulfilment.json"
DLQ = 'queue="fulfilment.order-placed.dlq"'
SHIPPED_DLQ = 'queue="fulfilment.order-shipped.dlq"'

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]


class Prometheus:
    """A Prometheus server of this test, on its own port and data folder."""

    def __init__(self, binary: str, folder: Path, target_ports: list[int]) -> None:
        self.port = _free_port()
        config = folder / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {
                            "job_name": "fulfilment",
                            "static_configs": [
                                {"targets": [f"127.0.0.1:{port}" for port in target_ports]}
                            ],
                        }
                    ],
                }
            )
        )
        self.log = folder / "prometheus.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=log,
            )

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}{path}" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())

    def query(self, expression: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query", query=expression)
        assert answer["status"] == "success", (expression, answer)
        return list(answer["data"]["result"])

    def value(self, expression: str) -> float | None:
        result = self.query(expression)
        return float(result[0]["value"][1]) if result else None

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/-/ready", timeout=2
                ) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail(f"prometheus not ready within {timeout:g} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        message = "prometheus is not installed (Debian package prometheus)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return binary


@pytest.fixture
def scraped_worker(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    prometheus_binary: str,
) -> Iterator[tuple[WorkerProcess, Prometheus]]:
    """A worker, a relay, a dispatcher (against the warehouse simulator) and the webhook intake,
    all scraped: the dashboard has panels of each."""
    simulator = SimulatorProcess(tmp_path / "simulator.log")
    simulator.start()
    env = handoff_env(
        worker_env,
        simulator,
        FULFILMENT_QUEUE_POLL_INTERVAL_SECONDS="1",
        FULFILMENT_INVARIANT_CHECK_INTERVAL_SECONDS="1",
        FULFILMENT_RELAY_POLL_SECONDS="0.5",
        # The first drift check runs one interval after the dispatcher becomes active.
        FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS="2",
    )
    worker = spawn(workers, env, tmp_path)
    relays: list[RelayProcess] = []
    relay = spawn_relay(relays, env, tmp_path)
    dispatcher = DispatcherProcess(dict(env), tmp_path / "dispatcher.log")
    dispatcher.start()
    intake = IntakeProcess(intake_env(env["FULFILMENT_DATABASE_URL"]), tmp_path / "webhooks.log")
    intake.start()
    # One unsigned request, refused 401: the answer histogram has a series from the start.
    forged = urllib.request.Request(intake.url, data=b"{}", method="POST")  # noqa: S310
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(forged, timeout=5)  # noqa: S310 - the test's own intake
    ports = [worker.port, relay.port, dispatcher.port, intake.http_port]
    server = Prometheus(prometheus_binary, tmp_path, ports)
    try:
        server.wait_ready()
        yield worker, server
    finally:
        server.stop()
        intake.stop_quietly()
        dispatcher.stop_quietly()
        relay.stop_quietly()
        simulator.stop()


async def _at_least(value: Awaitable[float], minimum: float) -> bool:
    return await value >= minimum


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title, expression)`` of every dashboard target, Grafana's variables filled in:
    the rate interval, and each selector variable with its "All" value."""
    dashboard = json.loads(DASHBOARD.read_text())
    values = {"$__rate_interval": "1m"} | {
        f"${variable['name']}": variable["allValue"]
        for variable in dashboard["templating"]["list"]
        if variable.get("includeAll")
    }
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in values.items():
                expr = expr.replace(name, value)
            queries.append((panel["title"], expr))
    return queries


async def test_the_dashboard_and_alert_queries_return_the_worker_s_data_from_prometheus(
    scraped_worker: tuple[WorkerProcess, Prometheus],
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    _, server = scraped_worker

    async def scraped(expression: str, expected: float) -> bool:
        return await asyncio.to_thread(server.value, expression) == expected

    # A baseline before any event, so that rates see the counters rise from 0.
    async def samples(series: str) -> float:
        expression = f"min(count_over_time({series}[1m]))"
        return await asyncio.to_thread(server.value, expression) or 0

    await wait_for(
        lambda: _at_least(samples("fulfilment_build_info"), 3),
        timeout=30,
        what="three scrapes of the idle worker",
    )
    await run_traffic(broker, db)

    # Bound, or every result event would come back (mandatory) and stay unpublished.
    await bind_events_queue(broker)
    await insert_outbox(db, lifecycle_rows(2))
    await wait_for(
        lambda: scraped("sum(fulfilment_events_total)", 14), timeout=30, what="14 events scraped"
    )

    # The cancel's request is answered after its event was counted, and its answer writes a
    # result event of its own: counted before that, the outbox would grow past the figure.
    async def answered() -> bool:
        return await open_requests(db) == 0

    await wait_for(answered, what="every warehouse request answered")
    # The traffic's own result events (the functions write them) and the rows inserted.
    written = await db.fetchval("SELECT count(*) FROM outbox")
    assert written > len(lifecycle_rows(2))
    await wait_for(
        lambda: scraped("sum(fulfilment_outbox_published_total)", written),
        timeout=30,
        what=f"{written} result events published and scraped",
    )
    await wait_for(
        lambda: scraped(f"max(fulfilment_queue_messages_ready{{{DLQ}}})", 2),
        timeout=30,
        what="the DLQ depth of 2 scraped",
    )
    await wait_for(
        lambda: scraped(f"max(fulfilment_queue_messages_ready{{{SHIPPED_DLQ}}})", 1),
        timeout=30,
        what="the shipments' DLQ depth of 1 scraped",
    )

    by_outcome = {
        row["metric"]["outcome"]: float(row["value"][1])
        for row in server.query('sum by (outcome) (fulfilment_events_total{event="order_placed"})')
    }
    assert by_outcome == {
        "reserved": 6,
        "rejected": 2,
        "duplicate": 1,
        "dead_lettered": 2,
        "requeued": 0,
    }
    handled = {
        # Prometheus drops a label whose value is empty.
        (row["metric"]["event"], row["metric"]["outcome"], row["metric"].get("reason", ""))
        for row in server.query(
            'fulfilment_events_total{event=~"order_cancelled|order_shipped"} > 0'
        )
    }
    assert handled == {
        ("order_cancelled", "cancel_requested", ""),
        ("order_shipped", "shipped", ""),
        ("order_shipped", "dead_lettered", "order_not_reserved"),
    }
    for queue in (
        "fulfilment.order-placed",
        "fulfilment.order-cancelled",
        "fulfilment.order-shipped",
    ):
        assert server.value(f'max(fulfilment_queue_consumers{{queue="{queue}"}})') == 1
    assert (server.value("max(fulfilment_dead_letters_oldest_age_seconds)") or 0) > 0
    assert server.value("max(fulfilment_stock_invariant_violations)") == 0
    # All 14 deliveries acknowledged (handled, or dead-lettered once the DLQ confirmed), none
    # requeued, none counted twice; and every delivery timed ended in one counted outcome.
    assert server.value('sum(fulfilment_events_total{outcome!="requeued"})') == 14
    assert server.value('sum(fulfilment_events_total{outcome="requeued"})') == 0
    assert server.value("sum(fulfilment_handler_duration_seconds_count)") == 14

    answered: dict[str, list[dict[str, Any]]] = {}
    for title, expression in dashboard_queries():
        answered[f"{title}: {expression}"] = server.query(expression)
    empty = [query for query, result in answered.items() if not result]
    assert empty == [], "\n".join(empty)
    for query, result in answered.items():  # the figures, for whoever reads the test output
        print(query, "=>", [(row["metric"], row["value"][1]) for row in result])  # noqa: T201

    await check_alert_rules(server)


async def run_traffic(
    broker: aio_pika.abc.AbstractRobustConnection, db: asyncpg.Connection
) -> None:
    """Orders: 6 reserved, 2 rejected (unknown SKU), 1 duplicate, 2 dead-lettered (malformed);
    once the warehouse accepted the 6, a cancel (a cancellation request) and a shipment of two
    reserved orders, and a shipment of an order that was never placed (dead-lettered,
    order_not_reserved)."""
    await db.executemany(
        "INSERT INTO stock_levels (sku, on_hand) VALUES ($1, $2)", [("85123A", 100)]
    )
    duplicate, duplicate_id = order_event([("85123A", 1)])
    reserved: list[uuid.UUID] = []
    for index in range(6):
        body, event_id = (duplicate, duplicate_id) if index == 0 else order_event([("85123A", 2)])
        await publish(broker, body, message_id=event_id)
        reserved.append(uuid.uuid5(uuid.NAMESPACE_URL, f"order:{event_id}"))
    for _ in range(2):
        body, event_id = order_event([("NO-SUCH-SKU", 1)])
        await publish(broker, body, message_id=event_id)
    await publish(broker, duplicate, message_id=duplicate_id)
    for index in range(2):
        await publish(broker, b'{"version": 1, "lines": []}', message_id=f"malformed-{index}")

    async def placed() -> bool:
        return int(await db.fetchval("SELECT count(*) FROM reservations")) == 8

    await wait_for(placed, what="the orders placed")

    async def handed_off() -> bool:
        return (await request_statuses(db))["accepted"] == 6

    # Every reservation handed to the warehouse first, so that the cancel below waits for the
    # warehouse's answer (a cancellation request) instead of releasing at once.
    await wait_for(handed_off, what="the six fulfilment orders accepted")
    now = datetime.now(UTC)
    cancel = order_cancelled_body(event_id=uuid.uuid4(), order_id=reserved[1], cancelled_at=now)
    await publish(broker, cancel, routing_key=ORDER_CANCELLED_ROUTING_KEY)
    for order_id in (reserved[2], uuid.uuid4()):
        shipment = order_shipped_body(event_id=uuid.uuid4(), order_id=order_id, shipped_at=now)
        await publish(broker, shipment, routing_key=ORDER_SHIPPED_ROUTING_KEY)


async def check_alert_rules(server: Prometheus) -> None:
    """Every rule evaluates without error on real data; the DLQ alert is pending (for: 5m)."""

    async def rules_evaluated() -> bool:
        groups = (await asyncio.to_thread(server.get, "/api/v1/rules"))["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return bool(rules) and all(rule["lastEvaluation"][:4] != "0001" for rule in rules)

    await wait_for(rules_evaluated, timeout=15, what="every alert rule evaluated")
    groups = server.get("/api/v1/rules")["data"]["groups"]
    rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert {name: rule["health"] for name, rule in rules.items()} == dict.fromkeys(rules, "ok")

    async def dead_letter_alert_pending() -> bool:
        alerts = await asyncio.to_thread(
            server.query, 'ALERTS{alertname="FulfilmentDeadLetterQueueNotEmpty"}'
        )
        return any(alert["metric"]["alertstate"] == "pending" for alert in alerts)

    await wait_for(dead_letter_alert_pending, timeout=15, what="the DLQ alert pending")
    assert server.query('ALERTS{alertname="FulfilmentNoConsumers"}') == []
    assert server.query('ALERTS{alertname="FulfilmentStockInvariantViolated"}') == []
