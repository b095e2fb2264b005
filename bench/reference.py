"""The hand-written reference consumer: aio-pika + asyncpg, what a careful engineer writes.

It does what the worker does for an order, the way the issue's reference figures describe it:
one transaction per order, one statement per round trip, ack after commit::

    BEGIN
    INSERT INTO inbox_messages ... ON CONFLICT DO NOTHING    -- a redelivery stops here
    UPDATE stock_levels ... WHERE sku = $1 AND on_hand - reserved >= $2   -- per SKU, in
                                                              -- code-point order (no deadlock)
    INSERT INTO reservations ...
    INSERT INTO reservation_lines ...                        -- executemany: one round trip
    COMMIT

A line that cannot be reserved rolls the transaction back, and a second one records the
rejection. The channel's prefetch is the concurrency (one task per delivery, as in aio-pika),
with a pool of as many connections. Statements are prepared once per connection (asyncpg's
statement cache), and the pool does not reset a connection when it is released (by default
asyncpg runs ``RESET ALL`` and more then, a seventh round trip, and the consumer changes no
session state). It is kept to what the benchmark needs: no retries, no dead-letter
publishing, no metrics; a failed delivery is rejected without requeue.

Run: ``python bench/reference.py --amqp-url URL --database-url URL --queue NAME
--concurrency N``; it prints ``ready`` once consuming, and stops on SIGTERM or SIGINT after
its in-flight deliveries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import uuid
from datetime import datetime

import aio_pika
import asyncpg

CONSUMER = "bench-reference"
"""Inbox namespace of the reference consumer."""

INSERT_INBOX = """
INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)
VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING
RETURNING 1
"""
RESERVE_LINE = """
UPDATE stock_levels SET reserved = reserved + $2, updated_at = now()
WHERE sku = $1 AND on_hand - reserved >= $2
"""
INSERT_RESERVATION = """
INSERT INTO reservations (order_id, event_id, status, reason, placed_at)
VALUES ($1, $2, $3, $4, $5)
"""
INSERT_LINE = "INSERT INTO reservation_lines (order_id, sku, quantity) VALUES ($1, $2, $3)"


class OutOfStockError(Exception):
    """A line could not be reserved; the transaction rolls back."""


async def reserve(connection: asyncpg.Connection, body: bytes) -> str:
    """Reserve one order's stock in one transaction; return its outcome.

    The outcome is ``reserved``, ``rejected`` or ``duplicate``.

    Raises:
        ValueError: the body is not an ``OrderPlaced`` v1.
        asyncpg.PostgresError: the database failed.
    """
    event = json.loads(body)
    if event.get("version") != 1:
        msg = "unknown version"
        raise ValueError(msg)
    event_id = uuid.UUID(event["event_id"])
    order_id = uuid.UUID(event["order_id"])
    placed_at = datetime.fromisoformat(event["placed_at"])
    demand: dict[str, int] = {}
    for line in event["lines"]:
        demand[line["sku"]] = demand.get(line["sku"], 0) + int(line["quantity"])
    lines = sorted(demand.items())
    try:
        async with connection.transaction():
            if await connection.fetchval(INSERT_INBOX, CONSUMER, event_id, order_id, "reserved"):
                for sku, quantity in lines:
                    if await connection.execute(RESERVE_LINE, sku, quantity) == "UPDATE 0":
                        raise OutOfStockError  # noqa: TRY301 - leaving the block rolls back
                await connection.execute(
                    INSERT_RESERVATION, order_id, event_id, "reserved", None, placed_at
                )
                await connection.executemany(
                    INSERT_LINE, [(order_id, sku, quantity) for sku, quantity in lines]
                )
                return "reserved"
            return "duplicate"
    except OutOfStockError:
        async with connection.transaction():
            if not await connection.fetchval(
                INSERT_INBOX, CONSUMER, event_id, order_id, "rejected"
            ):
                return "duplicate"
            await connection.execute(
                INSERT_RESERVATION, order_id, event_id, "rejected", "insufficient_stock", placed_at
            )
            return "rejected"


async def keep_session(_connection: asyncpg.Connection) -> None:
    """Pool ``reset`` hook that sends nothing: no statement of the consumer changes the session."""


async def consume(amqp_url: str, database_url: str, queue_name: str, concurrency: int) -> None:
    """Consume ``queue_name`` with ``concurrency`` deliveries in flight until SIGTERM/SIGINT."""
    pool = await asyncpg.create_pool(
        database_url, min_size=concurrency, max_size=concurrency, reset=keep_session
    )
    connection = await aio_pika.connect_robust(amqp_url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=concurrency)
    queue = await channel.get_queue(queue_name, ensure=False)
    in_flight: set[asyncio.Task[None]] = set()

    async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        try:
            async with pool.acquire() as database:
                await reserve(database, message.body)
        except (ValueError, KeyError, TypeError, asyncpg.PostgresError) as error:
            print(f"rejected {message.message_id}: {error!r}", file=sys.stderr)
            await message.reject(requeue=False)
        else:
            await message.ack()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        if task is not None:
            in_flight.add(task)
        try:
            await handle(message)
        finally:
            if task is not None:
                in_flight.discard(task)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tag = await queue.consume(on_message)
    print("ready", flush=True)
    await stop.wait()
    await queue.cancel(tag)
    if in_flight:
        await asyncio.wait(in_flight, timeout=10)
    await connection.close()
    await pool.close()


def main() -> None:
    """Parse the command line and consume until stopped."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--amqp-url", required=True)
    parser.add_argument("--database-url", required=True, help="postgresql://...")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(consume(args.amqp_url, args.database_url, args.queue, args.concurrency))


if __name__ == "__main__":
    main()
