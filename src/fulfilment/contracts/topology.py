"""RabbitMQ topology names for worker and tools (docs/events.md, "Topology and delivery limit").

The worker declares these objects at start (``fulfilment.worker.topology``); the operator tools
only name them. Renaming one is a change of the external contract.

Each input event's route (``fulfilment.routes.table.ROUTES``) names its queue, a
:class:`SubscribedQueue`; ``SUBSCRIBED_QUEUES`` there lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass

ORDERS_EXCHANGE = "orders"
"""The shop's exchange (direct, durable) the worker's queues are bound to."""

EVENTS_EXCHANGE = "fulfilment.events"
"""Topic exchange (durable) the relay publishes the result events to; owned and declared by
the service, bound to by the shop's other services (docs/design.md, "Result events and the relay").
The routing keys and models are in ``contracts.result_events`` (``RESULT_EVENTS``)."""

DEAD_LETTER_EXCHANGE = "fulfilment.dlx"
"""Dead letters are routed by the name of the queue they died in
(:attr:`SubscribedQueue.dead_letter_routing_key`), so every queue's dead letters share the
exchange and reach their own DLQ."""

ORDER_PLACED_ROUTING_KEY = "order.placed"
ORDER_PLACED_QUEUE = "fulfilment.order-placed"
ORDER_PLACED_DEAD_LETTER_QUEUE = "fulfilment.order-placed.dlq"

ORDER_CANCELLED_ROUTING_KEY = "order.cancelled"
ORDER_CANCELLED_QUEUE = "fulfilment.order-cancelled"
ORDER_CANCELLED_DEAD_LETTER_QUEUE = "fulfilment.order-cancelled.dlq"

ORDER_SHIPPED_ROUTING_KEY = "order.shipped"
ORDER_SHIPPED_QUEUE = "fulfilment.order-shipped"
ORDER_SHIPPED_DEAD_LETTER_QUEUE = "fulfilment.order-shipped.dlq"


@dataclass(frozen=True, slots=True)
class SubscribedQueue:
    """A queue the worker consumes, bound to ``orders``, with its dead-letter queue.

    Attributes:
        event: the event it carries, in snake case (``order_placed``): the name of its
            subscription, the prefix of its log lines and the ``event`` label of
            ``fulfilment_events_total``.
        routing_key: its binding to :data:`ORDERS_EXCHANGE` (``order.placed``).
        name: the quorum queue (``fulfilment.order-placed``).
        dead_letter_queue: its DLQ (``fulfilment.order-placed.dlq``), bound to
            :data:`DEAD_LETTER_EXCHANGE` with :attr:`dead_letter_routing_key`.
    """

    event: str
    routing_key: str
    name: str
    dead_letter_queue: str

    @property
    def dead_letter_routing_key(self) -> str:
        """The routing key of its dead letters: the queue's own name.

        The broker uses it (the queue's ``x-dead-letter-routing-key``) and so does the service
        when it dead-letters a delivery itself, so both reach :attr:`dead_letter_queue`.
        """
        return self.name


ORDER_PLACED = SubscribedQueue(
    "order_placed", ORDER_PLACED_ROUTING_KEY, ORDER_PLACED_QUEUE, ORDER_PLACED_DEAD_LETTER_QUEUE
)
ORDER_CANCELLED = SubscribedQueue(
    "order_cancelled",
    ORDER_CANCELLED_ROUTING_KEY,
    ORDER_CANCELLED_QUEUE,
    ORDER_CANCELLED_DEAD_LETTER_QUEUE,
)
ORDER_SHIPPED = SubscribedQueue(
    "order_shipped", ORDER_SHIPPED_ROUTING_KEY, ORDER_SHIPPED_QUEUE, ORDER_SHIPPED_DEAD_LETTER_QUEUE
)
