"""The relay's composition root (``fulfilment relay``): settings, logging, the relay, its HTTP.

A process of its own beside the worker's root (``entrypoints.worker``), so that publishing
never takes event-loop time from the deliveries (docs/design.md, "Result events and the
relay"). Nothing is built at import time.
"""

from __future__ import annotations

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from fulfilment import __version__
from fulfilment.adapters.postgres.engine import asyncpg_dsn, create_engine
from fulfilment.contracts.result_events import RESULT_ROUTING_KEYS
from fulfilment.entrypoints.startup import (
    StartRefusedError,
    database_options,
    require_broker,
    require_current_schema,
    run_pump,
    run_service,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.observability.relay_metrics import RelayMetrics
from fulfilment.pump.leader import RECONNECT_INITIAL_SECONDS, RECONNECT_MAX_SECONDS, Pump
from fulfilment.relay.service import Relay, RelayHooks, RelayOptions
from fulfilment.settings import BrokerSettings, DatabaseSettings, RelaySettings, Settings

logger = structlog.get_logger("fulfilment.relay")


def relay_options(
    relay: RelaySettings, broker: BrokerSettings, database: DatabaseSettings
) -> RelayOptions:
    """The relay's options from its settings groups (the database URL in asyncpg's own form)."""
    return RelayOptions(
        amqp_url=broker.amqp_url.get_secret_value(),
        database_url=asyncpg_dsn(database.url.get_secret_value()),
        batch_size=relay.batch_size,
        poll_seconds=relay.poll_seconds,
        batch_window_seconds=relay.batch_window_seconds,
        connect_timeout_seconds=database.connect_timeout_seconds,
        publish_timeout_seconds=relay.publish_timeout_seconds,
        app_id=f"fulfilment-{__version__}",
    )


async def run_relay(settings: Settings, *, hooks: RelayHooks | None = None) -> ExitCode:
    """Run the relay and its HTTP server until SIGTERM or SIGINT; return the exit code.

    ``hooks`` act at the points of each batch (:class:`RelayHooks`; none by default: the
    fault suite passes its crash points).

    0 after a stop. Before its first session the relay checks, as the worker does at start,
    that the database is at this build's migration (else exit 1, ``relay.schema_not_current``)
    and that neither service refuses its user, virtual host or database (else exit 4,
    ``relay.broker_refused``, ``relay.database_refused``), each in one log line; a taken HTTP
    port exits 1 (``relay.http_listen_failed``) before either is tried. Unlike the
    worker it does not exit when a service does not answer: it waits for it, as it does for a
    lost connection (:func:`wait_for_start`).

    The signal lets the batch in flight finish (its confirms, then its marks), closes the
    database session, which frees the lock for a standby, and stops the HTTP server
    (``startup.run_pump``).
    """
    metrics = RelayMetrics(RESULT_ROUTING_KEYS, version=__version__)
    relay = Relay(relay_options(settings.relay, settings.broker, settings.database), metrics, hooks)
    return await run_pump(
        relay,
        registry=metrics.registry,
        host=settings.http.http_host,
        port=settings.http.relay_http_port,
        port_variable="FULFILMENT_RELAY_HTTP_PORT",
        start=lambda: wait_for_start(settings, relay),
        batch_size=settings.relay.batch_size,
        poll_seconds=settings.relay.poll_seconds,
    )


async def wait_for_start(settings: Settings, relay: Pump) -> None:
    """Return once the database is at this build's migration and both services accept the relay.

    The worker's checks (``entrypoints.startup``): the schema first, on a connection of its
    own, then a broker connection opened and closed. A service that does not answer is waited
    for, with the relay's back-off (``pump.leader.RECONNECT_*``; a
    ``relay.<service>_unreachable`` warning per try), until it answers or ``relay`` is
    stopped; then this returns at once.

    Raises:
        StartRefusedError: the schema is not current (exit 1), or a service refused the
            relay's user, virtual host or database (exit 4).
    """
    database_url = settings.database.url.get_secret_value()
    engine = create_engine(database_options(settings.database, settings.deadlines))

    async def check() -> None:
        await require_current_schema(engine, database_url, program="relay")
        await require_broker(
            settings.broker.amqp_url.get_secret_value(),
            program="relay",
            timeout_seconds=settings.database.connect_timeout_seconds,
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception(
            lambda error: isinstance(error, StartRefusedError) and error.unreachable
        ),
        wait=wait_exponential_jitter(
            multiplier=RECONNECT_INITIAL_SECONDS, max=RECONNECT_MAX_SECONDS
        ),
        stop=lambda _state: relay.stopping.is_set(),
        sleep=relay.pause,
        before_sleep=_log_unreachable,
        reraise=True,
    )
    try:
        await retrying(check)
    except StartRefusedError as refused:
        if not (refused.unreachable and relay.stopping.is_set()):
            raise
    finally:
        await engine.dispose()


def _log_unreachable(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    if isinstance(error, StartRefusedError):  # the only error retried
        logger.warning(
            error.event,
            reason=str(error),
            attempt=state.attempt_number,
            wait_seconds=round(state.upcoming_sleep, 2),
        )


def main() -> None:
    """Console entry of ``fulfilment relay``; exits with its code (2 for invalid settings)."""
    run_service(run_relay)
