"""The worker's composition root: it reads the settings and builds the concrete adapters.

The operator tools have their own root, ``fulfilment.entrypoints.cli``; no other module reads
settings (import-linter checks it).

``main()`` builds settings, logging, the PostgreSQL pool and stock store, the broker and its
subscribers, and serves them with uvicorn until SIGTERM or SIGINT; it closes them in reverse
order. Nothing is built at import time. Tests call :func:`build_worker` with fakes.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import aio_pika
import structlog
import uvicorn
from faststream import FastStream
from faststream.rabbit import Channel, RabbitBroker, RabbitQueue
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from fulfilment import __version__
from fulfilment.adapters.postgres.engine import create_engine, create_pool
from fulfilment.adapters.postgres.retry import RETRY_LABELS, retry_label
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.rabbitmq.connection import connection_failure as broker_connection_failure
from fulfilment.contracts.dead_letter import SERVICE_FAILURE_CLASSES, FailureClass
from fulfilment.contracts.topology import SubscribedQueue
from fulfilment.entrypoints.startup import (
    StartRefusedError,
    database_options,
    listen,
    require_current_schema,
    run_service,
    service_stops_start,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.observability.metrics import Metrics
from fulfilment.observability.probes import ASGIApp, ProbeServer
from fulfilment.observability.tracing import start_tracing
from fulfilment.routes.table import OUTCOMES, ROUTES
from fulfilment.settings import BrokerSettings, DeadlineSettings, Settings
from fulfilment.worker.consumer_control import (
    ConsumerPause,
    ConsumerWatchdog,
    cancel_consumer,
    consumer_attached,
)
from fulfilment.worker.dead_lettering import DeadLetterChannel, DeadLetterPublisher, record_retry
from fulfilment.worker.delivery import DeliveryLimits, DeliveryPolicy, subscribe
from fulfilment.worker.health import health_app
from fulfilment.worker.monitors import (
    BackgroundTask,
    background,
    invariant_monitor,
    queue_monitor,
)
from fulfilment.worker.topology import (
    Topology,
    TopologyMismatchError,
    declare_topology,
    use_declared_arguments,
)

if TYPE_CHECKING:
    from faststream.rabbit.subscriber import RabbitSubscriber
    from sqlalchemy.ext.asyncio import AsyncEngine

    from fulfilment.application.ports import Stock

logger = structlog.get_logger("fulfilment.entrypoints.worker")


@dataclass(frozen=True, slots=True)
class Worker:
    """The assembled worker: the FastStream app, its HTTP endpoints, and what tests look into."""

    app: FastStream
    http: ASGIApp
    consumer_pause: ConsumerPause
    watchdog: ConsumerWatchdog
    broker: RabbitBroker
    subscribers: tuple[RabbitSubscriber, ...]
    metrics: Metrics


def build_worker(  # noqa: PLR0913 - the composition root passes each dependency by name
    settings: Settings,
    *,
    stock: Stock,
    database_ping: Callable[[], Awaitable[None]],
    metrics: Metrics | None = None,
    monitors: Sequence[BackgroundTask] = (),
    after_shutdown: Sequence[Callable[[], Awaitable[None]]] = (),
    startup_checks: Sequence[Callable[[], Awaitable[None]]] = (),
    dead_letter_publisher: Callable[[RabbitBroker], DeadLetterPublisher] | None = None,
) -> Worker:
    """Assemble the broker, a subscriber per event's queue, hooks and HTTP routes.

    One subscriber per route whose transport is a queue (``fulfilment.routes.table.ROUTES``):
    its handler, bound to ``warehouse``, on its queue, under its event's name.

    Every subscriber goes through the one delivery policy (``worker.delivery``). Start-up
    declares the topology (refusing to start on a mismatch); shutdown first cancels the
    consumers so no new delivery arrives while in-flight handlers drain for up to
    ``graceful_timeout_seconds``; ``after_shutdown`` callables run once the broker is closed.
    ``monitors`` and the consumer watchdog (supervised, see ``worker.monitors``) run from the
    broker's start until shutdown begins. The delivery policy counts each delivery on
    ``metrics`` (its outcome in ``fulfilment_events_total``, receipt to settlement in
    ``fulfilment_handler_duration_seconds``); ``/metrics`` serves ``metrics.registry``, which
    holds the service's metrics and the process collectors, none of FastStream's. While the
    database is down every consumer is paused (``worker.consumer_control.ConsumerPause``).
    ``startup_checks`` run before the topology is declared; one that raises stops the start.
    ``dead_letter_publisher`` makes, from the broker, what publishes dead letters: by default
    a channel of the broker's connection of their own (``DeadLetterChannel``).
    """
    metrics = metrics or new_metrics()
    topology = Topology(
        delivery_limit=settings.broker.delivery_limit,
        quorum_initial_group_size=settings.broker.quorum_initial_group_size,
    )
    amqp_url = settings.broker.amqp_url.get_secret_value()
    broker = _broker(settings.broker, settings.deadlines)
    consumer_pause = ConsumerPause(database_ping)
    policy = DeliveryPolicy(
        broker,
        metrics=metrics,
        limits=delivery_limits(settings.deadlines, settings.broker),
        count_redelivery=stock.count_redelivery,
        pause=consumer_pause.trip,
        prefetch_count=settings.worker.prefetch_count,
        publish_dead_letter=(
            dead_letter_publisher(broker)
            if dead_letter_publisher is not None
            else DeadLetterChannel(broker.connect).publish
        ),
    )
    orders = topology.orders_exchange()
    subscribers = tuple(
        subscribe(
            policy,
            topology.queue(route.transport),
            orders,
            partial(route.handler, stock=stock),
            name=route.event,
        )
        for route in ROUTES
        if isinstance(route.transport, SubscribedQueue)
    )
    consumer_pause.attach(subscribers)

    declare = _start_up(amqp_url, topology, startup_checks, [s.queue for s in subscribers])

    async def cancel_consumers_first() -> None:
        await consumer_pause.close()
        for subscriber in subscribers:
            await cancel_consumer(subscriber)
        logger.info("worker.consumer_cancelled", in_flight=metrics.in_flight._value.get())  # noqa: SLF001

    def stop_worker() -> None:
        app.exit()

    watchdog = ConsumerWatchdog(
        subscribers,
        consumer_pause,
        stop_worker,
        give_up_seconds=settings.worker.consumer_lost_exit_seconds,
    )
    start_monitors, stop_monitors = background(
        [*monitors, BackgroundTask("consumer", watchdog.run)], metrics
    )

    app = FastStream(
        broker,
        logger=logging.getLogger("faststream"),
        # Frozen before the broker starts consuming, so no delivery's objects are frozen.
        on_startup=[declare, _freeze_startup_objects],
        after_startup=[start_monitors],
        on_shutdown=[stop_monitors, cancel_consumers_first],
        after_shutdown=list(after_shutdown),
    )
    http = health_app(
        broker_connected=broker.ping,
        consumer_attached=lambda: all(consumer_attached(s) for s in subscribers),
        database_ping=database_ping,
        registry=metrics.registry,
    )
    return Worker(
        app=app,
        http=http,
        consumer_pause=consumer_pause,
        watchdog=watchdog,
        broker=broker,
        subscribers=subscribers,
        metrics=metrics,
    )


def _start_up(
    amqp_url: str,
    topology: Topology,
    startup_checks: Sequence[Callable[[], Awaitable[None]]],
    consumed: Sequence[RabbitQueue],
) -> Callable[[], Awaitable[None]]:
    """The start-up hook: ``startup_checks``, then the topology declared and checked.

    The arguments each queue was accepted with go to the subscribers' queues ``consumed``.

    It raises :class:`~fulfilment.entrypoints.startup.StartRefusedError` on a topology mismatch or a
    broker that refuses or does not answer.
    """

    async def declare() -> None:
        for check in startup_checks:
            await check()
        try:
            declared = await declare_topology(amqp_url, topology)
        except TopologyMismatchError as error:
            raise StartRefusedError(str(error), event="worker.topology_mismatch") from error
        except (OSError, TimeoutError, aio_pika.exceptions.AMQPError) as error:
            failure = broker_connection_failure(amqp_url, error)
            raise service_stops_start(failure, program="worker") from error
        use_declared_arguments(consumed, declared)

    return declare


async def _freeze_startup_objects() -> None:
    # The modules, models and app built at start-up are most of the heap and live until
    # exit; frozen, the collector's full passes skip them. Unfrozen, each full pass
    # walked them all, stopping the event loop for 50-160 ms every few seconds under load,
    # the tail of the end-to-end latency (docs/performance.md).
    gc.collect()
    gc.freeze()


def _broker(broker: BrokerSettings, deadlines: DeadlineSettings) -> RabbitBroker:
    """The worker's broker: not connected yet, and without FastStream's Prometheus middleware.

    The delivery policy counts every delivery on the service's own metrics (``Metrics``);
    the middleware's series repeated those counts and durations for 5 to 6 % of the worker's
    CPU per delivery.
    """
    return RabbitBroker(
        broker.amqp_url.get_secret_value(),
        # on_return_raises: an unroutable dead letter must raise, not vanish (mandatory=True
        # alone only hands back the Basic.Return frame).
        default_channel=Channel(on_return_raises=True),
        graceful_timeout=deadlines.graceful_timeout_seconds,
        app_id=f"fulfilment-{__version__}",
        logger=logging.getLogger("faststream"),
        # FastStream's per-message "Received"/"Processed" lines go to DEBUG: the service
        # writes its own single line per message.
        log_level=logging.DEBUG,
        # No FastDepends: its Context fields run in a thread pool, one hop per delivery; the
        # delivery policy takes the message from FastStream's context instead (worker.delivery).
        apply_types=False,
    )


def delivery_limits(deadlines: DeadlineSettings, broker: BrokerSettings) -> DeliveryLimits:
    """The bounds of one delivery, from the deadlines and the broker's limit (seconds)."""
    return DeliveryLimits(
        handler_deadline_seconds=deadlines.handler_deadline_seconds,
        # What is left of the graceful timeout once the deadline has passed.
        dead_letter_publish_seconds=deadlines.graceful_timeout_seconds
        - deadlines.handler_deadline_seconds,
        delivery_limit=broker.delivery_limit,
        # A delivery is received, handled (up to the deadline), and its dead letter tried
        # (up to the publish timeout) before it is held: held this long, it is still settled
        # before the broker's consumer timeout closes its channel.
        dead_letter_hold_seconds=max(
            0.0,
            deadlines.broker_consumer_timeout_seconds - 2 * deadlines.graceful_timeout_seconds,
        ),
    )


