"""Composition root: the only module that reads settings and builds concrete adapters.

``main()`` builds settings, logging, the PostgreSQL pool and warehouse, the broker and its
subscribers, and serves them with uvicorn until SIGTERM or SIGINT; it closes them in reverse
order. Nothing is built at import time. Tests call :func:`build_worker` with fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aio_pika
import sqlalchemy as sa
import structlog
import uvicorn
import uvloop
from faststream import FastStream
from faststream.rabbit import Channel, RabbitBroker
from faststream.rabbit.prometheus import RabbitPrometheusMiddleware
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from fulfilment import __version__
from fulfilment.adapters.postgres.engine import create_engine, create_pool
from fulfilment.adapters.postgres.retry import RETRY_LABELS, retry_label
from fulfilment.adapters.postgres.schema import SchemaNotCurrentError, check_schema_current
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.composition import database_options
from fulfilment.contracts.dead_letter import SERVICE_FAILURE_CLASSES
from fulfilment.contracts.topology import ORDER_CANCELLED, ORDER_PLACED, ORDER_SHIPPED
from fulfilment.observability.logging import configure_logging
from fulfilment.observability.metrics import Metrics
from fulfilment.settings import Settings, SettingsError, load_settings
from fulfilment.worker.consumer_control import (
    ConsumerPause,
    ConsumerWatchdog,
    cancel_consumer,
    consumer_attached,
)
from fulfilment.worker.crashing_warehouse import CrashingWarehouse
from fulfilment.worker.dead_lettering import record_retry
from fulfilment.worker.delivery import DeliveryLimits, DeliveryPolicy, subscribe
from fulfilment.worker.fault_injection import parse_fault_plan
from fulfilment.worker.health import ASGIApp, health_app
from fulfilment.worker.monitors import background, check_invariants, poll_queues
from fulfilment.worker.subscribers import (
    OUTCOMES,
    on_order_cancelled,
    on_order_placed,
    on_order_shipped,
)
from fulfilment.worker.topology import Topology, TopologyMismatchError, declare_topology

if TYPE_CHECKING:
    from faststream.rabbit.subscriber import RabbitSubscriber

    from fulfilment.application.ports import Warehouse

logger = structlog.get_logger("fulfilment.main")


EXIT_START_FAILED = 1
EXIT_SERVICE_UNREACHABLE = 3
"""The worker's exit codes besides 0, as for every ``fulfilment`` command."""


