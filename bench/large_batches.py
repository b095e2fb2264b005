"""Time one ``place_orders()`` call for large batches on a large stock table.

The worker's batches hold up to ``FULFILMENT_RESERVATION_BATCH_MAX`` orders (the prefetch, 64
by default) and an order up to 1,000 lines, so one call may carry 64,000 lines. This script
creates a database of its own (``FULFILMENT_BENCH_DATABASE_URL``, an admin URL, default
``postgresql://postgres@127.0.0.1:5432/postgres``), migrates it, loads 100,000 SKUs, times
one call per shape (orders x lines per order, every line a different SKU), prints the
milliseconds and drops the database. A call's time should grow with its lines, and stay well
under the default ``statement_timeout`` of 3 s.

    uv run python bench/large_batches.py
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from datetime import UTC, datetime

import asyncpg
from run import dedicated_database

SHAPES = ((1, 1_000), (64, 100), (64, 300), (64, 1_000), (100, 1_000))
"""(orders, lines per order) of each timed call."""

STOCKED_SKUS = 100_000


async def _time_calls(database_url: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        skus = [f"SKU{i:06d}" for i in range(STOCKED_SKUS)]
        await connection.execute(
            "INSERT INTO stock_levels (sku, on_hand) SELECT unnest($1::text[]), 1000000", skus
        )
        await connection.execute("ANALYZE stock_levels")
        rng = random.Random(7)
        for orders, lines in SHAPES:
            line_orders: list[int] = []
            line_skus: list[str] = []
            for ordinal in range(1, orders + 1):
                line_orders += [ordinal] * lines
                line_skus += rng.sample(skus, lines)
            started = time.perf_counter()
            await connection.fetch(
                "SELECT * FROM place_orders('bench', $1, $2, $3, $4, $5, $6)",
                [uuid.uuid4() for _ in range(orders)],
                [uuid.uuid4() for _ in range(orders)],
                [datetime.now(UTC)] * orders,
                line_orders,
                line_skus,
                [1] * len(line_skus),
            )
            elapsed_ms = (time.perf_counter() - started) * 1000
            print(
                f"{orders:>4} orders x {lines:>5} lines = {orders * lines:>6} lines: "
                f"{elapsed_ms:8.0f} ms"
            )
    finally:
        await connection.close()


def main() -> None:
    """Create and migrate a database, time the calls, drop it."""
    admin_url = os.environ.get(
        "FULFILMENT_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    with dedicated_database(admin_url) as database_url:
        asyncio.run(_time_calls(database_url))


if __name__ == "__main__":
    main()
