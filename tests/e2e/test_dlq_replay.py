"""Dead letters end to end: a real worker dead-letters, ``fulfilment dlq`` replays, the worker
reserves once (or answers a duplicate), against the real RabbitMQ and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fulfilment import __version__
from fulfilment.contracts import dead_letter as h
from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    ORDER_PLACED,
    ORDER_PLACED_DEAD_LETTER_QUEUE,
    ORDER_PLACED_QUEUE,
)
from tests.e2e.harness import WorkerProcess, order_event, publish, queue_depth, spawn, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

FULFILMENT = str(Path(sys.executable).with_name("fulfilment"))


def cli(env: dict[str, str], *args: str) -> str:
    """Run the ``fulfilment`` command; fail the test with its output when it fails."""
    result = subprocess.run(
        [FULFILMENT, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"fulfilment {' '.join(args)}: {result.stderr}"
    return result.stdout


def events(worker: WorkerProcess) -> dict[tuple[str, str], float]:
    """The worker's ``OrderPlaced`` outcomes, by ``(outcome, reason)``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.labels["outcome"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "fulfilment_events"
        for sample in family.samples
        if sample.name == "fulfilment_events_total" and sample.labels["event"] == "order_placed"
    }


async def reservations(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM reservations"))


async def test_an_order_dead_lettered_by_a_bug_is_reserved_once_when_replayed_after_the_fix(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    await db.execute("TRUNCATE dead_letter_audit")
    await db.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('85123A', 10)")
    # The bug: a release whose schema refuses every new reservation (a non-retryable error).
    await db.execute(
        "ALTER TABLE reservations ADD CONSTRAINT broken_release CHECK (false) NOT VALID"
    )
    worker = spawn(workers, worker_env, tmp_path)
    body, event_id = order_event([("85123A", 2)])
    await publish(broker, body, message_id=event_id)

    async def dead_lettered() -> bool:
        return await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE) == 1

    await wait_for(dead_lettered, what="the order in the DLQ")
    shown = json.loads(cli(worker_env, "dlq", "show", "--id", event_id, "--json"))
    assert len(shown) == 1
    letter = shown[0]
    assert letter["failure_class"] == "unexpected"
    assert letter["event_id"] == event_id
    headers = letter["headers"]
    assert "broken_release" in headers[h.EXCEPTION_MESSAGE]
    assert headers[h.ATTEMPTS] == 1  # a CHECK violation is not retried
    assert headers[h.DELIVERY_COUNT] == 0
    first = datetime.fromisoformat(headers[h.FIRST_FAILURE_AT])
    last = datetime.fromisoformat(headers[h.LAST_FAILURE_AT])
    assert first <= last <= datetime.now(UTC)
    assert headers[h.SERVICE_VERSION] == __version__
    assert headers[h.HOST]
    assert headers[h.ORIGINAL_QUEUE] == ORDER_PLACED_QUEUE
    assert headers[h.ORIGINAL_ROUTING_KEY] == "order.placed"
    assert headers[h.STACK]
    group = letter["group"]
    assert group in cli(worker_env, "dlq", "list")

    dry = cli(worker_env, "dlq", "replay", "--group", group)
    assert "dry run: 1 dead letter(s) would be replayed" in dry
    assert await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE) == 1

    await db.execute("ALTER TABLE reservations DROP CONSTRAINT broken_release")  # the fix
    done = cli(
        worker_env,
        *("dlq", "replay", "--group", group, "--yes", "--rate", "50"),
        *("--operator", "ops", "--comment", "constraint dropped"),
    )
    assert "replayed 1 of 1" in done

    await wait_for(lambda: _at_least(reservations(db), 1), what="the replayed order reserved")
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '85123A'") == 2
    assert await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE) == 0
    audit = await db.fetch("SELECT action, event_id, operator, comment FROM dead_letter_audit")
    assert [tuple(row) for row in audit] == [("replayed", event_id, "ops", "constraint dropped")]
    counted = events(worker)
    assert counted["dead_lettered", "unexpected"] == 1
    assert counted["reserved", ""] == 1


async def test_replaying_an_applied_event_is_a_counted_duplicate_and_a_fixed_one_reserves(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    await db.execute("TRUNCATE dead_letter_audit")
    await db.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('71053', 10)")
    worker = spawn(workers, worker_env, tmp_path)
    applied, applied_id = order_event([("71053", 3)])
    await publish(broker, applied, message_id=applied_id)
    await wait_for(lambda: _at_least(reservations(db), 1), what="the first order reserved")
    # Two dead letters as a worker writes them: a copy of the applied event (its dead letter
    # was confirmed, then the worker died before acknowledging, and the redelivery reserved),
    # and a permanent failure of an earlier release that the running one accepts.
    refused, refused_id = order_event([("71053", 4)])
    await put_dead_letter(broker, applied, applied_id, "unexpected", "KeyError")
    await put_dead_letter(broker, refused, refused_id, "permanent", "MalformedEventError")

    done = cli(worker_env, "dlq", "replay", "--all", "--yes", "--rate", "50")

    assert "replayed 2 of 2" in done

    async def both_handled() -> bool:
        counted = events(worker)
        return counted["reserved", ""] == 2 and counted["duplicate", "event"] == 1

    await wait_for(both_handled, what="one reservation and one duplicate")
    assert await reservations(db) == 2
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '71053'") == 7
    assert await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE) == 0
    assert await queue_depth(broker, ORDER_PLACED_QUEUE) == 0
    audited = await db.fetch("SELECT event_id, failure_class FROM dead_letter_audit ORDER BY id")
    assert [tuple(row) for row in audited] == [
        (applied_id, "unexpected"),
        (refused_id, "permanent"),
    ]


async def put_dead_letter(
    broker: aio_pika.abc.AbstractRobustConnection,
    body: bytes,
    message_id: str,
    failure_class: str,
    exception_type: str,
) -> None:
    channel = await broker.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
    await exchange.publish(
        aio_pika.Message(
            body,
            message_id=message_id,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers={
                h.FAILURE_CLASS: failure_class,
                h.EXCEPTION_TYPE: exception_type,
                h.REASON: f"{exception_type}: replay me",
                h.DEAD_LETTERED_AT: datetime.now(UTC).isoformat(),
                h.REPLAY_ID: str(uuid.uuid4()),  # stripped and replaced by the new replay's
            },
        ),
        routing_key=ORDER_PLACED.dead_letter_routing_key,
        mandatory=True,
    )
    await channel.close()


async def _at_least(count: Awaitable[int], minimum: int) -> bool:
    return await count >= minimum
