"""``fulfilment publish``: one ``OrderPlaced`` per invoice of Online Retail files.

With ``--cancellations``, also one ``OrderCancelled`` per cancellation invoice that can only
mean one order (``fulfilment.dataset.retail_lifecycle``), each at its own time among the orders.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fulfilment.adapters.rabbitmq.connection import connect
from fulfilment.adapters.rabbitmq.publishing import OutgoingEvent, UnroutableError, publish_events
from fulfilment.contracts.topology import (
    ORDER_CANCELLED_ROUTING_KEY,
    ORDER_PLACED_ROUTING_KEY,
    ORDER_SHIPPED_ROUTING_KEY,
    ORDERS_EXCHANGE,
)
from fulfilment.dataset.files import match_read_cancellations, read_order_files
from fulfilment.dataset.online_retail import RetailOrder
from fulfilment.dataset.retail_lifecycle import RetailCancellation, RetailEvent, plan_days
from fulfilment.tools.command import CommandError, Echo

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection


async def publish_command(
    amqp_url: str, files: Sequence[Path], *, cancellations: bool = False, echo: Echo
) -> None:
    """Publish the orders of ``files`` (see :func:`publish_orders`); echo how many.

    With ``cancellations``, the mapped cancellations too, day by day in time order
    (``RetailDay.runs``), without waiting for the worker between them; the echo then counts
    each kind and the cancellations not mapped, by reason.

    Raises:
        CommandError: a file cannot be read (exit 2), or no queue is bound for the events
            (exit 1; start the worker first).
        BrokerUnavailableError: RabbitMQ does not answer.
    """
    read = read_order_files(files)
    match = match_read_cancellations(read) if cancellations else None
    async with connect(amqp_url) as connection:
        try:
            if match is None:
                published = await publish_orders(connection, read.orders)
            else:
                days = plan_days(read.days, read.orders, match.cancellations)
                events = [event for day in days for run in day.runs() for event in run]
                await publish_in_order(connection, events)
        except UnroutableError as error:
            raise CommandError(str(error)) from error
    if match is None:
        echo(f"published {published} events (skipped: {read.skipped.describe()})")
        return
    echo(
        f"published {len(read.orders)} OrderPlaced and {len(match.cancellations)} OrderCancelled"
        f" events (skipped: {read.skipped.describe()}; cancellations not mapped:"
        f" {match.describe()})"
    )


async def publish_orders(connection: AbstractConnection, orders: Sequence[RetailOrder]) -> int:
    """Publish one ``OrderPlaced`` per order; return how many the broker confirmed.

    Each goes to ``orders`` with ``order.placed``, persistent, mandatory and confirmed, with the
    event id as message id. Ids derive from the invoice number, so publishing the same orders
    twice re-sends the same events (and the worker answers them as duplicates).

    Raises:
        UnroutableError: no queue is bound for ``order.placed``; events published before it
            stay published.
        aiormq.exceptions.DeliveryError: the broker refused a message (e.g. the queue is full).
    """
    return await publish_in_order(connection, orders)


async def publish_in_order(connection: AbstractConnection, events: Sequence[RetailEvent]) -> int:
    """Publish ``events`` in their order, each with its kind's routing key; return how many.

    Consecutive events of one kind are published together, as :func:`publish_orders` does,
    and each group is confirmed before the next starts: an event of another kind never
    overtakes the events before it on their way to the broker (their queues are still
    consumed independently).

    Raises:
        UnroutableError: no queue is bound for a routing key; events published before it
            stay published.
        aiormq.exceptions.DeliveryError: the broker refused a message (e.g. the queue is full).
    """
    published = 0
    for routing_key, group in itertools.groupby(events, key=routing_key_of):
        published += await publish_events(
            connection,
            [OutgoingEvent(event.body(), str(event.event_id)) for event in group],
            exchange=ORDERS_EXCHANGE,
            routing_key=routing_key,
        )
    return published


def routing_key_of(event: RetailEvent) -> str:
    """The routing key of ``event``'s kind on the ``orders`` exchange."""
    if isinstance(event, RetailOrder):
        return ORDER_PLACED_ROUTING_KEY
    if isinstance(event, RetailCancellation):
        return ORDER_CANCELLED_ROUTING_KEY
    return ORDER_SHIPPED_ROUTING_KEY
