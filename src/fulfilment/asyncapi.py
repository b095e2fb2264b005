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
connected, built from the same routes (``fulfilment.routes.table.ROUTES``: queues, models,
summaries) and result events (``contracts.result_events``). A
FastStream subscriber takes its payload from its handler's parameters, so each consumed event
gets a handler that takes its model and never runs; a publisher takes its model as ``schema``.
``tests/unit/test_asyncapi.py`` also holds the document's queues, exchange and routing keys to
those the worker subscribes.

A reader of another team finds each event by its model's name: FastStream names a channel
after its subscriber's or publisher's title, which is here the queue (consumed) or the routing
key (published), and names its messages ``<channel>:SubscribeMessage`` and
``<channel>:Message`` without a ``name``. :func:`asyncapi_document` renames each message after
its wire model (``OrderPlacedV1``, ``StockReservedV1``: the class's name, so that a new result
event of ``RESULT_EVENTS`` is named by its model), with the model's title and a summary, and
each operation ``receive<Model>`` or ``send<Model>``. The document stays AsyncAPI 3.0.0:
FastStream 0.7.8 writes no 3.1 (``faststream.specification.asyncapi`` has v2_6_0 and v3_0_0
only). ``make check-asyncapi`` parses it with the AsyncAPI project's parser.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faststream import FastStream
from faststream.rabbit import ExchangeType, QueueType, RabbitBroker, RabbitExchange, RabbitQueue
from faststream.specification import AsyncAPI
from pydantic import BaseModel

from fulfilment.contracts.result_events import RESULT_EVENTS, SkuEventV1
from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    EVENTS_EXCHANGE,
    ORDERS_EXCHANGE,
    SubscribedQueue,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.routes.route import Route
from fulfilment.routes.table import ROUTES

CONTRACT_VERSION = "1.0.0"
"""The document's ``info.version``: the version of the messaging contract, not of the package
(its events are all at version 1). Raised when an event's new version is published."""

SERVER_URL = "amqps://rabbitmq.fulfilment.svc:5671/"
"""The broker the document names: the production cluster's address (``k8s/``), without
credentials. ``FULFILMENT_AMQP_URL`` says where a deployment connects."""

QUEUE_ROUTES = tuple(route for route in ROUTES if isinstance(route.transport, SubscribedQueue))
"""The routes whose events come on a queue: the consumed events of the document. The
warehouse's webhooks are not messages of the broker; the intake's OpenAPI document has them."""


def _queue_routes() -> list[tuple[SubscribedQueue, Route[Any, Any, Any, Any]]]:
    """Each route of :data:`QUEUE_ROUTES` with its queue, typed as one."""
    return [
        (route.transport, route)
        for route in QUEUE_ROUTES
        if isinstance(route.transport, SubscribedQueue)
    ]


@dataclass(frozen=True, slots=True)
class DocumentedMessage:
    """One event of the document: its channel, its operation and the model it carries."""

    channel: str
    """The channel's key: the queue the event is consumed from, or its published routing key."""
    action: str
    """``receive`` (consumed by the service) or ``send`` (published by it)."""
    model: type[BaseModel]
    """The wire model; its class name names the message (``OrderPlacedV1``)."""
    summary: str
    """One sentence for the message's ``summary``."""

    @property
    def name(self) -> str:
        """The message's ``name`` and key: the model's class name, e.g. ``StockReservedV1``."""
        return self.model.__name__

    @property
    def operation(self) -> str:
        """The operation's key, e.g. ``receiveOrderPlacedV1`` or ``sendStockReservedV1``."""
        return f"{self.action}{self.name}"


def documented_messages() -> list[DocumentedMessage]:
    """Every event of the document: each queue route's, then each result event's."""
    consumed = [
        DocumentedMessage(queue.name, "receive", route.model, route.summary)
        for queue, route in _queue_routes()
    ]
    published = [
        DocumentedMessage(routing_key, "send", event, _first_paragraph(event.__doc__))
        for routing_key, event in RESULT_EVENTS.items()
    ]
    return consumed + published


