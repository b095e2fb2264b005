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
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import uvloop
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.schema import migrate
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.adapters.warehouse_system.client import (
    WarehouseClient,
    WarehouseClientOptions,
    build_http_client,
)
from fulfilment.composition import database_options
from fulfilment.dispatcher.service import Dispatcher, DispatcherOptions
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.observability.logging import configure_logging
from fulfilment.settings import Settings
from services import throwaway_database

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token"  # noqa: S105 - the simulator's, on loopback

_FILL = (
    "INSERT INTO warehouse_requests"
    " (idempotency_key, kind, order_id, causation_id, lines, status, next_attempt_at)"
    " SELECT gen_random_uuid(), 'fulfilment_order', gen_random_uuid(), gen_random_uuid(),"
    "        jsonb_build_array(jsonb_build_object('sku', '85123A', 'quantity', 6),"
    "                          jsonb_build_object('sku', '71053', 'quantity', g % 12 + 1)),"
    "        'pending', now()"
    " FROM generate_series(1, $1) AS g"
)


def free_port() -> int:
    """A TCP port free on the loopback now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def simulator(latency_seconds: float) -> Iterator[str]:
    """The warehouse simulator in a process of its own; yields its API's base URL."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "warehouse_simulator",
            "--port",
            str(port),
            "--token",
            TOKEN,
            "--latency-seconds",
            str(latency_seconds),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT / "simulator")},
        stdout=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{base}/_simulator/stats", timeout=1):  # noqa: S310 - loopback
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(10)


def simulator_stats(base: str) -> dict[str, object]:
    """The simulator's counts (``/_simulator/stats``)."""
    with urllib.request.urlopen(f"{base}/_simulator/stats", timeout=5) as answer:  # noqa: S310 - loopback
        stats: dict[str, object] = json.load(answer)
    return stats


async def measure(url: str, base: str, arguments: argparse.Namespace) -> None:
    """Fill the backlog, run the dispatcher until every request is answered, print figures."""
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    db = await asyncpg.connect(plain)
    await db.execute(_FILL, arguments.requests)
    await db.execute("ANALYZE warehouse_requests")
    engine = create_engine(database_options(Settings(database_url=url)))  # type: ignore[arg-type]
    http = build_http_client(
        WarehouseClientOptions(
            url=f"{base}/api/v1",
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
    stats = simulator_stats(base)
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
        simulator(arguments.latency_seconds) as base,
    ):
        migrate(url)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(measure(url, base, arguments))


if __name__ == "__main__":
    main()