async def run_worker(
    settings: Settings,
    *,
    wrap_stock: Callable[[PostgresStock], Stock] | None = None,
) -> ExitCode:
    """Run the worker until SIGTERM or SIGINT; return the process exit code.

    ``wrap_stock``, when given, wraps the PostgreSQL stock store the handlers use (the fault
    suite's crash points go around it this way); by default they use it as it is.

    0 after a clean shutdown; 3 when RabbitMQ or PostgreSQL did not answer at start, 4 when
    one refused the user or has no such virtual host or database; 1 when another start-up
    check failed (topology mismatch, schema behind, a broken subscriber, a taken HTTP port:
    ``entrypoints.startup.listen``, before any connection) or the consumer was
    lost for good (``ConsumerWatchdog``), so the orchestrator restarts the pod with back-off.
    The HTTP server runs beside the broker from the start, so liveness answers during start-up.
    """
    try:
        listening = listen(
            settings.http.http_host,
            settings.http.http_port,
            program="worker",
            port_variable="FULFILMENT_HTTP_PORT",
        )
    except StartRefusedError as refused:
        logger.error(refused.event, reason=str(refused))  # noqa: TRY400 - one line, no trace
        return refused.exit_code
    metrics = new_metrics()
    tracing = start_tracing(metrics.registry, service_name="fulfilment-worker", version=__version__)
    database = database_options(settings.database, settings.deadlines)
    engine = create_engine(database)
    pool = await create_pool(database)  # the reservations' (hot path); the engine for the rest

    def on_retry(error: BaseException) -> None:
        metrics.count_database_retry(retry_label(error))
        record_retry()  # for the attempt count and first failure time of a dead letter

    postgres = PostgresStock(
        engine,
        consumer=settings.worker.consumer_name,
        retry_budget_seconds=settings.deadlines.retry_budget_seconds,
        on_retry=on_retry,
        pool=pool,
        pool_size=settings.database.pool_size,
        batch_max=settings.worker.reservation_batch_max,
        # The worker records the requests; only the dispatcher ever calls the stock store system.
        handoff=settings.warehouse.url is not None,
    )
    stock: Stock = postgres if wrap_stock is None else wrap_stock(postgres)

    async def database_ping() -> None:
        await ping_database(engine)

    async def schema_is_current() -> None:
        await require_current_schema(
            engine, settings.database.url.get_secret_value(), program="worker"
        )

    async def close_pool() -> None:
        await pool.close()
        await engine.dispose()
        logger.info("worker.stopped")

    worker = build_worker(
        settings,
        stock=stock,
        database_ping=database_ping,
        metrics=metrics,
        monitors=[
            queue_monitor(
                settings.broker.amqp_url.get_secret_value(),
                metrics,
                interval_seconds=settings.worker.queue_poll_interval_seconds,
            ),
            invariant_monitor(
                engine, metrics, interval_seconds=settings.worker.invariant_check_interval_seconds
            ),
        ],
        after_shutdown=[close_pool],
        startup_checks=[schema_is_current],
    )
    http = ProbeServer(
        uvicorn.Config(
            worker.http,
            host=settings.http.http_host,
            port=settings.http.http_port,
            lifespan="off",
            log_config=None,
            access_log=False,
        )
    )
    logger.info(
        "worker.starting",
        version=__version__,
        prefetch_count=settings.worker.prefetch_count,
        database_pool_size=settings.database.pool_size,
        reservation_batch_max=settings.worker.reservation_batch_max,
        delivery_limit=settings.broker.delivery_limit,
        quorum_initial_group_size=settings.broker.quorum_initial_group_size,
        handler_deadline_seconds=settings.deadlines.handler_deadline_seconds,
        graceful_timeout_seconds=settings.deadlines.graceful_timeout_seconds,
        http_port=settings.http.http_port,
    )
    serving = asyncio.create_task(http.serve(sockets=[listening]))
    try:
        await worker.app.run(log_level=logging.INFO)
    except StartRefusedError as refused:
        logger.error(refused.event, reason=str(refused))  # noqa: TRY400 - one line, no trace
        return refused.exit_code
    except Exception as error:
        logger.exception("worker.start_failed", reason=f"{type(error).__name__}: {error}")
        return ExitCode.FAILED
    finally:
        http.should_exit = True
        await serving
        pool.terminate()
        await engine.dispose()
        if tracing is not None:
            await tracing.shutdown()
    return ExitCode.FAILED if worker.watchdog.gave_up else ExitCode.OK


