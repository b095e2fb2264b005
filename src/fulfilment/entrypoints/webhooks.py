"""The intake's composition root (``fulfilment webhooks``): settings, database, two servers.

One process serves two uvicorn servers: ``POST /webhooks/warehouse`` on
``FULFILMENT_WEBHOOKS_PORT`` (``intake.app``) and ``/health/live``, ``/health/ready`` and
``/metrics`` on ``FULFILMENT_WEBHOOKS_HTTP_PORT``, so that an Ingress exposes the endpoint and
nothing else. Every replica serves (no lock): the sender must always find one, and two
replicas given the same webhook apply it once (the inbox of ``webhook_inbox`` and the
shipment's or cancellation's own id, in the SQL functions).

SIGTERM or SIGINT stops it: the endpoint stops accepting, the requests in flight are answered
(each waits at most ``receiver.DATABASE_WAIT_SECONDS`` on the database), then the probes stop
and the pool closes. Nothing is built at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import sys

import asyncpg
import structlog
import uvicorn
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment import __version__
from fulfilment.adapters.postgres.engine import create_engine, create_pool
from fulfilment.adapters.postgres.invalid_webhooks import PostgresInvalidWebhooks
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.entrypoints.startup import (
    STOP_SIGNALS,
    StartRefusedError,
    database_options,
    listen,
    require_current_schema,
    run_service,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.intake.app import intake_app
from fulfilment.intake.receiver import DATABASE_WAIT_SECONDS, WebhookReceiver
from fulfilment.intake.signatures import Refusal, WebhookVerifier
from fulfilment.observability.intake_metrics import IntakeMetrics
from fulfilment.observability.probes import ASGIApp, ProbeServer, probe_app
from fulfilment.observability.tracing import start_tracing
from fulfilment.settings import Settings

logger = structlog.get_logger("fulfilment.webhooks")

READY_PING_SECONDS = 1.0
"""How long ``/health/ready`` waits for the database's ``SELECT 1``."""


async def run_webhooks(settings: Settings) -> int:
    """Run the intake until SIGTERM or SIGINT; return the exit code.

    0 after a stop; 2 without ``FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS``; 1 when a port is taken
    (``webhooks.http_listen_failed``) or the database is not at this build's migration
    (``webhooks.schema_not_current``); 3 when the database does not answer at the start, 4
    when it refuses the user. Once started, a database that stops answering is answered 503
    per webhook, and ``/health/ready`` says 503 until it answers again.
    """
    secrets = settings.warehouse.webhook_secrets.get_secret_value().split()
    if not secrets:
        sys.stderr.write(
            "fulfilment: invalid settings: FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS is not set:"
            " without the warehouse's secrets no webhook can be verified\n"
        )
        return ExitCode.BAD_INPUT
    sockets: list[socket.socket] = []
    try:
        for port, variable in (
            (settings.webhooks.port, "FULFILMENT_WEBHOOKS_PORT"),
            (settings.webhooks.http_port, "FULFILMENT_WEBHOOKS_HTTP_PORT"),
        ):
            sockets.append(
                listen(settings.http.http_host, port, program="webhooks", port_variable=variable)
            )
    except StartRefusedError as refused:
        for listening in sockets:
            listening.close()
        logger.error(refused.event, reason=str(refused))  # noqa: TRY400 - one line, no trace
        return refused.exit_code
    metrics = IntakeMetrics(version=__version__, refusals=tuple(str(r) for r in Refusal))
    tracing = start_tracing(
        metrics.registry, service_name="fulfilment-webhooks", version=__version__
    )
    database = database_options(settings.database, settings.deadlines)
    engine = create_engine(database)
    pool = await create_pool(database)
    try:
        return await _serve(
            settings, secrets=secrets, sockets=sockets, metrics=metrics, engine=engine, pool=pool
        )
    finally:
        pool.terminate()
        await engine.dispose()
        if tracing is not None:
            await tracing.shutdown()


async def _serve(  # noqa: PLR0913 - what the root built, by name
    settings: Settings,
    *,
    secrets: list[str],
    sockets: list[socket.socket],
    metrics: IntakeMetrics,
    engine: AsyncEngine,
    pool: asyncpg.Pool,
) -> int:
    endpoint_socket, probe_socket = sockets
    bound = min(settings.deadlines.retry_budget_seconds, DATABASE_WAIT_SECONDS)
    receiver = WebhookReceiver(
        verifier=WebhookVerifier(secrets, tolerance_seconds=settings.webhooks.tolerance_seconds),
        stock=PostgresStock(
            engine,
            consumer=settings.worker.consumer_name,
            retry_budget_seconds=bound,
            pool=pool,
            pool_size=settings.database.pool_size,
            handoff=settings.warehouse.url is not None,
        ),
        keep_invalid=PostgresInvalidWebhooks(engine, retry_budget_seconds=bound).keep,
        metrics=metrics,
        max_body_bytes=settings.webhooks.max_body_bytes,
    )

    async def readiness() -> tuple[bool, dict[str, bool]]:
        ready = await _database_answers(engine)
        return ready, {"database": ready}

    probes = _server(probe_app(readiness=readiness, registry=metrics.registry), settings)
    endpoint = _server(intake_app(receiver), settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    probing = asyncio.create_task(probes.serve(sockets=[probe_socket]))
    try:
        try:
            await require_current_schema(
                engine, settings.database.url.get_secret_value(), program="webhooks"
            )
        except StartRefusedError as refused:
            logger.error(refused.event, reason=str(refused))  # noqa: TRY400 - one line, no trace
            endpoint_socket.close()
            return refused.exit_code
        logger.info(
            "webhooks.starting",
            version=__version__,
            port=settings.webhooks.port,
            http_port=settings.webhooks.http_port,
            secrets=len(secrets),
            tolerance_seconds=settings.webhooks.tolerance_seconds,
            max_body_bytes=settings.webhooks.max_body_bytes,
        )
        serving = asyncio.create_task(endpoint.serve(sockets=[endpoint_socket]))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        # uvicorn stops accepting, then waits for the requests in flight to be answered.
        endpoint.should_exit = True
        await serving
        stopping.cancel()
        logger.info("webhooks.stopped")
        return ExitCode.OK
    finally:
        probes.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await probing


def _server(app: ASGIApp, settings: Settings) -> ProbeServer:
    """A uvicorn server of ``app`` that leaves the stop signals to the root."""
    return ProbeServer(
        uvicorn.Config(
            app,
            # httptools rather than h11: half the CPU per request, at 1,000 webhooks a second.
            http="httptools",
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=math.ceil(settings.deadlines.graceful_timeout_seconds),
        )
    )


async def _database_answers(engine: AsyncEngine) -> bool:
    """Whether the database answers ``SELECT 1`` within :data:`READY_PING_SECONDS`."""
    try:
        async with asyncio.timeout(READY_PING_SECONDS), engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    except Exception:  # noqa: BLE001 - any failure means not ready; the next probe asks again
        return False
    return True


def main() -> None:
    """Console entry of ``fulfilment webhooks``; exits with its code (2 for invalid settings)."""
    run_service(run_webhooks)
