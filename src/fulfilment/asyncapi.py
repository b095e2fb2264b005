"""The service's messaging contract as an AsyncAPI 3.0 document, written by FastStream.

``make asyncapi`` (``python -m fulfilment.asyncapi docs/asyncapi.json``) writes
``docs/asyncapi.json``: every message the service consumes (on its queues bound to ``orders``)
and every result event it publishes (to ``fulfilment.events``), each with the JSON schema of
its wire model. ``tests/unit/test_asyncapi.py`` regenerates the file and fails when it differs
from the committed one. ``faststream docs serve --factory
fulfilment.asyncapi:documentation_app`` shows the same document in a browser.

The worker subscribes with raw-bytes handlers on a broker without FastDepends
(``worker.delivery``), so FastStream cannot read a payload from them, and the relay publishes
rows of the outbox; the document is therefore drawn from a broker of its own that is never
connected, built from the same names (``contracts.topology``) and models (``contracts``). A
FastStream subscriber takes its payload from its handler's parameters, so each consumed event
gets a handler that takes its model and never runs; a publisher takes its model as ``schema``.
``tests/unit/test_asyncapi.py`` also holds the document's queues, exchange and routing keys to
those the worker subscribes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from faststream import FastStream
from faststream.rabbit import ExchangeType, QueueType, RabbitBroker, RabbitExchange, RabbitQueue
from faststream.specification import AsyncAPI
from pydantic import BaseModel

from fulfilment.contracts.order_cancelled import OrderCancelledV1
from fulfilment.contracts.order_placed import OrderPlacedV1
from fulfilment.contracts.order_shipped import OrderShippedV1
from fulfilment.contracts.result_events import RESULT_EVENTS
from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    EVENTS_EXCHANGE,
    ORDER_CANCELLED,
    ORDER_PLACED,
    ORDER_SHIPPED,
    ORDERS_EXCHANGE,
    SUBSCRIBED_QUEUES,
    SubscribedQueue,
)
from fulfilment.exit_codes import ExitCode

CONTRACT_VERSION = "1.0.0"
"""The document's ``info.version``: the version of the messaging contract, not of the package
(its events are all at version 1). Raised when an event's new version is published."""

SERVER_URL = "amqps://rabbitmq.fulfilment.svc:5671/"
"""The broker the document names: the production cluster's address (``k8s/``), without
credentials. ``FULFILMENT_AMQP_URL`` says where a deployment connects."""

CONSUMED: Mapping[SubscribedQueue, tuple[type[BaseModel], str]] = {
    ORDER_PLACED: (
        OrderPlacedV1,
        (
            "An order to reserve stock for, all lines or none: answered by stock.reserved or "
            "stock.rejected."
        ),
    ),
    ORDER_CANCELLED: (
        OrderCancelledV1,
        (
            "Cancels the whole order (no lines) or the given quantities: reserved units go back "
            "(stock.released); before its order, it is remembered for it."
        ),
    ),
    ORDER_SHIPPED: (
        OrderShippedV1,
        (
            "Ships everything the order still holds (stock.shipped); dead-lettered when the "
            "order is not reserved."
        ),
    ),
}
"""The wire model and a description of the event each subscribed queue carries."""


class UndocumentedQueueError(LookupError):
    """A queue of ``SUBSCRIBED_QUEUES`` has no entry in :data:`CONSUMED`."""


def documentation_app() -> FastStream:
    """The FastStream app whose AsyncAPI schema is the published contract; never run.

    One subscriber per queue of ``SUBSCRIBED_QUEUES`` (titled ``on_<event>`` as the worker's),
    bound to ``orders`` with the queue's routing key, whose payload is the event's wire model;
    one publisher per result event of ``contracts.result_events.RESULT_EVENTS`` on
    ``fulfilment.events`` with its routing key, persistent and mandatory as the relay
    publishes, whose payload is the event's model.

    Raises:
        UndocumentedQueueError: a subscribed queue has no wire model in :data:`CONSUMED`.
    """
    broker = RabbitBroker(
        specification_url=SERVER_URL,
        protocol="amqps",
        description="The shop's RabbitMQ, where fulfilment consumes and publishes.",
    )
    orders = RabbitExchange(ORDERS_EXCHANGE, type=ExchangeType.TOPIC, durable=True)
    for subscribed in SUBSCRIBED_QUEUES:
        if subscribed not in CONSUMED:
            msg = f"queue {subscribed.name} has no wire model in fulfilment.asyncapi.CONSUMED"
            raise UndocumentedQueueError(msg)
        model, description = CONSUMED[subscribed]
        broker.subscriber(
            RabbitQueue(
                subscribed.name, queue_type=QueueType.QUORUM, routing_key=subscribed.routing_key
            ),
            orders,
            title=f"on_{subscribed.event}",
            # AsyncAPI 3.0's AMQP binding of a queue cannot name the exchange it is bound to.
            description=(
                f"{description} Queue {subscribed.name}, bound to the topic exchange "
                f"{ORDERS_EXCHANGE} with {subscribed.routing_key}; a message that cannot "
                f"succeed goes to {subscribed.dead_letter_queue} via {DEAD_LETTER_EXCHANGE}."
            ),
        )(_takes(model))

    events = RabbitExchange(EVENTS_EXCHANGE, type=ExchangeType.TOPIC, durable=True)
    for routing_key, event in RESULT_EVENTS.items():
        broker.publisher(
            exchange=events,
            routing_key=routing_key,
            persist=True,
            mandatory=True,
            title=routing_key,
            description=(
                f"{(event.__doc__ or '').strip()} Published to the topic exchange "
                f"{EVENTS_EXCHANGE} with {routing_key}, persistent, from the outbox: at least "
                "once (the same event_id again), in commit order per order; AMQP message_id "
                "= event_id, type = the routing key, correlation_id = order_id."
            ),
            schema=event,
        )

    return FastStream(
        broker,
        specification=AsyncAPI(
            broker,
            title="fulfilment",
            version=CONTRACT_VERSION,
            description=(
                "Order fulfilment: reserves stock for orders, releases it on cancels and takes "
                "it out on shipments, at least once and never twice; publishes what it decided "
                "on fulfilment.events from an outbox, in commit order per order. Messages are "
                "JSON in UTF-8; unknown fields are ignored by both sides."
            ),
        ),
    )


def asyncapi_document() -> str:
    """The AsyncAPI document of :func:`documentation_app` as JSON text, keys sorted.

    FastStream keeps a broker's subscribers in a ``WeakSet``, so its channels come in another
    order from one process to the next; sorted keys make the committed file one text.
    """
    specification = documentation_app().schema.to_specification()
    return json.dumps(specification.to_jsonable(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> ExitCode:
    """``python -m fulfilment.asyncapi FILE``: write :func:`asyncapi_document` to FILE.

    Returns the exit status: 0, or 2 with a one-line usage when FILE is not the one argument.
    """
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 1:
        sys.stderr.write("usage: python -m fulfilment.asyncapi FILE\n")
        return ExitCode.BAD_INPUT
    Path(arguments[0]).write_text(asyncapi_document(), encoding="utf-8")
    return ExitCode.OK


def _takes(model: type[BaseModel]) -> Callable[[BaseModel], Awaitable[None]]:
    """A handler that never runs, whose one parameter is ``model``.

    FastStream reads a subscriber's payload schema from its handler's parameters.
    """

    async def documented(event: BaseModel) -> None:
        del event

    # The annotation FastStream reads; under postponed evaluation it is the string above.
    documented.__annotations__["event"] = model
    return documented


if __name__ == "__main__":
    sys.exit(main())