async def ping_database(engine: AsyncEngine) -> None:
    """Return when the database behind ``engine`` answers ``SELECT 1``; raise when it does not.

    The readiness check's and the paused consumer's look at the database (``database_ping``).
    A pooled connection the server closed while idle (``idle_session_timeout``, a proxy's idle
    limit) fails its next statement, which says nothing about the database; the error is then
    ``connection_invalidated`` (the driver's connection is closed) and SQLAlchemy drops the
    pool's older connections, so one more try, on a fresh connection, answers. This is cheaper
    than a pre-ping, which would cost every checkout of the engine three round trips
    (``adapters.postgres.engine``) to spare a rare probe one.

    Raises:
        sqlalchemy.exc.DBAPIError, OSError, TimeoutError: the database did not answer (any
            failure but a closed pooled connection, or a second failure).
    """

    async def select_one() -> None:
        async with engine.connect() as connection:
            await connection.execute(text("SELECT 1"))

    try:
        await select_one()
    except sa_exc.DBAPIError as error:
        if not error.connection_invalidated:
            raise
        await select_one()


def new_metrics() -> Metrics:
    """The worker's metrics: its version, and every outcome and database retry series at 0."""
    return Metrics(
        version=__version__,
        event_outcomes=OUTCOMES,
        dead_letter_classes=(*SERVICE_FAILURE_CLASSES, FailureClass.BROKER_REJECTED),
        database_retry_errors=RETRY_LABELS,
    )


def main() -> None:
    """Console entry of ``fulfilment worker`` and ``python -m fulfilment``; exits with its code."""
    run_service(run_worker)
