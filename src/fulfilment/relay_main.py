"""The relay's composition root (``fulfilment relay``): settings, logging, the relay, its HTTP.

A process of its own beside the worker's root (``main``), so that publishing never takes
event-loop time from the deliveries (README, "Result events and the relay"). Nothing is built
at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator

import structlog
import uvicorn

from fulfilment import __version__
from fulfilment.adapters.postgres.engine import asyncpg_dsn
from fulfilment.contracts.topology import RESULT_ROUTING_KEYS
from fulfilment.observability.logging import configure_logging
from fulfilment.observability.relay_metrics import RelayMetrics
from fulfilment.relay.health import relay_health_app
from fulfilment.relay.service import Relay, RelayOptions
from fulfilment.settings import Settings, SettingsError, load_settings
from fulfilment.worker.fault_injection import parse_fault_plan

logger = structlog.get_logger("fulfilment.relay")


def relay_options(settings: Settings) -> RelayOptions:
    """The relay's options from ``settings`` (its database URL in asyncpg's own form)."""
    return RelayOptions(
        amqp_url=settings.amqp_url.get_secret_value(),
        database_url=asyncpg_dsn(settings.database_url.get_secret_value()),
        batch_size=settings.relay_batch_size,
        poll_seconds=settings.relay_poll_seconds,
        connect_timeout_seconds=settings.database_connect_timeout_seconds,
        publish_timeout_seconds=settings.relay_publish_timeout_seconds,
        app_id=f"fulfilment-{__version__}",
        faults=parse_fault_plan(settings.fault_injection),
    )


async def run_relay(settings: Settings) -> int:
    """Run the relay and its HTTP server until SIGTERM or SIGINT; return the exit code (0).

    The signal lets the batch in flight finish (its confirms, then its marks), closes the
    database session, which frees the lock for a standby, and stops the HTTP server.
    """
    metrics = RelayMetrics(RESULT_ROUTING_KEYS)
    relay = Relay(relay_options(settings), metrics)
    http = _HttpServer(
        uvicorn.Config(
            relay_health_app(
                readiness=relay.readiness, ready=relay.ready, registry=metrics.registry
            ),
            host=settings.http_host,
            port=settings.relay_http_port,
            lifespan="off",
            log_config=None,
            access_log=False,
        )
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, relay.stop)
    logger.info(
        "relay.starting",
        version=__version__,
        batch_size=settings.relay_batch_size,
        poll_seconds=settings.relay_poll_seconds,
        http_port=settings.relay_http_port,
    )
    serving = asyncio.create_task(http.serve())
    try:
        await relay.run()
    finally:
        http.should_exit = True
        await serving
    return 0


class _HttpServer(uvicorn.Server):
    """uvicorn without signal handlers of its own: the relay owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def main() -> None:
    """Console entry of ``fulfilment relay``; exits with its code (2 for invalid settings)."""
    try:
        settings = load_settings()
    except SettingsError as error:
        sys.stderr.write(f"fulfilment: invalid settings: {error}\n")
        sys.exit(2)
    configure_logging(level=settings.log_level, log_format=settings.log_format)
    sys.exit(asyncio.run(run_relay(settings)))
