"""The worker process end to end, against the real RabbitMQ and PostgreSQL."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import time
import uuid
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.topology import ORDER_PLACED_QUEUE
from fulfilment.worker.topology import Topology, declare_topology
from tests.e2e.harness import (
    FAST_SETTINGS,
    WorkerProcess,
    drain_dead_letters,
    free_port,
    order_event,
    publish,
    put_stock,
    queue_depth,
    spawn,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]


async def reservation_count(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM reservations"))


async def test_an_invalid_payload_is_dead_lettered_on_its_first_delivery_with_its_reason(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    await put_stock(db, {"85123A": 10})
    worker = spawn(workers, worker_env, tmp_path)
    good_before, good_id_before = order_event([("85123A", 1)])
    good_after, good_id_after = order_event([("85123A", 2)])
    bad = b'{"version": 1, "event_id": "not-a-uuid", "lines": []}'

    await publish(broker, good_before, message_id=good_id_before)
    await publish(broker, bad, message_id="bad-1")
    await publish(broker, good_after, message_id=good_id_after)

    dead = await drain_dead_letters(broker, expect=1)
    assert len(dead) == 1
    letter = dead[0]
    headers = letter.headers
    assert letter.body == bad
    assert letter.message_id == "bad-1"
    assert headers["x-fulfilment-failure-class"] == "permanent"
    assert "event_id" in str(headers["x-fulfilment-reason"])
    assert headers["x-fulfilment-delivery-count"] == 0
    assert headers["x-fulfilment-original-queue"] == ORDER_PLACED_QUEUE
    assert "x-death" not in headers  # published by the service, not dead-lettered by the broker

    await wait_for(lambda: _reserved(db, 2), what="both valid orders reserved")
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '85123A'") == 3
    assert worker.process is not None
    assert worker.process.poll() is None


async def _reserved(db: asyncpg.Connection, count: int) -> bool:
    return await reservation_count(db) >= count


async def test_the_same_event_published_twice_reserves_once(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    await put_stock(db, {"71053": 10})
    worker = spawn(workers, worker_env, tmp_path)
    body, event_id = order_event([("71053", 4)])

    await publish(broker, body, message_id=event_id)
    await publish(broker, body, message_id=event_id)
    await publish(broker, body)  # a re-publish without an AMQP message id is still the event

    async def three_handled() -> bool:
        handled = [
            line for line in worker.log_lines() if line.get("event") == "order_placed.handled"
        ]
        return len(handled) >= 3

    await wait_for(three_handled, what="three deliveries handled")
    outcomes = sorted(
        line["outcome"]
        for line in worker.log_lines()
        if line.get("event") == "order_placed.handled"
    )
    assert outcomes == ["duplicate:event", "duplicate:event", "reserved"]
    assert await reservation_count(db) == 1
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '71053'") == 4
    assert await queue_depth(broker, ORDER_PLACED_QUEUE) == 0


async def test_a_worker_killed_in_the_middle_of_a_handler_leads_to_one_reservation_after_restart(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    await put_stock(db, {"84406B": 5})
    worker = spawn(workers, worker_env, tmp_path)
    body, event_id = order_event([("84406B", 2)])

    # Hold the stock row so the handler is inside its reservation, retrying lock timeouts.
    async with db.transaction():
        await db.execute("SELECT 1 FROM stock_levels WHERE sku = '84406B' FOR UPDATE")
        await publish(broker, body, message_id=event_id)

        async def waiting_on_the_lock() -> bool:
            # Inside a transaction PostgreSQL keeps the first pg_stat_activity snapshot; take
            # a fresh one on every poll, or a handler that starts waiting later is never seen.
            await db.execute("SELECT pg_stat_clear_snapshot()")
            return bool(
                await db.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fulfilment'"
                    " AND wait_event_type = 'Lock'"
                )
            )

        await wait_for(waiting_on_the_lock, timeout=15, what="the handler blocked on the row lock")
        worker.kill()
        # Hold the lock past client_connection_check_interval (1 s): PostgreSQL notices the
        # dead client and cancels its statement instead of committing it once the lock goes.
        await asyncio.sleep(2.5)
    assert await reservation_count(db) == 0

    restarted = spawn(workers, worker_env, tmp_path)
    await wait_for(lambda: _reserved(db, 1), what="the redelivered order reserved")
    await asyncio.sleep(1)  # let any second delivery show itself
    assert await reservation_count(db) == 1
    assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '84406B'") == 2
    handled = [
        line for line in restarted.log_lines() if line.get("event") == "order_placed.handled"
    ]
    # PostgreSQL notices a dead client only when it next writes to it, so the killed worker's
    # statement may still commit once the lock is released; the redelivery is then the
    # duplicate. Either way the order is reserved exactly once.
    assert len(handled) == 1
    assert handled[0]["outcome"] in {"reserved", "duplicate:event"}
    assert handled[0]["redelivered"] is True
    assert await queue_depth(broker, ORDER_PLACED_QUEUE) == 0


async def test_sigterm_under_load_loses_nothing_and_dead_letters_nothing(
    workers: list[WorkerProcess],
    worker_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
    amqp_url: str,
) -> None:
    # Enough that a worker on an idle machine (over 2,000 orders/s) is still draining when
    # SIGTERM arrives.
    orders = 4_000
    await put_stock(db, {f"SKU{i:03d}": 1_000_000 for i in range(20)})
    await declare_topology(
        amqp_url, Topology(delivery_limit=int(FAST_SETTINGS["FULFILMENT_DELIVERY_LIMIT"]))
    )
    event_ids = set()
    for number in range(orders):
        body, event_id = order_event(
            [(f"SKU{number % 20:03d}", 1), (f"SKU{(number * 7) % 20:03d}", 2)]
        )
        event_ids.add(uuid.UUID(event_id))
        await publish(broker, body, message_id=event_id)

    first = spawn(workers, worker_env, tmp_path)
    await wait_for(lambda: _reserved(db, 50), what="some orders reserved")
    code, seconds = first.terminate()
    assert code == 0
    assert seconds < float(FAST_SETTINGS["FULFILMENT_GRACEFUL_TIMEOUT_SECONDS"]) + 5
    stopped_at = await reservation_count(db)
    assert stopped_at < orders, "the backlog should still be draining when SIGTERM arrives"

    spawn(workers, worker_env, tmp_path)
    await wait_for(lambda: _reserved(db, orders), timeout=120, what="every order reserved")
    rows = await db.fetch("SELECT event_id FROM reservations")
    assert {row["event_id"] for row in rows} == event_ids
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == orders
    assert await queue_depth(broker, "fulfilment.order-placed.dlq") == 0
    assert await db.fetchval("SELECT sum(reserved) FROM stock_levels") == 3 * orders
    # Nothing was handled twice: a redelivery would show up as a duplicate outcome.
    duplicates = [
        line
        for worker in workers
        for line in worker.log_lines()
        if str(line.get("outcome", "")).startswith("duplicate")
    ]
    assert duplicates == []


async def test_the_worker_refuses_to_start_when_the_queue_exists_with_other_arguments(
    worker_env: dict[str, str], tmp_path: Path, broker: aio_pika.abc.AbstractRobustConnection
) -> None:
    channel = await broker.channel()
    await channel.queue_delete(ORDER_PLACED_QUEUE)
    await channel.declare_queue(
        ORDER_PLACED_QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
    )
    await channel.close()
    worker = WorkerProcess(dict(worker_env), tmp_path / "refused.log")
    worker.env["FULFILMENT_HTTP_PORT"] = str(worker.port)
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fulfilment", env=worker.env, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    channel = await broker.channel()
    await channel.queue_delete(ORDER_PLACED_QUEUE)
    await channel.close()

    assert process.returncode != 0
    assert time.monotonic() - started < 60
    mismatch = [line for line in stderr.decode().splitlines() if "topology_mismatch" in line]
    assert mismatch, stderr.decode()[-2000:]
    # RabbitMQ names the first argument that differs; the queue above has none of ours.
    assert re.search(
        rf"queue '{re.escape(ORDER_PLACED_QUEUE)}' exists with x-[a-z-]+=none,"
        r" the service expects \S+",
        mismatch[0],
    ), mismatch[0]


async def test_the_worker_refuses_to_start_on_a_database_that_is_not_migrated(
    worker_env: dict[str, str], database_url: str
) -> None:
    from sqlalchemy.engine import make_url  # noqa: PLC0415

    admin = make_url(database_url).set(drivername="postgresql", database="postgres")
    name = f"fulfilment_unmigrated_{uuid.uuid4().hex[:8]}"
    connection = await asyncpg.connect(admin.render_as_string(hide_password=False))
    await connection.execute(f'CREATE DATABASE "{name}"')
    try:
        env = dict(worker_env)
        env["FULFILMENT_DATABASE_URL"] = (
            make_url(database_url).set(database=name).render_as_string(hide_password=False)
        )
        env["FULFILMENT_HTTP_PORT"] = str(free_port())
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fulfilment", env=env, stderr=asyncio.subprocess.PIPE
        )
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await connection.close()

    assert process.returncode == 1
    lines = [line for line in stderr.decode().splitlines() if "schema_not_current" in line]
    assert len(lines) == 1, stderr.decode()[-2000:]
    assert "the database is at revision none" in lines[0]
    assert "fulfilment migrate" in lines[0]


async def test_the_worker_refuses_to_start_on_a_taken_http_port_naming_its_variable(
    worker_env: dict[str, str],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        env = {**worker_env, "FULFILMENT_HTTP_HOST": "127.0.0.1", "FULFILMENT_HTTP_PORT": str(port)}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fulfilment", env=env, stderr=asyncio.subprocess.PIPE
        )
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)

    assert process.returncode == 1
    log = stderr.decode()
    assert "Traceback" not in log
    assert "worker.starting" not in log  # before any connection
    lines = [line for line in log.splitlines() if "worker.http_listen_failed" in line]
    assert len(lines) == 1, log[-2000:]
    assert (
        f"the HTTP server of the worker cannot listen on 127.0.0.1:{port}: another process holds the"
        " port; set FULFILMENT_HTTP_PORT to a free one: [Errno 98] Address already in use"
    ) in lines[0]
