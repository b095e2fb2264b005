"""The broker alone: how long it takes to confirm a steady stream into a quorum queue.

``bench/run.py``'s latency phase reports how long the broker took to confirm each order it
published while the worker, the relay and PostgreSQL shared the cores with it. This publishes
orders of the same shape at the same steady rate, with nothing consuming them and nothing else
of the benchmark running, into a quorum queue of its own (``bench.broker-confirms``, emptied
before each round and deleted at the end) through the default exchange, persistent, with
publisher confirms and ``mandatory``, as the benchmark's publisher does. It prints, per round,
the confirm time's p50/p95/p99/max in ms and the broker's CPU seconds per 1,000 messages.

The tail it shows is the floor of commit -> confirm at that rate on the machine: a result event
is one such write after its commit (a tail the service adds nothing to), and the order that
caused it was another before.

Run: ``uv run python bench/broker_confirms.py [--rate R] [--seconds S] [--rounds N]
[--amqp-url URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import aio_pika
from acks import broker_cpu_seconds
from figures import lag_percentiles_ms
from workload import Order, publish_steadily

QUEUE = "bench.broker-confirms"
LINES = (("85123A", 6), ("71053", 6), ("84406B", 8))
"""Three lines of the sample's first invoice: a body of the size the benchmark sends."""


async def round_of(
    connection: aio_pika.abc.AbstractConnection,
    queue: aio_pika.abc.AbstractQueue,
    rate: float,
    seconds: float,
) -> tuple[dict[str, float], float]:
    """One steady publish into ``queue``, emptied first.

    Returns ``(confirm ms percentiles, broker CPU s per 1,000 messages)``. A message the
    broker returns or refuses raises, as in ``publish_steadily``.
    """
    orders = [Order(uuid.uuid4(), uuid.uuid4(), LINES) for _ in range(round(rate * seconds))]
    await queue.purge()
    cpu_before = broker_cpu_seconds()
    steady = await publish_steadily(
        connection, exchange="", routing_key=queue.name, orders=orders, rate=rate
    )
    cpu = broker_cpu_seconds() - cpu_before
    return lag_percentiles_ms(steady.placed, steady.confirmed), cpu / len(orders) * 1000


async def main() -> None:
    """Parse the arguments, run the rounds, print a line per round."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1300.0, help="messages per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/")
    args = parser.parse_args()
    connection = await aio_pika.connect(args.amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(
            QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
        )
        for number in range(1, args.rounds + 1):
            started = time.monotonic()
            lags, cpu = await round_of(connection, queue, args.rate, args.seconds)
            print(
                f"round {number}: {args.rate:,.0f} messages/s for {args.seconds:g} s, "
                f"confirm p50 {lags['p50']} ms, p95 {lags['p95']} ms, p99 {lags['p99']} ms, "
                f"max {lags['max']} ms; broker CPU {cpu:.3f} s per 1,000 messages "
                f"({time.monotonic() - started:.1f} s)"
            )
        await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()


if __name__ == "__main__":
    asyncio.run(main())
