"""What the service's metrics cost per delivery, against the whole delivery.

Prints microseconds per delivery for:

1. the service's metric updates of one delivery (outcome counter, two histograms, in-flight
   gauge up and down, the per-delivery retry context), with the outcome child bound once
   versus looked up with ``.labels()`` each time;
2. a whole delivery through FastStream's in-memory broker and ``on_order_placed`` with the
   in-memory stock store, and the share of it the bound updates take.

Run: ``uv run python bench/metrics_overhead.py [deliveries]``.
"""

from __future__ import annotations

import asyncio
import sys
import time
import timeit
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from faststream.rabbit import TestRabbitBroker

from fulfilment.contracts.order_placed import order_placed_body
from fulfilment.contracts.topology import ORDER_PLACED_ROUTING_KEY
from fulfilment.entrypoints.worker import build_worker, new_metrics
from fulfilment.observability.logging import configure_logging
from fulfilment.settings import Settings
from fulfilment.worker.dead_lettering import begin_delivery
from fulfilment.worker.topology import Topology
from tests.support.fakes import FakeStock


def metric_updates(rounds: int) -> tuple[float, float]:
    """Microseconds of one delivery's metric updates: (child bound once, ``.labels()``)."""
    metrics = new_metrics()

    def bound() -> None:
        begin_delivery()
        metrics.in_flight.inc()
        metrics.event("order_placed", "reserved", "").inc()
        metrics.end_to_end_latency.observe(0.02)
        metrics.in_flight.dec()
        metrics.handler_duration.observe(0.01)

    def looked_up() -> None:
        begin_delivery()
        metrics.in_flight.inc()
        metrics.events.labels("order_placed", "reserved", "").inc()
        metrics.end_to_end_latency.observe(0.02)
        metrics.in_flight.dec()
        metrics.handler_duration.observe(0.01)

    return (
        min(timeit.repeat(bound, number=rounds, repeat=5)) / rounds * 1e6,
        min(timeit.repeat(looked_up, number=rounds, repeat=5)) / rounds * 1e6,
    )


async def _no_database() -> None:
    return None


async def deliveries(count: int) -> float:
    """Microseconds per delivery through the in-memory broker, reserved by the fake."""
    stock = FakeStock()
    await stock.put_stock({"85123A": count * 2})
    worker = build_worker(Settings(), stock=stock, database_ping=_no_database)
    bodies = [
        order_placed_body(
            event_id=uuid.uuid4(),
            order_id=uuid.uuid4(),
            placed_at=datetime.now(UTC),
            lines=[("85123A", 1)],
        )
        for _ in range(count)
    ]
    exchange = Topology(5).orders_exchange()
    async with TestRabbitBroker(worker.broker) as broker:
        started = time.perf_counter()
        for body in bodies:
            await broker.publish(body, exchange=exchange, routing_key=ORDER_PLACED_ROUTING_KEY)
        return (time.perf_counter() - started) / count * 1e6


def main() -> None:
    """Print both measurements."""
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    configure_logging(level="WARNING")  # one log line per delivery would dwarf the metrics
    bound, looked_up = metric_updates(50_000)
    print(
        f"service metric updates per delivery: {bound:.2f} µs bound, {looked_up:.2f} µs .labels()"
    )
    # Best of three runs: other load on the machine only ever adds time.
    delivery = min(asyncio.run(deliveries(count)) for _ in range(3))
    print(
        f"in-memory delivery ({count}): {delivery:.1f} µs, of which the bound metric updates "
        f"{bound / delivery:.1%}"
    )


if __name__ == "__main__":
    main()
