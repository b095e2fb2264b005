"""``on_order_placed``: raw delivery -> ``OrderPlacedV1`` -> ``ReserveStock`` -> outcome.

Every delivery ends in exactly one of these (product contract, promise 1):

* reserved, rejected (``insufficient_stock``/``unknown_sku``) or duplicate: acknowledged;
* a failure the service classifies (:class:`FailureClass`): published to the DLQ with its
  reason, confirmed, then acknowledged;
* cancelled (SIGTERM past the graceful timeout, or a lost connection): neither acknowledged
  nor rejected, so the broker requeues it and the inbox absorbs the redelivery;
* anything else, including a failed dead-letter publish: the ``REJECT_ON_ERROR`` policy
  rejects it and the broker dead-letters it through the queue's ``x-dead-letter-exchange``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from uuid import UUID

import aiorwlock
import structlog
from faststream import AckPolicy
from faststream.exceptions import RejectMessage
from faststream.rabbit import Channel, RabbitBroker
from faststream.rabbit.annotations import RabbitMessage
from pydantic import ValidationError

from fulfilment.application.handlers import reserve_stock
from fulfilment.application.ports import TransientError, Warehouse
from fulfilment.contracts.order_placed import MAX_BODY_BYTES, OrderPlacedV1
from fulfilment.contracts.topology import MAIN_QUEUE
from fulfilment.domain.model import OutcomeKind, ReservationOutcome, ReserveStock
from fulfilment.observability.metrics import REQUEUED, REQUEUED_TRANSIENT
from fulfilment.worker.dead_lettering import (
    Failure,
    FailureClass,
    begin_delivery,
    delivery_count,
    publish_dead_letter,
)
from fulfilment.worker.topology import Topology

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage
    from faststream.rabbit.subscriber import RabbitSubscriber

    from fulfilment.observability.metrics import Metrics

logger = structlog.get_logger("fulfilment.worker")

JSON_CONTENT_TYPES = frozenset({"", "application/json", "text/json"})
"""Content types accepted for an ``OrderPlaced`` body; empty means the producer sent none."""


class MalformedEventError(Exception):
    """The body can never become an ``OrderPlaced`` v1; ``str(error)`` says why, in one line."""


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """Bounds of one delivery: times in seconds, and deliveries (see ``fulfilment.settings``)."""

    handler_deadline_seconds: float
    dead_letter_publish_seconds: float
    delivery_limit: int
    """Deliveries after which the service dead-letters an unsettled message as ``poison``."""


def parse_order_placed(body: bytes, content_type: str | None) -> OrderPlacedV1:
    """Validate a raw delivery body as ``OrderPlaced`` v1 (strict JSON, UTF-8).

    Raises:
        MalformedEventError: wrong content type, over :data:`MAX_BODY_BYTES`, not UTF-8 JSON,
            or not the contract's shape; the message lists the first few problems.
    """
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type not in JSON_CONTENT_TYPES:
        msg = f"content type {content_type!r} is not JSON"
        raise MalformedEventError(msg)
    if len(body) > MAX_BODY_BYTES:
        msg = f"body of {len(body)} bytes exceeds the limit of {MAX_BODY_BYTES}"
        raise MalformedEventError(msg)
    try:
        return OrderPlacedV1.model_validate_json(body)
    except ValidationError as error:
        raise MalformedEventError(_describe(error)) from error


def _describe(error: ValidationError, limit: int = 5) -> str:
    problems = [
        f"{'.'.join(str(part) for part in problem['loc']) or 'body'}: {problem['msg']}"
        for problem in error.errors(include_url=False, include_input=False)[:limit]
    ]
    more = error.error_count() - limit
    if more > 0:
        problems.append(f"and {more} more")
    return "invalid OrderPlaced v1: " + "; ".join(problems)


async def raw_body(message: AbstractIncomingMessage) -> bytes:
    """FastStream decoder that hands the body over untouched (validation is ours)."""
    return message.body


def register_order_placed(  # noqa: PLR0913 - the composition root passes each dependency by name
    broker: RabbitBroker,
    *,
    topology: Topology,
    warehouse: Warehouse,
    metrics: Metrics,
    limits: WorkerLimits,
    prefetch_count: int,
    pause: Callable[[str], None],
) -> RabbitSubscriber:
    """Subscribe ``on_order_placed`` to the main queue and return the subscriber.

    The subscriber has its own channel with ``prefetch_count`` unacknowledged deliveries, which
    is also its concurrency: FastStream runs one task per delivery and has no other limit on
    RabbitMQ. ``REJECT_ON_ERROR`` is explicit even though it is FastStream's default, because
    the dead-letter guarantees above depend on it.
    """
    subscriber = broker.subscriber(
        topology.main_queue(),
        topology.orders_exchange(),
        channel=Channel(prefetch_count=prefetch_count),
        ack_policy=AckPolicy.REJECT_ON_ERROR,
        decoder=raw_body,
        title="on_order_placed",
        description="Reserves stock for each OrderPlaced event, once per event_id.",
    )

    # A redelivered message may be the one that crashed the last worker. It runs alone, so
    # that if it crashes this one too, no other delivery is in flight to lose an attempt with
    # it; first deliveries share the gate and run concurrently up to the prefetch.
    gate = aiorwlock.RWLock()

    async def on_order_placed(_body: bytes) -> None:
        # The broker runs without FastDepends (apply_types=False, see main), so the delivery
        # is read from FastStream's context, where Context("message") would have found it.
        message: RabbitMessage = broker.context.get_local("message")
        async with gate.writer if message.raw_message.redelivered else gate.reader:
            await _handle(message)

    async def _handle(message: RabbitMessage) -> None:
        started = time.perf_counter()
        metrics.in_flight.inc()
        try:
            await handle_delivery(
                message,
                reserve=lambda command: reserve_stock(command, warehouse=warehouse),
                count_redelivery=warehouse.count_redelivery,
                dead_letter=lambda failure: publish_dead_letter(
                    broker,
                    message,
                    failure,
                    queue=MAIN_QUEUE,
                    timeout_seconds=limits.dead_letter_publish_seconds,
                ),
                pause=pause,
                metrics=metrics,
                handler_deadline_seconds=limits.handler_deadline_seconds,
                delivery_limit=limits.delivery_limit,
                started=started,
            )
        finally:
            metrics.in_flight.dec()
            metrics.handler_duration.observe(time.perf_counter() - started)

    subscriber(on_order_placed)
    return subscriber


async def handle_delivery(  # noqa: PLR0913 - one delivery's collaborators, each by name
    message: RabbitMessage,
    *,
    reserve: Callable[[ReserveStock], Awaitable[ReservationOutcome]],
    count_redelivery: Callable[[UUID], Awaitable[int]],
    dead_letter: Callable[[Failure], Awaitable[None]],
    pause: Callable[[str], None],
    metrics: Metrics,
    handler_deadline_seconds: float,
    delivery_limit: int,
    started: float,
) -> None:
    """Process one delivery; returning means "acknowledge", raising means "reject".

    * A redelivered event is counted first (``count_redelivery``); one delivered more than
      ``delivery_limit`` times without being settled crashes or stalls workers, and is
      dead-lettered as ``poison`` before it can do so again.
    * A transient database failure past the retry budget, or the handler deadline, sends the
      delivery back to the queue (``basic.reject`` with requeue) and ``pause`` stops the
      consumer until the database answers: an outage costs each delivery one attempt.
    * ``asyncio.CancelledError`` is never caught, so a delivery cancelled by shutdown or a
      lost connection is neither acknowledged nor rejected and goes back to the queue.
    """
    raw = message.raw_message
    begin_delivery()
    log = logger.bind(
        message_id=raw.message_id,
        delivery_count=delivery_count(raw.headers),
        redelivered=bool(raw.redelivered),
    )
    event: OrderPlacedV1 | None = None
    failure: Failure | None = None
    outcome: ReservationOutcome | None = None
    requeue_reason: str | None = None
    try:
        async with asyncio.timeout(handler_deadline_seconds):
            event = parse_order_placed(raw.body, raw.content_type)
            result = await reserve_unless_poison(
                event.to_command(),
                redelivered=bool(raw.redelivered),
                reserve=reserve,
                count_redelivery=count_redelivery,
                delivery_limit=delivery_limit,
            )
            if isinstance(result, Failure):
                failure = result
            else:
                outcome = result
    except MalformedEventError as error:
        failure = Failure(FailureClass.PERMANENT, str(error), error)
    except TransientError as error:
        requeue_reason = f"database: {error}"
    except TimeoutError:
        requeue_reason = f"handler deadline of {handler_deadline_seconds:g} s exceeded"
    except Exception as error:  # noqa: BLE001 - an unknown error is classified and dead-lettered, not lost
        failure = Failure(FailureClass.UNEXPECTED, f"{type(error).__name__}: {error}", error)

    if event is not None:
        log = log.bind(event_id=str(event.event_id), order_id=str(event.order_id))
    duration_ms = round((time.perf_counter() - started) * 1000, 1)

    if outcome is not None and event is not None:
        _record_outcome(outcome, event, metrics=metrics, log=log, duration_ms=duration_ms)
        return

    if requeue_reason is not None:
        pause(requeue_reason)
        metrics.event(REQUEUED, REQUEUED_TRANSIENT).inc()
        log.warning("order_placed.requeued", reason=requeue_reason, duration_ms=duration_ms)
        raise RejectMessage(requeue=True)

    assert failure is not None  # noqa: S101 - the try above sets outcome, failure or requeue
    try:
        await dead_letter(failure)
    except Exception:
        # Raised on: REJECT_ON_ERROR rejects the delivery and the broker dead-letters it.
        metrics.dead_letter_publish_failures.inc()
        raise
    metrics.event("dead_lettered", failure.failure_class).inc()
    log.warning(
        "order_placed.dead_lettered",
        outcome=f"dead_lettered:{failure.failure_class}",
        reason=failure.reason,
        duration_ms=duration_ms,
        exc_info=failure.error if failure.failure_class is FailureClass.UNEXPECTED else None,
    )


def _record_outcome(
    outcome: ReservationOutcome,
    event: OrderPlacedV1,
    *,
    metrics: Metrics,
    log: structlog.stdlib.BoundLogger,
    duration_ms: float,
) -> None:
    metrics.event(outcome.kind, _reason_label(outcome)).inc()
    if outcome.kind is not OutcomeKind.DUPLICATE:
        metrics.end_to_end_latency.observe(
            max(0.0, (datetime.now(UTC) - event.placed_at).total_seconds())
        )
    log.info(
        "order_placed.handled",
        outcome=outcome.label,
        skus=list(outcome.skus) or None,
        duration_ms=duration_ms,
    )


async def reserve_unless_poison(
    command: ReserveStock,
    *,
    redelivered: bool,
    reserve: Callable[[ReserveStock], Awaitable[ReservationOutcome]],
    count_redelivery: Callable[[UUID], Awaitable[int]],
    delivery_limit: int,
) -> ReservationOutcome | Failure:
    """Reserve ``command``, unless this is its ``delivery_limit``-th delivery.

    Returns the outcome, or a ``poison`` :class:`Failure` to dead-letter unprocessed (the
    count includes the first delivery, which is never recorded).

    Raises:
        TransientError: from the warehouse, after its retry budget.
    """
    # Only redeliveries are counted, so a first delivery costs no extra round trip. The
    # delivery_limit-th delivery is dead-lettered unprocessed: a message that crashes every
    # worker crashes delivery_limit - 1 of them, and neither it nor the deliveries returned
    # with it reach the broker's own limit (the same number), which would dead-letter those
    # innocent ones too on brokers that count returns (before 4.3).
    deliveries = 1 + (await count_redelivery(command.event_id) if redelivered else 0)
    if redelivered and deliveries >= delivery_limit:
        return Failure(
            FailureClass.POISON,
            f"delivered {deliveries} times without being settled: it crashes or stalls the worker",
        )
    return await reserve(command)


def _reason_label(outcome: ReservationOutcome) -> str:
    if outcome.reason is not None:
        return str(outcome.reason)
    if outcome.duplicate_of is not None:
        return str(outcome.duplicate_of)
    return ""
