"""``fulfilment publish``: one ``OrderPlaced`` per invoice of Online Retail files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fulfilment.adapters.rabbitmq import OutgoingEvent, UnroutableError, connect, publish_events
from fulfilment.contracts.topology import ORDER_PLACED_ROUTING_KEY, ORDERS_EXCHANGE
from fulfilment.tools.command import CommandError, Echo, read_order_files

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

    from fulfilment.tools.online_retail import RetailOrder


async def publish_command(amqp_url: str, files: Sequence[Path], *, echo: Echo) -> None:
    """Publish the orders of ``files`` (see :func:`publish_orders`); echo how many.

    Raises:
        CommandError: a file cannot be read (exit 2), or no queue is bound for the events
            (exit 1; start the worker first).
        BrokerUnavailableError: RabbitMQ does not answer.
    """
    read = read_order_files(files)
    async with connect(amqp_url) as connection:
        try:
            published = await publish_orders(connection, read.orders)
        except UnroutableError as error:
            raise CommandError(str(error)) from error
    echo(f"published {published} events (skipped: {read.skipped.describe()})")


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
    events = [OutgoingEvent(order.body(), str(order.event_id)) for order in orders]
    return await publish_events(
        connection, events, exchange=ORDERS_EXCHANGE, routing_key=ORDER_PLACED_ROUTING_KEY
    )