class StartRefusedError(Exception):
    """A start-up check failed; the hook that raised it has logged why, in one line.

    ``exit_code`` is :data:`EXIT_SERVICE_UNREACHABLE` when a service did not answer, else
    :data:`EXIT_START_FAILED`.
    """

    def __init__(self, reason: str, exit_code: int = EXIT_START_FAILED) -> None:
        super().__init__(reason)
        self.exit_code = exit_code


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
    warehouse: Warehouse,
    database_ping: Callable[[], Awaitable[None]],
    metrics: Metrics | None = None,
    monitors: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
    after_shutdown: Sequence[Callable[[], Awaitable[None]]] = (),
    startup_checks: Sequence[Callable[[], Awaitable[None]]] = (),
) -> Worker:
    """Assemble the broker, a subscriber per event's queue, hooks and HTTP routes.

    The subscribers are ``on_order_placed``, ``on_order_cancelled`` and ``on_order_shipped``,
    one per queue of ``contracts.topology.SUBSCRIBED_QUEUES``.

    Every subscriber goes through the one delivery policy (``worker.delivery``). Start-up
    declares the topology (refusing to start on a mismatch); shutdown first cancels the
    consumers so no new delivery arrives while in-flight handlers drain for up to
    ``graceful_timeout_seconds``; ``after_shutdown`` callables run once the broker is closed.
    ``monitors`` (endless background checks, see ``worker.monitors``) run from the
    broker's start until shutdown begins. FastStream's Prometheus middleware counts on
    ``metrics.registry`` next to the service's own metrics. While the database is down every
    consumer is paused (``worker.consumer_control.ConsumerPause``). ``startup_checks`` run
    before the topology is declared; one that raises stops the start.
    """
    metrics = metrics or new_metrics()
    topology = Topology(delivery_limit=settings.delivery_limit)
    amqp_url = settings.amqp_url.get_secret_value()
    broker = RabbitBroker(
        amqp_url,
        # on_return_raises: an unroutable dead letter must raise, not vanish (mandatory=True
        # alone only hands back the Basic.Return frame).
        default_channel=Channel(on_return_raises=True),
        graceful_timeout=settings.graceful_timeout_seconds,
        app_id=f"fulfilment-{__version__}",
        logger=logging.getLogger("faststream"),
        # FastStream's per-message "Received"/"Processed" lines go to DEBUG: the service
        # writes its own single line per message.
        log_level=logging.DEBUG,
        # No FastDepends: its Context fields run in a thread pool, one hop per delivery; the
        # delivery policy takes the message from FastStream's context instead (worker.delivery).
        apply_types=False,
        middlewares=[RabbitPrometheusMiddleware(registry=metrics.registry, app_name="fulfilment")],
    )
    consumer_pause = ConsumerPause(database_ping)
    policy = DeliveryPolicy(
        broker,
        metrics=metrics,
        limits=DeliveryLimits(
            handler_deadline_seconds=settings.handler_deadline_seconds,
            # What is left of the graceful timeout once the deadline has passed.
            dead_letter_publish_seconds=settings.graceful_timeout_seconds
            - settings.handler_deadline_seconds,
            delivery_limit=settings.delivery_limit,
        ),
        count_redelivery=warehouse.count_redelivery,
        pause=consumer_pause.trip,
        prefetch_count=settings.prefetch_count,
    )
    orders = topology.orders_exchange()
    subscribers = (
        subscribe(
            policy,
            topology.queue(ORDER_PLACED),
            orders,
            lambda body: on_order_placed(body, warehouse=warehouse),
            name=ORDER_PLACED.event,
        ),
        subscribe(
            policy,
            topology.queue(ORDER_CANCELLED),
            orders,
            lambda body: on_order_cancelled(body, warehouse=warehouse),
            name=ORDER_CANCELLED.event,
        ),
        subscribe(
            policy,
            topology.queue(ORDER_SHIPPED),
            orders,
            lambda body: on_order_shipped(body, warehouse=warehouse),
            name=ORDER_SHIPPED.event,
        ),
    )
    consumer_pause.attach(subscribers)

    async def declare() -> None:
        for check in startup_checks:
            await check()
        try:
            await declare_topology(amqp_url, topology)
        except TopologyMismatchError as error:
            logger.error("worker.topology_mismatch", reason=str(error))  # noqa: TRY400 - one line, no trace
            raise StartRefusedError(str(error)) from error
        except (OSError, TimeoutError, aio_pika.exceptions.AMQPError) as error:
            where = aio_pika.connection.make_url(amqp_url).with_password("***")
            reason = f"RabbitMQ at {where} does not answer: {type(error).__name__}: {error}"
            logger.error("worker.broker_unreachable", reason=reason.splitlines()[0])  # noqa: TRY400 - one line, no trace
            raise StartRefusedError(reason, EXIT_SERVICE_UNREACHABLE) from error

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
        give_up_seconds=settings.consumer_lost_exit_seconds,
    )
    start_monitors, stop_monitors = background(*monitors, watchdog.run)

    async def freeze_startup_objects() -> None:
        # The modules, models and app built at start-up are most of the heap and live until
        # exit; frozen, the collector's full passes skip them. Unfrozen, each full pass
        # walked them all, stopping the event loop for 50-160 ms every few seconds under load,
        # the tail of the end-to-end latency (README, "Performance").
        gc.collect()
        gc.freeze()

    app = FastStream(
        broker,
        logger=logging.getLogger("faststream"),
        # Frozen before the broker starts consuming, so no delivery's objects are frozen.
        on_startup=[declare, freeze_startup_objects],
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


async def run_worker(settings: Settings) -> int:
    """Run the worker until SIGTERM or SIGINT; return the process exit code.

    0 after a clean shutdown; 1 when start-up failed (unreachable broker, topology mismatch,
    a broken subscriber) or the consumer was lost for good (``ConsumerWatchdog``), so the
    orchestrator restarts the pod with back-off. The HTTP server
    runs beside the broker from the start, so liveness answers during start-up.
    """
    metrics = new_metrics()
    database = database_options(settings)
    engine = create_engine(database)
    pool = await create_pool(database)  # the reservations' (hot path); the engine for the rest

    def on_retry(error: BaseException) -> None:
        metrics.count_database_retry(retry_label(error))
        record_retry()  # for the attempt count and first failure time of a dead letter

    warehouse: Warehouse = PostgresWarehouse(
        engine,
        consumer=settings.consumer_name,
        retry_budget_seconds=settings.retry_budget_seconds,
        on_retry=on_retry,
        pool=pool,
        pool_size=settings.database_pool_size,
        batch_max=settings.reservation_batch_max,
    )
    faults = parse_fault_plan(settings.fault_injection)
    if faults.armed:  # the fault suite only
        logger.warning("worker.fault_injection_armed", plan=settings.fault_injection)
        warehouse = CrashingWarehouse(
            warehouse, faults, engine=engine, consumer=settings.consumer_name
        )

    async def database_ping() -> None:
        async with engine.connect() as connection:
            await connection.execute(text("SELECT 1"))

    async def schema_is_current() -> None:
        try:
            await check_schema_current(engine)
        except SchemaNotCurrentError as error:
            logger.error("worker.schema_not_current", reason=str(error))  # noqa: TRY400 - one line, no trace
            raise StartRefusedError(str(error)) from error
        except (OSError, TimeoutError, sa_exc.DBAPIError) as error:
            where = sa.engine.make_url(settings.database_url.get_secret_value())
            reason = (
                f"PostgreSQL at {where.render_as_string(hide_password=True)} does not answer: "
                f"{type(error).__name__}: {error}"
            ).splitlines()[0]
            logger.error("worker.database_unreachable", reason=reason)  # noqa: TRY400 - one line, no trace
            raise StartRefusedError(reason, EXIT_SERVICE_UNREACHABLE) from error

    async def close_pool() -> None:
        await pool.close()
        await engine.dispose()
        logger.info("worker.stopped")

    worker = build_worker(
        settings,
        warehouse=warehouse,
        database_ping=database_ping,
        metrics=metrics,
        monitors=[
            lambda: poll_queues(
                settings.amqp_url.get_secret_value(),
                metrics,
                interval_seconds=settings.queue_poll_interval_seconds,
            ),
            lambda: check_invariants(
                engine, metrics, interval_seconds=settings.invariant_check_interval_seconds
            ),
        ],
        after_shutdown=[close_pool],
        startup_checks=[schema_is_current],
    )
    http = _HttpServer(
        uvicorn.Config(
            worker.http,
            host=settings.http_host,
            port=settings.http_port,
            lifespan="off",
            log_config=None,
            access_log=False,
        )
    )
    logger.info(
        "worker.starting",
        version=__version__,
        prefetch_count=settings.prefetch_count,
        database_pool_size=settings.database_pool_size,
        reservation_batch_max=settings.reservation_batch_max,
        delivery_limit=settings.delivery_limit,
        handler_deadline_seconds=settings.handler_deadline_seconds,
        graceful_timeout_seconds=settings.graceful_timeout_seconds,
        http_port=settings.http_port,
    )
    serving = asyncio.create_task(http.serve())
    try:
        await worker.app.run(log_level=logging.INFO)
    except StartRefusedError as refused:
        return refused.exit_code  # already said in one line by the start-up hook
    except Exception as error:
        logger.exception("worker.start_failed", reason=f"{type(error).__name__}: {error}")
        return 1
    finally:
        http.should_exit = True
        await serving
        pool.terminate()
        await engine.dispose()
    return 1 if worker.watchdog.gave_up else 0


def new_metrics() -> Metrics:
    """The worker's metrics: its version, and every outcome and database retry series at 0."""
    return Metrics(
        version=__version__,
        event_outcomes=OUTCOMES,
        dead_letter_classes=SERVICE_FAILURE_CLASSES,
        database_retry_errors=RETRY_LABELS,
    )


class _HttpServer(uvicorn.Server):
    """uvicorn without signal handlers of its own.

    The FastStream app owns SIGTERM and SIGINT, so that a signal starts the broker's drain;
    the HTTP server stops after it, answering probes while in-flight handlers finish.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def main() -> None:
    """Console entry of ``fulfilment worker`` and ``python -m fulfilment``; exits with its code."""
    try:
        settings = load_settings()
    except SettingsError as error:
        sys.stderr.write(f"fulfilment: invalid settings: {error}\n")
        sys.exit(2)
    configure_logging(level=settings.log_level, log_format=settings.log_format)
    loop_factory = uvloop.new_event_loop if settings.event_loop == "uvloop" else None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        code = runner.run(run_worker(settings))
    sys.exit(code)
