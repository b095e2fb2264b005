"""The dispatcher's composition root (``fulfilment dispatcher``): settings, client, loop, HTTP.

A process of its own, not a part of the relay's, for three reasons:

- result events must never wait on the warehouse system: the relay publishes within
  milliseconds of a commit, and an outage, a ``Retry-After`` or a slow answer of the warehouse
  would otherwise share its event loop, its restarts and its alerts;
- its failure domain differs: it depends on an external HTTP API and its credentials, the
  relay on RabbitMQ; a refused token must stop the hand-off, not the result events;
- its scaling differs: the warehouse account's rate cap (requests per second) bounds it, not
  the outbox's throughput, so it runs one active replica per database whatever the relay does.

The same process polls the fulfilment orders with no news (``dispatcher.poll``), within the
same rate cap, and applies what it finds through a ``PostgresStock`` of its own, as the
webhook intake does; and compares the stock with the warehouse's every
``FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS`` (``dispatcher.drift``), after both.

Without ``FULFILMENT_WAREHOUSE_URL`` there is no hand-off and nothing to dispatch: the command
exits 2 (invalid settings) with one line naming the variable. Nothing is built at import time.
"""

from __future__ import annotations

import functools
import logging
import ssl
import sys

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment import __version__
from fulfilment.adapters.postgres.advisory_lock import DISPATCHER_LOCK_KEY
from fulfilment.adapters.postgres.engine import asyncpg_dsn, create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.adapters.warehouse.client import (
    WarehouseClient,
    WarehouseClientOptions,
    build_http_client,
)
from fulfilment.adapters.warehouse.drift import read_drift
from fulfilment.dispatcher.drift import DriftCheck
from fulfilment.dispatcher.poll import Poller, PollOptions
from fulfilment.dispatcher.pump import DispatcherPump
from fulfilment.dispatcher.service import DispatcherOptions
from fulfilment.entrypoints.startup import (
    database_options,
    require_current_schema,
    run_pump,
    run_service,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.pump.leader import LockOptions
from fulfilment.settings import Settings, WarehouseSettings

POLL_SECONDS = 1.0
"""How often the active dispatcher looks for due requests when none is, and a standby tries
the lock and reads the backlog."""

EXPIRE_INTERVAL_SECONDS = 60.0
"""How often the active dispatcher expires requests past their key's retention."""


def client_options(warehouse: WarehouseSettings) -> WarehouseClientOptions:
    """The warehouse client's options from ``warehouse`` (its URL must be set)."""
    return WarehouseClientOptions(
        url=warehouse.url or "",
        token=warehouse.token.get_secret_value(),
        timeout_seconds=warehouse.timeout_seconds,
        ca_file=warehouse.ca_file,
        max_connections=warehouse.concurrency,
        user_agent=f"fulfilment/{__version__}",
    )


def dispatcher_options(warehouse: WarehouseSettings) -> DispatcherOptions:
    """The loop's caps and intervals from ``warehouse``."""
    return DispatcherOptions(
        rate_per_second=warehouse.rate_per_second,
        concurrency=warehouse.concurrency,
        timeout_seconds=warehouse.timeout_seconds,
        poll_seconds=POLL_SECONDS,
        key_retention_seconds=warehouse.key_retention_seconds,
        expire_interval_seconds=EXPIRE_INTERVAL_SECONDS,
    )


def poll_options(warehouse: WarehouseSettings) -> PollOptions:
    """The polls' interval from ``warehouse``."""
    return PollOptions(
        reconcile_after_seconds=warehouse.reconcile_after_seconds,
        concurrency=warehouse.concurrency,
    )


def drift_check(
    warehouse: WarehouseSettings,
    engine: AsyncEngine,
    http_client: httpx.AsyncClient,
    metrics: DispatcherMetrics,
) -> DriftCheck | None:
    """The scheduled drift check from ``warehouse``; None when its interval is 0 (off).

    Sets ``fulfilment_stock_drift_interval_seconds`` either way.
    """
    metrics.drift_interval_seconds.set(warehouse.drift_interval_seconds)
    if warehouse.drift_interval_seconds == 0:
        return None
    read = functools.partial(
        read_drift, engine, http_client, timeout_seconds=warehouse.timeout_seconds
    )
    return DriftCheck(read, warehouse.drift_interval_seconds, metrics)


async def run_dispatcher(settings: Settings) -> int:
    """Run the dispatcher and its HTTP server until SIGTERM or SIGINT; return the exit code.

    0 after a stop; 2 without ``FULFILMENT_WAREHOUSE_URL`` or with an unreadable
    ``FULFILMENT_WAREHOUSE_CA_FILE``; 1 when its HTTP port is taken
    (``dispatcher.http_listen_failed``) or the database is not at this build's migration
    (``dispatcher.schema_not_current``); 3 when the database does not answer at the start, 4
    when it refuses the user (``startup.require_current_schema``). Once started, a lost
    database is waited for (``pump.leader``). The signal lets the requests in flight
    be recorded, and closes the lock's session (a standby takes over), the client's pool and
    the HTTP server.
    """
    # httpx logs each request at INFO; the dispatcher's own dispatcher.answer line says more.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if settings.warehouse.url is None:
        sys.stderr.write(
            "fulfilment: invalid settings: FULFILMENT_WAREHOUSE_URL is not set: without the"
            " warehouse system's URL there is no hand-off and no dispatcher to run\n"
        )
        return ExitCode.BAD_INPUT
    try:
        http_client = build_http_client(client_options(settings.warehouse))
    except (OSError, ssl.SSLError) as error:
        sys.stderr.write(
            "fulfilment: invalid settings: FULFILMENT_WAREHOUSE_CA_FILE: cannot be read as a"
            f" CA bundle: {error}\n"
        )
        return ExitCode.BAD_INPUT
    async with http_client:
        return await _serve(settings, http_client)


async def _serve(settings: Settings, http_client: httpx.AsyncClient) -> int:
    metrics = DispatcherMetrics(version=__version__)
    engine = create_engine(database_options(settings.database, settings.deadlines))
    requests = PostgresWarehouseRequests(
        engine, retry_budget_seconds=settings.deadlines.retry_budget_seconds
    )
    # The polls apply what they find as the intake applies a webhook: through the stock store,
    # with the hand-off on, as the worker's.
    stock = PostgresStock(
        engine,
        consumer=settings.worker.consumer_name,
        retry_budget_seconds=settings.deadlines.retry_budget_seconds,
        pool_size=settings.database.pool_size,
        handoff=True,
    )
    pump = DispatcherPump(
        LockOptions(
            database_url=asyncpg_dsn(settings.database.url.get_secret_value()),
            key=DISPATCHER_LOCK_KEY,
            connect_timeout_seconds=settings.database.connect_timeout_seconds,
            poll_seconds=POLL_SECONDS,
        ),
        requests,
        WarehouseClient(http_client, timeout_seconds=settings.warehouse.timeout_seconds),
        dispatcher_options(settings.warehouse),
        metrics,
        poller=Poller(requests, stock, poll_options(settings.warehouse), metrics),
        drift=drift_check(settings.warehouse, engine, http_client, metrics),
    )
    try:
        return await run_pump(
            pump,
            registry=metrics.registry,
            host=settings.http.http_host,
            port=settings.http.dispatcher_port,
            port_variable="FULFILMENT_DISPATCHER_PORT",
            start=lambda: require_current_schema(
                engine, settings.database.url.get_secret_value(), program="dispatcher"
            ),
            warehouse_url=settings.warehouse.url,
            rate_per_second=settings.warehouse.rate_per_second,
            concurrency=settings.warehouse.concurrency,
        )
    finally:
        await engine.dispose()


def main() -> None:
    """Console entry of ``fulfilment dispatcher``; exits with its code (2 for invalid settings)."""
    run_service(run_dispatcher)
