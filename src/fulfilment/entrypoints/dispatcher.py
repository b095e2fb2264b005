"""The dispatcher's composition root (``fulfilment dispatcher``): settings, client, loop, HTTP.

A process of its own, not a part of the relay's, for three reasons:

- result events must never wait on the warehouse system: the relay publishes within
  milliseconds of a commit, and an outage, a ``Retry-After`` or a slow answer of the warehouse
  would otherwise share its event loop, its restarts and its alerts;
- its failure domain differs: it depends on an external HTTP API and its credentials, the
  relay on RabbitMQ; a refused token must stop the hand-off, not the result events;
- its scaling differs: the warehouse account's rate cap (requests per second) bounds it, not
  the outbox's throughput, so it runs one active replica per database whatever the relay does.

Without ``FULFILMENT_WAREHOUSE_URL`` there is no hand-off and nothing to dispatch: the command
exits 2 (invalid settings) with one line naming the variable. Nothing is built at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import sys

import httpx
import structlog
import uvicorn

from fulfilment import __version__
from fulfilment.adapters.postgres.engine import asyncpg_dsn, create_engine
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.adapters.warehouse_system.client import (
    WarehouseClient,
    WarehouseClientOptions,
    build_http_client,
)
from fulfilment.dispatcher.health import DispatcherState, dispatcher_health_app
from fulfilment.dispatcher.leadership import Leadership
from fulfilment.dispatcher.service import Dispatcher, DispatcherOptions, read_backlog
from fulfilment.entrypoints.startup import (
    STOP_SIGNALS,
    StartRefusedError,
    database_options,
    listen,
    require_current_schema,
    run_service,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.observability.probes import ProbeServer
from fulfilment.observability.tracing import start_tracing
from fulfilment.settings import Settings, WarehouseSettings

logger = structlog.get_logger("fulfilment.dispatcher")

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


async def run_dispatcher(settings: Settings) -> int:
    """Run the dispatcher and its HTTP server until SIGTERM or SIGINT; return the exit code.

    0 after a stop; 2 without ``FULFILMENT_WAREHOUSE_URL`` or with an unreadable
    ``FULFILMENT_WAREHOUSE_CA_FILE``; 1 when its HTTP port is taken
    (``dispatcher.http_listen_failed``) or the database is not at this build's migration
    (``dispatcher.schema_not_current``); 3 when the database does not answer at the start, 4
    when it refuses the user (``composition.require_current_schema``). Once started, a lost
    database is waited for (``dispatcher.leadership``). The signal lets the requests in flight
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
    try:
        listening = listen(
            settings.http.http_host,
            settings.http.dispatcher_port,
            program="dispatcher",
            port_variable="FULFILMENT_DISPATCHER_PORT",
        )
    except StartRefusedError as refused:
        logger.error(refused.event, reason=str(refused))  # noqa: TRY400 - one line, no trace
        return refused.exit_code
    metrics = DispatcherMetrics(version=__version__)
    tracing = start_tracing(
        metrics.registry, service_name="fulfilment-dispatcher", version=__version__
    )
    engine = create_engine(database_options(settings.database, settings.deadlines))
    requests = PostgresWarehouseRequests(
        engine, retry_budget_seconds=settings.deadlines.retry_budget_seconds
    )
    client = WarehouseClient(http_client, timeout_seconds=settings.warehouse.timeout_seconds)
    leadership = Leadership(
        database_url=asyncpg_dsn(settings.database.url.get_secret_value()),
        connect_timeout_seconds=settings.database.connect_timeout_seconds,
        poll_seconds=POLL_SECONDS,
    )
    stopping = asyncio.Event()
    state = DispatcherState(leadership)

    async def active(lost: asyncio.Event) -> None:
        # A new loop per turn on the lock: its gates start open, as another replica's did.
        dispatcher = Dispatcher(requests, client, dispatcher_options(settings.warehouse), metrics)
        state.dispatcher = dispatcher
        metrics.active.set(1)
        running = asyncio.create_task(dispatcher.run())
        ending = [asyncio.create_task(lost.wait()), asyncio.create_task(stopping.wait())]
        try:
            await asyncio.wait([running, *ending], return_when=asyncio.FIRST_COMPLETED)
        finally:
            dispatcher.stop()
            for task in ending:
                task.cancel()
            await running
            metrics.active.set(0)
            state.dispatcher = None

    async def standby() -> None:
        await read_backlog(requests, metrics)

    http = ProbeServer(
        uvicorn.Config(
            dispatcher_health_app(
                readiness=state.readiness, ready=state.ready, registry=metrics.registry
            ),
            host=settings.http.http_host,
            port=settings.http.dispatcher_port,
            lifespan="off",
            log_config=None,
            access_log=False,
        )
    )
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stopping.set)
    logger.info(
        "dispatcher.starting",
        version=__version__,
        warehouse_url=settings.warehouse.url,
        rate_per_second=settings.warehouse.rate_per_second,
        concurrency=settings.warehouse.concurrency,
        http_port=settings.http.dispatcher_port,
    )
    serving = asyncio.create_task(http.serve(sockets=[listening]))
    try:
        await require_current_schema(
            engine, settings.database.url.get_secret_value(), program="dispatcher"
        )
        await leadership.run(active, standby, stopping)
    except StartRefusedError as refused:
        logger.error(refused.event, reason=str(refused))  # noqa: TRY400 - one line, no trace
        return refused.exit_code
    finally:
        http.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await engine.dispose()
        if tracing is not None:
            await tracing.shutdown()
    logger.info("dispatcher.stopped")
    return 0


def main() -> None:
    """Console entry of ``fulfilment dispatcher``; exits with its code (2 for invalid settings)."""
    run_service(run_dispatcher)
