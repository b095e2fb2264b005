"""How fast one dispatcher empties a backlog of fulfilment orders, and its CPU per request.

Writes REQUESTS pending fulfilment-order requests into a throwaway migrated database, starts
the warehouse simulator in a process of its own (answering after ``--latency-seconds``, 20 ms
by default), runs the dispatcher in this process with the PostgreSQL store at ``--rate`` and
``--concurrency``, and prints the requests answered per second until the last is accepted,
this process's CPU seconds per 1,000 requests over that drain (the fill left out), and the
connections the simulator accepted. The CPU figure is the one to compare between versions,
and with the worker's CPU per order (``make bench``): it says how many cores the dispatcher
needs to keep up with a worker's drain when the rate cap allows it. The dispatcher logs as
its process does, a JSON line per answer on standard error: send that to ``/dev/null``.

Run: ``uv run python bench/dispatcher_throughput.py [--requests N] [--rate R] [--concurrency C]
2>/dev/null``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import uvloop
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import SecretStr

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.schema import migrate
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.adapters.warehouse.client import (
    WarehouseClient,
    WarehouseClientOptions,
    build_http_client,
)
from fulfilment.dispatcher.service import Dispatcher, DispatcherOptions
from fulfilment.entrypoints.startup import database_options
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.observability.logging import configure_logging
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.e2e.warehouse_harness import TOKEN, SimulatorProcess
from tests.support.services import throwaway_database

_FILL = (
    "INSERT INTO warehouse_requests"
    " (idempotency_key, kind, order_id, causation_id, lines, status, next_attempt_at)"
    " SELECT gen_random_uuid(), 'fulfilment_order', gen_random_uuid(), gen_random_uuid(),"
    "        jsonb_build_array(jsonb_build_object('sku', '85123A', 'quantity', 6),"
    "                          jsonb_build_object('sku', '71053', 'quantity', g % 12 + 1)),"
    "        'pending', now()"
    " FROM generate_series(1, $1) AS g"
)


@contextmanager
def simulator(latency_seconds: float) -> Iterator[SimulatorProcess]:
    """The warehouse simulator in a process of its own, answering after ``latency_seconds``."""
    with tempfile.TemporaryDirectory() as folder:
        process = SimulatorProcess(Path(folder) / "simulator.log")
        process.start()
        try:
            process.faults(latency_seconds=latency_seconds)
            yield process
        finally:
            process.stop()


async def measure(url: str, warehouse: SimulatorProcess, arguments: argparse.Namespace) -> None:
    """Fill the backlog, run the dispatcher until every request is answered, print figures."""
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    db = await asyncpg.connect(plain)
    await db.execute(_FILL, arguments.requests)
    await db.execute("ANALYZE warehouse_requests")
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(url)), DeadlineSettings())
    )
    http = build_http_client(
        WarehouseClientOptions(
            url=warehouse.url,
            token=TOKEN,
            timeout_seconds=10.0,
            ca_file=None,
            max_connections=arguments.concurrency,
            user_agent="fulfilment-bench",
        )
    )
    dispatcher = Dispatcher(
        PostgresWarehouseRequests(engine, retry_budget_seconds=5.0),
        WarehouseClient(http, timeout_seconds=10.0),
        DispatcherOptions(
            rate_per_second=arguments.rate,
            concurrency=arguments.concurrency,
            timeout_seconds=10.0,
            poll_seconds=0.2,
        ),
        DispatcherMetrics(),
    )
    started = time.perf_counter()
    cpu_started = time.process_time()
    running = asyncio.create_task(dispatcher.run())
    # Polled: the dispatcher tells nobody; 100 ms is well below the figures.
    while await db.fetchval(  # noqa: ASYNC110 - see above
        "SELECT count(*) FROM warehouse_requests WHERE status <> 'accepted'"
    ):
        await asyncio.sleep(0.1)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    dispatcher.stop()
    await running
    await http.aclose()
    await engine.dispose()
    await db.close()
    stats = warehouse.stats()
    requests = arguments.requests
    print(
        f"requests={requests} rate cap={arguments.rate}/s concurrency={arguments.concurrency}"
        f" latency={arguments.latency_seconds * 1000:.0f} ms"
    )
    print(f"answered in {elapsed:.2f} s: {requests / elapsed:,.0f} requests/s")
    print(f"CPU {cpu:.2f} s: {cpu / requests * 1000:.3f} s per 1,000 requests (dispatcher)")
    print(
        f"at the warehouse: {stats['requests_total']} requests, {stats['orders']} orders,"
        f" at most {stats['max_requests_per_second']} in one second,"
        f" over {stats['connections']} connection(s)"
    )


def main() -> None:
    """Measure on a throwaway database, dropped afterwards."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5_000)
    parser.add_argument("--rate", type=float, default=10_000.0, help="the rate cap, per second")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency-seconds", type=float, default=0.02)
    arguments = parser.parse_args()
    # As the dispatcher's process logs: a JSON line per answer (to standard error), httpx's
    # own line per request off.
    configure_logging(log_format="json")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with (
        throwaway_database("fulfilment_bench") as url,
        simulator(arguments.latency_seconds) as warehouse,
    ):
        migrate(url)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(measure(url, warehouse, arguments))


if __name__ == "__main__":
    main()
