"""The delivery policy: what every subscriber does with a delivery, whatever its event.

A handler (one per input event, in its route: ``routes.table``) is a plain function of the
raw body, built from ``routes.handling``: it parses the body, calls its use case and returns
what it made of the event (``Handled``). Everything else is the policy's, the same for every
subscription made with :func:`subscribe`, and every delivery ends in exactly one of these
(docs/events.md, "Outcomes and failures"):

* handled (reserved, rejected, duplicate, ...): acknowledged;
* a failure the service classifies (:class:`FailureClass`): published to the DLQ with its
  reason, confirmed, then acknowledged: ``permanent`` for a body that can never be the event
  (not JSON by its content type, over ``MAX_BODY_BYTES``, or refused by the handler with
  ``MalformedEventError``) and for an event the handler refuses as it stands
  (``EventRefusedError``, e.g. the shipment of an order that is not reserved), ``poison``
  for a message redelivered up to the delivery limit (it crashes or stalls workers),
  ``unexpected`` for any other error (a bug);
* a transient failure past the retry budget (:class:`TransientError`) or the handler deadline:
  sent back to the queue (``basic.reject`` with requeue) while the consumers pause until the
  database answers (``worker.consumer_control.ConsumerPause``);
* a dead letter the broker refuses (a full dead-letter queue with ``reject-publish``, a DLQ
  that is unavailable or unbound) or does not confirm: the delivery is held, unacknowledged,
  in the queue it came from while the dead letter is tried again (1 s doubling to 30 s), and
  sent back to the queue if the DLQ still refuses it when the broker's consumer timeout
  nears (``DeliveryLimits.dead_letter_hold_seconds``): a dead letter is never acknowledged
  before the DLQ holds it, nor handed to the broker's own dead-lettering, which a capped DLQ
  could drop;
* cancelled (SIGTERM past the graceful timeout, or a lost connection): neither acknowledged
  nor rejected, so the broker requeues it and the inbox absorbs the redelivery;
* anything else (a bug in the policy itself): rejected without requeue, as the
  ``REJECT_ON_ERROR`` policy would, and the broker dead-letters it through the queue's
  ``x-dead-letter-exchange``.

The policy sends each settlement itself, through the subscription's
:class:`~fulfilment.worker.acknowledgements.ChannelAcks`: the acknowledgements of the
deliveries settled at the same moment (a committed batch) go out as one ``basic.ack`` with
``multiple`` where no earlier delivery of the channel is still in flight. An acknowledgement
is still sent only after the delivery's transaction committed (or its dead letter was
confirmed), and the handler's task ends only once it is written.

Each delivery is one ``CONSUMER`` span (``process <queue>``), child of the delivery's
``traceparent`` (``observability.tracing.trace_context``; a new trace without a valid one),
current while the handler runs, with the event, its ids and the outcome
(``observability.tracing``; with tracing off only the incoming context is made current). Each
delivery writes one log line (``<name>.handled``, ``<name>.dead_lettered`` or
``<name>.requeued``, ``name`` being the subscription's), and one
``<name>.dead_letter_refused`` per refused attempt while it is held, and counts one outcome in
``fulfilment_events_total``, under the subscription's name as
its ``event`` label.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from uuid import UUID

import aiormq.exceptions
import aiorwlock
import structlog
from faststream import AckPolicy
from faststream.exceptions import RejectMessage
from faststream.rabbit import Channel, RabbitBroker
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util.types import AttributeValue

from fulfilment.application.ports import TransientError
from fulfilment.contracts.envelope import read_envelope
from fulfilment.observability.metrics import (
    DEAD_LETTERED,
    REQUEUED,
    REQUEUED_DEAD_LETTER_REFUSED,
    REQUEUED_TRANSIENT,
)
from fulfilment.observability.tracing import context_of, current_span, trace_context
from fulfilment.routes.handling import (
    EventRefusedError,
    Handled,
    Handler,
    MalformedEventError,
    check_body,
)
from fulfilment.worker.acknowledgements import ChannelAcks
from fulfilment.worker.dead_lettering import (
    DeadLetterPublisher,
    Failure,
    FailureClass,
    begin_delivery,
    dead_letter_message,
    delivery_count,
    publish_holding,
)

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage
    from faststream.rabbit import RabbitExchange, RabbitQueue
    from faststream.rabbit.message import RabbitMessage
    from faststream.rabbit.subscriber import RabbitSubscriber

    from fulfilment.observability.metrics import Metrics

logger = structlog.get_logger("fulfilment.worker")
tracer = trace.get_tracer("fulfilment.worker")

BROKER_REJECTED = str(FailureClass.BROKER_REJECTED)
"""The ``reason`` of a delivery the policy could not classify (an error in the policy itself),
rejected without requeue for the broker to dead-letter: the class its dead letter gets."""

ACK_LOST: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError,  # the connection closed under the write
    aiormq.exceptions.ChannelInvalidStateError,  # the delivery's channel closed
    ConnectionError,
)
"""Why an acknowledgement could not be written: its channel or connection is gone."""


@dataclass(frozen=True, slots=True)
class Requeue:
    """A delivery to send back to its queue while the consumers pause.

    The store failed past its retry budget, or the handler's deadline passed. ``reason`` says
    which, in the ``<name>.requeued`` log line and in the pause it trips.
    """

    reason: str


@dataclass(frozen=True, slots=True)
class DeliveryLimits:
    """Bounds of one delivery: times in seconds, and deliveries (see ``fulfilment.settings``)."""

    handler_deadline_seconds: float
    dead_letter_publish_seconds: float
    delivery_limit: int
    """Deliveries after which the service dead-letters an unsettled message as ``poison``."""
    dead_letter_hold_seconds: float
    """Longest time a delivery is held while the broker refuses its dead letter; then it goes
    back to the queue. Below the broker's consumer timeout, which closes the channel of a
    delivery unacknowledged for longer (and with it every other delivery on it)."""


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    """What every subscription of one worker shares.

    ``count_redelivery`` records one more redelivery of an event id and returns how many it
    has had (``Warehouse.count_redelivery``); ``pause`` stops every consumer until the
    database answers (``ConsumerPause.trip``), with the reason; ``prefetch_count`` is the
    unacknowledged deliveries of each subscription, which is also its concurrency;
    ``publish_dead_letter`` publishes a dead letter, confirmed (``DeadLetterChannel.publish``).
    """

    broker: RabbitBroker
    metrics: Metrics
    limits: DeliveryLimits
    count_redelivery: Callable[[UUID], Awaitable[int]]
    pause: Callable[[str], None]
    prefetch_count: int
    publish_dead_letter: DeadLetterPublisher


async def raw_body(message: AbstractIncomingMessage) -> bytes:
    """FastStream decoder that hands the body over untouched (validation is the handler's)."""
    return message.body


def subscribe(
    policy: DeliveryPolicy,
    queue: RabbitQueue,
    exchange: RabbitExchange,
    handler: Handler,
    *,
    name: str,
) -> RabbitSubscriber:
    """Subscribe ``handler`` to ``queue`` (bound to ``exchange``) under the policy.

    ``name`` prefixes the log lines (``order_placed`` → ``order_placed.handled``), titles
    the subscriber (``on_order_placed``) and is the ``event`` label of the outcomes it
    counts. The service's dead letters of the queue are published with the queue's own
    ``x-dead-letter-routing-key`` (its name when it has none), the key the broker uses too.
    The subscriber has its own channel with ``policy.prefetch_count`` unacknowledged
    deliveries, which is also its concurrency: FastStream runs one task per delivery and has
    no other limit on RabbitMQ. ``REJECT_ON_ERROR`` is explicit even though it is FastStream's
    default, because the dead-letter guarantees above depend on it. ``no_reply`` turns off
    FastStream's RPC replies: a sender's ``reply_to`` would otherwise make FastStream publish
    the handler's return value (an empty message) to the address after the event was handled,
    and reject the delivery into the DLQ when that publish failed.
    """
    broker = policy.broker
    subscriber = broker.subscriber(
        queue,
        exchange,
        channel=Channel(prefetch_count=policy.prefetch_count),
        ack_policy=AckPolicy.REJECT_ON_ERROR,
        no_reply=True,
        decoder=raw_body,
        title=f"on_{name}",
    )
    arguments = queue.arguments or {}
    subscription = _Subscription(
        policy,
        handler,
        name=name,
        queue=queue.name,
        dead_letter_routing_key=str(arguments.get("x-dead-letter-routing-key", queue.name)),
    )

    async def on_delivery(_body: bytes) -> None:
        # The broker runs without FastDepends (apply_types=False, see main), so the delivery
        # is read from FastStream's context, where Context("message") would have found it.
        # Looked up on each delivery: adding the broker to the app replaces its context.
        message: RabbitMessage = broker.context.get_local("message")
        await subscription.settle(message)

    subscriber(on_delivery)
    return subscriber


class _Subscription:
    """One subscription's delivery policy: its handler, queue, event label and log line names."""

    __slots__ = (
        "_ack_lost",
        "_acks",
        "_dead_letter_refused",
        "_dead_letter_routing_key",
        "_dead_lettered",
        "_event",
        "_gate",
        "_handled",
        "_handler",
        "_policy",
        "_queue",
        "_requeued",
        "_span_name",
    )

    def __init__(
        self,
        policy: DeliveryPolicy,
        handler: Handler,
        *,
        name: str,
        queue: str,
        dead_letter_routing_key: str,
    ) -> None:
        self._policy = policy
        self._handler = handler
        self._queue = queue
        # A redelivered message may be the one that crashed the last worker. Its handler runs
        # alone, so that if it crashes this one too, no other delivery is in flight to lose an
        # attempt with it; first deliveries share the gate and run concurrently up to the
        # prefetch. Only the handler: publishing (or holding) a dead letter runs beside others.
        self._gate = aiorwlock.RWLock()
        self._acks = ChannelAcks()
        self._dead_letter_routing_key = dead_letter_routing_key
        self._event = name
        self._handled = f"{name}.handled"
        self._dead_lettered = f"{name}.dead_lettered"
        self._dead_letter_refused = f"{name}.dead_letter_refused"
        self._requeued = f"{name}.requeued"
        self._ack_lost = f"{name}.ack_lost"
        self._span_name = f"process {queue}"

    async def settle(self, message: RabbitMessage) -> None:
        """Process one delivery and settle it: acknowledge, or reject with or without requeue.

        Every settlement goes through the subscription's :class:`ChannelAcks`, which
        acknowledges the deliveries of a moment with one frame and must see every reject of
        the channel for that. What the policy does not classify (an error in the policy
        itself) is rejected without requeue, as ``AckPolicy.REJECT_ON_ERROR`` would, so the
        broker dead-letters it, and the error is raised for FastStream to log.

        An acknowledgement that cannot be written because the channel or connection closed
        logs ``<name>.ack_lost``: the broker requeues the delivery.

        The whole of it is the delivery's span (``process <queue>``), the settlement included.

        Raises:
            RejectMessage: with requeue, after the reject was sent (FastStream then sends
                nothing more).
        """
        raw = message.raw_message
        headers = raw.headers or {}
        tracestate = headers.get("tracestate")
        with current_span(
            tracer,
            self._span_name,
            kind=SpanKind.CONSUMER,
            parent=context_of(
                trace_context(headers), tracestate if isinstance(tracestate, str) else None
            ),
            attributes=lambda: self._span_attributes(raw),
            record_errors=False,
        ):
            await self._settle(message)

    def _span_attributes(self, raw: AbstractIncomingMessage) -> dict[str, AttributeValue]:
        """The delivery span's attributes known at its start."""
        return {
            # OpenTelemetry semantic conventions for messaging (RabbitMQ), then the service's
            # own attributes under fulfilment.*.
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": raw.exchange or "",
            "messaging.rabbitmq.destination.routing_key": raw.routing_key or "",
            "messaging.consumer.group.name": self._queue,
            "messaging.message.id": raw.message_id or "",
            "messaging.message.body.size": len(raw.body),
            "fulfilment.event": self._event,
        }

    async def _settle(self, message: RabbitMessage) -> None:
        raw = message.raw_message
        try:
            requeue = await self._process(message)
        except Exception as error:
            _annotate(
                {"fulfilment.outcome": f"{DEAD_LETTERED}:{BROKER_REJECTED}"},
                error=f"{type(error).__name__}: {error}",
            )
            self._policy.metrics.event(self._event, DEAD_LETTERED, BROKER_REJECTED).inc()
            await self._acks.reject(raw, requeue=False)
            raise
        if requeue:
            await self._acks.reject(raw, requeue=True)
            raise RejectMessage(requeue=True)
        try:
            await self._acks.ack(raw)
        except ACK_LOST as error:
            # Nothing to do but say so: the broker requeues what a closed channel held, and
            # the inbox absorbs the redelivery.
            logger.warning(
                self._ack_lost,
                message_id=raw.message_id,
                reason=" ".join(f"{type(error).__name__}: {error}".split()),
            )

    async def _process(self, message: RabbitMessage) -> bool:
        """Process one delivery; True to send it back to its queue, False to acknowledge it.

        * A redelivered event is counted first (``count_redelivery``, keyed by its event id,
          read from the envelope); one delivered ``delivery_limit`` times without being
          settled crashes or stalls workers, and is dead-lettered as ``poison`` before the
          handler can run it again.
        * A transient failure past the retry budget, or the handler deadline, sends the
          delivery back to the queue (``basic.reject`` with requeue) and ``pause`` stops the
          consumers until the database answers: an outage costs each delivery one attempt.
        * A dead letter the broker refuses holds the delivery (:meth:`_dead_letter`).
        * ``asyncio.CancelledError`` is never caught, so a delivery cancelled by shutdown or a
          lost connection is neither acknowledged nor rejected and goes back to the queue.
        """
        policy = self._policy
        metrics = policy.metrics
        started = time.perf_counter()
        metrics.in_flight.inc()
        try:
            raw = message.raw_message
            begin_delivery()
            log = logger.bind(
                message_id=raw.message_id,
                delivery_count=delivery_count(raw.headers, redelivered=bool(raw.redelivered)),
                redelivered=bool(raw.redelivered),
            )
            async with self._gate.writer if raw.redelivered else self._gate.reader:
                result = await self._run(raw)
            duration_ms = round((time.perf_counter() - started) * 1000, 1)
            if isinstance(result, Handled):
                handled = result
                metrics.event(self._event, *handled.labels).inc()
                if handled.latency_since is not None:
                    metrics.end_to_end_latency.observe(
                        max(0.0, (datetime.now(UTC) - handled.latency_since).total_seconds())
                    )
                _annotate(
                    {
                        "fulfilment.event_id": str(handled.event_id),
                        "fulfilment.order_id": str(handled.order_id),
                        "fulfilment.outcome": handled.outcome,
                    }
                )
                log.info(
                    self._handled,
                    event_id=str(handled.event_id),
                    order_id=str(handled.order_id),
                    outcome=handled.outcome,
                    **handled.log_fields,
                    duration_ms=duration_ms,
                )
                return False
            if isinstance(result, Requeue) or not isinstance(result.error, MalformedEventError):
                # Not refused as malformed, so the body is an event: say which one (its ids are
                # read again here, off the path of handled deliveries).
                ids = _ids(raw.body)
                log = log.bind(**ids)
                _annotate({f"fulfilment.{key}": value for key, value in ids.items()})
            if isinstance(result, Requeue):
                _annotate({"fulfilment.outcome": REQUEUED, "fulfilment.reason": result.reason})
                policy.pause(result.reason)
                metrics.event(self._event, REQUEUED, REQUEUED_TRANSIENT).inc()
                log.warning(self._requeued, reason=result.reason, duration_ms=duration_ms)
                return True
            failure = result
            held_seconds = await self._dead_letter(message, failure, log)
            if held_seconds is None:
                _annotate(
                    {
                        "fulfilment.outcome": REQUEUED,
                        "fulfilment.reason": REQUEUED_DEAD_LETTER_REFUSED,
                        "fulfilment.dead_letter.class": str(failure.failure_class),
                    }
                )
                metrics.event(self._event, REQUEUED, REQUEUED_DEAD_LETTER_REFUSED).inc()
                log.error(
                    self._requeued,
                    reason=(
                        f"the dead-letter queue refused the dead letter for "
                        f"{self._policy.limits.dead_letter_hold_seconds:g} s"
                    ),
                    failure_class=str(failure.failure_class),
                    failure_reason=failure.reason,
                    duration_ms=round((time.perf_counter() - started) * 1000, 1),
                )
                return True
            # A refused event counts under its own reason, the others under their class.
            label = (
                failure.error.reason
                if isinstance(failure.error, EventRefusedError)
                else str(failure.failure_class)
            )
            metrics.event(self._event, DEAD_LETTERED, label).inc()
            _annotate(
                {
                    "fulfilment.outcome": f"{DEAD_LETTERED}:{label}",
                    "fulfilment.dead_letter.class": str(failure.failure_class),
                },
                error=failure.reason if failure.failure_class is FailureClass.UNEXPECTED else None,
            )
            log.warning(
                self._dead_lettered,
                outcome=f"{DEAD_LETTERED}:{label}",
                reason=failure.reason,
                duration_ms=duration_ms,
                **({"held_seconds": round(held_seconds, 1)} if held_seconds else {}),
                exc_info=failure.error
                if failure.failure_class is FailureClass.UNEXPECTED
                else None,
            )
            return False
        finally:
            metrics.in_flight.dec()
            metrics.handler_duration.observe(time.perf_counter() - started)

    async def _run(self, raw: AbstractIncomingMessage) -> Handled | Failure | Requeue:
        """Run the handler within the deadline.

        Returns what it made of the event, the failure to dead-letter, or the delivery sent
        back to its queue, with why.
        """
        limits = self._policy.limits
        body = raw.body
        try:
            async with asyncio.timeout(limits.handler_deadline_seconds):
                check_body(body, raw.content_type)
                if raw.redelivered:
                    poison = await self._count_redelivery(body)
                    if poison is not None:
                        return poison
                return await self._handler(body)
        except (MalformedEventError, EventRefusedError) as error:
            return Failure(FailureClass.PERMANENT, str(error), error)
        except TransientError as error:
            return Requeue(f"database: {error}")
        except TimeoutError:
            return Requeue(f"handler deadline of {limits.handler_deadline_seconds:g} s exceeded")
        except Exception as error:  # noqa: BLE001 - an unknown error is classified and dead-lettered, not lost
            return Failure(FailureClass.UNEXPECTED, f"{type(error).__name__}: {error}", error)

    async def _count_redelivery(self, body: bytes) -> Failure | None:
        """Count a redelivery; a ``poison`` failure on the ``delivery_limit``-th delivery.

        Only redeliveries are counted, so a first delivery costs no extra round trip (the count
        includes the first delivery, which is never recorded). The ``delivery_limit``-th
        delivery is dead-lettered unprocessed: a message that crashes every worker crashes
        ``delivery_limit - 1`` of them, and neither it nor the deliveries returned with it
        reach the broker's own limit (the same number), which would dead-letter those innocent
        ones too on brokers that count returns (before 4.3). A body without a readable event
        id is not counted: the handler refuses it as ``permanent`` anyway.
        """
        envelope = read_envelope(body)
        if envelope is None:
            return None
        deliveries = 1 + await self._policy.count_redelivery(envelope.event_id)
        if deliveries < self._policy.limits.delivery_limit:
            return None
        return Failure(
            FailureClass.POISON,
            f"delivered {deliveries} times without being settled: it crashes or stalls the worker",
        )

    async def _dead_letter(
        self, message: RabbitMessage, failure: Failure, log: structlog.typing.FilteringBoundLogger
    ) -> float | None:
        """Publish the delivery's dead letter, confirmed; hold the delivery while it is refused.

        Returns the seconds the delivery was held, or None when it is to go back to its queue
        (``worker.dead_lettering.publish_holding``). Each refusal logs a line.

        Raises:
            Exception: anything but a refusal while building or publishing the dead letter;
                ``REJECT_ON_ERROR`` rejects the delivery and the broker dead-letters it.
        """
        policy = self._policy
        limits = policy.limits

        async def publish() -> None:
            await policy.publish_dead_letter(
                dead_letter_message(message, failure, queue=self._queue),
                routing_key=self._dead_letter_routing_key,
                timeout_seconds=limits.dead_letter_publish_seconds,
            )

        def refused(error: BaseException, held_seconds: float, retry_in: float | None) -> None:
            log.warning(
                self._dead_letter_refused,
                reason=" ".join(f"{type(error).__name__}: {error}".split()),
                failure_class=str(failure.failure_class),
                held_seconds=round(held_seconds, 1),
                retry_in_seconds=retry_in,
            )

        return await publish_holding(
            publish,
            hold_seconds=limits.dead_letter_hold_seconds,
            metrics=policy.metrics,
            refused=refused,
        )


def _ids(body: bytes) -> dict[str, str]:
    """The ids of the event in ``body`` for a log line; read again only on failures."""
    envelope = read_envelope(body)
    if envelope is None:
        return {}
    ids = {"event_id": str(envelope.event_id)}
    if envelope.order_id is not None:
        ids["order_id"] = str(envelope.order_id)
    return ids


def _annotate(attributes: Mapping[str, str], *, error: str | None = None) -> None:
    """Set ``attributes`` on the delivery's span; ``error`` marks it failed, with that text.

    Nothing is built for a span that does not record (tracing off, or not sampled).
    """
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attributes(attributes)
    if error is not None:
        span.set_status(StatusCode.ERROR, error)
