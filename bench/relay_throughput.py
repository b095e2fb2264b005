"""How fast one relay empties a backlog of outbox rows, its CPU per event, and its lag.

Writes ROWS outbox rows of ROWS / 3 orders (reserved, released, shipped each) into a
throwaway migrated database, runs the relay in this process against the RabbitMQ of
``FULFILMENT_TEST_AMQP_URL`` (the local one by default; a queue bound to
``fulfilment.events`` takes the events), and prints rows per second until the
last one is marked, the process's CPU seconds per 1,000 events over that drain (the fill
left out), and the lag percentiles of ``fulfilment_outbox_publish_lag_seconds``. The CPU
figure is the one to compare between versions: rows per second also depend on what else the
machine runs. The relay runs on the event loop that ``FULFILMENT_EVENT_LOOP`` names
(``uvloop``, the service's default, or ``asyncio``).

Run: ``uv run python bench/relay_throughput.py [rows] [batch size]`` (defaults 30000, 100).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

import aio_pika
import asyncpg
import uvloop
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fulfilment.adapters.postgres.schema import migrate
from fulfilment.contracts.result_events import RESULT_ROUTING_KEYS
from fulfilment.contracts.topology import EVENTS_EXCHANGE
from fulfilment.observability.relay_metrics import RelayMetrics
from fulfilment.relay.service import Relay, RelayOptions
from tests.support.services import AMQP_URL, throwaway_database

KEYS = ("stock.reserved", "stock.released", "stock.shipped")


async def fill(url: str, rows: int) -> None:
    """Write ``rows`` outbox rows: each order's reserved, released, shipped, interleaved."""
    orders = [uuid.uuid4() for _ in range(rows // 3)]
    records = []
    for key in KEYS:
        for order_id in orders:
            event_id = uuid.uuid4()
            body = {"version": 1, "event_id": str(event_id), "order_id": str(order_id)}
            records.append((event_id, order_id, key, json.dumps(body)))
    db = await asyncpg.connect(url)
    try:
        await db.executemany(
            "INSERT INTO outbox (event_id, order_id, routing_key, body)"
            " VALUES ($1, $2, $3, $4::jsonb)",
            records,
        )
    finally:
        await db.close()


async def measure(url: str, rows: int, batch_size: int) -> None:
    """Run the relay until every row is marked; print the rate and the lag percentiles."""
    async with await aio_pika.connect(AMQP_URL) as broker:
        channel = await broker.channel()
        exchange = await channel.declare_exchange(
            EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, "#")
        await fill(url, rows)
        metrics = RelayMetrics(RESULT_ROUTING_KEYS)
        relay = Relay(
            RelayOptions(
                amqp_url=AMQP_URL,
                database_url=url,
                batch_size=batch_size,
                poll_seconds=0.2,
                batch_window_seconds=0,
                connect_timeout_seconds=5,
                publish_timeout_seconds=30,
                app_id="fulfilment-bench",
            ),
            metrics,
        )
        db = await asyncpg.connect(url)
        started = time.perf_counter()
        cpu_started = time.process_time()
        running = asyncio.create_task(relay.run())
        # Polled: the relay marks in batches and tells nobody; 50 ms is below the figures.
        while await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"):  # noqa: ASYNC110 - see above
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        relay.stop()
        await running
        await db.close()
        await queue.delete(if_unused=False, if_empty=False)
    print(f"rows={rows} batch_size={batch_size}")
    print(f"published in {elapsed:.2f} s: {rows / elapsed:,.0f} rows/s")
    print(f"CPU {cpu:.2f} s: {cpu / rows * 1000:.3f} s per 1,000 events (relay and this poll)")
    lag = next(iter(metrics.publish_lag.collect())).samples
    buckets = [(s.labels["le"], s.value) for s in lag if s.name.endswith("_bucket")]
    for quantile in (0.5, 0.99):
        bound = next(le for le, count in buckets if count >= quantile * rows)
        print(f"commit-to-confirm lag p{int(quantile * 100)} <= {bound} s (backlog included)")


def main() -> None:
    """Measure on a throwaway database, dropped afterwards."""
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 30_000
    batch_size = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    with throwaway_database("fulfilment_bench") as url:
        migrate(url)
        plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        loop = os.environ.get("FULFILMENT_EVENT_LOOP", "uvloop")
        print(f"event loop: {loop}")
        factory = uvloop.new_event_loop if loop == "uvloop" else None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(measure(plain, rows, batch_size))


if __name__ == "__main__":
    main()