def documentation_app() -> FastStream:
    """The FastStream app whose AsyncAPI schema is the published contract; never run.

    One subscriber per route whose transport is a queue (``fulfilment.routes.table.ROUTES``,
    titled with the queue's name), bound to ``orders`` with the queue's routing key, whose
    payload is the route's wire model;
    one publisher per result event of ``contracts.result_events.RESULT_EVENTS`` on
    ``fulfilment.events`` with its routing key, persistent and mandatory as the relay
    publishes, whose payload is the event's model.
    """
    broker = RabbitBroker(
        specification_url=SERVER_URL,
        protocol="amqps",
        description="The shop's RabbitMQ, where fulfilment consumes and publishes.",
    )
    orders = RabbitExchange(ORDERS_EXCHANGE, type=ExchangeType.TOPIC, durable=True)
    for subscribed, route in _queue_routes():
        model, description = route.model, route.summary
        broker.subscriber(
            RabbitQueue(
                subscribed.name, queue_type=QueueType.QUORUM, routing_key=subscribed.routing_key
            ),
            orders,
            title=subscribed.name,
            # AsyncAPI 3.0's AMQP binding of a queue cannot name the exchange it is bound to.
            description=(
                f"{description} Queue {subscribed.name}, bound to the topic exchange "
                f"{ORDERS_EXCHANGE} with {subscribed.routing_key}; a message that cannot "
                f"succeed goes to {subscribed.dead_letter_queue} via {DEAD_LETTER_EXCHANGE}."
            ),
        )(_takes(model))

    events = RabbitExchange(EVENTS_EXCHANGE, type=ExchangeType.TOPIC, durable=True)
    for routing_key, event in RESULT_EVENTS.items():
        subject, field = ("SKU", "sku") if issubclass(event, SkuEventV1) else ("order", "order_id")
        broker.publisher(
            exchange=events,
            routing_key=routing_key,
            persist=True,
            mandatory=True,
            title=routing_key,
            description=(
                f"{(event.__doc__ or '').strip()} Published to the topic exchange "
                f"{EVENTS_EXCHANGE} with {routing_key}, persistent, from the outbox: at least "
                f"once (the same event_id again), in commit order per {subject}; AMQP "
                f"message_id = event_id, type = the routing key, correlation_id = {field}."
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
    document: dict[str, Any] = specification.to_jsonable()
    for message in documented_messages():
        _name_message(document, message)
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def _name_message(document: dict[str, Any], message: DocumentedMessage) -> None:
    """Key ``message``'s channel message, component and operation by its model's name.

    FastStream's keys are ``<channel>:SubscribeMessage`` or ``<channel>:Message`` (components),
    ``SubscribeMessage`` or ``Message`` (the channel's) and the channel's own key (operations);
    every ``$ref`` to them is rewritten with them.
    """
    channel = document["channels"][message.channel]
    ((_, reference),) = channel["messages"].items()
    component = document["components"]["messages"].pop(reference["$ref"].rsplit("/", 1)[1])
    component.update(
        name=message.name,
        title=message.model.model_config.get("title", message.name),
        summary=message.summary,
    )
    document["components"]["messages"][message.name] = component
    channel["messages"] = {message.name: {"$ref": f"#/components/messages/{message.name}"}}
    operation = document["operations"].pop(message.channel)
    operation["summary"] = message.summary
    operation["messages"] = [
        {"$ref": f"#/channels/{_pointer(message.channel)}/messages/{message.name}"}
    ]
    document["operations"][message.operation] = operation


def _pointer(key: str) -> str:
    """``key`` as one part of a JSON pointer (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _first_paragraph(text: str | None) -> str:
    """The first paragraph of a docstring on one line, without reStructuredText's backticks."""
    paragraph = (text or "").strip().split("\n\n", 1)[0]
    return " ".join(paragraph.replace("``", "").split())


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
